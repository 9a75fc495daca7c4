// A host shaped like the original PiBench's run (issue 17): operations run on OpenMP pool
// threads inside `#pragma omp parallel sections` with a nested `#pragma omp parallel`, and
// the tree is deleted while those pool threads are still alive (libgomp keeps them for the
// next region). Each pool thread keeps a thread_local Index::ThreadScope, as the tree_api
// wrapper does (bench/tree_api_wrapper.cpp), or none (--no-scope: pins register on their own).
// A second round opens a new tree, runs on the same pool threads (which used the deleted
// tree) and deletes it too; then the process exits with the pool threads alive.
//
//   omp_delete_host <kind> <value_size> [--no-scope] [threads] [keys_per_thread] [rounds]
//
// Exit 0: every answer was right and nothing aborted. tests/sync/test_omp_delete.cpp runs it
// 20 times per kind. With the epoch manager of before issue 17 it aborts at the first
// `delete` ("contract violation: destroyed while a Participant or Guard is still alive").
#include <omp.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "pmindex/index.h"

namespace {

using pmindex::Code;
using pmindex::Index;

// What the tree_api wrapper keeps per thread: the tree it attached to and its scope. Never
// reset when the tree goes (as in PiBench's pool threads), so it outlives the tree.
struct ThreadAttachment {
  const Index* tree = nullptr;
  Index::ThreadScope scope;
};
thread_local ThreadAttachment tls_attachment;

bool use_scope = true;

void attach(Index& tree) {
  if (!use_scope || tls_attachment.tree == &tree) return;
  tls_attachment.scope = Index::ThreadScope();  // the wrapper's "detach from a previous tree"
  tls_attachment.scope = tree.attach_thread();
  tls_attachment.tree = &tree;
}

std::string value_of(std::uint64_t key, std::uint64_t version, std::size_t size) {
  std::string v(size, 'v');
  const std::uint64_t word = key * 31 + version;
  std::memcpy(v.data(), &word, sizeof word < size ? sizeof word : size);
  return v;
}

// One thread's share: insert its keys, read them back, update half (retiring old value
// records where values are out of line), remove a quarter, check what is left.
bool run_share(Index& tree, std::uint64_t first, std::uint64_t count, std::size_t value_size) {
  attach(tree);
  bool ok = true;
  std::string got;
  for (std::uint64_t k = first; k < first + count; ++k) {
    ok &= tree.insert(pmindex::encode_u64(k), value_of(k, 0, value_size)) == Code::ok;
  }
  for (std::uint64_t k = first; k < first + count; k += 2) {
    ok &= tree.update(pmindex::encode_u64(k), value_of(k, 1, value_size)) == Code::ok;
  }
  for (std::uint64_t k = first; k < first + count; k += 4) {
    ok &= tree.remove(pmindex::encode_u64(k)) == Code::ok;
  }
  for (std::uint64_t k = first; k < first + count; ++k) {
    const Code c = tree.find(pmindex::encode_u64(k), &got);
    if ((k - first) % 4 == 0) {
      ok &= c == Code::not_found;
    } else {
      ok &= c == Code::ok && got == value_of(k, (k - first) % 2 == 0 ? 1 : 0, value_size);
    }
  }
  return ok;
}

std::unique_ptr<Index> open_tree(const char* kind, std::size_t value_size, std::uint64_t keys) {
  pmindex::Options o;
  o.kind = kind;
  o.persistence = pmindex::pm::Mode::dram;  // anonymous DRAM pool: no file
  o.expected_records = keys;
  o.max_value_size = static_cast<std::uint32_t>(value_size);
  auto idx = Index::open(o);
  if (!idx.ok()) {
    std::fprintf(stderr, "open %s: %s\n", kind, idx.status().to_string().c_str());
    return nullptr;
  }
  return std::move(*idx);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: omp_delete_host <kind> <value_size> [--no-scope] [threads] "
                 "[keys_per_thread] [rounds]\n");
    return 2;
  }
  const char* kind = argv[1];
  const std::size_t value_size = std::strtoull(argv[2], nullptr, 10);
  int arg = 3;
  if (arg < argc && std::strcmp(argv[arg], "--no-scope") == 0) {
    use_scope = false;
    ++arg;
  }
  const int threads = arg < argc ? std::atoi(argv[arg++]) : 4;
  const std::uint64_t per_thread = arg < argc ? std::strtoull(argv[arg++], nullptr, 10) : 2000;
  const int rounds = arg < argc ? std::atoi(argv[arg++]) : 2;

  omp_set_max_active_levels(2);  // PiBench's run phase nests a parallel region in a section
  for (int round = 0; round < rounds; ++round) {
    Index* tree = open_tree(kind, value_size, per_thread * threads).release();
    if (tree == nullptr) return 1;
    int failures = 0;
    // PiBench: one section runs the workers, the other samples progress meanwhile.
#pragma omp parallel sections num_threads(2)
    {
#pragma omp section
      {
#pragma omp parallel num_threads(threads) reduction(+ : failures)
        {
          const auto t = static_cast<std::uint64_t>(omp_get_thread_num());
          const std::uint64_t base = 1 + (static_cast<std::uint64_t>(round) << 32);
          if (!run_share(*tree, base + t * per_thread, per_thread, value_size)) ++failures;
        }
      }
#pragma omp section
      {
        // PiBench's progress monitor: it reads only its own counters, not the tree.
      }
    }
    if (failures != 0) {
      std::fprintf(stderr, "round %d: %d threads saw wrong answers\n", round, failures);
      return 1;
    }
    // PiBench deletes the tree here; its OpenMP pool threads are alive and still hold
    // their thread_local scopes and epoch registrations.
    delete tree;
  }
  std::printf("ok: %s, %d rounds, %d threads\n", kind, rounds, threads);
  return 0;
}

// A host shaped like the original PiBench's run (issue 17): operations run on OpenMP pool
// threads inside `#pragma omp parallel sections` with a nested `#pragma omp parallel`, and
// the tree is deleted while those pool threads are still alive (libgomp keeps them for the
// next region). A second round creates a new tree, runs on the same pool threads (which used
// the deleted tree) and deletes it too; then the process exits with the pool threads alive.
//
//   omp_delete_host <kind> <value_size> [--no-scope] [threads] [keys_per_thread] [rounds]
//   omp_delete_host --tree-api <libpmindex_KIND_tree.so> <value_size> [threads] [keys] [rounds]
//
// Native mode opens the index with pmindex::Index::open (anonymous DRAM pool); each pool
// thread keeps a thread_local Index::ThreadScope, as the tree_api wrapper does, or none
// (--no-scope: the first operation registers the thread). --tree-api loads our PiBench
// library the way PiBench does (dlopen + create_tree) and deletes the tree_api object.
//
// Exit 0: every answer was right and nothing aborted. tests/sync/test_omp_delete.cpp runs it
// 20 times per configuration. With the epoch manager of before issue 17 it aborts at the
// first `delete` ("contract violation: destroyed while a Participant or Guard is still
// alive") whenever the pool threads hold scopes.
#include <dlfcn.h>
#include <omp.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "pmindex/index.h"
#include "tree_api.h"

namespace {

using pmindex::Code;
using pmindex::Index;

// The tree under test, either API. Keys are distinct u64s, big-endian (PiBench's 8 bytes).
class Tree {
 public:
  virtual ~Tree() = default;
  virtual bool insert(std::uint64_t key, const std::string& value) = 0;
  virtual bool update(std::uint64_t key, const std::string& value) = 0;
  virtual bool remove(std::uint64_t key) = 0;
  // Whether the key is present; if so, *value holds its value.
  virtual bool find(std::uint64_t key, std::string* value) = 0;
};

// What the tree_api wrapper keeps per thread: the tree it attached to and its scope. Never
// reset when the tree goes (as in PiBench's pool threads), so it outlives the tree.
struct ThreadAttachment {
  const Index* tree = nullptr;
  Index::ThreadScope scope;
};
thread_local ThreadAttachment tls_attachment;

class NativeTree final : public Tree {
 public:
  NativeTree(std::unique_ptr<Index> index, bool use_scope)
      : index_(std::move(index)), use_scope_(use_scope) {}
  bool insert(std::uint64_t key, const std::string& value) override {
    attach();
    return index_->insert(pmindex::encode_u64(key), value) == Code::ok;
  }
  bool update(std::uint64_t key, const std::string& value) override {
    attach();
    return index_->update(pmindex::encode_u64(key), value) == Code::ok;
  }
  bool remove(std::uint64_t key) override {
    attach();
    return index_->remove(pmindex::encode_u64(key)) == Code::ok;
  }
  bool find(std::uint64_t key, std::string* value) override {
    attach();
    return index_->find(pmindex::encode_u64(key), value) == Code::ok;
  }

 private:
  void attach() {
    if (!use_scope_ || tls_attachment.tree == index_.get()) return;
    tls_attachment.scope = Index::ThreadScope();  // the wrapper's "detach from a previous tree"
    tls_attachment.scope = index_->attach_thread();
    tls_attachment.tree = index_.get();
  }
  std::unique_ptr<Index> index_;
  bool use_scope_;
};

class TreeApiTree final : public Tree {
 public:
  TreeApiTree(tree_api* tree, std::size_t value_size) : tree_(tree), value_size_(value_size) {}
  bool insert(std::uint64_t key, const std::string& value) override {
    const std::string k = pmindex::encode_u64(key);
    return tree_->insert(k.data(), k.size(), value.data(), value.size());
  }
  bool update(std::uint64_t key, const std::string& value) override {
    const std::string k = pmindex::encode_u64(key);
    return tree_->update(k.data(), k.size(), value.data(), value.size());
  }
  bool remove(std::uint64_t key) override {
    const std::string k = pmindex::encode_u64(key);
    return tree_->remove(k.data(), k.size());
  }
  bool find(std::uint64_t key, std::string* value) override {
    const std::string k = pmindex::encode_u64(key);
    value->assign(value_size_, '\0');
    return tree_->find(k.data(), k.size(), value->data());
  }

 private:
  std::unique_ptr<tree_api> tree_;  // deleting it closes and destroys the index
  std::size_t value_size_;
};

std::string value_of(std::uint64_t key, std::uint64_t version, std::size_t size) {
  std::string v(size, 'v');
  const std::uint64_t word = key * 31 + version;
  std::memcpy(v.data(), &word, sizeof word < size ? sizeof word : size);
  return v;
}

// One thread's share: insert its keys, update half (retiring old value records where values
// are out of line), remove a quarter, check what is left.
bool run_share(Tree& tree, std::uint64_t first, std::uint64_t count, std::size_t value_size) {
  bool ok = true;
  std::string got;
  for (std::uint64_t k = first; k < first + count; ++k) ok &= tree.insert(k, value_of(k, 0, value_size));
  for (std::uint64_t k = first; k < first + count; k += 2) {
    ok &= tree.update(k, value_of(k, 1, value_size));
  }
  for (std::uint64_t k = first; k < first + count; k += 4) ok &= tree.remove(k);
  for (std::uint64_t k = first; k < first + count; ++k) {
    const bool found = tree.find(k, &got);
    if ((k - first) % 4 == 0) {
      ok &= !found;
    } else {
      ok &= found && got == value_of(k, (k - first) % 2 == 0 ? 1 : 0, value_size);
    }
  }
  return ok;
}

struct Config {
  const char* kind = nullptr;      // native mode
  const char* library = nullptr;   // --tree-api mode
  std::size_t value_size = 8;
  bool use_scope = true;
  int threads = 4;
  std::uint64_t per_thread = 2000;
  int rounds = 2;
};

Tree* open_tree(const Config& c) {
  const std::uint64_t keys = c.per_thread * static_cast<std::uint64_t>(c.threads);
  if (c.library != nullptr) {
    void* lib = ::dlopen(c.library, RTLD_NOW | RTLD_LOCAL);  // kept open, as PiBench does
    auto* create = lib != nullptr ? reinterpret_cast<tree_api* (*)(const tree_options_t&)>(
                                        ::dlsym(lib, "create_tree"))
                                  : nullptr;
    if (create == nullptr) {
      std::fprintf(stderr, "cannot load %s: %s\n", c.library, ::dlerror());
      return nullptr;
    }
    ::setenv("PMINDEX_EXPECTED_RECORDS", std::to_string(keys).c_str(), 1);
    tree_options_t o;
    o.value_size = c.value_size;
    o.num_threads = static_cast<std::size_t>(c.threads);
    tree_api* t = create(o);
    return t != nullptr ? new TreeApiTree(t, c.value_size) : nullptr;
  }
  pmindex::Options o;
  o.kind = c.kind;
  o.persistence = pmindex::pm::Mode::dram;  // anonymous DRAM pool: no file
  o.expected_records = keys;
  o.max_value_size = static_cast<std::uint32_t>(c.value_size);
  auto idx = Index::open(o);
  if (!idx.ok()) {
    std::fprintf(stderr, "open %s: %s\n", c.kind, idx.status().to_string().c_str());
    return nullptr;
  }
  return new NativeTree(std::move(*idx), c.use_scope);
}

bool parse(int argc, char** argv, Config* c) {
  int arg = 1;
  if (arg < argc && std::strcmp(argv[arg], "--tree-api") == 0) {
    if (argc < 4) return false;
    c->library = argv[2];
    arg = 3;
  } else {
    if (argc < 3) return false;
    c->kind = argv[1];
    arg = 2;
  }
  c->value_size = std::strtoull(argv[arg++], nullptr, 10);
  if (arg < argc && std::strcmp(argv[arg], "--no-scope") == 0) {
    c->use_scope = false;
    ++arg;
  }
  if (arg < argc) c->threads = std::atoi(argv[arg++]);
  if (arg < argc) c->per_thread = std::strtoull(argv[arg++], nullptr, 10);
  if (arg < argc) c->rounds = std::atoi(argv[arg++]);
  return c->value_size >= 8 && c->threads > 0 && c->rounds > 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  if (!parse(argc, argv, &c)) {
    std::fprintf(stderr,
                 "usage: omp_delete_host <kind> <value_size> [--no-scope] [threads] "
                 "[keys_per_thread] [rounds]\n"
                 "       omp_delete_host --tree-api <lib.so> <value_size> [threads] "
                 "[keys_per_thread] [rounds]\n");
    return 2;
  }
  omp_set_max_active_levels(2);  // PiBench's run phase nests a parallel region in a section
  for (int round = 0; round < c.rounds; ++round) {
    Tree* tree = open_tree(c);
    if (tree == nullptr) return 1;
    int failures = 0;
    // PiBench: one section runs the workers, the other samples progress meanwhile.
#pragma omp parallel sections num_threads(2)
    {
#pragma omp section
      {
#pragma omp parallel num_threads(c.threads) reduction(+ : failures)
        {
          const auto t = static_cast<std::uint64_t>(omp_get_thread_num());
          const std::uint64_t base = 1 + (static_cast<std::uint64_t>(round) << 32);
          if (!run_share(*tree, base + t * c.per_thread, c.per_thread, c.value_size)) ++failures;
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
  std::printf("ok: %s, %d rounds, %d threads\n", c.kind != nullptr ? c.kind : c.library,
              c.rounds, c.threads);
  return 0;
}

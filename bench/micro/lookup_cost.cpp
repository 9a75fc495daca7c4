// Instructions per lookup and per insert of one index, for callgrind (issue 16, "Must prove").
//
//   valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=OUT
//       build/release/bench/lookup_cost KIND [--records N] [--lookups L] [--inserts I]
//                                             [--load bulk|insert] [--time 1]
//
// Opens KIND in `dram` persistence mode on an anonymous pool, bulk-loads N sorted random
// 8-byte keys (u64 key type, 8-byte values; `--load insert`: inserts them in random order
// instead, the shape the originals' own drivers build for NBTree and uTree), precomputes L encoded lookup keys (uniform picks
// of loaded keys) and I encoded new keys, then runs `find` over the lookup keys and `insert`
// over the new keys. Under callgrind only those two loops are instrumented (client requests):
// OUT.1 holds the find loop, OUT.2 the insert loop. One run's total still holds a constant
// (the loop's entry, the dump request); the difference of two runs of different lengths
// cancels it: tools/callgrind-cost.sh does that and prints "kind lookup_instr insert_instr".
//
// Outside valgrind the client requests are no-ops and the program only checks its results;
// `--time 1` also prints the find loop's rate: lookups with no harness between them (the
// originals' drivers call their lookups the same way), for comparison with pmbench's loop.
// Exit code: 0, or 1 if the index could not be built or a lookup or insert failed.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <valgrind/callgrind.h>

#include "pmindex/index.h"

namespace {

struct Args {
  std::string kind;
  std::size_t records = 1'000'000;
  std::size_t lookups = 100'000;
  std::size_t inserts = 20'000;
  bool insert_load = false;  // --load insert
  bool time = false;         // --time 1
};

// noinline: each loop is one function, so a callgrind profile shows its inclusive cost.
[[gnu::noinline]] std::size_t find_loop(const pmindex::Index& index,
                                        const std::vector<std::string>& keys,
                                        std::string* value) {
  std::size_t found = 0;
  for (const std::string& k : keys) found += index.find(k, value) == pmindex::Code::ok;
  return found;
}

[[gnu::noinline]] std::size_t insert_loop(pmindex::Index& index,
                                          const std::vector<std::string>& keys) {
  std::size_t inserted = 0;
  for (const std::string& k : keys) inserted += index.insert(k, k) == pmindex::Code::ok;
  return inserted;
}

bool parse(int argc, char** argv, Args* a) {
  if (argc < 2) return false;
  a->kind = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i];
    if (flag == "--load") {
      const std::string_view how = argv[i + 1];
      if (how != "bulk" && how != "insert") return false;
      a->insert_load = how == "insert";
      continue;
    }
    const std::size_t v = std::strtoull(argv[i + 1], nullptr, 10);
    if (flag == "--records") a->records = v;
    else if (flag == "--lookups") a->lookups = v;
    else if (flag == "--inserts") a->inserts = v;
    else if (flag == "--time") a->time = v != 0;
    else return false;
  }
  return a->records > 0 && (argc % 2) == 0;
}

// records + inserts distinct random keys: the first `records` sorted (to load), the rest in
// random order (to insert).
std::vector<std::uint64_t> make_keys(std::size_t records, std::size_t inserts) {
  std::mt19937_64 rng(42);
  std::vector<std::uint64_t> keys;
  while (keys.size() < records + inserts) {
    while (keys.size() < records + inserts + 1024) keys.push_back(rng());
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  }
  std::shuffle(keys.begin(), keys.end(), rng);
  keys.resize(records + inserts);
  std::sort(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(records));
  return keys;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!parse(argc, argv, &a)) {
    std::fprintf(stderr, "usage: lookup_cost KIND [--records N] [--lookups L] [--inserts I] "
                 "[--load bulk|insert] [--time 1]\n");
    return 1;
  }
  pmindex::Options o;
  o.kind = a.kind;
  o.persistence = pmindex::pm::Mode::dram;
  // Twice the records: some indexes' default pool is tight for a bulk load at fill 1.0.
  o.expected_records = 2 * (a.records + a.inserts);
  auto opened = pmindex::Index::open(o);
  if (!opened.ok()) {
    std::fprintf(stderr, "open: %s\n", opened.status().to_string().c_str());
    return 1;
  }
  pmindex::Index& index = **opened;
  const pmindex::Index::ThreadScope scope = index.attach_thread();

  const std::vector<std::uint64_t> keys = make_keys(a.records, a.inserts);
  std::vector<std::string> encoded(a.records);
  std::vector<pmindex::KeyValue> sorted(a.records);
  for (std::size_t i = 0; i < a.records; ++i) {
    encoded[i] = pmindex::encode_u64(keys[i]);
    sorted[i] = {encoded[i], encoded[i]};
  }
  if (a.insert_load) {
    std::vector<std::size_t> order(a.records);
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::shuffle(order.begin(), order.end(), std::mt19937_64(11));
    for (const std::size_t i : order) {
      if (const pmindex::Code c = index.insert(encoded[i], encoded[i]); c != pmindex::Code::ok) {
        std::fprintf(stderr, "insert-load: %s\n", std::string(pmindex::to_string(c)).c_str());
        return 1;
      }
    }
  } else if (const pmindex::Status s = index.bulk_load(sorted, 1.0); !s.ok()) {
    std::fprintf(stderr, "bulk_load: %s\n", s.to_string().c_str());
    return 1;
  }
  std::mt19937_64 rng(7);
  std::vector<std::string> lookups(a.lookups);
  for (auto& k : lookups) k = encoded[rng() % a.records];
  std::vector<std::string> inserts(a.inserts);
  for (std::size_t i = 0; i < a.inserts; ++i) inserts[i] = pmindex::encode_u64(keys[a.records + i]);
  std::string value;
  value.reserve(64);

  CALLGRIND_START_INSTRUMENTATION;
  CALLGRIND_ZERO_STATS;
  const auto t0 = std::chrono::steady_clock::now();
  const std::size_t found = find_loop(index, lookups, &value);
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - t0;
  CALLGRIND_DUMP_STATS_AT("find");
  if (a.time) {
    std::printf("find loop: %zu lookups in %.3f s: %.0f ops/s\n", a.lookups, took.count(),
                static_cast<double>(a.lookups) / took.count());
  }
  const std::size_t inserted = insert_loop(index, inserts);
  CALLGRIND_DUMP_STATS_AT("insert");
  CALLGRIND_STOP_INSTRUMENTATION;

  // Values equal keys: the last lookup's value proves values are copied out.
  const bool value_ok = a.lookups == 0 || value == lookups.back();
  if (found != a.lookups || inserted != a.inserts || !value_ok) {
    std::fprintf(stderr, "%s: found %zu of %zu, inserted %zu of %zu\n", a.kind.c_str(), found,
                 a.lookups, inserted, a.inserts);
    return 1;
  }
  return 0;
}

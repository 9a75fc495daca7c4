// Two-thread stress of mixed insert/update/remove/find/scan against per-thread oracles
// (tests/index/common/hybrid_stress.h): thread t owns the keys with key % 2 == t, so both
// threads fill the same buffer, trigger merges the other thread's reads and writes wait for,
// and update base slots in place next to each other. Time-boxed by PMINDEX_STRESS_SECONDS
// (default 2), over 8-slot leaves (a merge every 8 writes) and the default 256. Run under TSan
// (cmake --preset tsan) for the race check.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <random>
#include <thread>

#include "index/common/hybrid_stress.h"
#include "index/dptree/dptree.h"
#include "index/dptree/layout.h"

namespace pmindex {
namespace {

void run_stress(std::uint32_t slots, double seconds) {
  Options o;
  o.kind = "dptree";
  o.pool_size = 64 << 20;
  o.node_size = static_cast<std::uint32_t>(dptree::leaf_bytes(slots));
  hybrid_test::run_two_thread_stress(
      o, 4000, seconds,
      hybrid_test::StressMix{.insert = 2, .update = 1, .remove = 1, .find = 1, .scan = 1}, 4321,
      "dptree " + std::to_string(slots) + " slots");
}

TEST(DPTreeStress, TwoThreadsAgainstOracle) {
  const double t = hybrid_test::stress_seconds();
  run_stress(8, t / 4);  // the default: background merges
  run_stress(256, t / 4);
  setenv("PMINDEX_DPTREE_MERGE", "sync", 1);  // the registry's merge mode
  run_stress(8, t / 4);
  run_stress(256, t / 4);
  unsetenv("PMINDEX_DPTREE_MERGE");
}

// Background merges beside two writers and a reader/scanner: preloaded keys (k % 4 == 0)
// that no writer touches must always be found with their values and appear in every scan
// that covers them; scans return strictly increasing keys (no duplicate from front, middle
// and base). Each writer owns the keys k % 4 == 1 + id (upserts and removes against its own
// map), checked after the run. 8-slot leaves: a merge every few writes.
TEST(DPTreeStress, WritersAndScannerBesideBackgroundMerges) {
  Options o;
  o.kind = "dptree";
  o.pool_size = 64 << 20;
  o.node_size = static_cast<std::uint32_t>(dptree::leaf_bytes(8));
  setenv("PMINDEX_DPTREE_MERGE", "background", 1);  // the registry's merge mode
  auto r = Index::open(o);
  unsetenv("PMINDEX_DPTREE_MERGE");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::unique_ptr<Index> idx = std::move(r).value();
  constexpr std::uint64_t kStable = 2000;
  for (std::uint64_t i = 0; i < kStable; ++i)
    ASSERT_EQ(idx->insert(encode_u64(i * 4), encode_u64(i)), Code::ok);
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(hybrid_test::stress_seconds() / 2));
  std::atomic<int> failures{0};
  std::atomic<bool> done{false};
  std::map<std::uint64_t, std::uint64_t> model[2];
  auto writer = [&](int id) {
    std::mt19937_64 rng(77 + static_cast<unsigned>(id));
    while (std::chrono::steady_clock::now() < until && failures == 0) {
      const std::uint64_t k = (rng() % kStable) * 4 + 1 + static_cast<std::uint64_t>(id);
      if (rng() % 4 == 0) {
        const Code c = idx->remove(encode_u64(k));
        if (c != (model[id].erase(k) != 0 ? Code::ok : Code::not_found)) ++failures;
      } else {
        const std::uint64_t v = rng();
        if (idx->upsert(encode_u64(k), encode_u64(v)) != Code::ok) ++failures;
        model[id][k] = v;
      }
    }
  };
  std::uint64_t scans = 0;
  auto reader = [&] {
    std::mt19937_64 rng(99);
    std::string got;
    ScanBuffer out;
    while (!done && failures == 0) {
      const std::uint64_t i = rng() % kStable;
      if (idx->find(encode_u64(i * 4), &got) != Code::ok || got != encode_u64(i)) ++failures;
      idx->scan(encode_u64(i * 4), 64, out);
      std::uint64_t prev = 0, stable = 0;
      for (std::size_t j = 0; j < out.size(); ++j) {
        const std::uint64_t k = decode_u64(out.key(j));
        if (j > 0 && !(k > prev)) ++failures;
        if (k % 4 == 0) {
          if (k != (i + stable) * 4 || out.value(j) != encode_u64(k / 4)) ++failures;
          ++stable;
        }
        prev = k;
      }
      if (out.size() < 64 && i + stable != kStable) ++failures;  // a short scan reached the end
      ++scans;
    }
  };
  std::thread w0(writer, 0), w1(writer, 1), rd(reader);
  w0.join();
  w1.join();
  done = true;
  rd.join();
  ASSERT_EQ(failures.load(), 0);
  auto* t = dynamic_cast<dptree::DPTree<>*>(idx.get());
  ASSERT_NE(t, nullptr);
  t->wait_merge_for_testing();
  const dptree::MergeStats ms = t->merge_stats();
  std::cout << "dptree background: " << ms.background_merges << " background merges of "
            << ms.merges << ", writers blocked " << ms.writer_blocks << " times, " << scans
            << " scans\n";
  EXPECT_GT(ms.background_merges, 0u);
  ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
  std::string got;
  for (int id = 0; id < 2; ++id)
    for (std::uint64_t i = 0; i < kStable; ++i) {
      const std::uint64_t k = i * 4 + 1 + static_cast<std::uint64_t>(id);
      const auto it = model[id].find(k);
      const Code c = idx->find(encode_u64(k), &got);
      ASSERT_EQ(c, it == model[id].end() ? Code::not_found : Code::ok) << k;
      if (it != model[id].end()) {
        ASSERT_EQ(got, encode_u64(it->second)) << k;
      }
    }
}

}  // namespace
}  // namespace pmindex

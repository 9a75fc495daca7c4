// Two-thread stress of mixed insert/delete/update/lookup/scan against per-thread oracles.
// Each thread owns the keys k with k % 2 == its id, so both threads share every leaf (splits,
// leaf removal and inner-node SMOs race) while each thread can check its own keys exactly.
// Time-boxed by PMINDEX_STRESS_SECONDS (default 2), split over node sizes 256 B and 1 KiB,
// and over u64 keys and variable-length keys (separator copies retired through EBR).
// Run under TSan (cmake --preset tsan) for the race check. Shared with FPTree:
// tests/index/common/hybrid_stress.h.
// NeighbouringRangesMerge: two writers own adjacent key ranges and repeatedly fill theirs and
// thin it out, so half-full leaves merge (J1-J6) at and across the ranges' border while the
// other writer splits and merges next to them, and a third thread scans and finds.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "index/common/hybrid_stress.h"
#include "index/lbtree/lbtree.h"

namespace pmindex {
namespace {

void run_stress(std::uint32_t node_size, KeyType kt, double seconds) {
  Options o;
  o.kind = "lbtree";
  o.pool_size = 64 << 20;
  o.node_size = node_size;
  o.key_type = kt;
  o.max_key_size = 8;
  const std::string label =
      "lbtree node " + std::to_string(node_size) + " B" + (kt == KeyType::bytes ? " bytes" : "");
  hybrid_test::run_two_thread_stress(
      o, 4000, seconds,
      hybrid_test::StressMix{.insert = 2, .update = 1, .remove = 1, .find = 1, .scan = 1}, 1234,
      label);
}

TEST(LBTreeStress, TwoThreadsAgainstOracle) {
  const double t = hybrid_test::stress_seconds();
  run_stress(256, KeyType::u64, t / 3);
  run_stress(1024, KeyType::u64, t / 3);
  run_stress(256, KeyType::bytes, t / 3);
}

// Writer t owns keys [t R, (t + 1) R). A round: insert the range ascending (half-full leaves),
// remove every other key (each leaf drops below the merge trigger: merges), check the rest
// with find, remove the rest (empty leaves unlinked). A reader scans the whole key space (keys
// strictly increasing, each key of the writer's even or odd class) and finds. Time-boxed.
void run_neighbours(std::uint32_t node_size, double seconds) {
  Options o;
  o.kind = "lbtree";
  o.pool_size = 16 << 20;
  o.node_size = node_size;
  o.key_type = KeyType::u64;
  auto opened = Index::open(o);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  Index& idx = **opened;
  constexpr std::uint64_t kRange = 600;
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  auto fail = [&](const char* what, std::uint64_t k) {
    if (failures.fetch_add(1) < 10) ADD_FAILURE() << what << " key " << k;
  };
  auto writer = [&](std::uint64_t t) {
    const std::uint64_t lo = t * kRange + 1;
    std::string got;
    while (!stop.load(std::memory_order_relaxed)) {
      for (std::uint64_t k = lo; k < lo + kRange; ++k)
        if (idx.insert(encode_u64(k), encode_u64(k * 3)) != Code::ok) fail("insert", k);
      for (std::uint64_t k = lo; k < lo + kRange; k += 2)
        if (idx.remove(encode_u64(k)) != Code::ok) fail("remove", k);
      for (std::uint64_t k = lo; k < lo + kRange; ++k) {
        const Code c = idx.find(encode_u64(k), &got);
        const bool kept = (k - lo) % 2 == 1;
        if (c != (kept ? Code::ok : Code::not_found)) fail("find", k);
        if (kept && c == Code::ok && got != encode_u64(k * 3)) fail("value", k);
      }
      for (std::uint64_t k = lo + 1; k < lo + kRange; k += 2)
        if (idx.remove(encode_u64(k)) != Code::ok) fail("remove rest", k);
    }
  };
  auto reader = [&] {
    ScanBuffer buf;
    std::string got;
    std::uint64_t i = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      const std::uint64_t start = (i++ * 97) % (2 * kRange);
      idx.scan(encode_u64(start), 64, buf);
      std::uint64_t prev = 0;
      for (std::size_t j = 0; j < buf.size(); ++j) {
        const std::uint64_t k = decode_u64(buf.key(j));
        if (k < start || (j > 0 && k <= prev)) fail("scan order", k);
        if (buf.value(j) != encode_u64(k * 3)) fail("scan value", k);
        prev = k;
      }
      const std::uint64_t k = start + 1;
      if (idx.find(encode_u64(k), &got) == Code::ok && got != encode_u64(k * 3))
        fail("find value", k);
    }
  };
  std::thread w0(writer, 0), w1(writer, 1), r(reader);
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  w0.join();
  w1.join();
  r.join();
  EXPECT_EQ(failures.load(), 0);
  const Status v = idx.verify();
  EXPECT_TRUE(v.ok()) << v.to_string();
  std::uint64_t merges = 0;
  if (auto* t = dynamic_cast<lbtree::LBTree<1>*>(&idx)) merges = t->merges();
  if (auto* t = dynamic_cast<lbtree::LBTree<4>*>(&idx)) merges = t->merges();
  std::printf("[lbtree neighbours] node %u B: %llu merges\n", node_size,
              static_cast<unsigned long long>(merges));
  EXPECT_GT(merges, 0u) << "the workload never merged";
}

TEST(LBTreeStress, NeighbouringRangesMerge) {
  const double t = hybrid_test::stress_seconds();
  run_neighbours(256, t / 2);
  run_neighbours(1024, t / 2);
}

}  // namespace
}  // namespace pmindex

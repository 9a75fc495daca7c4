// Two threads, mixed insert / update / remove / find / scan, checked against per-thread
// oracles. Thread t owns the keys with key % 2 == t, so both threads write the same leaves:
// leaf locks, splits (split micro-log), empty-leaf removal (delete micro-log, try-lock of the
// neighbour) and inner-node SMOs race, while each thread can still check its keys exactly.
// 8-entry leaves (many SMOs, inner fanout 4) and the paper's 64-entry leaves. Time-boxed by
// PMINDEX_STRESS_SECONDS (default 2). Run under TSan (cmake --preset tsan) for the race check.
// Shared with LB+-Tree: tests/index/common/hybrid_stress.h.
// NeighbouringRangesMerge: two writers own adjacent key ranges and repeatedly fill theirs and
// thin it out, so sparse leaves merge into their left neighbours (J1-J7) at and across the
// ranges' border while the other writer splits and merges next to them, and a third thread
// scans and finds (hybrid_test::run_neighbouring_ranges); u64 keys with 8- and 64-entry
// leaves, and bytes keys (key records move with their slots; leaves retired through EBR).
#include <gtest/gtest.h>

#include "index/common/hybrid_stress.h"
#include "index/fptree/fptree.h"

namespace pmindex {
namespace {

void stress(std::uint32_t node_size, std::uint64_t key_range, double seconds) {
  Options o;
  o.kind = "fptree";
  o.node_size = node_size;
  o.pool_size = 64 << 20;
  hybrid_test::run_two_thread_stress(
      o, key_range, seconds,
      hybrid_test::StressMix{.insert = 2, .update = 1, .remove = 2, .find = 1, .scan = 1}, 77,
      "fptree leaf " + std::to_string(node_size) + " B");
}

TEST(FPTreeStress, TwoThreadsAgainstOracle) {
  const double t = hybrid_test::stress_seconds();
  stress(sizeof(fptree::Leaf<8>), 300, t / 2);
  stress(sizeof(fptree::Leaf<64>), 3000, t / 2);
}

std::uint64_t merges_of(const Index& idx) {
  if (auto* t = dynamic_cast<const fptree::FPTree<8>*>(&idx)) return t->merges();
  if (auto* t = dynamic_cast<const fptree::FPTree<64>*>(&idx)) return t->merges();
  return 0;
}

void run_neighbours(std::uint32_t node_size, KeyType kt, double seconds) {
  Options o;
  o.kind = "fptree";
  o.pool_size = 16 << 20;
  o.node_size = node_size;
  o.key_type = kt;
  o.max_key_size = 8;
  hybrid_test::run_neighbouring_ranges(
      o, seconds, merges_of,
      "fptree neighbours leaf " + std::to_string(node_size) + " B" +
          (kt == KeyType::bytes ? " bytes" : ""));
}

TEST(FPTreeStress, NeighbouringRangesMerge) {
  const double t = hybrid_test::stress_seconds();
  run_neighbours(sizeof(fptree::Leaf<8>), KeyType::u64, t / 3);
  run_neighbours(sizeof(fptree::Leaf<64>), KeyType::u64, t / 3);
  run_neighbours(sizeof(fptree::Leaf<8>), KeyType::bytes, t / 3);
}

}  // namespace
}  // namespace pmindex

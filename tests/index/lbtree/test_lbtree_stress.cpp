// Two-thread stress of mixed insert/delete/update/lookup/scan against per-thread oracles.
// Each thread owns the keys k with k % 2 == its id, so both threads share every leaf (splits,
// leaf removal and inner-node SMOs race) while each thread can check its own keys exactly.
// Time-boxed by PMINDEX_STRESS_SECONDS (default 2), split over node sizes 256 B and 1 KiB,
// and over u64 keys and variable-length keys (separator copies retired through EBR).
// Run under TSan (cmake --preset tsan) for the race check. Shared with FPTree:
// tests/index/common/hybrid_stress.h.
// NeighbouringRangesMerge: two writers own adjacent key ranges and repeatedly fill theirs and
// thin it out, so half-full leaves merge (J1-J6) at and across the ranges' border while the
// other writer splits and merges next to them, and a third thread scans and finds (shared
// with FPTree: hybrid_test::run_neighbouring_ranges).
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

std::uint64_t merges_of(const Index& idx) {
  if (auto* t = dynamic_cast<const lbtree::LBTree<1>*>(&idx)) return t->merges();
  if (auto* t = dynamic_cast<const lbtree::LBTree<4>*>(&idx)) return t->merges();
  return 0;
}

void run_neighbours(std::uint32_t node_size, double seconds) {
  Options o;
  o.kind = "lbtree";
  o.pool_size = 16 << 20;
  o.node_size = node_size;
  o.key_type = KeyType::u64;
  hybrid_test::run_neighbouring_ranges(o, seconds, merges_of,
                                       "lbtree neighbours node " + std::to_string(node_size) + " B");
}

TEST(LBTreeStress, NeighbouringRangesMerge) {
  const double t = hybrid_test::stress_seconds();
  run_neighbours(256, t / 2);
  run_neighbours(1024, t / 2);
}

}  // namespace
}  // namespace pmindex

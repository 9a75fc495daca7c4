// Two-thread stress of mixed insert/update/remove/find/scan against per-thread oracles
// (tests/index/common/hybrid_stress.h): thread t owns the keys with key % 2 == t, so both
// threads write the same DRAM leaves and link next to each other's list nodes (predecessors
// in a neighbour leaf's range, marks and unlinks racing with inserts, dirty links settled by
// walkers). Time-boxed by PMINDEX_STRESS_SECONDS (default 2), split over DRAM leaves of 64 B
// (2 entries: a split every other insert, most predecessors in another leaf) and 512 B, and
// over u64 and variable-length keys. Run under TSan (cmake --preset tsan) for the race check.
#include <gtest/gtest.h>

#include "index/common/hybrid_stress.h"

namespace pmindex {
namespace {

void run_stress(std::uint32_t node_size, KeyType kt, double seconds) {
  Options o;
  o.kind = "utree";
  o.pool_size = 64 << 20;
  o.node_size = node_size;
  o.key_type = kt;
  o.max_key_size = 8;
  const std::string label =
      "utree node " + std::to_string(node_size) + " B" + (kt == KeyType::bytes ? " bytes" : "");
  hybrid_test::run_two_thread_stress(
      o, 4000, seconds,
      hybrid_test::StressMix{.insert = 2, .update = 1, .remove = 1, .find = 1, .scan = 1}, 4321,
      label);
}

TEST(UTreeStress, TwoThreadsAgainstOracle) {
  const double t = hybrid_test::stress_seconds();
  run_stress(64, KeyType::u64, t / 3);
  run_stress(512, KeyType::u64, t / 3);
  run_stress(64, KeyType::bytes, t / 3);
}

}  // namespace
}  // namespace pmindex

// Two threads, mixed insert / update / remove / find / scan, checked against per-thread
// oracles. Thread t owns the keys with key % 2 == t, so both threads write the same leaves:
// leaf locks, splits (split micro-log), empty-leaf removal (delete micro-log, try-lock of the
// neighbour) and inner-node SMOs race, while each thread can still check its keys exactly.
// 8-entry leaves (many SMOs, inner fanout 4) and the paper's 64-entry leaves. Time-boxed by
// PMINDEX_STRESS_SECONDS (default 2). Run under TSan (cmake --preset tsan) for the race check.
// Shared with LB+-Tree: tests/index/common/hybrid_stress.h.
#include <gtest/gtest.h>

#include "index/common/hybrid_stress.h"
#include "index/fptree/leaf.h"

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

}  // namespace
}  // namespace pmindex

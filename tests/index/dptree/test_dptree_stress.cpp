// Two-thread stress of mixed insert/update/remove/find/scan against per-thread oracles
// (tests/index/common/hybrid_stress.h): thread t owns the keys with key % 2 == t, so both
// threads fill the same buffer, trigger merges the other thread's reads and writes wait for,
// and update base slots in place next to each other. Time-boxed by PMINDEX_STRESS_SECONDS
// (default 2), over 8-slot leaves (a merge every 8 writes) and the default 256. Run under TSan
// (cmake --preset tsan) for the race check.
#include <gtest/gtest.h>

#include "index/common/hybrid_stress.h"
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
  run_stress(8, t / 2);
  run_stress(256, t / 2);
}

}  // namespace
}  // namespace pmindex

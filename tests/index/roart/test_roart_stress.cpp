// Two threads, mixed insert / update / remove / find / scan on roart, checked against
// per-thread oracles (tests/index/common/hybrid_stress.h): thread t owns keys with
// key % 2 == t, so both threads change the same leaf arrays (grows, shrinks, splits race with
// optimistic readers and scans). Time-boxed by PMINDEX_STRESS_SECONDS (default 2).
// Run under TSan (cmake --preset tsan) for the race check.
#include <gtest/gtest.h>

#include "index/common/hybrid_stress.h"

namespace pmindex {
namespace {

void stress(KeyType kt, std::uint64_t key_range, double seconds, const char* label) {
  Options o;
  o.kind = "roart";
  o.key_type = kt;
  o.max_key_size = 8;
  o.pool_size = 64 << 20;
  hybrid_test::run_two_thread_stress(
      o, key_range, seconds,
      hybrid_test::StressMix{.insert = 2, .update = 1, .remove = 2, .find = 1, .scan = 1}, 91,
      label);
}

TEST(RoartStress, TwoThreadsAgainstOracle) {
  const double t = hybrid_test::stress_seconds();
  stress(KeyType::u64, 300, t / 2, "roart u64 300 keys");
  stress(KeyType::u64, 100000, t / 2, "roart u64 sparse");
}

}  // namespace
}  // namespace pmindex

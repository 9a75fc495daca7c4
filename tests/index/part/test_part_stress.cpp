// Two threads, mixed insert / update / remove / find / scan on part, checked against
// per-thread oracles (tests/index/common/hybrid_stress.h): thread t owns keys with
// key % 2 == t, so both threads change the same nodes (grows, shrinks, prefix splits,
// collapses race with optimistic readers). Time-boxed by PMINDEX_STRESS_SECONDS (default 2).
// Run under TSan (cmake --preset tsan) for the race check. A third thread relocating every
// record again and again (PROTOCOL.md P11) beside the two workers: moves race with updates,
// removes, grows, shrinks and lookups of the same keys.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "index/common/hybrid_stress.h"
#include "index/part/part.h"

namespace pmindex {
namespace {

void stress(KeyType kt, std::uint64_t key_range, double seconds, const char* label) {
  Options o;
  o.kind = "part";
  o.key_type = kt;
  o.max_key_size = 8;
  o.pool_size = 64 << 20;
  hybrid_test::run_two_thread_stress(
      o, key_range, seconds,
      hybrid_test::StressMix{.insert = 2, .update = 1, .remove = 2, .find = 1, .scan = 1}, 91,
      label);
}

TEST(PartStress, TwoThreadsAgainstOracle) {
  const double t = hybrid_test::stress_seconds();
  stress(KeyType::u64, 300, t / 2, "part u64 300 keys");
  stress(KeyType::u64, 100000, t / 2, "part u64 sparse");
}

TEST(PartStress, TwoThreadsBesideRelocation) {
  Options o;
  o.kind = "part";
  o.key_type = KeyType::u64;
  o.pool_size = 64 << 20;
  auto r = Index::open(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  Index& idx = **r;
  auto& p = dynamic_cast<part::Part&>(idx);
  std::atomic<int> failures{0};
  std::atomic<bool> done{false};
  const hybrid_test::StressMix mix{.insert = 2, .update = 1, .remove = 2, .find = 1, .scan = 1};
  std::vector<hybrid_test::StressWorker> workers;
  for (int id = 0; id < 2; ++id) workers.emplace_back(idx, id, 300, mix, 93, failures);
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(hybrid_test::stress_seconds() / 2));
  auto body = [&](int id) {
    auto scope = idx.attach_thread();
    for (std::uint64_t n = 0; n < 200 || std::chrono::steady_clock::now() < until; ++n)
      workers[id].step();
  };
  std::size_t moved = 0;
  std::thread mover([&] {
    auto scope = idx.attach_thread();
    while (!done.load()) moved += p.relocate_records(part::Part::Relocate::every_record);
  });
  std::thread t0(body, 0), t1(body, 1);
  t0.join();
  t1.join();
  done = true;
  mover.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(moved, 0u);
  const std::size_t keys = hybrid_test::expect_holds_workers_keys(idx, workers);
  std::printf("part beside relocation: %zu records moved, %zu keys at the end\n", moved, keys);
}

}  // namespace
}  // namespace pmindex

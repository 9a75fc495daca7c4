// The kill -9 harness's writer threads (include/pmindex/crash/kill_harness.h): with 1, 2 and 3
// writers every writer runs and is judged on its own keys; an impossible writer count is refused.
// lbtree, whose leaf locks let writers on different keys proceed together (the reference
// index's one mutex can starve a writer for a few milliseconds, which is fair to it but
// would make "every writer acknowledged something" a matter of luck).
#include <gtest/gtest.h>

#include "pmindex/crash/kill_harness.h"
#include "support/temp_dir.h"

namespace pmindex::crash {
namespace {

TEST(KillHarness, EveryWriterRunsOnItsOwnKeys) {
  for (unsigned writers : {1u, 2u, 3u}) {
    pmindex::testing::TempDir dir;
    KillConfig cfg;
    cfg.options.kind = "lbtree";
    cfg.options.path = dir.file("kill.pool");
    cfg.options.pool_size = 4 << 20;
    cfg.cycles = 6;
    cfg.writers = writers;
    const KillReport r = run_kill_cycles(cfg);
    ASSERT_TRUE(r.ok()) << r.to_string();
    ASSERT_EQ(r.acknowledged_by_writer.size(), writers);
    for (std::size_t acked : r.acknowledged_by_writer) EXPECT_GT(acked, 0u) << r.to_string();
  }
}

TEST(KillHarness, RefusesWriterCountsTheLogCannotHold) {
  pmindex::testing::TempDir dir;
  for (unsigned writers : {0u, KillConfig::kMaxWriters + 1}) {
    KillConfig cfg;
    cfg.options.kind = "lbtree";
    cfg.options.path = dir.file("kill.pool");
    cfg.writers = writers;
    const KillReport r = run_kill_cycles(cfg);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.failures[0].find("writers must be"), std::string::npos) << r.to_string();
  }
}

}  // namespace
}  // namespace pmindex::crash

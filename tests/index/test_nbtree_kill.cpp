// NBTree under the kill -9 harness: PMINDEX_KILL_CYCLES cycles (about 30 in CI), half killed at
// a random time, half at the k-th persistence call; reopen, recover, compare with the oracle.
#include <gtest/gtest.h>

#include <iostream>

#include "pmindex/crash/kill_harness.h"
#include "support/temp_dir.h"

namespace pmindex::crash {
namespace {

void run(pm::Mode mode) {
  pmindex::testing::TempDir dir;
  KillConfig cfg = KillConfig::from_env(30);
  cfg.options.kind = "nbtree";
  cfg.options.path = dir.file("kill.pool");
  cfg.options.pool_size = 1 << 20;
  cfg.options.node_size = 128;
  cfg.options.persistence = mode;
  const KillReport r = run_kill_cycles(cfg);
  std::cout << "nbtree." << pm::to_string(mode) << " seed " << cfg.seed << ": " << r.to_string()
            << "\n";
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_EQ(r.cycles, cfg.cycles);
}

TEST(KillNBTree, Adr) { run(pm::Mode::adr); }
TEST(KillNBTree, Eadr) { run(pm::Mode::eadr); }

}  // namespace
}  // namespace pmindex::crash

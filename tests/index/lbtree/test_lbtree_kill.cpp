// LB+-Tree under the kill -9 harness (/dev/shm pool): PMINDEX_KILL_CYCLES cycles (about 30 in
// CI, hundreds in `long`), half killed at a random time, half at the k-th persistence call
// (some inside recovery). Leaves of 256 B and 1 KiB; key space 200 so splits and leaf
// removals happen across cycles.
#include <gtest/gtest.h>

#include <iostream>

#include "pmindex/crash/kill_harness.h"
#include "support/temp_dir.h"

namespace pmindex::crash {
namespace {

void run(std::uint32_t node_size, pm::Mode mode) {
  pmindex::testing::TempDir dir;
  KillConfig cfg = KillConfig::from_env(30);
  cfg.options.kind = "lbtree";
  cfg.options.node_size = node_size;
  cfg.options.path = dir.file("kill.pool");
  cfg.options.pool_size = 1 << 20;
  cfg.options.persistence = mode;
  cfg.key_space = 200;
  const KillReport r = run_kill_cycles(cfg);
  std::cout << "lbtree" << node_size << "." << pm::to_string(mode) << " seed " << cfg.seed
            << ": " << r.to_string() << "\n";
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_EQ(r.cycles, cfg.cycles);
}

TEST(KillLBTree, Leaf256Adr) { run(256, pm::Mode::adr); }
TEST(KillLBTree, Leaf1024Adr) { run(1024, pm::Mode::adr); }

}  // namespace
}  // namespace pmindex::crash

// APEX under kill -9 (the crash harness forks children that run operations on a pool file in
// /dev/shm and SIGKILLs them at random times or at a chosen persistence call, then reopens and
// checks against the oracle). 1 KiB nodes: expansions, splits, merges between kills; 16 KiB
// nodes: several record locks per node, contractions. Cycles: PMINDEX_KILL_CYCLES (30 in CI,
// 300 in the `long` variant).
#include <gtest/gtest.h>

#include <iostream>

#include "pmindex/crash/kill_harness.h"
#include "support/temp_dir.h"

namespace pmindex::crash {
namespace {

void run(std::uint32_t node_size, std::uint64_t key_space, std::uint64_t seed_offset) {
  pmindex::testing::TempDir dir;
  KillConfig cfg = KillConfig::from_env(30);
  cfg.seed += seed_offset;
  cfg.options.kind = "apex";
  cfg.options.node_size = node_size;
  cfg.options.path = dir.file("kill.pool");
  cfg.options.pool_size = 8 << 20;
  cfg.key_space = key_space;  // enough records for SMOs between kills
  const KillReport r = run_kill_cycles(cfg);
  std::cout << "apex kill (node " << node_size << ") seed " << cfg.seed << ": " << r.to_string()
            << "\n";
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_EQ(r.cycles, cfg.cycles);
}

TEST(KillApex, Adr) { run(1024, 2000, 0); }
TEST(KillApex, AdrLargeNodes) { run(16384, 6000, 1); }

}  // namespace
}  // namespace pmindex::crash

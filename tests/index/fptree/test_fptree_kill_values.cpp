// FPTree with out-of-line values (max_value_size = 64: every value is a PM record) under the
// kill -9 harness (/dev/shm pool): PMINDEX_KILL_CYCLES cycles (about 30 in CI, hundreds in
// `long`), half killed at a random time, half at the k-th persistence call (some inside
// recovery). After each kill the parent recovers, verify()s (value records checked and
// counted against the allocator's bytes in use) and compares with the oracle.
#include <gtest/gtest.h>

#include <iostream>

#include "index/fptree/layout.h"
#include "pmindex/crash/kill_harness.h"
#include "support/temp_dir.h"

namespace pmindex::crash {
namespace {

void run(std::uint32_t node_size, pm::Mode mode) {
  pmindex::testing::TempDir dir;
  KillConfig cfg = KillConfig::from_env(30);
  cfg.options.kind = "fptree";
  cfg.options.node_size = node_size;
  cfg.options.max_value_size = 64;
  cfg.options.path = dir.file("kill.pool");
  cfg.options.pool_size = 1 << 20;
  cfg.options.persistence = mode;
  cfg.key_space = 200;
  const KillReport r = run_kill_cycles(cfg);
  std::cout << "fptree" << node_size << "values." << pm::to_string(mode) << " seed " << cfg.seed
            << ": " << r.to_string() << "\n";
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_EQ(r.cycles, cfg.cycles);
}

TEST(KillFPTreeValues, Leaf8Adr) { run(sizeof(fptree::Leaf<8>), pm::Mode::adr); }

}  // namespace
}  // namespace pmindex::crash

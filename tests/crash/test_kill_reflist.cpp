// reflist under the kill -9 harness: PMINDEX_KILL_CYCLES cycles (about 30 in CI, hundreds in
// the `long` variant), half of them killed at a random time, half at the k-th persistence call.
#include <gtest/gtest.h>

#include <iostream>

#include "pmindex/crash/kill_harness.h"
#include "support/temp_dir.h"

namespace pmindex::crash {
namespace {

void run(pm::Mode mode) {
  pmindex::testing::TempDir dir;
  KillConfig cfg = KillConfig::from_env(30);
  cfg.options.kind = "reflist";
  cfg.options.path = dir.file("kill.pool");
  cfg.options.pool_size = 1 << 20;
  cfg.options.persistence = mode;
  const KillReport r = run_kill_cycles(cfg);
  std::cout << "reflist." << pm::to_string(mode) << " seed " << cfg.seed << ": " << r.to_string()
            << "\n";
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_EQ(r.cycles, cfg.cycles);
}

TEST(KillRefList, Adr) { run(pm::Mode::adr); }
TEST(KillRefList, Eadr) { run(pm::Mode::eadr); }

}  // namespace
}  // namespace pmindex::crash

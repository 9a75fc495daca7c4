// NBTree under the kill -9 harness: PMINDEX_KILL_CYCLES cycles (about 30 in CI), half killed at
// a random time, half at the k-th persistence call; reopen, recover, compare with the oracle.
// u64 keys in adr and eadr, bytes keys (PM key records) in adr.
#include <gtest/gtest.h>

#include <iostream>

#include "pmindex/crash/kill_harness.h"
#include "support/temp_dir.h"

namespace pmindex::crash {
namespace {

void run(pm::Mode mode, KeyType kt = KeyType::u64) {
  pmindex::testing::TempDir dir;
  KillConfig cfg = KillConfig::from_env(30);
  cfg.options.kind = "nbtree";
  cfg.options.key_type = kt;  // bytes: the harness's 8-byte keys through PM key records
  cfg.options.max_key_size = 8;
  cfg.options.path = dir.file("kill.pool");
  cfg.options.pool_size = 1 << 20;
  cfg.options.node_size = 128;
  cfg.options.persistence = mode;
  const KillReport r = run_kill_cycles(cfg);
  std::cout << "nbtree." << pm::to_string(mode) << (kt == KeyType::bytes ? ".bytes" : "")
            << " seed " << cfg.seed << ": " << r.to_string()
            << "\n";
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_EQ(r.cycles, cfg.cycles);
}

TEST(KillNBTree, Adr) { run(pm::Mode::adr); }
TEST(KillNBTree, Eadr) { run(pm::Mode::eadr); }
TEST(KillNBTree, AdrBytesKeys) { run(pm::Mode::adr, KeyType::bytes); }

}  // namespace
}  // namespace pmindex::crash

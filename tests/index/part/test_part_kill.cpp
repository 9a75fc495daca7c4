// part under kill -9 (the harness forks children that run operations with 2 writer threads on
// a pool file in /dev/shm and SIGKILLs them at random times or at a chosen persistence call,
// then reopens and checks against the acknowledgement log). Cycles: PMINDEX_KILL_CYCLES (30
// in CI, 300 in the `long` variant). A known-bad pool (its root forgotten) must be caught.
#include <gtest/gtest.h>

#include <iostream>

#include "index/common/hybrid_test_support.h"
#include "pmindex/crash/kill_harness.h"
#include "support/temp_dir.h"

namespace pmindex::crash {
namespace {

void run(KeyType kt, std::uint64_t key_space, std::uint64_t seed_offset) {
  pmindex::testing::TempDir dir;
  KillConfig cfg = KillConfig::from_env(30);
  cfg.seed += seed_offset;
  cfg.options.kind = "part";
  cfg.options.key_type = kt;
  cfg.options.max_key_size = 8;
  cfg.options.path = dir.file("kill.pool");
  cfg.options.pool_size = 8 << 20;
  cfg.key_space = key_space;
  cfg.max_open_event = 4;
  const KillReport r = run_kill_cycles(cfg);
  std::cout << "part kill seed " << cfg.seed << ": " << r.to_string() << "\n";
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_EQ(r.cycles, cfg.cycles);
}

TEST(KillPart, Adr) { run(KeyType::u64, 2000, 0); }
TEST(KillPart, AdrByteKeys) { run(KeyType::bytes, 600, 1); }

// The harness must be able to fail on part: the pool forgets its root after each kill, so the
// reopen builds an empty index and acknowledged records are missing.
TEST(KillPart, HarnessCatchesLostRecords) {
  Options o;
  o.kind = "part";
  o.key_type = KeyType::u64;
  o.max_key_size = 8;
  hybrid_test::expect_kill_catches(o, hybrid_test::forget_root, "part.kill.tampered");
}

}  // namespace
}  // namespace pmindex::crash

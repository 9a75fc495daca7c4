// NBTree under the crash simulator (single thread), in adr and eadr modes: every persistence
// point of insert, update, delete, the SMO phases (tiny leaves: capacity 7, so the driver's
// key space splits leaves often) and recovery itself. Sized by PMINDEX_CRASH_IMAGES, seeded by
// PMINDEX_CRASH_SEED; u64 keys and variable-length keys (KeyType::bytes: K1-K3 key records
// in every insert, delete and SMO); a failure prints a replay token:
//   PMINDEX_CRASH_REPLAY='nbtree.adr/<seed>/<op>/<point>/<choice>' ./test_nbtree_crash
#include <gtest/gtest.h>

#include <iostream>

#include "pmindex/crash/index_driver.h"
#include "index/common/crash_kit.h"

namespace pmindex::crash {
namespace {

void run(pm::Mode mode, std::uint32_t node_size, KeyType kt = KeyType::u64) {
  IndexCrashConfig cfg;
  cfg.options.kind = "nbtree";
  cfg.options.key_type = kt;  // bytes: the driver's 8-byte keys go through PM key records
  cfg.options.max_key_size = 8;
  cfg.options.node_size = node_size;
  cfg.pool_size = 512 * 1024;
  const std::string label = "nbtree." + std::string(pm::to_string(mode)) + "." +
                            std::to_string(node_size) + (kt == KeyType::bytes ? ".bytes" : "");
  const ExploreOptions opt = ExploreOptions::from_env(label, mode);
  const ExploreReport r = run_index_crash(cfg, opt);
  if (r.replay_skipped) GTEST_SKIP() << "PMINDEX_CRASH_REPLAY names another configuration";
  crash_kit::expect_explored(r, opt);
}

TEST(CrashNBTree, AdrSmallLeaves) { run(pm::Mode::adr, 128); }
TEST(CrashNBTree, EadrSmallLeaves) { run(pm::Mode::eadr, 128); }
TEST(CrashNBTree, AdrTinyLeaves) { run(pm::Mode::adr, 64); }
TEST(CrashNBTree, AdrSmallLeavesBytesKeys) { run(pm::Mode::adr, 128, KeyType::bytes); }
TEST(CrashNBTree, EadrSmallLeavesBytesKeys) { run(pm::Mode::eadr, 128, KeyType::bytes); }

}  // namespace
}  // namespace pmindex::crash

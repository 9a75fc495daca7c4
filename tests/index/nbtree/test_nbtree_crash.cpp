// NBTree under the crash simulator (single thread), in adr and eadr modes: every persistence
// point of insert, update, delete, the SMO phases (tiny leaves: capacity 7, so the driver's
// key space splits leaves often) and recovery itself. Sized by PMINDEX_CRASH_IMAGES, seeded by
// PMINDEX_CRASH_SEED; u64 keys and variable-length keys (KeyType::bytes: K1-K3 key records
// in every insert, delete and SMO); a failure prints a replay token:
//   PMINDEX_CRASH_REPLAY='nbtree.adr/<seed>/<op>/<point>/<choice>' ./test_nbtree_crash
#include <gtest/gtest.h>

#include <cstring>
#include <iostream>

#include "pmindex/crash/index_driver.h"
#include "index/common/crash_kit.h"
#include "index/common/hybrid_test_support.h"
#include "index/nbtree/nbtree.h"

namespace pmindex::crash {
namespace {

// NBTree's leaf count on the live index: "leaves+" is a leaf split.
crash_kit::SmoTally::Levels leaf_levels(const Index& idx) {
  return {{"leaves", dynamic_cast<const nbtree::NBTree&>(idx).leaf_count()}};
}

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
  const crash_kit::SmoTally tally(leaf_levels);
  cfg.observe = tally.observer();
  const ExploreReport r = run_index_crash(cfg, opt);
  if (r.replay_skipped) GTEST_SKIP() << "PMINDEX_CRASH_REPLAY names another configuration";
  crash_kit::expect_explored(r, opt, {.smos = {"leaves+"}}, &tally);  // leaf splits ran
}

TEST(CrashNBTree, AdrSmallLeaves) { run(pm::Mode::adr, 128); }
TEST(CrashNBTree, EadrSmallLeaves) { run(pm::Mode::eadr, 128); }
TEST(CrashNBTree, AdrTinyLeaves) { run(pm::Mode::adr, 64); }
TEST(CrashNBTree, AdrSmallLeavesBytesKeys) { run(pm::Mode::adr, 128, KeyType::bytes); }
TEST(CrashNBTree, EadrSmallLeavesBytesKeys) { run(pm::Mode::eadr, 128, KeyType::bytes); }

// An nbtree-specific loss: zeroing the head leaf's entries (a zero key word is a free slot)
// drops records that completed operations wrote (128-byte leaves).
void clear_head_leaf(std::span<char> image) {
  std::uint64_t root = 0, head = 0;
  std::memcpy(&root, image.data() + offsetof(pm::PoolHeader, root), 8);
  if (root == 0 || root + sizeof(nbtree::Root) > image.size()) return;
  std::memcpy(&head, image.data() + root + offsetof(nbtree::Root, head), 8);
  if (head == 0 || head + 128 > image.size()) return;
  std::memset(image.data() + head + sizeof(nbtree::BlockHeader), 0,
              128 - sizeof(nbtree::BlockHeader));
}

Options leaf128() {
  Options o;
  o.kind = "nbtree";
  o.node_size = 128;
  return o;
}

// The crash driver and the kill harness must both catch it.
TEST(CrashNBTree, DriverCatchesLostRecords) {
  hybrid_test::expect_driver_catches(leaf128(), 40, clear_head_leaf, "nbtree.tampered");
}
TEST(CrashNBTree, KillHarnessCatchesLostRecords) {
  hybrid_test::expect_kill_catches(leaf128(), clear_head_leaf, "nbtree.kill.tampered");
}

}  // namespace
}  // namespace pmindex::crash

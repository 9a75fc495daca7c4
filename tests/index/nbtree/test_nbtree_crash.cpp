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

// NBTree's leaf count on the live index: "leaves+" is a leaf split; "merges+" a merge that
// reached its durability point (M5p).
crash_kit::SmoTally::Levels leaf_levels(const Index& idx) {
  const auto& nb = dynamic_cast<const nbtree::NBTree&>(idx);
  return {{"leaves", nb.leaf_count()}, {"merges", nb.merges_linked()}};
}

// The kit's registry crash run; it fails a run whose workload split no leaf or merged none.
void run(pm::Mode mode, std::uint32_t node_size, KeyType kt = KeyType::u64) {
  hybrid_test::RegistryCrashRun r;
  r.options.kind = "nbtree";
  r.options.key_type = kt;  // bytes: the driver's 8-byte keys go through PM key records
  r.options.max_key_size = 8;
  r.options.node_size = node_size;
  r.pool_size = 512 * 1024;
  r.mode = mode;
  r.label = "nbtree." + std::string(pm::to_string(mode)) + "." + std::to_string(node_size) +
            (kt == KeyType::bytes ? ".bytes" : "");
  r.smos = {"leaves+", "merges+"};
  r.probe = leaf_levels;
  hybrid_test::run_registry_crash(r);
}

TEST(CrashNBTree, AdrSmallLeaves) { run(pm::Mode::adr, 128); }
TEST(CrashNBTree, EadrSmallLeaves) { run(pm::Mode::eadr, 128); }
TEST(CrashNBTree, AdrTinyLeaves) { run(pm::Mode::adr, 64); }
TEST(CrashNBTree, AdrSmallLeavesBytesKeys) { run(pm::Mode::adr, 128, KeyType::bytes); }
TEST(CrashNBTree, EadrSmallLeavesBytesKeys) { run(pm::Mode::eadr, 128, KeyType::bytes); }

// Fill then drain (the driver's drain_from), so leaves empty and merge (M0..M7), with an
// optional known-bad variant set on the live index after op 0 (it writes no PM).
ExploreReport run_drain(pm::Mode mode, nbtree::NBTree::Fault fault, const std::string& label,
                        const crash_kit::SmoTally& tally, ExploreOptions* opt) {
  IndexCrashConfig cfg;
  cfg.options.kind = "nbtree";
  cfg.options.node_size = 128;
  cfg.pool_size = 512 * 1024;
  cfg.ops = 120;
  cfg.drain_from = 60;
  auto observe = tally.observer();
  cfg.observe = [fault, observe](const Index& idx, std::size_t op) {
    if (op == 0) {
      const_cast<nbtree::NBTree&>(dynamic_cast<const nbtree::NBTree&>(idx))
          .set_fault_for_testing(fault);
    }
    observe(idx, op);
  };
  *opt = ExploreOptions::from_env(label, mode);
  return run_index_crash(cfg, *opt);
}

// Without the fault: clean in adr and eadr, and the workload merged (some merge reached M5p).
void expect_drain_clean(pm::Mode mode) {
  const crash_kit::SmoTally tally(leaf_levels);
  ExploreOptions opt;
  const ExploreReport r = run_drain(mode, nbtree::NBTree::Fault::none,
                                    "nbtree." + std::string(pm::to_string(mode)) + ".drain",
                                    tally, &opt);
  if (r.replay_skipped) GTEST_SKIP() << "PMINDEX_CRASH_REPLAY names another configuration";
  crash_kit::expect_explored(r, opt, {.smos = {"leaves+", "merges+"}}, &tally);
}
TEST(CrashNBTree, AdrFillThenDrainMerges) { expect_drain_clean(pm::Mode::adr); }
TEST(CrashNBTree, EadrFillThenDrainMerges) { expect_drain_clean(pm::Mode::eadr); }

// The checker can fail: a merge whose M5p (the predecessor's switch from P to the merged leaf)
// skips its write-back leaves P and E in the PM chain while later writes go to the merged
// leaf, so some ADR image loses them.
TEST(CrashNBTree, SkippedMergeLinkPersistIsCaught) {
  const crash_kit::SmoTally tally(leaf_levels);
  ExploreOptions opt;
  const ExploreReport r = run_drain(pm::Mode::adr, nbtree::NBTree::Fault::skip_merge_link_persist,
                                    "nbtree.adr.drain.bad_merge_link", tally, &opt);
  if (r.replay_skipped) GTEST_SKIP() << "PMINDEX_CRASH_REPLAY names another configuration";
  EXPECT_FALSE(r.ok()) << "the skipped M5p write-back went unnoticed: " << r.to_string();
  std::cout << "[caught] " << r.to_string().substr(0, 600) << "\n";
}

// An nbtree-specific loss that the crash driver and the kill harness must both catch: zeroing
// the head leaf's entries (a zero key word is a free slot) drops records that completed
// operations wrote (128-byte leaves).
TEST(CrashNBTree, DriverAndKillHarnessCatchLostRecords) {
  Options o;
  o.kind = "nbtree";
  o.node_size = 128;
  hybrid_test::expect_checkers_catch(o, [](std::span<char> image) {
    if (const std::uint64_t head = hybrid_test::head_leaf(image, offsetof(nbtree::Root, head), 128))
      std::memset(image.data() + head + sizeof(nbtree::BlockHeader), 0,
                  128 - sizeof(nbtree::BlockHeader));
  }, "nbtree");
}

}  // namespace
}  // namespace pmindex::crash

// NBTree under the multi-threaded crash simulator: 2 and 3 threads of inserts, updates,
// deletes and reads on tiny leaves (capacity 7: SMOs, cooperative helping and sync-on-write /
// sync-on-read all happen) under a seeded deterministic schedule; crash images across all
// threads (eADR: after every store; ADR: line mode), each recovered and judged for durable
// linearizability (crash::run_index_crash_concurrent). PMINDEX_CRASH_IMAGES is the image
// budget per mode (spread over schedules of 125 images each), PMINDEX_CRASH_SEED the base seed. A
// failure prints a replay token:
//   PMINDEX_CRASH_REPLAY='nbtree.mt.adr.2t/<seed>/<op>/<point>/<choice>' ./test_nbtree_mt_crash
// Known-bad variants (a skipped insert write-back, a skipped reader write-back) must fail.
#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <vector>

#include "index/common/crash_kit.h"
#include "index/nbtree/nbtree.h"
#include "pmindex/crash/index_driver.h"

namespace pmindex::crash {
namespace {

ConcurrentCrashConfig config(std::size_t threads, nbtree::NBTree::Fault fault,
                             KeyType kt = KeyType::u64) {
  ConcurrentCrashConfig cfg;
  cfg.options.kind = "nbtree";
  cfg.options.key_type = kt;  // bytes: the driver's 8-byte keys through PM key records (K1-K5)
  cfg.options.max_key_size = 8;
  cfg.options.node_size = 128;  // capacity 7
  cfg.threads = threads;
  cfg.ops_per_thread = threads == 2 ? 30 : 20;
  // The dirty-read variant needs a read to overlap an update of the same key: few keys.
  cfg.key_space = fault == nbtree::NBTree::Fault::skip_reader_persist ? 3 : 14;
  // The skipped-insert-persist variant starts empty, so it is caught while threads run.
  cfg.preload = fault == nbtree::NBTree::Fault::skip_insert_persist
                    ? 0
                    : std::min<std::size_t>(6, cfg.key_space);
  cfg.prepare = [fault](Index& index) {
    auto* t = dynamic_cast<nbtree::NBTree*>(&index);
    ASSERT_NE(t, nullptr);
    t->set_fault_for_testing(fault);
  };
  return cfg;
}

using Totals = crash_kit::SweepTotals;

// NBTree's leaf count, read on the live index: "leaves+" is a leaf split (a replaced leaf
// becomes two) during a schedule.
crash_kit::SmoTally::Levels leaf_levels(const Index& idx) {
  const auto& nb = dynamic_cast<const nbtree::NBTree&>(idx);
  return {{"leaves", nb.leaf_count()}, {"merges", nb.merges_linked()}};
}

// Spends the mode's image budget over consecutive seeds (125 images per schedule).
Totals sweep(pm::Mode mode, std::size_t threads, nbtree::NBTree::Fault fault,
             std::size_t max_seeds = 0, KeyType kt = KeyType::u64,
             const crash_kit::SmoTally* tally = nullptr,
             const std::vector<std::string>& smos = {}) {
  const std::string label = "nbtree.mt." + std::string(pm::to_string(mode)) + "." +
                            std::to_string(threads) + "t" +
                            (kt == KeyType::bytes ? ".bytes" : "") +
                            (fault == nbtree::NBTree::Fault::none
                                 ? std::string()
                                 : ".bad" + std::to_string(static_cast<int>(fault)));
  ExploreOptions opt = ExploreOptions::from_env(label, mode, 20261122, 1000);
  // S5b's known-bad is a rare race (2 of 4 base seeds caught it within 400 schedules): it
  // always starts from the base seed whose 36th schedule catches it, whatever CI's seed.
  if (fault == nbtree::NBTree::Fault::skip_sync_stop_persist) opt.seed = 20261122;
  // Half of the budget for each thread count. A known-bad variant must be caught whatever the
  // base seed: it gets max_seeds schedules (not the image budget) and stops at the first that
  // fails.
  // A clean sweep that has not yet run every SMO it names gets up to 12 more schedules.
  const bool bad = fault != nbtree::NBTree::Fault::none;
  crash_kit::SweepPlan plan{
      .per_run = 125, .budget_share = 2, .max_seeds = max_seeds, .stop_at_failure = bad};
  if (tally != nullptr) {
    plan.covered = [tally, &smos] { return tally->covers(smos); };
    plan.max_extra_seeds = 12;
  }
  return crash_kit::sweep(
      opt, plan,
      [&](const ExploreOptions& one) {
        ConcurrentCrashConfig cfg = config(threads, fault, kt);
        if (tally != nullptr) cfg.observe = tally->observer();
        return run_index_crash_concurrent(cfg, one);
      });
}

// The kit's rules per schedule (crash_kit::expect_swept): no violation, every schedule checked
// its 125 images or every distinct image it offered, and leaves split in some schedule (and,
// with 2 threads, merged: "merges+", PROTOCOL.md M5p).
void expect_clean(pm::Mode mode, std::size_t threads, KeyType kt = KeyType::u64) {
  const crash_kit::SmoTally tally(leaf_levels);
  // 2 threads (30 ops each) also merge leaves (M5p reached), though not in every schedule
  // (eADR, 2 threads: none in 4 schedules from CI's seed 3091667297); 3 threads of 20 ops
  // rarely do.
  const std::vector<std::string> smos = threads == 2
                                            ? std::vector<std::string>{"leaves+", "merges+"}
                                            : std::vector<std::string>{"leaves+"};
  const Totals t = sweep(mode, threads, nbtree::NBTree::Fault::none, 0, kt, &tally, smos);
  crash_kit::expect_swept(
      t, "nbtree.mt." + std::string(pm::to_string(mode)) + "." + std::to_string(threads) + "t",
      smos, &tally);
}

TEST(MtCrashNBTree, Eadr2Threads) { expect_clean(pm::Mode::eadr, 2); }
TEST(MtCrashNBTree, Eadr3Threads) { expect_clean(pm::Mode::eadr, 3); }
TEST(MtCrashNBTree, Adr2Threads) { expect_clean(pm::Mode::adr, 2); }
TEST(MtCrashNBTree, Adr3Threads) { expect_clean(pm::Mode::adr, 3); }
TEST(MtCrashNBTree, Eadr2ThreadsBytesKeys) { expect_clean(pm::Mode::eadr, 2, KeyType::bytes); }
TEST(MtCrashNBTree, Adr2ThreadsBytesKeys) { expect_clean(pm::Mode::adr, 2, KeyType::bytes); }

// The checker can fail: an insert that skips its write-back (I5) is lost by some image.
TEST(MtCrashNBTree, SkippedInsertPersistIsCaught) {
  const Totals t = sweep(pm::Mode::adr, 2, nbtree::NBTree::Fault::skip_insert_persist, 200);
  EXPECT_GT(t.failed_runs, 0u) << "the skipped persist went unnoticed";
  std::cout << "[caught] " << t.first_failure.substr(0, 600) << "\n";
}

// A reader that skips R1 (writing back a line an update has not yet persisted) returns a
// value a crash can take away: a dirty read, caught in ADR.
TEST(MtCrashNBTree, SkippedReaderPersistIsCaught) {
  const Totals t = sweep(pm::Mode::adr, 2, nbtree::NBTree::Fault::skip_reader_persist, 400);
  EXPECT_GT(t.failed_runs, 0u) << "the dirty read went unnoticed";
  std::cout << "[caught] " << t.first_failure.substr(0, 600) << "\n";
}

// A merge whose M5p skips its write-back: later writes to the merged leaf are lost by some
// ADR image (the predecessor's block still names P).
TEST(MtCrashNBTree, SkippedMergeLinkPersistIsCaught) {
  const Totals t = sweep(pm::Mode::adr, 2, nbtree::NBTree::Fault::skip_merge_link_persist, 200);
  EXPECT_GT(t.failed_runs, 0u) << "the skipped M5p write-back went unnoticed";
  std::cout << "[caught] " << t.first_failure.substr(0, 600) << "\n";
}

// S5b skipped: a helper that finds a new entry already synced by another thread's CAS, not
// yet written back, links the new leaves (S11) first; an ADR image then keeps the new block
// without the sync (a completed remove came back). Found by MtCrashNBTree.Adr3Threads once
// tagged links had shifted its schedules (issue 18).
TEST(MtCrashNBTree, SkippedSyncStopPersistIsCaught) {
  const Totals t = sweep(pm::Mode::adr, 3, nbtree::NBTree::Fault::skip_sync_stop_persist, 400);
  EXPECT_GT(t.failed_runs, 0u) << "the skipped S5b write-back went unnoticed";
  std::cout << "[caught] " << t.first_failure.substr(0, 600) << "\n";
}

}  // namespace
}  // namespace pmindex::crash

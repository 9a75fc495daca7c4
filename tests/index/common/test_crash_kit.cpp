// The crash kit's checks must be able to fail (crash_kit.h expect_explored): a suite that names
// leaf splits but whose workload never splits, and one that names crashes during recovery but
// explored none, are reported; the same suites with a workload that does split and a nested
// exploration that runs pass. The multi-threaded driver observes during the run, so a merge
// that undid a split is seen (and a sweep that names merges it never ran fails). Small budgets:
// a few seconds under ASan.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "index/common/crash_kit.h"
#include "index/nbtree/nbtree.h"
#include "pmindex/crash/index_driver.h"

namespace pmindex::crash {
namespace {

// The gtest failures `check` reports, concatenated (intercepted: the test itself passes).
std::string failures_of(const std::function<void()>& check) {
  ::testing::TestPartResultArray failures;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
    check();
  }
  std::string all;
  for (int i = 0; i < failures.size(); ++i) all += failures.GetTestPartResult(i).message();
  return all;
}

// LB+-Tree with 256-byte leaves (14 slots): a key space of 10 never fills the head leaf, a
// key space of 60 splits it within a few dozen operations.
std::string kit_failures(std::uint64_t key_space, std::size_t recovery_crash_images,
                         crash_kit::ExploreExpect expect) {
  IndexCrashConfig cfg;
  cfg.options.kind = "lbtree";
  cfg.options.node_size = 256;
  cfg.key_space = key_space;
  cfg.ops = 120;
  cfg.recovery_crash_images = recovery_crash_images;
  cfg.recovery_crash_every = 4;
  ExploreOptions opt;
  opt.label = "crash_kit.lbtree" + std::to_string(key_space);
  opt.images_budget = 120;
  const crash_kit::SmoTally tally(crash_kit::footprint_levels);
  cfg.observe = tally.observer();
  const ExploreReport r = run_index_crash(cfg, opt);
  return failures_of([&] { crash_kit::expect_explored(r, opt, expect, &tally); });
}

TEST(CrashKit, NamedSplitsThatHappenPass) {
  EXPECT_EQ(kit_failures(60, 0, {.smos = {"pm_bytes+"}}), "");
}

TEST(CrashKit, NamedSplitsThatNeverHappenFail) {
  const std::string f = kit_failures(10, 0, {.smos = {"pm_bytes+"}});
  EXPECT_NE(f.find("never ran the SMO it names (pm_bytes+)"), std::string::npos) << f;
}

TEST(CrashKit, NamedSmosWithoutATallyFail) {
  IndexCrashConfig cfg;
  cfg.options.kind = "reflist";
  cfg.ops = 10;
  ExploreOptions opt;
  opt.label = "crash_kit.notally";
  opt.images_budget = 20;
  const ExploreReport r = run_index_crash(cfg, opt);
  const std::string f =
      failures_of([&] { crash_kit::expect_explored(r, opt, {.smos = {"pm_bytes+"}}); });
  EXPECT_NE(f.find("passed no SmoTally"), std::string::npos) << f;
}

TEST(CrashKit, NamedRecoveryCrashesThatRanPass) {
  EXPECT_EQ(kit_failures(60, 4, {.recovery_crashes = true, .smos = {}}), "");
}

TEST(CrashKit, NamedRecoveryCrashesThatNeverRanFail) {
  const std::string f = kit_failures(60, 0, {.recovery_crashes = true, .smos = {}});
  EXPECT_NE(f.find("no crash during recovery was explored"), std::string::npos) << f;
}

// NBTree's leaf count, read during the run (an epoch-pinned walk: safe beside operations).
crash_kit::SmoTally::Levels nb_leaves(const Index& idx) {
  return {{"leaves", dynamic_cast<const nbtree::NBTree&>(idx).leaf_count()}};
}

// Two schedules (seeds 1 and 2, 40 eADR images each) of NBTree with 7-slot leaves on the
// multi-threaded driver: two threads of `ops` operations over `keys` keys from one leaf of
// `preload` keys, merges on or off, observed by `observe`.
crash_kit::SweepTotals mt_nbtree(std::size_t ops, std::uint64_t keys, std::size_t preload,
                                 bool merges,
                                 const std::function<void(const Index&, std::size_t)>& observe) {
  crash_kit::SweepTotals t;
  for (std::uint64_t seed : {1, 2}) {
    ConcurrentCrashConfig cfg;
    cfg.options.kind = "nbtree";
    cfg.options.node_size = 128;
    cfg.threads = 2;
    cfg.ops_per_thread = ops;
    cfg.key_space = keys;
    cfg.preload = preload;
    cfg.prepare = [merges](Index& idx) {
      dynamic_cast<nbtree::NBTree&>(idx).set_merges_for_testing(merges);
    };
    cfg.observe = observe;
    ExploreOptions opt;
    opt.label = "crash_kit.mt";
    opt.mode = pm::Mode::eadr;
    opt.seed = seed;
    opt.images_budget = 40;
    t.add(run_index_crash_concurrent(cfg, opt), opt);
  }
  return t;
}

// The multi-threaded driver's sweep: 3 keys never split a 7-slot leaf, so a sweep that names
// leaf splits fails (test_nbtree_mt_crash names them with 14 keys and passes).
TEST(CrashKit, MtSweepNamingSplitsThatNeverHappenFails) {
  const crash_kit::SmoTally tally(nb_leaves);
  const crash_kit::SweepTotals t = mt_nbtree(8, 3, 2, true, tally.observer());
  const std::string f =
      failures_of([&] { crash_kit::expect_swept(t, "crash_kit.mt", {"leaves+"}, &tally); });
  EXPECT_NE(f.find("no schedule ran the SMO it names (leaves+)"), std::string::npos) << f;
  EXPECT_EQ(t.failed_runs, 0u) << t.first_failure;
}

// 2 threads of 30 ops over 14 keys from 6 preloaded (test_nbtree_mt_crash's setting): leaves
// split, and with merges on some merge back. `during` observes as the driver does (after
// every op); `ends` sees only op 0 and kObserveEnd, what the driver used to observe.
crash_kit::SweepTotals mt_nbtree_smos(bool merges, const crash_kit::SmoTally& during,
                                      const crash_kit::SmoTally& ends) {
  return mt_nbtree(30, 14, 6, merges,
                   [all = during.observer(), at_ends = ends.observer()](const Index& idx,
                                                                        std::size_t op) {
                     all(idx, op);
                     if (op == 0 || op == kObserveEnd) at_ends(idx, op);
                   });
}

// Observed during the run, a sweep sees the leaf splits and the merges that undid some of
// them. Observed only at its ends (op 0 and kObserveEnd), as the driver did before, it cannot
// see a merge: every schedule starts from one leaf, so the count at the end is never below it.
TEST(CrashKit, MtObserveDuringTheRunSeesMergesTheEndsHide) {
  const crash_kit::SmoTally during(nb_leaves), ends(nb_leaves);
  const crash_kit::SweepTotals t = mt_nbtree_smos(true, during, ends);
  EXPECT_EQ(t.failed_runs, 0u) << t.first_failure;
  EXPECT_EQ(failures_of([&] {
              crash_kit::expect_swept(t, "crash_kit.mt.during", {"leaves+", "leaves-"}, &during);
            }),
            "");
  const std::string f = failures_of(
      [&] { crash_kit::expect_swept(t, "crash_kit.mt.ends", {"leaves+", "leaves-"}, &ends); });
  EXPECT_NE(f.find("no schedule ran the SMO it names (leaves-)"), std::string::npos) << f;
}

// Known-bad: the same sweep with NBTree's merges switched off splits but never merges, and a
// suite that names merges ("leaves-") fails although it observes during the run.
TEST(CrashKit, MtSweepNamingMergesThatNeverHappenFails) {
  const crash_kit::SmoTally during(nb_leaves), ends(nb_leaves);
  const crash_kit::SweepTotals t = mt_nbtree_smos(false, during, ends);
  EXPECT_EQ(t.failed_runs, 0u) << t.first_failure;
  EXPECT_GT(during.count("leaves+"), 0u) << "the workload should still split leaves";
  const std::string f = failures_of(
      [&] { crash_kit::expect_swept(t, "crash_kit.mt.nomerge", {"leaves+", "leaves-"}, &during); });
  EXPECT_NE(f.find("no schedule ran the SMO it names (leaves-)"), std::string::npos) << f;
}

}  // namespace
}  // namespace pmindex::crash

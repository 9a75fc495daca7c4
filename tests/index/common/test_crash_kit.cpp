// The crash kit's checks must be able to fail (crash_kit.h expect_explored): a suite that names
// leaf splits but whose workload never splits, and one that names crashes during recovery but
// explored none, are reported; the same suites with a workload that does split and a nested
// exploration that runs pass. Small budgets: a few seconds under ASan.
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

// The multi-threaded driver's sweep: NBTree with 7-slot leaves and 3 keys never splits, so a
// sweep that names leaf splits fails (test_nbtree_mt_crash names them with 14 keys and passes).
TEST(CrashKit, MtSweepNamingSplitsThatNeverHappenFails) {
  const crash_kit::SmoTally tally([](const Index& idx) -> crash_kit::SmoTally::Levels {
    return {{"leaves", dynamic_cast<const nbtree::NBTree&>(idx).leaf_count()}};
  });
  crash_kit::SweepTotals t;
  for (std::uint64_t seed : {1, 2}) {
    ConcurrentCrashConfig cfg;
    cfg.options.kind = "nbtree";
    cfg.options.node_size = 128;
    cfg.threads = 2;
    cfg.ops_per_thread = 8;
    cfg.key_space = 3;
    cfg.preload = 2;
    cfg.observe = tally.observer();
    ExploreOptions opt;
    opt.label = "crash_kit.mt";
    opt.mode = pm::Mode::eadr;
    opt.seed = seed;
    opt.images_budget = 40;
    t.add(run_index_crash_concurrent(cfg, opt), opt);
  }
  const std::string f =
      failures_of([&] { crash_kit::expect_swept(t, "crash_kit.mt", {"leaves+"}, &tally); });
  EXPECT_NE(f.find("no schedule ran the SMO it names (leaves+)"), std::string::npos) << f;
  EXPECT_EQ(t.failed_runs, 0u) << t.first_failure;
}

}  // namespace
}  // namespace pmindex::crash

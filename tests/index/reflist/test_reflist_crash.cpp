// reflist under the crash simulator, in adr and eadr modes. Sized by PMINDEX_CRASH_IMAGES
// (about 1,000 images per mode in CI; the `long` variant runs 10,000) and seeded by
// PMINDEX_CRASH_SEED (CI derives it from the commit hash). A failure prints a replay token:
//   PMINDEX_CRASH_REPLAY='reflist.adr/<seed>/<op>/<point>/<choice>' ./test_reflist_crash
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <iostream>

#include "pmindex/crash/index_driver.h"
#include "index/common/crash_kit.h"
#include "index/common/hybrid_test_support.h"

namespace pmindex::crash {
namespace {

void run(pm::Mode mode) {
  hybrid_test::RegistryCrashRun r;
  r.options.kind = "reflist";
  r.mode = mode;
  r.label = "reflist." + std::string(pm::to_string(mode));
  hybrid_test::run_registry_crash(r);
}

TEST(CrashRefList, Adr) { run(pm::Mode::adr); }

// A crash during the recovery of a crash image (nested exploration), in both modes.
TEST(CrashRefList, CrashDuringRecovery) {
  for (pm::Mode mode : {pm::Mode::adr, pm::Mode::eadr}) {
    IndexCrashConfig cfg;
    cfg.options.kind = "reflist";
    cfg.ops = 40;
    cfg.recovery_crash_images = 6;
    cfg.recovery_crash_every = 4;
    ExploreOptions opt = ExploreOptions::from_env(
        "reflist.nested." + std::string(pm::to_string(mode)), mode, 20261122, 200);
    const ExploreReport r = run_index_crash(cfg, opt);
    if (r.replay_skipped) continue;
    crash_kit::expect_explored(r, opt, {.recovery_crashes = true, .smos = {}});
  }
}

// The driver's oracle must be able to fail: an image whose root pointer is wiped recovers as an
// empty index, which loses completed inserts.
TEST(CrashRefList, DriverCatchesLostRecords) {
  IndexCrashConfig cfg;
  cfg.options.kind = "reflist";
  cfg.ops = 40;
  cfg.tamper_image = hybrid_test::forget_root;
  ExploreOptions opt;
  opt.label = "reflist.tampered";
  opt.images_budget = 200;
  const ExploreReport r = run_index_crash(cfg, opt);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.failures[0].message.find("match no acceptable state"), std::string::npos)
      << r.to_string();
}
TEST(CrashRefList, Eadr) { run(pm::Mode::eadr); }

}  // namespace
}  // namespace pmindex::crash

// APEX under the crash simulator (adr and eadr), with 1 KiB data nodes and a key space large
// enough that inserts expand, split sideways and downward and expand inner nodes while crash
// points are explored. Sized by PMINDEX_CRASH_IMAGES (about 1,000 per mode in CI; the `long`
// variant runs 10,000); a failure prints a replay token:
//   PMINDEX_CRASH_REPLAY='apex.adr/<seed>/<op>/<point>/<choice>' ./test_apex_crash
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <iostream>

#include "pmindex/crash/index_driver.h"
#include "index/apex/apex.h"
#include "index/common/crash_kit.h"
#include "index/common/hybrid_test_support.h"

namespace pmindex::crash {
namespace {

IndexCrashConfig apex_config(std::uint64_t key_space) {
  IndexCrashConfig cfg;
  cfg.options.kind = "apex";
  cfg.options.key_type = KeyType::u64;
  cfg.options.node_size = 1024;
  cfg.pool_size = 512 * 1024;
  cfg.key_space = key_space;
  return cfg;
}

// APEX's SMO counters, read on the live index after every op of the explored run.
crash_kit::SmoTally::Levels smo_levels(const Index& idx) {
  const apex::Apex::Stats st = dynamic_cast<const apex::Apex&>(idx).stats();
  return {{"expansions", st.expansions},
          {"sideways_splits", st.sideways_splits},
          {"downward_splits", st.downward_splits},
          {"inner_expansions", st.inner_expansions}};
}

void run(pm::Mode mode, std::uint64_t key_space, const std::string& name,
         std::vector<std::string> smos = {}) {
  IndexCrashConfig cfg = apex_config(key_space);
  const std::string label = name + "." + std::string(pm::to_string(mode));
  const ExploreOptions opt = ExploreOptions::from_env(label, mode);
  // Enough operations that the nodes fill and every SMO kind runs inside the explored window
  // (and more when the budget asks for more images).
  // eADR has fewer distinct images per operation (no flush lanes): give it more operations.
  const std::size_t ops = default_crash_ops(opt.images_budget) * (mode == pm::Mode::eadr ? 3 : 2) / 2;
  if (key_space > 100) cfg.ops = std::max<std::size_t>(400, ops);
  const crash_kit::SmoTally tally(smo_levels);
  cfg.observe = tally.observer();
  const ExploreReport r = run_index_crash(cfg, opt);
  if (r.replay_skipped) GTEST_SKIP() << "PMINDEX_CRASH_REPLAY names another configuration";
  crash_kit::expect_explored(r, opt, {.smos = smos}, &tally);
}

// The SMOs the *Smos suites name: each must run while their crash points are explored.
const std::vector<std::string> kSmos = {"expansions+", "sideways_splits+", "downward_splits+",
                                        "inner_expansions+"};

// Small key space: records stay in the initial nodes (PA, SA and extended stash inserts,
// updates, deletes). Large key space: SMOs of every kind.
TEST(CrashApex, AdrSmallKeySpace) { run(pm::Mode::adr, 24, "apex_small"); }
TEST(CrashApex, AdrSmos) { run(pm::Mode::adr, 400, "apex", kSmos); }
TEST(CrashApex, EadrSmos) { run(pm::Mode::eadr, 400, "apex", kSmos); }

// The driver's oracle must be able to fail on APEX too: wiping the root pointer loses records.
TEST(CrashApex, DriverCatchesLostRecords) {
  IndexCrashConfig cfg = apex_config(400);
  cfg.ops = 60;
  cfg.tamper_image = [](std::span<char> image) {
    std::memset(image.data() + offsetof(pm::PoolHeader, root), 0, 8);
  };
  ExploreOptions opt;
  opt.label = "apex.tampered";
  opt.images_budget = 100;
  const ExploreReport r = run_index_crash(cfg, opt);
  ASSERT_FALSE(r.ok());
}

// The kill harness must catch the same loss in the pool file after a kill.
TEST(CrashApex, KillHarnessCatchesLostRecords) {
  Options o;
  o.kind = "apex";
  o.node_size = 1024;
  hybrid_test::expect_kill_catches(
      o,
      [](std::span<char> image) {
        std::memset(image.data() + offsetof(pm::PoolHeader, root), 0, 8);
      },
      "apex.kill.tampered");
}

}  // namespace
}  // namespace pmindex::crash

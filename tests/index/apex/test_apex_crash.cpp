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
  hybrid_test::RegistryCrashRun r;
  r.options.kind = "apex";
  r.options.key_type = KeyType::u64;
  r.options.node_size = 1024;
  r.pool_size = 512 * 1024;
  r.key_space = key_space;
  r.mode = mode;
  r.label = name + "." + std::string(pm::to_string(mode));
  // Enough operations that the nodes fill and every SMO kind runs inside the explored window
  // (and more when the budget asks for more images).
  // eADR has fewer distinct images per operation (no flush lanes): give it more operations.
  const std::size_t budget = ExploreOptions::from_env(r.label, mode).images_budget;
  const std::size_t ops = default_crash_ops(budget) * (mode == pm::Mode::eadr ? 3 : 2) / 2;
  if (key_space > 100) r.min_ops = std::max<std::size_t>(400, ops);
  r.smos = std::move(smos);
  r.probe = smo_levels;
  hybrid_test::run_registry_crash(r);
}

// The SMOs the *Smos suites name: each must run while their crash points are explored.
const std::vector<std::string> kSmos = {"expansions+", "sideways_splits+", "downward_splits+",
                                        "inner_expansions+"};

// Small key space: records stay in the initial nodes (PA, SA and extended stash inserts,
// updates, deletes). Large key space: SMOs of every kind.
TEST(CrashApex, AdrSmallKeySpace) { run(pm::Mode::adr, 24, "apex_small"); }
TEST(CrashApex, AdrSmos) { run(pm::Mode::adr, 400, "apex", kSmos); }
TEST(CrashApex, EadrSmos) { run(pm::Mode::eadr, 400, "apex", kSmos); }

// The driver's oracle and the kill harness must be able to fail on APEX too: wiping the root
// pointer loses records.
TEST(CrashApex, DriverAndKillHarnessCatchLostRecords) {
  Options o;
  o.kind = "apex";
  o.node_size = 1024;
  hybrid_test::expect_checkers_catch(o, [](std::span<char> image) {
    // Format v2 refuses a lost root word, so the tamper forges a consistent "creation never
    // published a root" state (both copies checksummed): recovery then builds an empty index.
    pm::HeaderState st{};
    if (!pm::image_state(image.data(), &st)) return;
    st.root = 0;
    st.flags = pm::kStateBuilding;
    pm::set_image_state(image.data(), st);
  }, "apex");
}

}  // namespace
}  // namespace pmindex::crash

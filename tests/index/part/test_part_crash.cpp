// part under the crash simulator (adr and eadr). Key spaces chosen for what they exercise:
// 24 keys share 7 bytes (one node grows N4 -> N16 -> N48 and shrinks back, end-to-end removes
// collapse it into a record); 400 keys differ in the last two bytes (a prefix split at byte 6
// each time the tree regrows, leaf splits, an N256 at the last byte); 70,000 keys are sparse
// (prefix splits and collapses at several depths). Recovery after every image meets the state
// each step leaves, stale prefixes (crash between P5 and P6) included. Sized by
// PMINDEX_CRASH_IMAGES (about 1,000 per run in CI; the `long` variant runs 10,000); a failure
// prints a replay token: PMINDEX_CRASH_REPLAY='part.adr/<seed>/<op>/<point>/<choice>'.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "index/common/crash_kit.h"
#include "index/common/hybrid_test_support.h"
#include "pmindex/crash/index_driver.h"

namespace pmindex::crash {
namespace {

IndexCrashConfig part_config(std::uint64_t key_space) {
  IndexCrashConfig cfg;
  cfg.options.kind = "part";
  cfg.options.key_type = KeyType::u64;
  cfg.pool_size = 512 * 1024;
  cfg.key_space = key_space;
  return cfg;
}

// share: the part of the image budget this configuration checks (the two extra adr key spaces
// take half each, so adr and eadr each check about the budget in CI).
void run(pm::Mode mode, std::uint64_t key_space, const std::string& name, double share = 1.0) {
  IndexCrashConfig cfg = part_config(key_space);
  const std::string label = name + "." + std::string(pm::to_string(mode));
  ExploreOptions opt = ExploreOptions::from_env(label, mode);
  if (!opt.replay && share < 1.0)
    opt.images_budget = std::max<std::size_t>(100, static_cast<std::size_t>(opt.images_budget * share));
  const std::size_t ops = default_crash_ops(opt.images_budget) * (mode == pm::Mode::eadr ? 3 : 2) / 2;
  cfg.ops = std::max<std::size_t>(key_space > 100 ? 300 : 120, ops);
  const ExploreReport r = run_index_crash(cfg, opt);
  if (r.replay_skipped) GTEST_SKIP() << "PMINDEX_CRASH_REPLAY names another configuration";
  crash_kit::expect_explored(r, opt);
}

TEST(CrashPart, AdrOneNode) { run(pm::Mode::adr, 24, "part_small", 0.5); }
TEST(CrashPart, AdrPrefixSplits) { run(pm::Mode::adr, 400, "part"); }
TEST(CrashPart, EadrPrefixSplits) { run(pm::Mode::eadr, 400, "part"); }
TEST(CrashPart, AdrSparse) { run(pm::Mode::adr, 70000, "part_sparse", 0.5); }

// The driver's oracle must be able to fail on part too: wiping the root pointer loses records.
TEST(CrashPart, DriverCatchesLostRecords) {
  IndexCrashConfig cfg = part_config(400);
  cfg.ops = 60;
  cfg.tamper_image = hybrid_test::forget_root;
  ExploreOptions opt;
  opt.label = "part.tampered";
  opt.images_budget = 100;
  const ExploreReport r = run_index_crash(cfg, opt);
  ASSERT_FALSE(r.ok());
}

}  // namespace
}  // namespace pmindex::crash

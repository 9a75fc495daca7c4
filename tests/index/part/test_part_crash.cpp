// part under the crash simulator (adr and eadr). Key spaces chosen for what they exercise:
// 24 keys share 7 bytes (one node grows N4 -> N16 -> N48 and shrinks back, end-to-end removes
// collapse it into a record); 400 keys differ in the last two bytes (every node type, an N256
// at the last byte, and shrinks; a prefix split at byte 6 only when the first two keys shared
// that byte); 70,000 keys are sparse (prefix splits and collapses at several depths); a bulk load (B1-B2) of every node type, with
// its known-bad (nodes not persisted before the publish). Recovery after every image meets the state
// each step leaves, stale prefixes (crash between P5 and P6) included. Sized by
// PMINDEX_CRASH_IMAGES (about 1,000 per run in CI; the `long` variant runs 10,000); a failure
// prints a replay token: PMINDEX_CRASH_REPLAY='part.adr/<seed>/<op>/<point>/<choice>'.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "index/common/crash_kit.h"
#include "index/common/hybrid_test_support.h"
#include "index/part/part.h"
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

// The live tree's node counts by type (a verify walk: the single-threaded driver observes
// between operations) and its prefix splits: "n16+" is a grow into an N16, "n4-" a node
// shrunk or collapsed away, "prefix_splits+" a prefix split (P5-P6).
crash_kit::SmoTally::Levels node_levels(const Index& idx) {
  const auto& p = dynamic_cast<const part::Part&>(idx);
  art::TreeStats st;
  if (!p.verify_with(&st).ok()) return {};
  return {{"n4", st.nodes[static_cast<int>(art::NodeType::n4)]},
          {"n16", st.nodes[static_cast<int>(art::NodeType::n16)]},
          {"n48", st.nodes[static_cast<int>(art::NodeType::n48)]},
          {"n256", st.nodes[static_cast<int>(art::NodeType::n256)]},
          {"prefix_splits", p.prefix_splits()}};
}

// share: the part of the image budget this configuration checks (the two extra adr key spaces
// take half each, so adr and eadr each check about the budget in CI). `smos`: what the
// configuration is for, and must have happened while its crash points were explored.
void run(pm::Mode mode, std::uint64_t key_space, const std::string& name,
         const std::vector<std::string>& smos, double share = 1.0) {
  IndexCrashConfig cfg = part_config(key_space);
  const std::string label = name + "." + std::string(pm::to_string(mode));
  ExploreOptions opt = ExploreOptions::from_env(label, mode);
  if (!opt.replay && share < 1.0)
    opt.images_budget = std::max<std::size_t>(100, static_cast<std::size_t>(opt.images_budget * share));
  const std::size_t ops = default_crash_ops(opt.images_budget) * (mode == pm::Mode::eadr ? 3 : 2) / 2;
  cfg.ops = std::max<std::size_t>(key_space > 100 ? 300 : 120, ops);
  const crash_kit::SmoTally tally(node_levels);
  cfg.observe = tally.observer();
  const ExploreReport r = run_index_crash(cfg, opt);
  if (r.replay_skipped) GTEST_SKIP() << "PMINDEX_CRASH_REPLAY names another configuration";
  crash_kit::expect_explored(r, opt, {.smos = smos}, &tally);
}

// What each key space must have run (seen over seeds: the 400 keys split a prefix in most
// runs but not all, the sparse keys in every one).
const std::vector<std::string> kEveryType = {"n16+", "n48+", "n256+", "n48-", "n16-"};
TEST(CrashPart, AdrOneNode) {
  // Grows to an N16 from every seed; the N48 and the shrinks back depend on the seed (CI's
  // seed 3258858119 reached neither).
  run(pm::Mode::adr, 24, "part_small", {"n16+"}, 0.5);
}
TEST(CrashPart, AdrEveryNodeType) { run(pm::Mode::adr, 400, "part", kEveryType); }
TEST(CrashPart, EadrEveryNodeType) { run(pm::Mode::eadr, 400, "part", kEveryType, 0.5); }
TEST(CrashPart, AdrSparsePrefixSplits) {
  run(pm::Mode::adr, 70000, "part_sparse", {"prefix_splits+", "n4-"}, 0.5);
}
TEST(CrashPart, EadrSparsePrefixSplits) {
  run(pm::Mode::eadr, 70000, "part_sparse", {"prefix_splits+", "n4-"}, 0.25);
}

// Bulk load (B1-B2) of about 1,000 keys shaped into every node type (a root N4 with a 6-byte
// prefix over an N256 per group of 85 keys, an N48, an N16 and an N4), then inserts beside
// them and removes that shrink the N48 and collapse the N4: every image of the load must
// recover empty or complete (B2 is one store), every later one as the script left it.
std::vector<std::uint64_t> bulk_keys() {
  std::vector<std::uint64_t> keys;
  for (std::uint64_t k = 3; k < 1024; k += 3) keys.push_back(k);        // N256 children
  for (std::uint64_t k = 1024; k < 1064; ++k) keys.push_back(k);        // an N48
  for (std::uint64_t k = 1280; k < 1520; k += 20) keys.push_back(k);    // an N16
  for (std::uint64_t k = 1536; k < 1539; ++k) keys.push_back(k);        // an N4
  return keys;
}

std::vector<WorkOp> after_bulk_script() {
  std::vector<WorkOp> ops;
  std::uint64_t v = 5000;
  for (std::uint64_t k = 1; k < 60; k += 3) ops.push_back({OpKind::insert, k, ++v});
  for (std::uint64_t k = 1024; k < 1060; ++k) ops.push_back({OpKind::remove, k, 0});
  for (std::uint64_t k = 1536; k < 1538; ++k) ops.push_back({OpKind::remove, k, 0});
  ops.push_back({OpKind::scan, 1, 0});
  return ops;
}

hybrid_test::ScriptedScenario bulk_scenario(pm::Mode mode) {
  Options o;
  o.kind = "part";
  o.key_type = KeyType::u64;
  o.persistence = mode;
  o.pool_size = 512 * 1024;
  return hybrid_test::ScriptedScenario(o, 1600, after_bulk_script(), bulk_keys(), 1.0);
}

void run_bulk(pm::Mode mode) {
  hybrid_test::ScriptedScenario scenario = bulk_scenario(mode);
  const std::string label = "part_bulk." + std::string(pm::to_string(mode));
  const ExploreOptions env = ExploreOptions::from_env(label, mode);
  // removals: part frees through the epoch manager, so a remove does not shrink the footprint
  // at the op that made it (the counter would stay 0); the removes run all the same.
  hybrid_test::run_scripted(scenario, label, mode, {.splits = true, .removals = false},
                            env.replay ? std::nullopt
                                       : std::optional<std::size_t>(std::max<std::size_t>(
                                             100, env.images_budget / 2)));
}

TEST(CrashPart, BulkLoadAdr) { run_bulk(pm::Mode::adr); }
TEST(CrashPart, BulkLoadEadr) { run_bulk(pm::Mode::eadr); }

// The known-bad of B1: the nodes and records written but not persisted before B2. In adr a
// crash after B2 loses lines the root already names, which the suite must catch.
TEST(CrashPart, CatchesAnUnpersistedBulkLoad) {
  hybrid_test::ScriptedScenario scenario = bulk_scenario(pm::Mode::adr);
  scenario.set_prepare([](Index& idx) {
    static_cast<part::Part&>(idx).set_unpersisted_bulk_load_for_test();
  });
  hybrid_test::expect_scripted_caught(scenario, "part_bulk_unpersisted.adr", pm::Mode::adr,
                                      "a bulk load that publishes unpersisted nodes");
}

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

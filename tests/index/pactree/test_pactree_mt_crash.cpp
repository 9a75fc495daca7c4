// PACTree under the crash simulator's multi-threaded driver (docs/crash-simulator.md): 2 and 3
// simulated threads insert / update / remove / find over a few keys on one live index, the
// deterministic scheduler switching at every traced PM event and yield point (lock CASes,
// validations, spins), and every crash image is recovered and judged for durable
// linearizability. Data nodes of 4 slots, so splits and merges (and their log entries and
// LSN-ordered search-layer updates) race with lookups walking the last mile. PACTree needs no
// reader help: a writer persists before it unlocks and a reader acts only on words it
// validated against an unlocked version.
#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <vector>

#include "index/common/crash_kit.h"
#include "index/pactree/layout.h"
#include "index/pactree/pactree.h"
#include "pmindex/crash/index_driver.h"

namespace pmindex::crash {
namespace {

using Search = PacTreeOptions::SearchLayer;

ConcurrentCrashConfig config(std::size_t threads, std::uint64_t key_space, Search search) {
  ConcurrentCrashConfig cfg;
  cfg.options.kind = "pactree";
  cfg.options.pactree.search_layer = search;
  cfg.options.key_type = KeyType::u64;
  cfg.options.node_size = pactree::kHeaderBytes + 4 * pactree::kSlotBytes;  // splits and merges
  cfg.threads = threads;
  cfg.ops_per_thread = threads == 2 ? 30 : 20;
  cfg.key_space = key_space;
  cfg.preload = std::min<std::size_t>(6, key_space);
  return cfg;
}

// The live index's SMO counters: "splits+" / "merges+" name data-node splits and merges.
crash_kit::SmoTally::Levels smo_levels(const Index& idx) {
  const auto& t = dynamic_cast<const pactree::PacTree&>(idx);
  return {{"splits", t.splits()}, {"merges", t.merges()}};
}

void expect_clean(pm::Mode mode, std::size_t threads, std::uint64_t key_space,
                  const std::vector<std::string>& smos, Search search = Search::dram) {
  const std::string label = "pactree.mt." + std::string(search == Search::pm ? "pmsearch." : "") +
                            std::string(pm::to_string(mode)) + "." + std::to_string(threads) +
                            "t.k" + std::to_string(key_space);
  const crash_kit::SmoTally tally(smo_levels);
  // Half of the budget for each thread count, in schedules of 125 images; up to 12 more while
  // an SMO the test names has not run (which SMOs a schedule runs depends on CI's seed).
  crash_kit::SweepPlan plan{.per_run = 125, .budget_share = 2};
  plan.covered = [&] { return tally.covers(smos); };
  plan.max_extra_seeds = 12;
  const crash_kit::SweepTotals t = crash_kit::sweep(
      ExploreOptions::from_env(label, mode, 20261126, 1000), plan, [&](const ExploreOptions& opt) {
        ConcurrentCrashConfig cfg = config(threads, key_space, search);
        cfg.observe = tally.observer();
        return run_index_crash_concurrent(cfg, opt);
      });
  crash_kit::expect_swept(t, label, smos, &tally);
}

const std::vector<std::string> kSplitsAndMerges = {"splits+", "merges+"};

// 14 keys: a few nodes split and merge under two writers (both required); 600 keys: splits
// (required). The two writers' runs with the search layer in DRAM and in PM (suffix /dram, /pm).
class MtCrashPacTree : public ::testing::TestWithParam<Search> {};
std::string search_name(const ::testing::TestParamInfo<Search>& i) {
  return i.param == Search::pm ? "pm" : "dram";
}
TEST_P(MtCrashPacTree, Adr2Threads) {
  expect_clean(pm::Mode::adr, 2, 14, kSplitsAndMerges, GetParam());
}
TEST_P(MtCrashPacTree, Eadr2Threads) {
  expect_clean(pm::Mode::eadr, 2, 14, kSplitsAndMerges, GetParam());
}
INSTANTIATE_TEST_SUITE_P(Search, MtCrashPacTree, ::testing::Values(Search::dram, Search::pm),
                         search_name);
TEST(MtCrashPacTreeDram, Adr3Threads) { expect_clean(pm::Mode::adr, 3, 600, {"splits+"}); }

}  // namespace
}  // namespace pmindex::crash

// part under the crash simulator's multi-threaded driver (docs/crash-simulator.md): 2 and 3
// simulated threads insert / update / remove / find over a few keys on one live index, the
// deterministic scheduler switching at every traced PM event and yield point (lock CASes,
// validations, spins), and every crash image is recovered and judged for durable
// linearizability. part needs no reader help (no flush-on-read): a writer persists before it
// unlocks and a reader acts only on words it validated against an unlocked version, so a
// reader that meets an unpersisted word restarts (PROTOCOL.md, "Readers").
#include <gtest/gtest.h>

#include <atomic>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "index/common/crash_kit.h"
#include "index/part/part.h"
#include "pmindex/crash/index_driver.h"

namespace pmindex::crash {
namespace {

ConcurrentCrashConfig config(std::size_t threads, std::uint64_t key_space) {
  ConcurrentCrashConfig cfg;
  cfg.options.kind = "part";
  cfg.options.key_type = KeyType::u64;
  cfg.threads = threads;
  cfg.ops_per_thread = threads == 2 ? 30 : 20;
  cfg.key_space = key_space;
  cfg.preload = std::min<std::size_t>(6, key_space);
  return cfg;
}

// The live tree's prefix splits (a counter: safe beside the other threads' operations).
crash_kit::SmoTally::Levels split_levels(const Index& idx) {
  return {{"prefix_splits", dynamic_cast<const part::Part&>(idx).prefix_splits()}};
}

void expect_clean(pm::Mode mode, std::size_t threads, std::uint64_t key_space,
                  const std::vector<std::string>& smos = {}) {
  const std::string label = "part.mt." + std::string(pm::to_string(mode)) + "." +
                            std::to_string(threads) + "t.k" + std::to_string(key_space);
  const crash_kit::SmoTally tally(split_levels);
  // Half of the budget for each thread count, in schedules of 125 images; up to 12 more while
  // an SMO the test names has not run (which ones a schedule runs depends on CI's seed).
  crash_kit::SweepPlan plan{.per_run = 125, .budget_share = 2};
  plan.covered = [&] { return tally.covers(smos); };
  plan.max_extra_seeds = 12;
  const crash_kit::SweepTotals t = crash_kit::sweep(
      ExploreOptions::from_env(label, mode, 20261126, 1000), plan, [&](const ExploreOptions& opt) {
        ConcurrentCrashConfig cfg = config(threads, key_space);
        cfg.observe = tally.observer();
        return run_index_crash_concurrent(cfg, opt);
      });
  crash_kit::expect_swept(t, label, smos, &tally);
}

// 14 keys share 7 bytes: one node grows and shrinks under two writers; 600 keys: prefix
// splits (required) and collapses at byte 6 race with lookups.
TEST(MtCrashPart, Adr2Threads) { expect_clean(pm::Mode::adr, 2, 14); }
TEST(MtCrashPart, Eadr2Threads) { expect_clean(pm::Mode::eadr, 2, 14); }
TEST(MtCrashPart, Adr3ThreadsPrefixSplits) {
  expect_clean(pm::Mode::adr, 3, 600, {"prefix_splits+"});
}

// Record relocation (PROTOCOL.md P11) as one more simulated thread: it moves every record,
// again and again, while two threads insert, update, remove and find, so moves meet every
// write of the same key and lookups holding the old record, at every scheduling point; each
// crash image must still be durably linearizable. `broken`: the known-bad variant (the copy
// published before it is persisted, P11b before P11a), which ADR images must catch.
ConcurrentCrashConfig relocating(std::shared_ptr<std::atomic<std::size_t>> moved, bool broken) {
  ConcurrentCrashConfig cfg = config(2, 14);
  cfg.ops_per_thread = 16;
  if (broken) {
    cfg.prepare = [](Index& index) {
      auto* p = dynamic_cast<part::Part*>(&index);
      ASSERT_NE(p, nullptr);
      p->break_relocation_for_test();
    };
  }
  cfg.background = [moved](Index& index, const std::function<bool()>& ops_done) {
    auto& p = dynamic_cast<part::Part&>(index);
    while (!ops_done()) {
      moved->fetch_add(p.relocate_records(part::Part::Relocate::every_record));
      pm::yield_point("test.relocate");  // an empty tree moves nothing: still a switch point
    }
  };
  return cfg;
}

void expect_relocation(pm::Mode mode, bool broken) {
  const std::string label = "part.mt.relocate." + std::string(pm::to_string(mode)) +
                            (broken ? ".bad" : "");
  auto moved = std::make_shared<std::atomic<std::size_t>>(0);
  // Half of the budget (schedules of 125 images); the known-bad variant gets 12
  // schedules and stops at the first that fails.
  const crash_kit::SweepPlan plan{.per_run = 125, .budget_share = 2,
                                  .max_seeds = broken ? 12u : 0u, .stop_at_failure = broken};
  const crash_kit::SweepTotals t = crash_kit::sweep(
      ExploreOptions::from_env(label, mode, 20261128, 1000), plan,
      [&](const ExploreOptions& opt) { return run_index_crash_concurrent(relocating(moved, broken), opt); });
  std::cout << label << ": " << t.to_string() << ", " << moved->load() << " records moved\n";
  EXPECT_GT(moved->load(), 0u) << "no relocation ran";
  if (broken) {
    EXPECT_GT(t.failed_runs, 0u) << label << ": the known-bad relocation was not caught";
    std::cout << label << " caught: " << t.first_failure.substr(0, 400) << "\n";
  } else {
    crash_kit::expect_swept(t, label);
  }
}

TEST(MtCrashPart, AdrRelocation) { expect_relocation(pm::Mode::adr, false); }
TEST(MtCrashPart, EadrRelocation) { expect_relocation(pm::Mode::eadr, false); }
TEST(MtCrashPart, AdrRelocationCopyPublishedFirstIsCaught) { expect_relocation(pm::Mode::adr, true); }

}  // namespace
}  // namespace pmindex::crash

// DPTree's background merge under the crash simulator's multi-threaded driver
// (docs/crash-simulator.md): two simulated writer threads insert / update / remove / find over
// a few keys while a third simulated thread runs the merges (dptree::Config::external_merger:
// the index's own merge thread replaced by the test's, so the deterministic scheduler
// interleaves B2's free-slot, fresh-leaf and meta[nv] writes, B4's flip and log trim with the
// writers' log appends, buffer rotations (B1) and waits (B5)). Every crash image is recovered
// (by the registry's entry) and judged for durable linearizability. 8-slot leaves and a
// 4-entry buffer, so nearly every schedule runs several background merges with splits.
// Known-bad: FlipBeforeMeta (the flip, M5, before the new chain's metadata, M3) must be caught.
#include <gtest/gtest.h>

#include <iostream>

#include "index/common/crash_kit.h"
#include "index/dptree/dptree_recovery.h"
#include "pmindex/crash/index_driver.h"

namespace pmindex::crash {
namespace {

struct FlipBeforeMeta : dptree::Protocol {
  static constexpr bool kFlipBeforeMeta = true;
};

struct Tally {
  std::uint64_t background_merges = 0;
  std::uint64_t writer_blocks = 0;
};

template <class P>
ConcurrentCrashConfig config(Tally* tally) {
  ConcurrentCrashConfig cfg;
  cfg.options.kind = "dptree";
  cfg.options.key_type = KeyType::u64;
  cfg.options.node_size = static_cast<std::uint32_t>(dptree::leaf_bytes(8));
  cfg.threads = 2;
  cfg.ops_per_thread = 30;
  cfg.key_space = 24;
  cfg.preload = 6;
  cfg.create = [](std::unique_ptr<pm::Pool> pool, const Options& o) {
    dptree::Config c;
    c.background = true;
    c.external_merger = true;
    c.min_buffer = 4;
    return dptree::DPTree<P>::create(std::move(pool), o, c);
  };
  cfg.background = [](Index& idx, const std::function<bool()>& ops_done) {
    auto& t = dynamic_cast<dptree::DPTree<P>&>(idx);
    while (!ops_done()) {
      if (!t.merge_step_for_testing()) pm::yield_point("dptree.merger.idle");
    }
  };
  cfg.observe = [tally](const Index& idx, std::size_t op) {
    if (op != kObserveEnd) return;  // the run's totals
    const dptree::MergeStats m = dynamic_cast<const dptree::DPTree<P>&>(idx).merge_stats();
    tally->background_merges += m.background_merges;
    tally->writer_blocks += m.writer_blocks;
  };
  return cfg;
}

struct Outcome {
  crash_kit::SweepTotals totals;
  Tally tally;
};

// PMINDEX_CRASH_IMAGES images (default 1,000; CI 1,000) per mode, in schedules of 100. A
// known-bad protocol stops at its first failing schedule.
template <class P>
Outcome explore_mode(pm::Mode mode, const std::string& label, bool known_bad) {
  Outcome out;
  out.totals = crash_kit::sweep(
      ExploreOptions::from_env(label, mode, 20261127, 1000),
      {.per_run = 100, .budget_share = 1, .stop_at_failure = known_bad},
      [&](const ExploreOptions& opt) {
        return run_index_crash_concurrent(config<P>(&out.tally), opt);
      });
  std::cout << label << ": " << out.tally.background_merges << " background merges, "
            << out.tally.writer_blocks << " writer waits\n";
  return out;
}

void expect_clean(pm::Mode mode) {
  const std::string label = "dptree.mt.bg." + std::string(pm::to_string(mode));
  const Outcome o = explore_mode<dptree::Protocol>(mode, label, false);
  crash_kit::expect_swept(o.totals, label);
  // The schedules must have run background merges (else this test shows nothing).
  EXPECT_GE(o.tally.background_merges, 2 * o.totals.runs) << "too few background merges";
}

TEST(MtCrashDPTree, AdrBackgroundMerge) { expect_clean(pm::Mode::adr); }
TEST(MtCrashDPTree, EadrBackgroundMerge) { expect_clean(pm::Mode::eadr); }

// The known-bad protocol flips the version bit before the next chain's metadata are durable:
// some image between M5 and M3 recovers a chain described by stale metadata.
TEST(MtCrashDPTree, CatchesFlipBeforeMetaInBackground) {
  for (pm::Mode mode : {pm::Mode::adr, pm::Mode::eadr}) {
    const std::string label = "dptree.mt.bg.flip_before_meta." + std::string(pm::to_string(mode));
    const Outcome o = explore_mode<FlipBeforeMeta>(mode, label, true);
    EXPECT_GT(o.totals.failed_runs, 0u)
        << "a flip before M3 in the background merge was not caught (" << pm::to_string(mode)
        << ")";
  }
}

}  // namespace
}  // namespace pmindex::crash

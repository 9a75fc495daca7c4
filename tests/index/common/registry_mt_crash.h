// The multi-threaded crash suite of an index that needs nothing of its own from the driver
// (no background thread, no reader help to switch on): 2 or 3 simulated threads insert /
// update / remove / find over a few keys on one live index, the deterministic scheduler
// switching at every traced PM event and yield point, and every crash image is recovered
// and judged for durable linearizability (crash::run_index_crash_concurrent). The kit's rules
// apply (crash_kit::expect_swept): no violation, every schedule checked its images or every
// distinct image it offered, and every SMO the suite names ran in some schedule.
//
//   hybrid_test::MtCrashRun r{.label = "lbtree.mt", .options = o, .smos = {"leaves+"},
//                             .probe = leaf_levels};
//   hybrid_test::expect_mt_clean(r, pm::Mode::adr, 2);
//   hybrid_test::expect_mt_caught(r, pm::Mode::adr, 2, switch_on_fault, 40);
//
// PMINDEX_CRASH_IMAGES is the image budget per mode (spread over schedules of `per_run`
// images; each thread count takes 1 / budget_share of it), PMINDEX_CRASH_SEED the base seed.
// A failure prints a replay token (PMINDEX_CRASH_REPLAY).
//
// Thread safety: test code, single-threaded (the simulated threads are the driver's).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "index/common/crash_kit.h"
#include "pmindex/crash/index_driver.h"

namespace pmindex::crash::hybrid_test {

struct MtCrashRun {
  std::string label;         // e.g. "lbtree.mt"; the mode and thread count are appended
  Options options;           // kind, node_size, key type (persistence comes from the mode)
  std::uint64_t seed = 0;    // the suite's default base seed (CI's replaces it)
  std::size_t pool_size = 512 * 1024;
  std::uint64_t key_space = 14;
  std::size_t preload = 6;
  std::size_t per_run = 125;       // images per schedule
  std::size_t budget_share = 2;    // each thread count takes this share of the budget
  std::vector<std::string> smos;   // SMOs that must run in some schedule (SmoTally names)
  crash_kit::SmoTally::Probe probe = crash_kit::footprint_levels;
};

inline std::string mt_label(const MtCrashRun& r, pm::Mode mode, std::size_t threads) {
  return r.label + "." + std::string(pm::to_string(mode)) + "." + std::to_string(threads) + "t";
}

inline ConcurrentCrashConfig mt_config(const MtCrashRun& r, std::size_t threads) {
  ConcurrentCrashConfig cfg;
  cfg.options = r.options;
  cfg.pool_size = r.pool_size;
  cfg.threads = threads;
  cfg.ops_per_thread = threads == 2 ? 30 : 20;
  cfg.key_space = r.key_space;
  cfg.preload = std::min<std::size_t>(r.preload, r.key_space);
  return cfg;
}

// A clean sweep. A schedule's SMOs depend on its seed, and CI's base seed changes with every
// commit: up to 12 more schedules run while a named SMO has not yet been seen.
inline void expect_mt_clean(const MtCrashRun& r, pm::Mode mode, std::size_t threads) {
  const std::string label = mt_label(r, mode, threads);
  const crash_kit::SmoTally tally(r.probe);
  crash_kit::SweepPlan plan{.per_run = r.per_run, .budget_share = r.budget_share};
  if (!r.smos.empty()) {
    plan.covered = [&tally, &r] { return tally.covers(r.smos); };
    plan.max_extra_seeds = 12;
  }
  const crash_kit::SweepTotals t = crash_kit::sweep(
      ExploreOptions::from_env(label, mode, r.seed, 1000), plan, [&](const ExploreOptions& one) {
        ConcurrentCrashConfig cfg = mt_config(r, threads);
        cfg.observe = tally.observer();
        return run_index_crash_concurrent(cfg, one);
      });
  crash_kit::expect_swept(t, label, r.smos, &tally);
}

// The checker can fail: with `prepare` switching on a known-bad variant of the index, some
// image of the first `max_seeds` schedules from the base seed (CI's changes with every commit)
// must be judged a violation.
inline void expect_mt_caught(const MtCrashRun& r, pm::Mode mode, std::size_t threads,
                             const std::function<void(Index&)>& prepare, std::size_t max_seeds) {
  const std::string label = mt_label(r, mode, threads) + ".bad";
  const ExploreOptions opt = ExploreOptions::from_env(label, mode, r.seed, 1000);
  const crash_kit::SweepPlan plan{.per_run = r.per_run, .budget_share = r.budget_share,
                                  .max_seeds = max_seeds, .stop_at_failure = true};
  const crash_kit::SweepTotals t =
      crash_kit::sweep(opt, plan, [&](const ExploreOptions& one) {
        ConcurrentCrashConfig cfg = mt_config(r, threads);
        cfg.prepare = prepare;
        return run_index_crash_concurrent(cfg, one);
      });
  EXPECT_GT(t.failed_runs, 0u) << label << ": the known-bad variant went unnoticed in "
                               << t.runs << " schedules";
  std::cout << label << " caught: " << t.first_failure.substr(0, 400) << "\n";
}

}  // namespace pmindex::crash::hybrid_test

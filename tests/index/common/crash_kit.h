// The crash suites' one acceptance check (issue 27): a run proves what its name claims only if
// it found no violation AND explored what its budget promised AND reached what it names. Every
// crash test calls expect_explored instead of comparing images_checked with a number of its own.
//
//   SmoTally smos(apex_probe);                      // levels read from the live index
//   cfg.observe = smos.observer();                  // IndexCrashConfig / ConcurrentCrashConfig
//   const ExploreReport r = run_index_crash(cfg, opt);
//   crash_kit::expect_explored(r, opt, {.recovery_crashes = true,
//                                       .smos = {"expansions+", "sideways_splits+"}}, &smos);
//
// A named SMO is "<level>+" (the level rose after some op: a split, an expansion) or
// "<level>-" (it fell: a leaf removal, a merge); a suite that names one its workload never
// runs fails, and so does one that names crashes during recovery but explored none.
//
// The multi-threaded driver (run_index_crash_concurrent) is held to the same rules per
// schedule: every suite spends its budget through sweep (SweepPlan) and checks the totals with
// expect_swept, with the same SmoTally.
//
// Thread safety: test code, single-threaded (the multi-threaded driver calls observers from
// one simulated thread at a time).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "pmindex/crash/explorer.h"
#include "pmindex/index.h"

namespace pmindex::crash::crash_kit {

// Tallies the SMOs a crash workload ran. `probe` reads levels from the live index (leaf count,
// an SMO counter); after each op the tally counts, per level, the ops after which it rose
// ("name+") or fell ("name-"). Op 0 (create) starts a new run: the explorer reruns the
// workload from a fresh pool, and levels are compared within one run only.
class SmoTally {
 public:
  using Levels = std::map<std::string, std::uint64_t>;
  using Probe = std::function<Levels(const Index&)>;
  explicit SmoTally(Probe probe) : st_(std::make_shared<State>()) { st_->probe = std::move(probe); }

  std::function<void(const Index&, std::size_t)> observer() const {
    return [st = st_](const Index& idx, std::size_t op) {
      Levels now = st->probe(idx);
      if (op != 0) {
        for (const auto& [name, v] : now) {
          const auto prev = st->last.find(name);
          if (prev == st->last.end()) continue;
          if (v > prev->second) ++st->seen[name + "+"];
          if (v < prev->second) ++st->seen[name + "-"];
        }
      }
      st->last = std::move(now);
    };
  }
  std::size_t count(const std::string& smo) const {
    const auto it = st_->seen.find(smo);
    return it == st_->seen.end() ? 0 : it->second;
  }
  // Every SMO in `smos` has run at least once.
  bool covers(const std::vector<std::string>& smos) const {
    return std::all_of(smos.begin(), smos.end(),
                       [this](const std::string& smo) { return count(smo) > 0; });
  }
  std::string to_string() const {
    std::string out;
    for (const auto& [name, n] : st_->seen)
      out += (out.empty() ? "" : ", ") + name + " " + std::to_string(n);
    return out.empty() ? "none" : out;
  }

 private:
  struct State {
    Probe probe;
    Levels last;
    std::map<std::string, std::size_t> seen;
  };
  std::shared_ptr<State> st_;
};

// The probe for indexes whose PM footprint grows only by node allocation and shrinks only by
// node removal (8-byte keys and values inline): "pm_bytes+" is a split, "pm_bytes-" a removal.
inline SmoTally::Levels footprint_levels(const Index& idx) {
  return {{"pm_bytes", idx.footprint().pm_bytes}};
}

struct ExploreExpect {
  // The scenario crashes during recovery too: nested images must have been checked.
  bool recovery_crashes = false;
  // At least this many crash points (a scenario that reaches its persistence steps has them).
  std::size_t min_crash_points = 1;
  // SMOs the suite names ("level+" / "level-", see SmoTally): each must have run at least once
  // in the explored workload. Needs the tally passed to expect_explored.
  std::vector<std::string> smos;
};

// Prints the report, its coverage and the SMOs seen; fails on violations, on a run short of its
// budget (ExploreReport::coverage), on no nested image when recovery crashes were asked for, on
// too few crash points, and on a named SMO the workload never ran. A replay
// (PMINDEX_CRASH_REPLAY) checks one image: only violations count.
inline void expect_explored(const ExploreReport& r, const ExploreOptions& opt,
                            ExploreExpect expect = {}, const SmoTally* tally = nullptr) {
  std::cout << opt.label << " seed " << opt.seed << ": " << r.to_string() << "; "
            << r.coverage_text(opt);
  if (tally != nullptr) std::cout << "; SMOs seen: " << tally->to_string();
  std::cout << "\n";
  EXPECT_TRUE(r.ok()) << r.to_string();
  if (opt.replay) return;
  EXPECT_NE(r.coverage(opt), ExploreReport::Coverage::short_of_budget)
      << opt.label << ": " << r.coverage_text(opt)
      << " (grow the workload so it offers the budget, or shrink the budget)";
  EXPECT_GE(r.crash_points, expect.min_crash_points) << opt.label;
  if (expect.recovery_crashes) {
    EXPECT_GT(r.inner_images, 0u) << opt.label << ": no crash during recovery was explored";
  }
  if (!expect.smos.empty() && tally == nullptr) {
    ADD_FAILURE() << opt.label << ": the suite names SMOs but passed no SmoTally";
    return;
  }
  for (const std::string& smo : expect.smos) {
    EXPECT_GT(tally->count(smo), 0u)
        << opt.label << ": the workload never ran the SMO it names (" << smo
        << "); seen: " << tally->to_string();
  }
}

// The multi-threaded driver explores one schedule per seed; a suite sweeps many. The totals
// apply expect_explored's rules per schedule: no violation, none short of its budget.
struct SweepTotals {
  std::size_t runs = 0, images = 0, crash_points = 0, steps = 0, failed_runs = 0;
  std::size_t short_runs = 0;  // schedules that checked less than their budget offered
  std::string first_failure, first_short;

  void add(const ExploreReport& r, const ExploreOptions& opt) {
    ++runs;
    images += r.images_checked;
    crash_points += r.crash_points;
    steps += r.schedule_steps;
    if (r.ok() && r.coverage(opt) == ExploreReport::Coverage::short_of_budget &&
        short_runs++ == 0)
      first_short = "seed " + std::to_string(opt.seed) + ": " + r.coverage_text(opt);
    if (!r.ok() && failed_runs++ == 0) first_failure = r.to_string();
  }
  std::string to_string() const {
    return std::to_string(runs) + " schedules, " + std::to_string(images) + " images, " +
           std::to_string(crash_points) + " crash points, " + std::to_string(steps) +
           " scheduling steps, " + std::to_string(failed_runs) + " failed, " +
           std::to_string(short_runs) + " short of their budget";
  }
};

// How a suite spends its image budget on the multi-threaded driver: schedules of `per_run`
// images over consecutive seeds (base, base + 7919, ...), as many as `budget_share` of the
// budget pays for (a suite that runs two thread counts gives each half).
struct SweepPlan {
  std::size_t per_run = 125;
  std::size_t budget_share = 2;
  // Non-zero: at most this many schedules; with stop_at_failure exactly this many (a known-bad
  // variant must be caught whatever the budget), stopping at the first that fails.
  std::size_t max_seeds = 0;
  bool stop_at_failure = false;
  // Which SMOs a schedule runs depends on its seed, and CI's base seed changes with every
  // commit: when the budgeted schedules leave `covered` false, up to `max_extra_seeds` more
  // run (same per-run budget, the seed sequence continued) until it turns true. A workload
  // that no longer reaches an SMO still fails expect_swept after them.
  std::function<bool()> covered = nullptr;
  std::size_t max_extra_seeds = 0;
};

// Explores one schedule: `opt` carries its seed and its per-schedule budget.
using Schedule = std::function<ExploreReport(const ExploreOptions&)>;

// The one sweep loop of the multi-threaded suites: runs the plan's schedules from opt.seed
// (a replay, PMINDEX_CRASH_REPLAY, runs its one schedule: only a violation counts) and returns
// the totals for expect_swept.
inline SweepTotals sweep(ExploreOptions opt, const SweepPlan& plan, const Schedule& schedule) {
  SweepTotals t;
  if (opt.replay) {
    opt.seed = opt.replay->seed;
    const ExploreReport r = schedule(opt);
    std::cout << opt.label << " replay: " << r.to_string() << "\n";
    if (!r.ok()) t.add(r, opt);
    else ++t.runs;
    return t;
  }
  std::size_t seeds =
      std::max<std::size_t>(1, opt.images_budget / plan.budget_share / plan.per_run);
  if (plan.max_seeds != 0)
    seeds = plan.stop_at_failure ? plan.max_seeds : std::min(seeds, plan.max_seeds);
  const std::uint64_t base = opt.seed;
  opt.images_budget = plan.per_run;
  opt.max_failures = 1;
  std::size_t i = 0;
  for (; i < seeds; ++i) {
    opt.seed = base + i * 7919;
    const ExploreReport r = schedule(opt);
    t.add(r, opt);
    if (!r.ok() && plan.stop_at_failure) break;
  }
  std::size_t extra = 0;
  if (i == seeds && plan.covered) {
    for (; extra < plan.max_extra_seeds && !plan.covered(); ++extra, ++i) {
      opt.seed = base + i * 7919;
      t.add(schedule(opt), opt);
    }
  }
  std::cout << opt.label << " base seed " << base << ": " << t.to_string();
  if (extra != 0) std::cout << " (" << extra << " extra for SMO coverage)";
  std::cout << "\n";
  return t;
}

// A clean sweep: schedules ran, none failed, none short of its budget, and every SMO the suite
// names ran in some schedule.
inline void expect_swept(const SweepTotals& t, const std::string& label,
                         const std::vector<std::string>& smos = {},
                         const SmoTally* tally = nullptr) {
  std::cout << label << ": " << t.to_string();
  if (tally != nullptr) std::cout << "; SMOs seen: " << tally->to_string();
  std::cout << "\n";
  EXPECT_GT(t.runs, 0u) << label;
  EXPECT_EQ(t.failed_runs, 0u) << t.first_failure;
  EXPECT_EQ(t.short_runs, 0u) << label << ": " << t.first_short;
  if (!smos.empty() && tally == nullptr) {
    ADD_FAILURE() << label << ": the suite names SMOs but passed no SmoTally";
    return;
  }
  for (const std::string& smo : smos) {
    EXPECT_GT(tally->count(smo), 0u) << label << ": no schedule ran the SMO it names (" << smo
                                     << "); seen: " << tally->to_string();
  }
}

}  // namespace pmindex::crash::crash_kit

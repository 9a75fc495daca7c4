// The crash suites' one acceptance check (issue 27): a run proves what its name claims only if
// it found no violation AND explored what its budget promised. Every crash test calls
// expect_explored instead of comparing images_checked with a number of its own.
//
//   const ExploreReport r = explore(scenario, opt);
//   crash_kit::expect_explored(r, opt, {.recovery_crashes = true});
//
// Thread safety: test code, single-threaded.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <iostream>
#include <string>

#include "pmindex/crash/explorer.h"

namespace pmindex::crash::crash_kit {

struct ExploreExpect {
  // The scenario crashes during recovery too: nested images must have been checked.
  bool recovery_crashes = false;
  // At least this many crash points (a scenario that reaches its persistence steps has them).
  std::size_t min_crash_points = 1;
};

// Prints the report and its coverage; fails on violations, on a run short of its budget
// (ExploreReport::coverage), on no nested image when recovery crashes were asked for, and on
// too few crash points. A replay (PMINDEX_CRASH_REPLAY) checks one image: only violations count.
inline void expect_explored(const ExploreReport& r, const ExploreOptions& opt,
                            ExploreExpect expect = {}) {
  std::cout << opt.label << " seed " << opt.seed << ": " << r.to_string() << "; "
            << r.coverage_text(opt) << "\n";
  EXPECT_TRUE(r.ok()) << r.to_string();
  if (opt.replay) return;
  EXPECT_NE(r.coverage(opt), ExploreReport::Coverage::short_of_budget)
      << opt.label << ": " << r.coverage_text(opt)
      << " (grow the workload so it offers the budget, or shrink the budget)";
  EXPECT_GE(r.crash_points, expect.min_crash_points) << opt.label;
  if (expect.recovery_crashes) {
    EXPECT_GT(r.inner_images, 0u) << opt.label << ": no crash during recovery was explored";
  }
}

}  // namespace pmindex::crash::crash_kit

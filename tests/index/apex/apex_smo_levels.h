// APEX's SMO counters as crash-kit levels (tests/index/common/crash_kit.h SmoTally): read on
// the live index after every returned operation by the single- and multi-threaded crash
// suites. Apex::smo_counts() reads relaxed counters (no lock, no walk), safe beside other
// threads' operations.
#pragma once

#include "index/apex/apex.h"
#include "index/common/crash_kit.h"

namespace pmindex::crash::apex_test {

inline crash_kit::SmoTally::Levels smo_levels(const Index& idx) {
  const apex::Apex::Stats st = dynamic_cast<const apex::Apex&>(idx).smo_counts();
  return {{"expansions", st.expansions},
          {"sideways_splits", st.sideways_splits},
          {"downward_splits", st.downward_splits},
          {"inner_expansions", st.inner_expansions},
          {"merges", st.merges},
          {"collapses", st.collapses}};
}

}  // namespace pmindex::crash::apex_test

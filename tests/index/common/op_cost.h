// PM work of one operation, for tests linked with the counting flavour (pmindex_counting):
// the counter delta across `op`, with Runtime::end_operation() on both sides so that the
// distinct-line count starts fresh for this operation.
#pragma once

#include "pmindex/pm/persist.h"

namespace pmindex::test {

template <class F>
pm::Counters op_cost(F&& op) {
  pm::Runtime::end_operation();
  const pm::Counters before = pm::Runtime::counters();
  op();
  pm::Runtime::end_operation();
  return pm::Runtime::counters() - before;
}

}  // namespace pmindex::test

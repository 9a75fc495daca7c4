// The frame every PM index's recover() runs in, so each index writes only its own part:
// reachability recovery begun (allocator), the "crashed before the root object was
// published" case (nothing was reachable: finish, commit the open, create afresh), otherwise
// the index's own checked walk from the root offset; the clean-shutdown flag and the time
// taken go into RecoveryStats. LB+-Tree's and FPTree's recover() run in it, and inside it the
// hybrid indexes' shared leaf-chain pass (leaf_recovery.h, recover_leaf_chain).
//
// Thread safety: single-threaded (opening a pool).
#pragma once

#include <chrono>
#include <cstdint>

#include "pmindex/index.h"
#include "pmindex/pm/pool.h"

namespace pmindex::index_common {

// make_fresh() -> Status builds an empty index after commit_open; recover_root(root) -> Status
// checks and rebuilds from the published root (it must call finish_recovery and commit_open
// itself, after its read-only pass).
template <class MakeFresh, class RecoverRoot>
Status run_recovery(pm::Pool& pool, RecoveryStats* stats, MakeFresh make_fresh,
                    RecoverRoot recover_root) {
  const auto began = std::chrono::steady_clock::now();
  stats->clean_shutdown = pool.was_clean();
  stats->warning = pool.open_warning();
  pool.allocator().begin_recovery(/*start_now=*/false);
  Status s;
  if (const std::uint64_t root = pool.root(); root != 0) {
    s = recover_root(root);
  } else if (s = pool.allocator().finish_recovery(); s.ok()) {
    pool.commit_open();
    s = make_fresh();
  }
  stats->seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  return s;
}

}  // namespace pmindex::index_common

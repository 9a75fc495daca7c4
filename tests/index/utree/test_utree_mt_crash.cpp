// uTree under the multi-threaded crash simulator: 2 and 3 threads of inserts, updates, removes
// and reads on DRAM leaves of 64 B (2 entries), so most predecessors lie in a neighbour leaf's
// range: writers link and unlink on words of nodes another leaf's holder also changes, and meet
// links that another thread has just CASed (dirty) and not yet persisted. Seeded deterministic
// schedules; crash images across all threads (eADR: after every store; ADR: line mode), each
// recovered and judged for durable linearizability (crash::run_index_crash_concurrent).
// PMINDEX_CRASH_IMAGES is the image budget per mode (125 images per schedule). A known-bad
// instantiation that unlocks before its link is durable (a reader can observe the key, an
// insert can link behind it, and a crash then takes both away) must fail. Replay:
//   PMINDEX_CRASH_REPLAY='utree.mt.adr.2t/<seed>/<op>/<point>/<choice>' ./test_utree_mt_crash
#include <gtest/gtest.h>

#include <iostream>

#include "index/common/crash_kit.h"
#include "index/utree/utree_recovery.h"
#include "pmindex/crash/index_driver.h"

namespace pmindex::utree {

struct UnlockBeforePersist : Protocol {
  static constexpr bool kUnlockBeforePersist = true;
};
template class UTree<UnlockBeforePersist>;

namespace {

namespace crash_kit = crash::crash_kit;
using crash::ConcurrentCrashConfig;
using crash::ExploreOptions;

ConcurrentCrashConfig config(std::size_t threads, bool bad, KeyType kt) {
  ConcurrentCrashConfig cfg;
  cfg.options.kind = "utree";
  cfg.options.key_type = kt;
  cfg.options.max_key_size = 8;
  cfg.options.node_size = 64;
  cfg.threads = threads;
  cfg.ops_per_thread = threads == 2 ? 30 : 20;
  // The known-bad variant needs a read or an insert to overlap an insert of a nearby key.
  cfg.key_space = bad ? 4 : 14;
  cfg.preload = bad ? 0 : 6;
  if (bad) {
    cfg.create = [](std::unique_ptr<pm::Pool> pool, const Options& o) {
      return UTree<UnlockBeforePersist>::create(std::move(pool), o);
    };
  }
  return cfg;
}

// Half of the budget for each thread count, in schedules of 125 images; a known-bad variant
// gets max_seeds schedules and stops at the first that fails (crash_kit::sweep).
crash_kit::SweepTotals sweep(pm::Mode mode, std::size_t threads, bool bad, std::size_t max_seeds,
                             KeyType kt = KeyType::u64) {
  const std::string label = "utree.mt." + std::string(pm::to_string(mode)) + "." +
                            std::to_string(threads) + "t" +
                            (kt == KeyType::bytes ? ".bytes" : "") + (bad ? ".bad" : "");
  return crash_kit::sweep(
      ExploreOptions::from_env(label, mode, 20261126, 1000),
      {.per_run = 125, .budget_share = 2, .max_seeds = max_seeds, .stop_at_failure = bad},
      [&](const ExploreOptions& opt) {
        return run_index_crash_concurrent(config(threads, bad, kt), opt);
      });
}

void expect_clean(pm::Mode mode, std::size_t threads, KeyType kt = KeyType::u64) {
  crash_kit::expect_swept(sweep(mode, threads, false, 0, kt),
                          "utree.mt." + std::string(pm::to_string(mode)) + "." +
                              std::to_string(threads) + "t");
}

TEST(MtCrashUTree, Eadr2Threads) { expect_clean(pm::Mode::eadr, 2); }
TEST(MtCrashUTree, Eadr3Threads) { expect_clean(pm::Mode::eadr, 3); }
TEST(MtCrashUTree, Adr2Threads) { expect_clean(pm::Mode::adr, 2); }
TEST(MtCrashUTree, Adr3Threads) { expect_clean(pm::Mode::adr, 3); }
TEST(MtCrashUTree, Adr2ThreadsBytesKeys) { expect_clean(pm::Mode::adr, 2, KeyType::bytes); }

// The checker can fail: an insert that shows its key in the DRAM leaf before its link is
// durable (U3 after the unlock) lets a reader observe, or another insert build on, a link
// that a crash takes away.
TEST(MtCrashUTree, UnlockBeforePersistIsCaught) {
  const crash_kit::SweepTotals t = sweep(pm::Mode::adr, 2, true, 300);
  EXPECT_GT(t.failed_runs, 0u) << "the unpersisted link went unnoticed";
  std::cout << "[caught] " << t.first_failure.substr(0, 600) << "\n";
}

}  // namespace
}  // namespace pmindex::utree

// part under the crash simulator's multi-threaded driver (docs/crash-simulator.md): 2 and 3
// simulated threads insert / update / remove / find over a few keys on one live index, the
// deterministic scheduler switching at every traced PM event and yield point (lock CASes,
// validations, spins), and every crash image is recovered and judged for durable
// linearizability. part needs no reader help (no flush-on-read): a writer persists before it
// unlocks and a reader acts only on words it validated against an unlocked version, so a
// reader that meets an unpersisted word restarts (PROTOCOL.md, "Readers").
#include <gtest/gtest.h>

#include <iostream>

#include "index/common/crash_kit.h"
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

void expect_clean(pm::Mode mode, std::size_t threads, std::uint64_t key_space) {
  const std::string label = "part.mt." + std::string(pm::to_string(mode)) + "." +
                            std::to_string(threads) + "t.k" + std::to_string(key_space);
  // Half of the budget for each thread count, in schedules of 125 images.
  const crash_kit::SweepTotals t = crash_kit::sweep(
      ExploreOptions::from_env(label, mode, 20261126, 1000), {.per_run = 125, .budget_share = 2},
      [&](const ExploreOptions& opt) {
        return run_index_crash_concurrent(config(threads, key_space), opt);
      });
  crash_kit::expect_swept(t, label);
}

// 14 keys share 7 bytes: one node grows and shrinks under two writers; 600 keys: prefix
// splits and collapses at byte 6 race with lookups.
TEST(MtCrashPart, Adr2Threads) { expect_clean(pm::Mode::adr, 2, 14); }
TEST(MtCrashPart, Eadr2Threads) { expect_clean(pm::Mode::eadr, 2, 14); }
TEST(MtCrashPart, Adr3ThreadsPrefixSplits) { expect_clean(pm::Mode::adr, 3, 600); }

}  // namespace
}  // namespace pmindex::crash

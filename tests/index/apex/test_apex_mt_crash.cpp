// APEX under the crash simulator's multi-threaded driver (docs/crash-simulator.md): 2 and 3
// simulated threads insert / update / remove / find on 1 KiB data nodes, so node splits and
// merges race with lookups and with each other; every crash image is recovered and judged for
// durable linearizability (hybrid_test::expect_mt_clean). APEX's SMO locks spin at scheduling
// points for this (PROTOCOL.md, "Concurrency").
#include <gtest/gtest.h>

#include "index/apex/apex.h"
#include "index/apex/apex_smo_levels.h"
#include "index/common/registry_mt_crash.h"

namespace pmindex::crash {
namespace {

using apex_test::smo_levels;

// 300 of 400 keys preloaded: the first data nodes are near their density bound, so inserts
// expand and split them (sideways, under a shared parent) and removes merge them back.
hybrid_test::MtCrashRun smos() {
  hybrid_test::MtCrashRun r;
  r.label = "apex.mt";
  r.options.kind = "apex";
  r.options.node_size = 1024;
  r.options.key_type = KeyType::u64;
  r.pool_size = 1 << 20;
  r.seed = 20261128;
  r.key_space = 400;
  r.preload = 300;
  r.smos = {"sideways_splits+", "merges+"};
  r.probe = smo_levels;
  return r;
}

TEST(MtCrashApex, Adr2Threads) { hybrid_test::expect_mt_clean(smos(), pm::Mode::adr, 2); }
TEST(MtCrashApex, Eadr2Threads) { hybrid_test::expect_mt_clean(smos(), pm::Mode::eadr, 2); }
TEST(MtCrashApex, Adr3Threads) { hybrid_test::expect_mt_clean(smos(), pm::Mode::adr, 3); }

// The known-bad merge (A16's parent slots switched while the log still says UNDO): recovery
// of an image inside or right after the switch frees the node the slots name.
TEST(MtCrashApex, MergeSwitchInUndoIsCaught) {
  hybrid_test::expect_mt_caught(smos(), pm::Mode::adr, 2, [](Index& idx) {
    dynamic_cast<apex::Apex&>(idx).set_fault_for_testing(apex::Apex::Fault::merge_switch_in_undo);
  }, 40);
}

}  // namespace
}  // namespace pmindex::crash

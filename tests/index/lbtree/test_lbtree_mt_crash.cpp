// LB+-Tree under the crash simulator's multi-threaded driver (docs/crash-simulator.md): 2 and 3
// simulated threads insert / update / remove / find over 14 keys on 256 B leaves (14 slots:
// leaf splits and merges race with lookups and with each other), every crash image recovered
// and judged for durable linearizability (hybrid_test::expect_mt_clean). A known-bad variant
// (J4's unlink committed before the moved entries, PROTOCOL.md) must be caught.
#include <gtest/gtest.h>

#include "index/common/registry_mt_crash.h"
#include "index/lbtree/lbtree.h"

namespace pmindex::crash {
namespace {

using Tree = lbtree::LBTree<1>;  // 256 B leaves

// The live leaf chain's length and the merge counter: "leaves+" is a split, "merges+" a merge.
crash_kit::SmoTally::Levels leaf_levels(const Index& idx) {
  const auto& t = dynamic_cast<const Tree&>(idx);
  return {{"leaves", t.leaf_count()}, {"merges", t.merges()}};
}

// Splits: 20 of 40 keys preloaded (two leaves), so inserts of new keys fill and split them.
hybrid_test::MtCrashRun growing() {
  hybrid_test::MtCrashRun r;
  r.label = "lbtree.mt";
  r.options.kind = "lbtree";
  r.options.node_size = 256;
  r.options.key_type = KeyType::u64;
  r.seed = 20261128;
  r.key_space = 40;
  r.preload = 20;
  r.smos = {"leaves+"};
  r.probe = leaf_levels;
  return r;
}

// Merges (J1-J6): every key preloaded (leaves of 7, 7 and 8), so inserts only put back what
// removes took and leaves thin until a remove folds one into its left neighbour.
hybrid_test::MtCrashRun thinning() {
  hybrid_test::MtCrashRun r = growing();
  r.label = "lbtree.mt.thin";
  r.key_space = 22;
  r.preload = 22;
  r.smos = {"merges+"};
  return r;
}

TEST(MtCrashLBTree, Adr2Threads) { hybrid_test::expect_mt_clean(growing(), pm::Mode::adr, 2); }
TEST(MtCrashLBTree, Eadr2Threads) { hybrid_test::expect_mt_clean(growing(), pm::Mode::eadr, 2); }
TEST(MtCrashLBTree, Adr3Threads) { hybrid_test::expect_mt_clean(growing(), pm::Mode::adr, 3); }
TEST(MtCrashLBTree, Adr2ThreadsMerges) {
  hybrid_test::expect_mt_clean(thinning(), pm::Mode::adr, 2);
}
TEST(MtCrashLBTree, Eadr2ThreadsMerges) {
  hybrid_test::expect_mt_clean(thinning(), pm::Mode::eadr, 2);
}

// The known-bad merge (J4's unlink committed before the moved entries' bits): some image
// after the unlink and before the entries' NAW loses the right leaf's keys.
TEST(MtCrashLBTree, MergeUnlinkFirstIsCaught) {
  hybrid_test::expect_mt_caught(thinning(), pm::Mode::adr, 2, [](Index& idx) {
    dynamic_cast<Tree&>(idx).set_fault_for_testing(Tree::Fault::merge_unlink_first);
  }, 40);
}

}  // namespace
}  // namespace pmindex::crash

// FPTree under the crash simulator's multi-threaded driver (docs/crash-simulator.md): 2 and 3
// simulated threads insert / update / remove / find on 8-slot leaves, so leaf splits and merges
// race with lookups and with each other; every crash image is recovered and judged for
// durable linearizability (hybrid_test::expect_mt_clean). A known-bad merge (J5's unlink before
// J4's bitmap NAW, PROTOCOL.md) must be caught.
#include <gtest/gtest.h>

#include "index/common/registry_mt_crash.h"
#include "index/fptree/fptree.h"

namespace pmindex::crash {
namespace {

using Tree = fptree::FPTree<8>;

// The live leaf chain's length and the merge counter: "leaves+" is a split, "merges+" a merge.
crash_kit::SmoTally::Levels leaf_levels(const Index& idx) {
  const auto& t = dynamic_cast<const Tree&>(idx);
  return {{"leaves", t.leaf_count()}, {"merges", t.merges()}};
}

// Splits: 12 of 30 keys preloaded (two leaves), so inserts of new keys fill and split them.
hybrid_test::MtCrashRun growing() {
  hybrid_test::MtCrashRun r;
  r.label = "fptree.mt";
  r.options.kind = "fptree";
  r.options.node_size = sizeof(fptree::Leaf<8>);
  r.options.key_type = KeyType::u64;
  r.seed = 20261128;
  r.key_space = 30;
  r.preload = 12;
  r.smos = {"leaves+"};
  r.probe = leaf_levels;
  return r;
}

// Merges (J1-J7): every key preloaded, so inserts only put back what removes took and leaves
// thin until a remove folds one into its left neighbour.
hybrid_test::MtCrashRun thinning() {
  hybrid_test::MtCrashRun r = growing();
  r.label = "fptree.mt.thin";
  r.key_space = 14;
  r.preload = 14;
  r.smos = {"merges+"};
  return r;
}

TEST(MtCrashFPTree, Adr2Threads) { hybrid_test::expect_mt_clean(growing(), pm::Mode::adr, 2); }
TEST(MtCrashFPTree, Eadr2Threads) { hybrid_test::expect_mt_clean(growing(), pm::Mode::eadr, 2); }
TEST(MtCrashFPTree, Adr3Threads) { hybrid_test::expect_mt_clean(growing(), pm::Mode::adr, 3); }
TEST(MtCrashFPTree, Adr2ThreadsMerges) {
  hybrid_test::expect_mt_clean(thinning(), pm::Mode::adr, 2);
}
TEST(MtCrashFPTree, Eadr2ThreadsMerges) {
  hybrid_test::expect_mt_clean(thinning(), pm::Mode::eadr, 2);
}

// The known-bad merge: some image between the unlink and the moved entries' NAW loses the
// right leaf's keys.
TEST(MtCrashFPTree, MergeUnlinkFirstIsCaught) {
  hybrid_test::expect_mt_caught(thinning(), pm::Mode::adr, 2, [](Index& idx) {
    dynamic_cast<Tree&>(idx).set_fault_for_testing(Tree::Fault::merge_unlink_first);
  }, 40);
}

}  // namespace
}  // namespace pmindex::crash

// FPTree under the crash simulator, ADR and eADR.
//  * CrashFPTree.*: the generic registry driver (random insert/update/upsert/remove mix over a
//    small key space) with 8- and 16-entry leaves, u64 and variable-length (bytes) keys;
//    sized by PMINDEX_CRASH_IMAGES (about 1,000 per mode in CI, 10,000 in `long`); one run
//    also crashes inside recovery (the driver's nested exploration).
//  * CrashFPTreeSteps.*: a designed sequence that walks each persistence path of PROTOCOL.md
//    in order: inserts into free slots (I1-I4), a split of a full leaf (S1-S8), out-of-place
//    updates (U1-U4) including one in a full leaf (split first), deletes that empty a leaf
//    and unlink it with the delete micro-log (D1-D6). The split and removal ops are checked
//    with NO image budget, so every crash point of both micro-logs is recovered and checked.
//  * CrashFPTreeMerges.*: a script that thins half-full leaves so that they merge into their
//    left neighbours (J1-J7), which must happen in the explored run (SmoTally over
//    FPTree::merges()), 8- and 16-entry leaves; one short merge checked at every crash point;
//    and a known-bad variant of the merge (the unlink committed before the moved entries,
//    FPTree::Fault::merge_unlink_first) that the same suite must catch.
// Each image: recover through the registry, verify(), compare with the oracle (completed ops
// present, the op in flight all or nothing), keep operating, check again.
// Replay: PMINDEX_CRASH_REPLAY='<printed token>' ./test_fptree_crash
// Scaffolding shared with LB+-Tree: tests/index/common/hybrid_test_support.h.
#include <gtest/gtest.h>

#include <cstring>
#include <iostream>

#include "index/common/crash_kit.h"
#include "index/common/hybrid_test_support.h"
#include "index/fptree/fptree.h"

namespace pmindex::crash {
namespace {

constexpr std::uint32_t kLeaf8 = sizeof(fptree::Leaf<8>);
constexpr std::uint32_t kLeaf16 = sizeof(fptree::Leaf<16>);

void run_driver(std::uint32_t node_size, std::uint64_t key_space, pm::Mode mode, std::size_t ops,
                KeyType kt = KeyType::u64, std::size_t recovery_crash_images = 0) {
  hybrid_test::RegistryCrashRun r;
  r.options.kind = "fptree";
  r.options.node_size = node_size;
  r.options.key_type = kt;
  r.options.max_key_size = 16;
  r.key_space = key_space;
  r.mode = mode;
  r.min_ops = ops;
  r.recovery_crash_images = recovery_crash_images;  // > 0: nested images must be checked
  // Leaf splits must happen while the crash points are explored; with byte keys the footprint
  // also grows by key records, so the leaf count is the level.
  r.smos = {"leaves+"};
  r.probe = [node_size](const Index& idx) -> crash_kit::SmoTally::Levels {
    if (node_size == kLeaf8) return {{"leaves", dynamic_cast<const fptree::FPTree<8>&>(idx).leaf_count()}};
    return {{"leaves", dynamic_cast<const fptree::FPTree<16>&>(idx).leaf_count()}};
  };
  r.label = "fptree" + std::to_string(node_size) + (kt == KeyType::bytes ? "bytes" : "") +
            (recovery_crash_images > 0 ? "rec." : ".") + std::string(pm::to_string(mode));
  hybrid_test::run_registry_crash(r);
}

TEST(CrashFPTree, Leaf8Adr) { run_driver(kLeaf8, 40, pm::Mode::adr, 200); }
TEST(CrashFPTree, Leaf8Eadr) { run_driver(kLeaf8, 40, pm::Mode::eadr, 200); }
TEST(CrashFPTree, Leaf16Adr) { run_driver(kLeaf16, 80, pm::Mode::adr, 300); }
TEST(CrashFPTree, Leaf16Eadr) { run_driver(kLeaf16, 80, pm::Mode::eadr, 300); }
// Variable-length key mode: keys are PM records (K1-K3) referenced from the slots.
TEST(CrashFPTree, Leaf8BytesKeysAdr) { run_driver(kLeaf8, 40, pm::Mode::adr, 200, KeyType::bytes); }
TEST(CrashFPTree, Leaf8BytesKeysEadr) { run_driver(kLeaf8, 40, pm::Mode::eadr, 200, KeyType::bytes); }

// Crashes inside recovery (its repair pass re-links split and removed leaves, clears logs and
// lock words, unlinks empty leaves): for one in 8 checked images, images of a crash during its
// recovery are recovered and checked in turn.
TEST(CrashFPTree, CrashDuringRecoveryAdr) { run_driver(kLeaf8, 40, pm::Mode::adr, 200, KeyType::u64, 16); }

// An fptree-specific loss that the crash driver and the kill harness must both catch: clearing
// the head leaf's bitmap drops records that completed operations wrote.
TEST(CrashFPTree, DriverAndKillHarnessCatchLostRecords) {
  Options o;
  o.kind = "fptree";
  o.node_size = kLeaf8;
  hybrid_test::expect_checkers_catch(o, [](std::span<char> image) {
    if (const std::uint64_t head = hybrid_test::head_leaf(image, offsetof(fptree::Root, head), 8))
      std::memset(image.data() + head, 0, 8);
  }, "fptree");
}

// The designed sequence (8-entry leaves). Op 0 creates the index. The split and removal ops
// are checked with no image budget: every crash point, every candidate image.
void run_steps(pm::Mode mode) {
  Options o;
  o.kind = "fptree";
  o.node_size = kLeaf8;
  o.persistence = mode;
  o.pool_size = 256 * 1024;
  std::vector<WorkOp> ops;
  std::uint64_t v = 500;
  for (std::uint64_t k = 1; k <= 8; ++k) ops.push_back({OpKind::insert, k * 2, ++v});  // full
  ops.push_back({OpKind::insert, 9, ++v});                                  // S1-S8, then I1-I4
  ops.push_back({OpKind::update, 4, ++v});                                  // U1-U4
  for (std::uint64_t k = 3; k <= 7; k += 2) ops.push_back({OpKind::insert, k, ++v});
  ops.push_back({OpKind::update, 2, ++v});                                  // full: split, U1-U4
  for (std::uint64_t k = 17; k >= 10; --k) ops.push_back({OpKind::remove, k, 0});  // D1-D6
  ops.push_back({OpKind::scan, 1, 0});
  hybrid_test::ScriptedScenario scenario(o, 20, std::move(ops));
  hybrid_test::run_scripted(scenario, "fptree_steps." + std::string(pm::to_string(mode)), mode,
                            {.splits = true, .removals = true, .min_crash_points = 51},
                            /*images_budget=*/0);
}

TEST(CrashFPTreeSteps, EveryPointAdr) { run_steps(pm::Mode::adr); }
TEST(CrashFPTreeSteps, EveryPointEadr) { run_steps(pm::Mode::eadr); }

// --- merges (J1-J7) ---

template <unsigned N>
fptree::FPTree<N>* as_fptree(Index& idx) { return dynamic_cast<fptree::FPTree<N>*>(&idx); }

crash_kit::SmoTally::Levels merge_levels(const Index& idx) {
  Index& i = const_cast<Index&>(idx);
  std::uint64_t m = 0;
  if (auto* t = as_fptree<8>(i)) {
    m = t->merges();
  } else if (auto* t16 = as_fptree<16>(i)) {
    m = t16->merges();
  } else {
    ADD_FAILURE() << "not an 8- or 16-entry fptree";
  }
  return {{"merges", m}};
}

Options merge_options(std::uint32_t node_size, pm::Mode mode) {
  Options o;
  o.kind = "fptree";
  o.node_size = node_size;
  o.persistence = mode;
  o.pool_size = 256 * 1024;
  return o;
}

void run_merges(std::uint32_t node_size, std::uint64_t slots, pm::Mode mode) {
  hybrid_test::ScriptedScenario scenario(merge_options(node_size, mode), 4 * slots + 1,
                                         hybrid_test::sparse_merge_script(slots));
  crash_kit::SmoTally tally(merge_levels);
  scenario.set_observer(tally.observer());
  const std::string label =
      "fptree_merges" + std::to_string(node_size) + "." + std::string(pm::to_string(mode));
  hybrid_test::run_scripted(scenario, label, mode,
                            {.splits = true, .removals = true, .smos = {"merges+"}}, {}, &tally);
}

TEST(CrashFPTreeMerges, Leaf8Adr) { run_merges(kLeaf8, 8, pm::Mode::adr); }
TEST(CrashFPTreeMerges, Leaf8Eadr) { run_merges(kLeaf8, 8, pm::Mode::eadr); }
TEST(CrashFPTreeMerges, Leaf16Adr) { run_merges(kLeaf16, 16, pm::Mode::adr); }
TEST(CrashFPTreeMerges, Leaf16Eadr) { run_merges(kLeaf16, 16, pm::Mode::eadr); }

// One merge, every crash point and candidate image (no budget): 8-entry leaves, 1..12
// ascending (a split: the head keeps 1..4, the right leaf 5..12), then 5..10 removed: the right
// leaf reaches the trigger (2 entries) and the two fit (6 <= kMergeMax): J1-J7.
void run_one_merge(pm::Mode mode) {
  std::vector<WorkOp> ops;
  std::uint64_t v = 700;
  for (std::uint64_t k = 1; k <= 12; ++k) ops.push_back({OpKind::insert, k, ++v});
  for (std::uint64_t k = 5; k <= 10; ++k) ops.push_back({OpKind::remove, k, 0});
  ops.push_back({OpKind::scan, 1, 0});
  hybrid_test::ScriptedScenario scenario(merge_options(kLeaf8, mode), 13, std::move(ops));
  crash_kit::SmoTally tally(merge_levels);
  scenario.set_observer(tally.observer());
  hybrid_test::run_scripted(scenario, "fptree_one_merge." + std::string(pm::to_string(mode)),
                            mode, {.splits = true, .removals = true, .smos = {"merges+"}},
                            /*images_budget=*/0, &tally);
}

TEST(CrashFPTreeMerges, EveryPointOfOneMergeAdr) { run_one_merge(pm::Mode::adr); }
TEST(CrashFPTreeMerges, EveryPointOfOneMergeEadr) { run_one_merge(pm::Mode::eadr); }

// The known-bad merge (FPTree::Fault::merge_unlink_first: the link NAW that unlinks the right
// leaf is persisted before the bitmap NAW that validates its entries in the left one) loses the
// right leaf's keys if a crash falls between the two stores: the suite must report it, in both
// modes.
void run_bad_merge(pm::Mode mode) {
  hybrid_test::ScriptedScenario scenario(merge_options(kLeaf8, mode), 4 * 8 + 1,
                                         hybrid_test::sparse_merge_script(8));
  scenario.set_prepare([](Index& idx) {
    auto* t = as_fptree<8>(idx);
    ASSERT_NE(t, nullptr);
    t->set_fault_for_testing(fptree::FPTree<8>::Fault::merge_unlink_first);
  });
  hybrid_test::expect_scripted_caught(
      scenario, "fptree_merges_bad." + std::string(pm::to_string(mode)), mode,
      "the reordered merge");
}

TEST(CrashFPTreeMerges, KnownBadUnlinkFirstIsCaughtAdr) { run_bad_merge(pm::Mode::adr); }
TEST(CrashFPTreeMerges, KnownBadUnlinkFirstIsCaughtEadr) { run_bad_merge(pm::Mode::eadr); }

}  // namespace
}  // namespace pmindex::crash

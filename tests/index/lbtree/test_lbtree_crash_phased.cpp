// LB+-Tree under the crash simulator with a designed workload that walks every persistence
// path in order (PROTOCOL.md): ascending inserts (good case, entry moving, splits with the key
// going right), descending inserts between them (entry moving, splits with the key going left),
// 8-byte in-place updates, then deletes of a contiguous range (leaves empty and are unlinked:
// U1-U4); a second scenario starts with a bulk load (B1-B4). ADR and eADR, m = 1, 2, 4.
// Each image: recover through the registry, verify(), compare with the oracle (completed ops
// present, the op in flight all or nothing), then keep operating and check again.
// Sized by PMINDEX_CRASH_IMAGES, replayable with the printed token. The scenario frame is
// shared with FPTree: hybrid_test::ScriptedScenario (tests/index/common/hybrid_test_support.h).
// CrashLBTreeMerges: a script that thins half-full leaves so that they merge (J1-J6), which
// must happen in the explored run (SmoTally over LBTree::merges()), and a known-bad variant of
// the merge (the unlink committed before the moved entries) that the same suite must catch.
#include <gtest/gtest.h>

#include <iostream>

#include "index/common/crash_kit.h"
#include "index/common/hybrid_test_support.h"
#include "index/lbtree/lbtree.h"

namespace pmindex::crash {
namespace {

void run(std::uint32_t node_size, pm::Mode mode, bool bulk) {
  Options o;
  o.kind = "lbtree";
  o.node_size = node_size;
  o.persistence = mode;
  o.pool_size = 512 * 1024;
  const std::uint64_t s = 14 * (node_size / 256);  // slots per leaf
  std::vector<std::uint64_t> bulk_keys;
  std::vector<WorkOp> ops;
  std::uint64_t v = 1000;
  if (bulk) {
    for (std::uint64_t k = 2; k <= 4 * s; k += 2) bulk_keys.push_back(k);
    for (std::uint64_t k = 1; k < s; k += 2) ops.push_back({OpKind::insert, k, ++v});
    for (std::uint64_t k = 2; k <= s; k += 4) ops.push_back({OpKind::remove, k, 0});
  } else {
    for (std::uint64_t k = 2; k <= 4 * s; k += 2) ops.push_back({OpKind::insert, k, ++v});
    for (std::uint64_t k = 4 * s - 1; k >= 1 && k < 4 * s; k -= 2)
      ops.push_back({OpKind::insert, k, ++v});
    for (std::uint64_t k = 3; k <= 4 * s; k += 7) ops.push_back({OpKind::update, k, ++v});
    for (std::uint64_t k = 2 * s; k >= 1; --k) ops.push_back({OpKind::remove, k, 0});
    ops.push_back({OpKind::scan, 1, 0});
  }
  hybrid_test::ScriptedScenario scenario(o, 4 * s, std::move(ops), std::move(bulk_keys), 0.7);
  const std::string label = std::string(bulk ? "lbtree_bulk" : "lbtree_phased") +
                            std::to_string(node_size) + "." + std::string(pm::to_string(mode));
  hybrid_test::run_scripted(scenario, label, mode, {.splits = true, .removals = !bulk});
}

TEST(CrashLBTreePhased, Leaf256Adr) { run(256, pm::Mode::adr, false); }
TEST(CrashLBTreePhased, Leaf256Eadr) { run(256, pm::Mode::eadr, false); }
TEST(CrashLBTreePhased, Leaf512Adr) { run(512, pm::Mode::adr, false); }
TEST(CrashLBTreePhased, Leaf512Eadr) { run(512, pm::Mode::eadr, false); }
TEST(CrashLBTreePhased, Leaf1024Adr) { run(1024, pm::Mode::adr, false); }
TEST(CrashLBTreePhased, Leaf1024Eadr) { run(1024, pm::Mode::eadr, false); }
TEST(CrashLBTreePhased, BulkLoad256Adr) { run(256, pm::Mode::adr, true); }
TEST(CrashLBTreePhased, BulkLoad1024Adr) { run(1024, pm::Mode::adr, true); }
TEST(CrashLBTreePhased, BulkLoad256Eadr) { run(256, pm::Mode::eadr, true); }

// --- merges (J1-J6) ---

template <unsigned M>
lbtree::LBTree<M>* as_lbtree(Index& idx) { return dynamic_cast<lbtree::LBTree<M>*>(&idx); }

std::uint64_t merges_of(const Index& idx) {
  Index& i = const_cast<Index&>(idx);
  if (auto* t = as_lbtree<1>(i)) return t->merges();
  if (auto* t = as_lbtree<2>(i)) return t->merges();
  if (auto* t = as_lbtree<4>(i)) return t->merges();
  ADD_FAILURE() << "not an lbtree";
  return 0;
}

crash_kit::SmoTally::Levels merge_levels(const Index& idx) {
  return {{"merges", merges_of(idx)}};
}

Options merge_options(std::uint32_t node_size, pm::Mode mode) {
  Options o;
  o.kind = "lbtree";
  o.node_size = node_size;
  o.persistence = mode;
  o.pool_size = 512 * 1024;
  return o;
}

void run_merges(std::uint32_t node_size, pm::Mode mode) {
  const std::uint64_t s = 14 * (node_size / 256);
  hybrid_test::ScriptedScenario scenario(merge_options(node_size, mode), 4 * s + 1,
                                         hybrid_test::sparse_merge_script(s));
  crash_kit::SmoTally tally(merge_levels);
  scenario.set_observer(tally.observer());
  const std::string label =
      "lbtree_merges" + std::to_string(node_size) + "." + std::string(pm::to_string(mode));
  hybrid_test::run_scripted(scenario, label, mode,
                            {.splits = true, .removals = true, .smos = {"merges+"}}, {}, &tally);
}

TEST(CrashLBTreeMerges, Leaf256Adr) { run_merges(256, pm::Mode::adr); }
TEST(CrashLBTreeMerges, Leaf256Eadr) { run_merges(256, pm::Mode::eadr); }
TEST(CrashLBTreeMerges, Leaf1024Adr) { run_merges(1024, pm::Mode::adr); }
TEST(CrashLBTreeMerges, Leaf1024Eadr) { run_merges(1024, pm::Mode::eadr); }

// The known-bad merge (LBTree::Fault::merge_unlink_first: the alt flip that unlinks the right
// leaf is persisted before the NAW that validates its entries in the left one) loses the right
// leaf's keys if a crash falls between the two stores: the suite must report it, in both modes.
void run_bad_merge(pm::Mode mode) {
  hybrid_test::ScriptedScenario scenario(merge_options(256, mode), 4 * 14 + 1,
                                         hybrid_test::sparse_merge_script(14));
  scenario.set_prepare([](Index& idx) {
    auto* t = as_lbtree<1>(idx);
    ASSERT_NE(t, nullptr);
    t->set_fault_for_testing(lbtree::LBTree<1>::Fault::merge_unlink_first);
  });
  hybrid_test::expect_scripted_caught(
      scenario, "lbtree_merges_bad." + std::string(pm::to_string(mode)), mode,
      "the reordered merge");
}

TEST(CrashLBTreeMerges, KnownBadUnlinkFirstIsCaughtAdr) { run_bad_merge(pm::Mode::adr); }
TEST(CrashLBTreeMerges, KnownBadUnlinkFirstIsCaughtEadr) { run_bad_merge(pm::Mode::eadr); }

}  // namespace
}  // namespace pmindex::crash

// Regression test for a race in InnerTree::descend found by pmbench (2-thread load of 1M
// keys into lbtree lost a key about one run in three): a reader that loaded root_ just before
// a root split waited out the split inside readLockOrRestart and then searched the old root,
// which by then held only the lower half of its keys. The root has no parent version to
// catch that; descend now re-checks root_ after reading the root's version.
//
// One writer grows fresh small-fanout trees (many root splits per round) by appending leaves;
// one reader descends to random keys of leaves that already exist and checks it reaches
// exactly the leaf that covers the key. Leaves are fake ids (no PM); separators are integers.
#include <atomic>
#include <cstdint>
#include <optional>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "index/common/inner_tree.h"
#include "pmindex/pm/dram_arena.h"

namespace {

using pmindex::index_common::InnerTree;

constexpr std::uint64_t kRange = 1000;  // leaf i covers [i * kRange, (i + 1) * kRange)
std::uint64_t leaf_id(std::uint64_t i) { return (i + 1) * 256; }

TEST(InnerTreeRace, DescentNeverSearchesAHalvedRoot) {
  const int rounds = 300;
  const std::uint64_t leaves_per_round = 2000;  // max_keys 3: about 6 root splits per round
  std::uint64_t misrouted = 0;
  for (int round = 0; round < rounds && misrouted == 0; ++round) {
    pmindex::pm::DramArena arena;
    InnerTree tree(3, arena);
    tree.init_single(leaf_id(0));
    std::atomic<std::uint64_t> complete{1};  // leaves 0 .. complete-1 are installed
    std::atomic<bool> done{false};
    std::thread reader([&] {
      std::mt19937_64 rng(round);
      while (!done.load(std::memory_order_acquire)) {
        const std::uint64_t c = complete.load(std::memory_order_acquire);
        if (c < 2) continue;
        // Keys of leaves 0 .. c-2: their covering leaf can no longer change.
        const std::uint64_t key = rng() % ((c - 1) * kRange);
        const auto [leaf, token] = tree.descend(
            [key](std::uint64_t sep) { return key < sep; },
            [](std::uint64_t) { return std::optional<std::uint64_t>(0); });
        (void)token;
        if (leaf != leaf_id(key / kRange)) ++misrouted;
      }
    });
    for (std::uint64_t i = 1; i < leaves_per_round; ++i) {
      auto smo = tree.smo_lock();
      InnerTree::Path path;
      const std::uint64_t sep = i * kRange;
      tree.path_to([sep](std::uint64_t s) { return sep < s; }, &path);
      ASSERT_TRUE(tree.insert_separator(path, leaf_id(i - 1), sep, leaf_id(i)));
      complete.store(i + 1, std::memory_order_release);
    }
    done.store(true, std::memory_order_release);
    reader.join();
  }
  EXPECT_EQ(misrouted, 0u) << "a descent reached a leaf that does not cover its key";
}

}  // namespace

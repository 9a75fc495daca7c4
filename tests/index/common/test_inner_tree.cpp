// InnerTree routing against a sorted-vector oracle, for every fanout the indexes use (3 and 127
// for FPTree, 14 for LB+-Tree) and the edges of child_index's two searches (a node counted
// whole below kLinearKeys separators, binary steps then a counted window above it). Each probe
// is routed twice, with WordProbe (the integer path) and with a plain lambda (the byte-key
// path's binary search), and both must reach the leaf whose range holds the key.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "index/common/inner_tree.h"
#include "pmindex/pm/dram_arena.h"

namespace {

using pmindex::index_common::InnerTree;
using pmindex::index_common::WordProbe;

std::uint64_t leaf_id(std::size_t i) { return (i + 1) * 256; }

// Separators seps[1..] (seps[0] is the -infinity fence); leaf i covers [seps[i], seps[i+1]).
std::size_t oracle(const std::vector<std::uint64_t>& seps, std::uint64_t key) {
  return static_cast<std::size_t>(std::upper_bound(seps.begin() + 1, seps.end(), key) -
                                  seps.begin()) - 1;
}

// Splits random leaves at random points inside their ranges, `splits` - 1 times (leaf ids
// follow creation, so the oracle maps each range to its id through `ids`); false if the tree
// refused a separator.
bool grow_by_random_splits(InnerTree& t, std::mt19937_64& rng, int splits,
                           std::vector<std::uint64_t>& seps, std::vector<std::uint64_t>& ids) {
  for (int n = 1; n < splits; ++n) {
    const std::uint64_t key = rng();
    const std::size_t i = oracle(seps, key);
    if (key == seps[i]) continue;
    auto smo = t.smo_lock();
    InnerTree::Path path;
    t.path_to(WordProbe{key}, &path);
    if (!t.insert_separator(path, ids[i], key, leaf_id(n))) return false;
    seps.insert(seps.begin() + static_cast<std::ptrdiff_t>(i) + 1, key);
    ids.insert(ids.begin() + static_cast<std::ptrdiff_t>(i) + 1, leaf_id(n));
  }
  return true;
}

std::uint64_t route_words(const InnerTree& t, std::uint64_t key) {
  return t.descend(WordProbe{key}, [](std::uint64_t) { return std::optional<std::uint64_t>(0); })
      .first;
}

// The compile-time-capacity descent (descend<kKeys>: AVX2 window, unrolled prefetch) for the
// fanouts the indexes pass it and the window's edges; other fanouts route as route_words.
std::uint64_t route_fixed(const InnerTree& t, std::uint64_t key) {
  const auto leaf = [](std::uint64_t) { return std::optional<std::uint64_t>(0); };
  switch (t.max_keys()) {
    case 3: return t.descend<3>(WordProbe{key}, leaf).first;
    case 14: return t.descend<14>(WordProbe{key}, leaf).first;
    case 15: return t.descend<15>(WordProbe{key}, leaf).first;
    case 16: return t.descend<16>(WordProbe{key}, leaf).first;
    case 17: return t.descend<17>(WordProbe{key}, leaf).first;
    case 127: return t.descend<127>(WordProbe{key}, leaf).first;
    default: return route_words(t, key);
  }
}

std::uint64_t route_lambda(const InnerTree& t, std::uint64_t key) {
  return t.descend([key](std::uint64_t sep) { return key < sep; },
                   [](std::uint64_t) { return std::optional<std::uint64_t>(0); })
      .first;
}

// Probes: every separator, its neighbours, the extremes, and random keys.
std::vector<std::uint64_t> probes(const std::vector<std::uint64_t>& seps, std::mt19937_64& rng) {
  std::vector<std::uint64_t> p = {0, 1, std::numeric_limits<std::uint64_t>::max()};
  for (std::size_t i = 1; i < seps.size(); ++i) {
    p.push_back(seps[i]);
    p.push_back(seps[i] - 1);
    p.push_back(seps[i] + 1);
  }
  for (int i = 0; i < 2000; ++i) p.push_back(rng());
  return p;
}

void expect_routes(const InnerTree& t, const std::vector<std::uint64_t>& seps,
                   std::mt19937_64& rng, unsigned max_keys) {
  for (std::uint64_t key : probes(seps, rng)) {
    const std::uint64_t want = leaf_id(oracle(seps, key));
    ASSERT_EQ(route_words(t, key), want) << "WordProbe, max_keys " << max_keys << ", key " << key;
    ASSERT_EQ(route_lambda(t, key), want) << "lambda, max_keys " << max_keys << ", key " << key;
    ASSERT_EQ(route_fixed(t, key), want) << "fixed, max_keys " << max_keys << ", key " << key;
  }
}

class InnerTreeRouting : public ::testing::TestWithParam<unsigned> {};

TEST_P(InnerTreeRouting, BulkBuiltTreeRoutesLikeTheOracle) {
  const unsigned max_keys = GetParam();
  std::mt19937_64 rng(max_keys);
  for (std::size_t leaves : {1u, 2u, 15u, 16u, 17u, 300u, 5000u}) {
    for (double fill : {1.0, 0.5}) {
      std::vector<std::uint64_t> seps(leaves);
      for (auto& s : seps) s = 2 + rng() % (std::numeric_limits<std::uint64_t>::max() - 4);
      std::sort(seps.begin(), seps.end());
      seps.erase(std::unique(seps.begin(), seps.end()), seps.end());
      std::vector<std::pair<std::uint64_t, std::uint64_t>> items;
      for (std::size_t i = 0; i < seps.size(); ++i) items.emplace_back(seps[i], leaf_id(i));
      seps[0] = 0;  // the first separator is the fence
      pmindex::pm::DramArena arena;
      InnerTree t(max_keys, arena);
      t.bulk_build(items, fill, 1);
      expect_routes(t, seps, rng, max_keys);
    }
  }
}

TEST_P(InnerTreeRouting, TreeGrownBySplitsRoutesLikeTheOracle) {
  const unsigned max_keys = GetParam();
  std::mt19937_64 rng(max_keys + 1000);
  pmindex::pm::DramArena arena;
  InnerTree t(max_keys, arena);
  t.init_single(leaf_id(0));
  std::vector<std::uint64_t> seps = {0};  // seps[i] is leaf i's low bound
  std::vector<std::uint64_t> ids = {leaf_id(0)};
  ASSERT_TRUE(grow_by_random_splits(t, rng, 3000, seps, ids));
  for (std::uint64_t key : probes(seps, rng)) {
    const std::uint64_t want = ids[oracle(seps, key)];
    ASSERT_EQ(route_words(t, key), want) << "WordProbe, max_keys " << max_keys << ", key " << key;
    ASSERT_EQ(route_lambda(t, key), want) << "lambda, max_keys " << max_keys << ", key " << key;
    ASSERT_EQ(route_fixed(t, key), want) << "fixed, max_keys " << max_keys << ", key " << key;
  }
}

// remove_leaf(join_left = true), as a leaf merge uses it: whatever the leaf's position in its
// node (first child included, where the plain removal hands the range to the right neighbour)
// and however many nodes empty on the way up, the removed leaf's range joins its left
// neighbour. Grown by splits, then most leaves removed at random; routing must match the
// oracle with each removed range merged left. The plain removal on the same sequence must
// route some key elsewhere (the check can fail).
// Coupling only checks parent against child: a removal that changes an ancestor and a node
// below it must change the version of every node between them too, else a reader that
// validated the ancestor before the change and read the lower node after it routes a key of
// the removed range to the wrong leaf. Versions along the path before and after one removal;
// true if some unchanged node lies below a changed one (counting the node itself as changed
// if it went obsolete or was recycled).
bool unchanged_between_changed(const InnerTree::Path& path,
                               const std::vector<std::uint64_t>& before) {
  std::size_t highest = path.size();
  for (std::size_t j = 0; j < path.size(); ++j) {
    if (path[j].node->lock.peek() != before[j]) {
      highest = j;
      break;
    }
  }
  for (std::size_t j = highest; j < path.size(); ++j)
    if (path[j].node->lock.peek() == before[j]) return true;
  return false;
}

struct RemovalTally {
  std::size_t misroutes = 0;
  std::size_t unfenced = 0;   // removals that left an unchanged node between changed ones
  std::size_t far_fence = 0;  // removals whose fence moved two or more levels up
};

RemovalTally removals_tally(unsigned max_keys, bool join_left) {
  std::mt19937_64 rng(max_keys + 2000);
  pmindex::pm::DramArena arena;
  InnerTree t(max_keys, arena);
  t.init_single(leaf_id(0));
  std::vector<std::uint64_t> seps = {0};
  std::vector<std::uint64_t> ids = {leaf_id(0)};
  if (!grow_by_random_splits(t, rng, 600, seps, ids)) {
    ADD_FAILURE() << "a split's separator insert failed, max_keys " << max_keys;
    return {};
  }
  {  // the first leaf has no left neighbour: refused, nothing changes
    auto smo = t.smo_lock();
    InnerTree::Path path;
    t.path_to(WordProbe{0}, &path);
    if (join_left) {
      EXPECT_FALSE(t.remove_leaf(path, ids[0], nullptr, true));
    }
  }
  RemovalTally tally;
  while (ids.size() > 3) {
    const std::size_t i = 1 + rng() % (ids.size() - 1);
    {
      auto smo = t.smo_lock();
      InnerTree::Path path;
      t.path_to(WordProbe{seps[i]}, &path);
      std::vector<std::uint64_t> before;
      for (const auto& step : path) before.push_back(step.node->lock.peek());
      std::size_t up = path.size() - 1;  // where a join_left fence lives
      while (up > 0 && path[up].index == 0) --up;
      if (path.back().index == 0 && up + 2 < path.size()) ++tally.far_fence;
      std::uint64_t dropped = 1;
      EXPECT_TRUE(t.remove_leaf(path, ids[i], &dropped, join_left));
      if (unchanged_between_changed(path, before)) ++tally.unfenced;
      if (join_left) {
        EXPECT_EQ(dropped, seps[i]) << "the removed leaf's low fence leaves";
      }
    }
    seps.erase(seps.begin() + static_cast<std::ptrdiff_t>(i));
    ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(i));
    if (ids.size() % 37 != 0 && ids.size() > 4) continue;  // check now and then
    for (std::uint64_t key : probes(seps, rng)) {
      const std::uint64_t want = ids[oracle(seps, key)];
      if (route_words(t, key) != want || route_lambda(t, key) != want ||
          route_fixed(t, key) != want)
        ++tally.misroutes;
    }
  }
  return tally;
}

TEST_P(InnerTreeRouting, MergeRemovalJoinsTheLeftNeighbour) {
  const RemovalTally merged = removals_tally(GetParam(), true);
  EXPECT_EQ(merged.misroutes, 0u);
  EXPECT_GT(removals_tally(GetParam(), false).misroutes, 0u)
      << "plain removals never handed a range right: the check above proves nothing";
  // Every node between the moved fence and the leaf's node changes version (the FPTree
  // stress found readers misrouted when only those two did). Small fanouts move fences
  // two or more levels up, so there the check has cases it could fail on.
  EXPECT_EQ(merged.unfenced, 0u);
  if (GetParam() <= 4) {
    EXPECT_GT(merged.far_fence, 0u) << "no removal moved a fence two levels up";
  }
}

// insert_separator_hinted: a hint from the descent inserts where path_to's path would (the
// tree still routes like the oracle), and a hint whose node changed since is refused with
// nothing changed (a split that trusted it would insert at a stale child index).
TEST(InnerTreeHint, FreshHintInsertsAndStaleHintIsRefused) {
  pmindex::pm::DramArena arena;
  InnerTree t(14, arena);
  t.init_single(leaf_id(0));
  std::vector<std::uint64_t> seps = {0};
  std::vector<std::uint64_t> ids = {leaf_id(0)};
  const auto leaf = [](std::uint64_t) { return std::optional<std::uint64_t>(0); };
  std::mt19937_64 rng(7);
  int hinted = 0;
  for (int n = 1; n < 2000; ++n) {
    const std::uint64_t key = rng();
    const std::size_t i = oracle(seps, key);
    if (key == seps[i]) continue;
    InnerTree::ParentHint hint;
    ASSERT_EQ(t.descend<14>(WordProbe{key}, leaf, &hint).first, ids[i]);
    auto smo = t.smo_lock();
    if (t.insert_separator_hinted(hint, ids[i], key, leaf_id(n))) {
      ++hinted;
    } else {
      InnerTree::Path path;
      t.path_to(WordProbe{key}, &path);
      ASSERT_TRUE(t.insert_separator(path, ids[i], key, leaf_id(n)));
    }
    seps.insert(seps.begin() + static_cast<std::ptrdiff_t>(i) + 1, key);
    ids.insert(ids.begin() + static_cast<std::ptrdiff_t>(i) + 1, leaf_id(n));
  }
  EXPECT_GT(hinted, 1000) << "most splits find room in the level-1 node";
  for (std::uint64_t key : probes(seps, rng))
    ASSERT_EQ(route_fixed(t, key), ids[oracle(seps, key)]) << "key " << key;

  // Stale: a hint taken, then another separator enters the same node; the hint is refused and
  // the tree is unchanged.
  const std::uint64_t key = rng();
  const std::size_t i = oracle(seps, key);
  InnerTree::ParentHint hint;
  t.descend<14>(WordProbe{key}, leaf, &hint);
  {
    auto smo = t.smo_lock();
    InnerTree::Path path;
    t.path_to(WordProbe{key}, &path);
    // Another split in the same leaf's range: the node's version moves on.
    const std::uint64_t other = key - 1;
    ASSERT_NE(other, seps[i]);
    ASSERT_TRUE(t.insert_separator(path, ids[i], other, leaf_id(9999)));
    seps.insert(seps.begin() + static_cast<std::ptrdiff_t>(i) + 1, other);
    ids.insert(ids.begin() + static_cast<std::ptrdiff_t>(i) + 1, leaf_id(9999));
    EXPECT_FALSE(t.insert_separator_hinted(hint, ids[i], key, leaf_id(10000)));
  }
  for (std::uint64_t k : probes(seps, rng)) ASSERT_EQ(route_fixed(t, k), ids[oracle(seps, k)]);
  // A hint without a node (no descent filled it) is refused too.
  auto smo = t.smo_lock();
  EXPECT_FALSE(t.insert_separator_hinted(InnerTree::ParentHint{}, ids[0], 1, leaf_id(10001)));
}

// test_inner_tree_baseline (tests/CMakeLists.txt) exists to run the SSE4.2 form.
#if defined(PMINDEX_EXPECT_NODE_SEARCH_SSE42) && !defined(PMINDEX_NODE_SEARCH_SCALAR) && \
    !defined(PMINDEX_NODE_SEARCH_SSE42)
#error "test_inner_tree_baseline must compile node_search.h's SSE4.2 form"
#endif

using pmindex::index_common::SearchIsa;

// count_u64_window in form I. The AVX2 form goes through a PMINDEX_AVX2_ENTRY function, as the
// indexes' dispatched lookups do (docs/isa.md): in a build without -mavx2 (this file's
// test_inner_tree_baseline) it is the only way to compile it.
template <unsigned kSlots, bool kBiased>
PMINDEX_AVX2_ENTRY [[gnu::noinline]] unsigned window_avx2(const std::uint64_t* k, unsigned cnt,
                                                          std::uint64_t p) {
  return pmindex::index_common::count_u64_window<kSlots, kBiased, SearchIsa::avx2>(k, cnt, p);
}
template <unsigned kSlots, bool kBiased, SearchIsa I>
unsigned window(const std::uint64_t* k, unsigned cnt, std::uint64_t p) {
  if constexpr (I == SearchIsa::avx2) {
    return window_avx2<kSlots, kBiased>(k, cnt, p);
  } else {
    return pmindex::index_common::count_u64_window<kSlots, kBiased, I>(k, cnt, p);
  }
}

// count_u64_window against a plain count, for every count and window size the descents use;
// the words past cnt are garbage (small and huge) that must not be counted.
template <unsigned kSlots, SearchIsa I>
void expect_window_counts(std::mt19937_64& rng) {
  for (int round = 0; round < 200; ++round) {
    alignas(64) std::uint64_t k[16];
    for (auto& w : k) w = rng();
    std::sort(k, k + kSlots);
    for (unsigned cnt = 0; cnt <= kSlots; ++cnt) {
      for (unsigned i = cnt; i < 16; ++i) k[i] = (round % 2) != 0 ? 0 : ~std::uint64_t{0};
      std::vector<std::uint64_t> ps = {0, ~std::uint64_t{0}, rng()};
      for (unsigned i = 0; i < cnt; ++i) ps.insert(ps.end(), {k[i] - 1, k[i], k[i] + 1});
      alignas(64) std::uint64_t biased[16];  // InnerTree's stored form of the same words
      for (unsigned i = 0; i < 16; ++i) biased[i] = k[i] ^ pmindex::index_common::kSignBias;
      for (std::uint64_t p : ps) {
        const auto want = static_cast<unsigned>(std::count_if(
            k, k + cnt, [p](std::uint64_t w) { return w <= p; }));
        ASSERT_EQ((window<kSlots, false, I>(k, cnt, p)), want)
            << "window " << kSlots << ", cnt " << cnt << ", probe " << p;
        ASSERT_EQ((window<kSlots, true, I>(biased, cnt, p)), want)
            << "biased window " << kSlots << ", cnt " << cnt << ", probe " << p;
      }
    }
    // A torn count above the capacity (a reader racing a writer) still answers at most
    // kSlots: descend relies on it to stay inside the node without a bound test.
    for (unsigned cnt : {kSlots + 1, 17u, 31u, 32u, 33u, 47u, 1000u, ~0u}) {
      if (cnt <= kSlots) continue;
      for (std::uint64_t p : {std::uint64_t{0}, ~std::uint64_t{0}, rng()}) {
        ASSERT_LE((window<kSlots, false, I>(k, cnt, p)), kSlots)
            << "window " << kSlots << ", torn cnt " << cnt << ", probe " << p;
      }
    }
  }
}

TEST(NodeSearch, WindowCountsLikeAPlainCount) {
  std::mt19937_64 rng(16);
  expect_window_counts<3, SearchIsa::baseline>(rng);
  expect_window_counts<14, SearchIsa::baseline>(rng);
  expect_window_counts<15, SearchIsa::baseline>(rng);
  expect_window_counts<16, SearchIsa::baseline>(rng);
}

TEST(NodeSearch, Avx2WindowCountsLikeAPlainCount) {
  if (__builtin_cpu_supports("avx2") == 0) GTEST_SKIP() << "this CPU has no AVX2";
  std::mt19937_64 rng(16);
  expect_window_counts<3, SearchIsa::avx2>(rng);
  expect_window_counts<14, SearchIsa::avx2>(rng);
  expect_window_counts<15, SearchIsa::avx2>(rng);
  expect_window_counts<16, SearchIsa::avx2>(rng);
}

INSTANTIATE_TEST_SUITE_P(Fanouts, InnerTreeRouting,
                         ::testing::Values(2u, 3u, 7u, 14u, 15u, 16u, 17u, 31u, 33u, 127u));

}  // namespace

// The DRAM inner-node layer shared by the hybrid indexes (LB+-Tree, FPTree): a B+-tree of
// separator keys over opaque 8-byte leaf words (PM leaf offsets), with a run-time fanout,
// optimistic lock coupling for readers, and a bulk rebuild from a sorted (separator, leaf)
// list at recovery. Nothing here is persistent.
//
// Keys are opaque 8-byte "key words" too: the index decides what they mean (an integer key,
// or a pointer to a DRAM copy of a variable-length key) and passes comparison lambdas:
//   probe_less(word)   true if the search key is < the separator `word`
//   word_less(a, b)    separator order (verify only)
//
// Node (DRAM, 64 B aligned, from pm::DramArena; node_bytes() = 16 + 8 max_keys + 8 (max_keys+1)
// rounded up to 64; 256 B for max_keys = 14):
//   [ 0, 8) OptimisticLock       [ 8,12) count (keys in use)   [12,16) level (1 = children are leaves)
//   [16, 16 + 8 max_keys)      keys[max_keys], each stored biased: word ^ kSignBias
//                              (node_search.h), so the integer search compares them signed
//                              without a vector xor per four keys (5 instructions per level)
//   [.., + 8 (max_keys+1))     children[max_keys+1]: leaf words (level 1) or Node* (level > 1)
// Child i holds the keys k with keys[i-1] <= k < keys[i] (missing bounds are the node's fences).
//
// Thread safety / Invariants:
//   (1) Readers (descend) never write: they read nodes with optimistic_read (olc.h) between
//       readLockOrRestart and checkOrRestart of each node's version, coupling parent and child versions, and
//       restart from the root on any change. The root has no parent version, so after
//       reading its version a reader checks that root_ still names it (a root split
//       publishes the new root before unlocking the old one). A leaf's own version is read by the caller's
//       on_leaf callback *before* the parent is validated, so the leaf was the right one for the
//       probe at a moment when its version was the one returned.
//   (2) Structure modifications (insert_separator, remove_leaf, bulk_build, clear) are
//       serialised by one lock, smo_lock (SMOs are one per leaf split/removal, so this costs
//       little);
//       within an SMO every node that changes is write-locked while it changes, and so is
//       every node on the path between two that change (readers couple parent and child
//       only: remove_leaf's join_left moves an ancestor's fence); a node that
//       splits stays locked until its parent holds the new separator.
//   (3) Nodes are never returned to the arena while the tree lives: a removed node goes to a
//       free list and keeps its version counter (olc.h invariant 3), so an optimistic
//       reader holding a stale pointer reads mapped memory and fails validation.
//   (4) Fences: every key in a node lies in [lo, hi) given by its parent; keys strictly
//       increase; all leaves are at the same depth (checked by verify).
#pragma once

#include <atomic>
#include <bit>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "index/common/node_search.h"
#include "index/common/olc.h"
#include "index/common/prefetch.h"
#include "pmindex/pm/dram_arena.h"
#include "pmindex/sync/spin_lock.h"
#include "pmindex/status.h"

namespace pmindex::index_common {

// The probe of integer key words: the search key is below separator `sep`. Its compare is one
// instruction, so child_index counts small nodes slot by slot for it (other probes compare
// key bytes, where fewer compares win). kIsa: the form of node_search.h's vector count it
// selects (WordProbeIsa<SearchIsa::avx2> only inside a target("avx2") entry point, docs/isa.md).
template <SearchIsa kIsaArg>
struct WordProbeIsa {
  static constexpr SearchIsa kIsa = kIsaArg;
  std::uint64_t word;
  bool operator()(std::uint64_t sep) const { return word < sep; }
};
using WordProbe = WordProbeIsa<kBuiltIsa>;
template <class P>
inline constexpr bool kIsWordProbe = false;
template <SearchIsa I>
inline constexpr bool kIsWordProbe<WordProbeIsa<I>> = true;

class InnerTree {
 public:
  struct Node {
    OptimisticLock lock;
    std::uint32_t count;  // accessed through count()/set_count
    std::uint32_t level;
  };
  static_assert(sizeof(Node) == 16);

  // One step of a root-to-leaf path taken by an SMO: the node and the child index followed.
  struct Step {
    Node* node;
    unsigned index;
  };
  using Path = std::vector<Step>;

  // max_keys: separators per node (fanout - 1). 14 gives 256 B nodes.
  InnerTree(unsigned max_keys, pm::DramArena& arena);
  ~InnerTree();
  InnerTree(const InnerTree&) = delete;
  InnerTree& operator=(const InnerTree&) = delete;

  unsigned max_keys() const { return max_keys_; }
  // A node's bytes for max_keys separators: header, keys, children, rounded up to 64.
  static constexpr std::size_t node_bytes_for(unsigned max_keys) {
    return (sizeof(Node) + 8 * std::size_t{max_keys} + 8 * (std::size_t{max_keys} + 1) + 63) /
           64 * 64;
  }
  std::size_t node_bytes() const { return node_bytes_; }

  // Empty tree: one level-1 root with a single child.
  void init_single(std::uint64_t leaf);
  // Replaces the tree by one built bottom-up from `items` (separator, leaf) in key order; the
  // first separator is ignored (it is the -infinity fence). Nodes are filled to `fill` of
  // their capacity; level-1 nodes are built by `threads` threads. Not concurrent with any
  // other operation.
  void bulk_build(std::span<const std::pair<std::uint64_t, std::uint64_t>> items, double fill,
                  unsigned threads);

  // Optimistic descent (invariant 1). on_leaf(leaf) returns the caller's token (typically the
  // leaf's version) or nullopt to restart. Returns (leaf, token). kKeys: max_keys() if the
  // caller knows it at compile time (the node search and prefetch then have constant trip
  // counts, and integer keys compare four at a time); 0 otherwise.
  template <unsigned kKeys = 0, class ProbeLess, class OnLeaf>
  std::pair<std::uint64_t, std::uint64_t> descend(ProbeLess probe_less, OnLeaf on_leaf) const {
    return descend_impl<kKeys, false>(probe_less, on_leaf, nullptr);
  }
  // The level-1 node a descent ended in, the child index it took and the node's version that
  // validated it: a split that follows the descent inserts its separator there without a
  // second descent if the node is unchanged since (insert_separator_hinted).
  struct ParentHint {
    const Node* node = nullptr;
    std::uint64_t version = 0;
    unsigned index = 0;
  };
  // descend, also filling *hint (not null).
  template <unsigned kKeys = 0, class ProbeLess, class OnLeaf>
  std::pair<std::uint64_t, std::uint64_t> descend(ProbeLess probe_less, OnLeaf on_leaf,
                                                  ParentHint* hint) const {
    return descend_impl<kKeys, true>(probe_less, on_leaf, hint);
  }

  // Interleaved optimistic descents of n <= kMaxBatch independent probes (batched lookups).
  // Each probe is a small state machine advanced one node per round, round-robin over the
  // batch: a step reads the version of a node the previous round prefetched, validates its
  // parent (lock coupling as in descend, invariant 1), searches it, validates it, and
  // prefetches the child it names; the next probe's step then runs while that line is on its
  // way, so the batch's misses overlap. At the leaf level touch(leaf) starts loading what
  // on_leaf(leaf) will read one round later (the leaf's lines, its version). probe_at(i) is
  // probe i's ProbeLess. Writes (leaf, token) to out[i] for the probes that completed and
  // returns the mask of those that met a change (bit i): the caller descends them alone.
  static constexpr std::size_t kMaxBatch = 64;
  template <unsigned kKeys = 0, class ProbeAt, class Touch, class OnLeaf>
  std::uint64_t descend_batch(std::size_t n, ProbeAt probe_at, Touch touch, OnLeaf on_leaf,
                              std::pair<std::uint64_t, std::uint64_t>* out) const;

  // --- structure modifications (serialised; invariant 2) -----------------------------------
  // A spin lock (spinning, then yielding), not a std::mutex: an SMO holds it for a
  // microsecond or so, and the mutex's lock and unlock calls were ~100 instructions of an
  // LB+-Tree split (issue 16, callgrind). Its waits are scheduling points, so the crash
  // simulator's deterministic scheduler never stalls on it.
  std::unique_lock<sync::SpinLock> smo_lock() const {
    return std::unique_lock<sync::SpinLock>(smo_mu_);
  }
  // With smo_lock held: the path from the root to the level-1 node whose child covers the probe.
  // kKeys as for descend (integer keys then count a node by vector compares).
  template <unsigned kKeys = 0, class ProbeLess>
  void path_to(ProbeLess probe_less, Path* path) const;
  // With smo_lock held and `path` from path_to(probe of a key in `left`): inserts separator
  // `sep` and child `right` just after the child `left`. Returns false if `left` is not the
  // child the path ends in (the caller's probe was wrong) or DRAM is exhausted.
  bool insert_separator(Path& path, std::uint64_t left, std::uint64_t sep, std::uint64_t right);
  // With smo_lock held: insert_separator into the hint's node if it is still the node the
  // descent validated (same version, so `left` is still its child at the hint's index) and has
  // room. Returns false, changing nothing, otherwise: the caller then takes path_to's path.
  bool insert_separator_hinted(const ParentHint& hint, std::uint64_t left, std::uint64_t sep,
                               std::uint64_t right);
  // With smo_lock held: removes the leaf child the path ends in (its range joins a neighbour).
  // Returns false (and changes nothing) if it is the only leaf of the tree. On success, if
  // `dropped` is given, *dropped is the separator word that left the tree (exactly one does);
  // optimistic readers may still hold it, so the index frees what it points to through its
  // epoch manager (SeparatorStore::retire).
  // join_left: the leaf's range always joins its left neighbour (the leaf's keys moved there,
  // a merge); if the leaf is the first child of its node, the nearest ancestor fence below it
  // moves up to the node's first separator instead. Returns false for the first leaf.
  bool remove_leaf(Path& path, std::uint64_t leaf, std::uint64_t* dropped = nullptr,
                   bool join_left = false);
  // With smo_lock held: the leaf just left of the path's leaf, or 0 if it is the first leaf.
  std::uint64_t left_neighbour(const Path& path) const;

  // --- inspection (quiescent) -----------------------------------------------------------------
  // Checks invariant 4 and visits the leaves in order with their fences (nullptr = unbounded).
  Status verify(const std::function<bool(std::uint64_t, std::uint64_t)>& word_less,
                const std::function<Status(std::uint64_t leaf, const std::uint64_t* lo,
                                           const std::uint64_t* hi)>& on_leaf) const;
  // Every separator word in the tree (the index frees what the words point to).
  void for_each_separator(const std::function<void(std::uint64_t)>& fn) const;
  std::uint64_t height() const;
  std::uint64_t dram_bytes() const { return arena_.bytes_in_use(); }

 private:
  std::uint64_t* keys(Node* n) const { return reinterpret_cast<std::uint64_t*>(n + 1); }
  const std::uint64_t* keys(const Node* n) const {
    return reinterpret_cast<const std::uint64_t*>(n + 1);
  }
  std::uint64_t* children(Node* n) const { return keys(n) + max_keys_; }
  const std::uint64_t* children(const Node* n) const { return keys(n) + max_keys_; }
  static std::uint32_t count(const Node* n) {
    return optimistic_read(n->count);
  }
  static void set_count(Node* n, std::uint32_t c) {
    locked_write(n->count, c);
  }
  static std::uint32_t level(const Node* n) {
    return optimistic_read(n->level);
  }
  static void set_level(Node* n, std::uint32_t l) {
    locked_write(n->level, l);
  }
  // Integer-key searches count the last this many slots (node_search.h).
  static constexpr unsigned kLinearKeys = 16;
  // Whether child_index<kKeys> with this probe returns at most kKeys for any count read
  // (count_u64_window clamps a torn count), so descend needs no separate bound test.
  template <unsigned kKeys, class ProbeLess>
  static constexpr bool kClampsCount =
      kKeys != 0 && kKeys <= kLinearKeys && kIsWordProbe<ProbeLess>;
  template <unsigned kKeys, class ProbeLess>
  unsigned child_index(const Node* n, unsigned cnt, ProbeLess probe_less) const;
  // All lines of a node at once: the binary search would otherwise miss on them one by one.
  void prefetch_node(const Node* n) const { prefetch_lines(n, node_bytes_); }

  // Allocates a node, locked (invariant 3: a recycled node keeps its counter).
  Node* new_node(std::uint32_t lvl);
  void retire_node(Node* n);  // with n locked: unlock obsolete, onto the free list
  // `stored_sep` is biased (keys' stored form): a split passes its middle key up unchanged.
  bool insert_at(Path& path, std::size_t depth, std::uint64_t stored_sep, std::uint64_t right);
  // insert_at's case of a node with room: the separator and child go in after child idx.
  void insert_into(Node* n, unsigned idx, unsigned cnt, std::uint64_t stored_sep,
                   std::uint64_t right);
  // kHint: fill *hint (a separate instantiation, so lookups carry no hint code).
  template <unsigned kKeys, bool kHint, class ProbeLess, class OnLeaf>
  std::pair<std::uint64_t, std::uint64_t> descend_impl(ProbeLess probe_less, OnLeaf on_leaf,
                                                       ParentHint* hint) const;
  bool remove_at(Path& path, std::size_t depth, std::uint64_t* dropped, bool join_left);
  Status verify_node(const Node* n, const std::uint64_t* lo, const std::uint64_t* hi,
                     std::uint32_t want_level,
                     const std::function<bool(std::uint64_t, std::uint64_t)>& word_less,
                     const std::function<Status(std::uint64_t, const std::uint64_t*,
                                                const std::uint64_t*)>& on_leaf) const;

  const unsigned max_keys_;
  const std::size_t node_bytes_;
  pm::DramArena& arena_;
  std::atomic<Node*> root_{nullptr};  // release on change, acquire in descend
  mutable sync::SpinLock smo_mu_;
  std::vector<Node*> free_nodes_;     // under smo_mu_
};

// --- templates ---------------------------------------------------------------------------------

template <unsigned kKeys, class ProbeLess>
[[gnu::always_inline]] inline unsigned InnerTree::child_index(const Node* n, unsigned cnt,
                                                          ProbeLess probe_less) const {
  // The number of separators <= probe (keys strictly increase), by node_search.h. Integer keys
  // count the last 16 slots (the whole node for LB+-Tree's 14 keys): LB+-Tree lookups after a
  // 10M-key bulk load x1.16, FPTree's x1.05 (medians of four interleaved pairs,
  // docs/performance-history.md).
  const std::uint64_t* k = keys(n);
  const auto sep = [k](unsigned i) { return optimistic_read(k[i]) ^ kSignBias; };
  constexpr bool kWords = kIsWordProbe<ProbeLess>;
  if constexpr (kWords && kKeys != 0) {
    // Capacity known: node_search.h's vector window. It reads up to 16 words past the count;
    // they stay inside the node, whose children follow its keys.
    return count_u64_not_above<kKeys, /*kBiased=*/true, ProbeLess::kIsa>(k, cnt,
                                                                         probe_less.word);
  } else {
    constexpr unsigned kWindow = kWords ? kLinearKeys : 0;
    return count_not_above<kWindow>(cnt, kKeys != 0 ? kKeys : max_keys_, sep, probe_less);
  }
}

template <unsigned kKeys, bool kHint, class ProbeLess, class OnLeaf>
std::pair<std::uint64_t, std::uint64_t> InnerTree::descend_impl(ProbeLess probe_less,
                                                               OnLeaf on_leaf,
                                                               ParentHint* hint) const {
  constexpr bool kFixed = kKeys != 0;
  const unsigned max_keys = kFixed ? kKeys : max_keys_;
  assert(!kFixed || kKeys == max_keys_);
  for (;;) {
    const Node* n = root_.load(std::memory_order_acquire);
    bool restart = false;
    std::uint64_t v = n->lock.readLockOrRestart(restart);
    // The root has no parent whose version covers it. readLockOrRestart waits out a locked
    // node, so a root split may have finished meanwhile: n then holds only the lower half of
    // its keys, under a fresh version. insert_at publishes the new root before it unlocks n,
    // so a root_ that still names n proves no root split ended before v was read.
    if (!restart && root_.load(std::memory_order_acquire) != n) restart = true;
    while (!restart) {
      const unsigned cnt = count(n);
      // A torn count of a changing node (validation fails anyway) must not send the search
      // out of the node; the whole-node vector count clamps it by itself (node_search.h).
      if (!kClampsCount<kKeys, ProbeLess> && cnt > max_keys) break;
      const unsigned idx = child_index<kKeys>(n, cnt, probe_less);
      const std::uint64_t* const ch = keys(n) + max_keys;  // children(n), max_keys constant
      const std::uint64_t child = optimistic_read(ch[std::size_t{idx}]);
      const std::uint32_t lvl = level(n);
      n->lock.checkOrRestart(v, restart);  // child and level are consistent
      if (restart) break;
      if (lvl == 1) {
        const std::optional<std::uint64_t> token = on_leaf(child);
        if (!token) break;
        n->lock.checkOrRestart(v, restart);
        if (restart) break;
        if constexpr (kHint) *hint = ParentHint{n, v, idx};
        return {child, *token};
      }
      const Node* c = reinterpret_cast<const Node*>(child);
      if constexpr (kFixed) {
        // Constant counts (unrolled). A node counted whole (kKeys <= kLinearKeys) loads its
        // key lines at once by itself (independent loads overlap): prefetch the lines from
        // the children on, whose load waits for the search. A larger node's binary steps read
        // key lines one after another: prefetch its key lines (one child line then misses at
        // the end; FPTree's 2 KiB node has 33 lines, and the inner nodes of a 10M-key FPTree
        // fit in L3 anyway).
        constexpr std::size_t kKeyEnd = sizeof(Node) + 8 * std::size_t{kKeys};
        constexpr std::size_t kFrom = kKeys <= kLinearKeys ? kKeyEnd / 64 * 64 : 0;
        constexpr std::size_t kTo = kKeys <= kLinearKeys ? node_bytes_for(kKeys) : kKeyEnd;
        prefetch_lines(reinterpret_cast<const char*>(c) + kFrom, kTo - kFrom);
      } else {
        prefetch_node(c);
      }
      const std::uint64_t cv = c->lock.readLockOrRestart(restart);
      n->lock.checkOrRestart(v, restart);
      n = c;
      v = cv;
    }
    olc_pause();
  }
}

template <unsigned kKeys, class ProbeAt, class Touch, class OnLeaf>
std::uint64_t InnerTree::descend_batch(std::size_t n, ProbeAt probe_at, Touch touch,
                                       OnLeaf on_leaf,
                                       std::pair<std::uint64_t, std::uint64_t>* out) const {
  assert(n <= kMaxBatch);
  constexpr bool kFixed = kKeys != 0;
  const unsigned max_keys = kFixed ? kKeys : max_keys_;
  // Per probe: the node to step next (an inner node, or the leaf word once `at_leaf`), and
  // the node above it with the version its step validated (nullptr above the root).
  struct Cursor {
    const Node* parent;
    std::uint64_t parent_version;
    std::uint64_t next;
    bool at_leaf;
  };
  Cursor cur[kMaxBatch];
  // acquire: as descend (the root a reader finds is fully built); each probe's first step
  // re-checks that root_ still names it.
  const Node* root = root_.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < n; ++i)
    cur[i] = Cursor{nullptr, 0, reinterpret_cast<std::uint64_t>(root), false};
  std::uint64_t live = n == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << n) - 1;
  std::uint64_t failed = 0;
  while (live != 0) {
    for (std::uint64_t m = live; m != 0; m &= m - 1) {
      const auto i = static_cast<std::size_t>(std::countr_zero(m));
      Cursor& c = cur[i];
      bool restart = false;
      if (c.at_leaf) {
        // The leaf's version, read before its parent validates (as descend's on_leaf).
        const std::optional<std::uint64_t> token = on_leaf(c.next);
        if (token) c.parent->lock.checkOrRestart(c.parent_version, restart);
        if (!token || restart) failed |= std::uint64_t{1} << i;
        else out[i] = {c.next, *token};
        live &= ~(std::uint64_t{1} << i);
        continue;
      }
      const Node* nd = reinterpret_cast<const Node*>(c.next);
      const std::uint64_t v = nd->lock.readLockOrRestart(restart);
      if (c.parent != nullptr) c.parent->lock.checkOrRestart(c.parent_version, restart);
      else if (!restart && root_.load(std::memory_order_acquire) != nd) restart = true;  // as descend
      const unsigned cnt = restart ? 0 : count(nd);
      if (!restart && cnt <= max_keys) {
        const unsigned idx = child_index<kKeys>(nd, cnt, probe_at(i));
        const std::uint64_t child = optimistic_read(keys(nd)[std::size_t{max_keys} + idx]);
        const std::uint32_t lvl = level(nd);
        nd->lock.checkOrRestart(v, restart);  // child and level are consistent
        if (!restart) {
          c = Cursor{nd, v, child, lvl == 1};
          if (lvl == 1) touch(child);
          else prefetch_node(reinterpret_cast<const Node*>(child));
          continue;
        }
      }
      failed |= std::uint64_t{1} << i;
      live &= ~(std::uint64_t{1} << i);
    }
  }
  return failed;
}

template <unsigned kKeys, class ProbeLess>
void InnerTree::path_to(ProbeLess probe_less, Path* path) const {
  assert(kKeys == 0 || kKeys == max_keys_);
  path->clear();
  Node* n = root_.load(std::memory_order_acquire);
  for (;;) {
    const unsigned idx = child_index<kKeys>(n, count(n), probe_less);
    path->push_back({n, idx});
    if (level(n) == 1) return;
    n = reinterpret_cast<Node*>(optimistic_read(children(n)[idx]));
  }
}

}  // namespace pmindex::index_common

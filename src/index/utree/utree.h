// uTree (Chen et al., PVLDB 13(11) 2020): a DRAM B+-tree (the "array layer") over a sorted,
// singly linked list of PM nodes, one node per record (the "list layer"). Structure
// modifications touch DRAM only; PM work per insert is one node plus one linking CAS.
// Persistence steps: PROTOCOL.md (cited in code as `// Un:`); layouts: layout.h.
//
// Thread safety: every operation may run concurrently.
//   * Inner nodes: optimistic lock coupling (index_common::InnerTree contract).
//   * DRAM leaves: an OptimisticLock each. Writers (insert, update, remove) hold the write lock
//     of the leaf covering their key for the whole operation, list work included, so every
//     list node in a leaf's key range is changed only by that leaf's holder. Readers (find,
//     scan) read leaf words and the PM words of the nodes they name with optimistic_read and
//     validate the leaf version, so they never see a record whose persist is still to come.
//   * The list is shared across leaf boundaries: the predecessor of a leaf's first key lives in
//     a leaf to the left. Inserters find it by walking the list (Harris-style: mark bit on
//     next, CAS to link and unlink) from a node read in a validated leaf snapshot; a dirty bit
//     on a fresh link makes anyone who walks or builds on it persist it first (W1).
//   * Lock order: a leaf, then its left neighbour (only to remove an emptied leaf, L1), then
//     the InnerTree SMO mutex. A writer reads leaves to its LEFT optimistically (spinning
//     while they are locked) and never waits for a leaf to its right, so waits form no cycle;
//     it waits for the leaf its prev hint names only while the hint still names it (a stale
//     hint may name a leaf reused to its right).
//   * Nodes, key records and value records leave through the epoch manager (U9/K3): writers
//     (list walkers) are pinned while they hold an offset, readers while they read records
//     (pin_for_records); a reader of integer keys with inline values reads only node words,
//     which are pool memory even if freed, and its validation fails if the node was removed.
//   * DRAM leaves are type-stable (L1-L4): a remove that empties a leaf other than the first,
//     or leaves it at most a quarter full with room in its left neighbour (a merge), takes it
//     out of the chain and the inner tree and unlocks it obsolete (every optimistic reader of
//     it restarts); it goes to a free list that new_leaf draws from before the
//     arena, and its lock word only grows. So a stale leaf pointer (an unpinned reader's, a
//     prev hint, a scan's next) always names a leaf, whose version tells whether it changed:
//     descents validate the parent after the leaf's version, scans re-check the left leaf's
//     version after reading the next one's, and walk_start accepts a start node from the leaf
//     its prev hint named only if the hint still names it and the node's key lies below the
//     key (L4). Chosen over retiring leaves through the epochs, which would make every reader
//     pin (the argument: PROTOCOL.md, L1-L4).
//   * verify(), bulk_load() and close() expect no concurrent operations.
// Invariants (checked by verify()):
//   (1) the list from root.head is in bounds, keys strictly increase, no mark or dirty bit,
//       every link carries the tag of the node it names and the list ends at kListEnd (R1t);
//   (2) the DRAM leaves, left to right, hold exactly the list's nodes in list order, each
//       entry's key word equal to its node's; the inner tree's leaves are the leaf chain and
//       every key lies within its inner fences; prev hints agree with the chain; no leaf but
//       the first is empty (L1);
//   (3) the PM bytes reachable from the root equal the allocator's bytes in use.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "index/common/inner_tree.h"
#include "index/common/key_codec.h"
#include "index/common/separator_store.h"
#include "index/common/value_codec.h"
#include "index/utree/layout.h"
#include "pmindex/index.h"
#include "pmindex/pm/dram_arena.h"
#include "pmindex/sync/epoch.h"
#include "pmindex/sync/spin_lock.h"

namespace pmindex::utree {

inline constexpr std::uint32_t kMaxKeyBytes = 8192;
inline constexpr unsigned kInnerKeys = 14;  // 256 B DRAM inner nodes

// The production protocol. Tests instantiate UTree with known-bad policies (a checker must be
// able to fail); the library never contains them.
struct Protocol {
  // The original's order: enter the key in the DRAM leaf and unlock, then link the node with
  // the predecessor taken from that DRAM snapshot (its lost-key race).
  static constexpr bool kPublishBeforeLink = false;
  // U3 after the unlock: the key is in the DRAM leaf (readers find it, inserters link behind
  // it) before its link is durable.
  static constexpr bool kUnlockBeforePersist = false;
  // walk_start trusts the leaf its prev hint names once that leaf's snapshot validates: no
  // check that prev still names it and that its last key lies below the key (L4), so a leaf
  // removed and reused meanwhile (L3) hands out a start node to the right of the key.
  static constexpr bool kUncheckedLeafReuse = false;
  // A scan steps to the leaf its current leaf's next named without checking the current leaf
  // again after reading the next one's version (L4): a next removed and reused meanwhile
  // sends the scan to wherever the reused leaf now lies.
  static constexpr bool kUncoupledScan = false;
  // Recovery and verify() follow links without R1t's checks: the tag in a link is not compared
  // with the node it names, and any link naming offset 0 ends the list (the untagged format's
  // reading), so a zeroed or redirected link reads as a shorter list.
  static constexpr bool kUncheckedLinks = false;
};

// Registry entry points.
pm::Layout layout_for(const Options& options);
Status validate(const Options& options);  // before any file is touched
std::size_t default_pool_size(const Options& options);
Result<std::unique_ptr<Index>> create(std::unique_ptr<pm::Pool> pool, const Options& options);
Result<std::unique_ptr<Index>> recover(std::unique_ptr<pm::Pool> pool, const Options& options);

template <class Policy = Protocol>
class UTree final : public Index {
 public:
  static Result<std::unique_ptr<Index>> create(std::unique_ptr<pm::Pool> pool,
                                               const Options& options);
  static Result<std::unique_ptr<Index>> recover(std::unique_ptr<pm::Pool> pool,
                                                const Options& options);

  ~UTree() override;
  std::string_view kind() const override { return "utree"; }
  Code insert(std::string_view key, std::string_view value) override;
  Code update(std::string_view key, std::string_view value) override;
  Code find(std::string_view key, std::string* value) const override;
  void find_batch(const std::string_view* keys, std::string* values, Code* codes,
                  std::size_t n) const override;
  Code remove(std::string_view key) override;
  std::size_t scan(std::string_view start, std::size_t max, ScanBuffer& out) const override;
  Status bulk_load(std::span<const KeyValue> sorted, double fill) override;
  Status verify() const override;
  RecoveryStats recovery_stats() const override { return recovery_; }
  Footprint footprint() const override;
  Status close() override;
  const pm::Pool& pool() const override { return *pool_; }
  ThreadScope attach_thread() override;

  // Tests: the keys of the PM list in list order (quiescent), and deliberate damage so a test
  // can see verify() notice it: 0 swaps two list keys, 1 points a DRAM entry at another node,
  // 2 leaves a dirty bit on a link, 3 empties the second DRAM leaf (L1 not done).
  std::vector<std::string> list_keys_for_testing() const;
  void corrupt_for_testing(int what);
  std::uint32_t leaf_capacity() const { return cap_; }
  // Leaves removed from the array layer while open (L1; merged: those that still had entries),
  // and those now on the free list.
  std::uint64_t leaves_unlinked_for_testing() const {
    return leaves_unlinked_.load(std::memory_order_relaxed);
  }
  std::uint64_t leaves_merged_for_testing() const {
    return leaves_merged_.load(std::memory_order_relaxed);
  }
  std::size_t free_leaves_for_testing() const {
    std::lock_guard<sync::SpinLock> g(free_leaves_mu_);
    return free_leaves_.size();
  }
  // Skip hints (R0/R4): the stride used when hints are written next (tests use small ones),
  // and what the last recovery did with the hints it found.
  void set_hint_stride_for_testing(std::uint64_t stride) { hint_stride_ = stride; }
  // Writes hints now from the DRAM leaves, as close() does (quiescent index).
  void refresh_hints_for_testing();
  struct HintStats {
    std::uint64_t read = 0;      // hints in the block (0: no usable block)
    std::uint64_t used = 0;      // segments counted: segment 0 and each hint reached by links
    std::uint64_t ignored = 0;   // hints out of bounds, misaligned or never reached
  };
  HintStats hint_stats() const { return hint_stats_; }

 private:
  // A search key prepared once per operation: the key word (integer modes) or the 8-byte
  // prefix (bytes mode), and the key's bytes.
  struct Probe {
    std::uint64_t word = 0;
    std::string_view bytes;
  };
  // A link word's owner: 0 is root.head, anything else a list node.
  using NodeOff = std::uint64_t;
  struct Pred {
    NodeOff node;        // predecessor (0: root.head)
    std::uint64_t word;  // its link word as read: clean, unmarked, naming the successor
  };

  UTree(std::unique_ptr<pm::Pool> pool, std::uint32_t node_size);
  Status init_root(const Options& o);
  void configure(const Root& r);
  void init_dram();

  // keys and nodes
  Probe probe(std::string_view key) const;
  ListNode* node_at(NodeOff off) const { return pool_->at<ListNode>(off); }
  std::uint64_t* link_of(NodeOff off) const {
    return off == 0 ? &root_->head : &node_at(off)->next;
  }
  bool node_in_pool(NodeOff off) const { return off != 0 && off + node_bytes_ <= pool_->extent(); }
  // R1t: a node's tag (its key word and key record never change while it is linked), and the
  // clean link word naming the node at off. Quiescent or own (not yet linked) nodes only.
  std::uint64_t tag_of(const ListNode* n) const {
    return node_tag(n->key, bytes_ ? n->key_record : 0);
  }
  std::uint64_t link_to(NodeOff off) const { return make_link(off, tag_of(node_at(off))); }
  // Sign of (probe - key of node / entry): prefix words first, key records on a tie.
  int compare_node(const Probe& p, NodeOff off) const;
  int compare_entry(const Probe& p, std::uint64_t word, std::uint32_t idx) const;
  std::string node_key(NodeOff off) const;  // quiescent / validated use
  NodeOff make_node(const Probe& p, std::string_view value, Code* code);
  void write_next(NodeOff node, std::uint64_t next);
  void free_node_now(NodeOff off);
  static void free_node(void* self, std::uint64_t off);

  // DRAM leaves
  Leaf* new_leaf(bool locked);
  static Leaf* leaf_of(std::uint64_t word) { return reinterpret_cast<Leaf*>(word); }
  static Leaf* prev_hint(const Leaf* l);
  static void set_prev_hint(Leaf* l, Leaf* prev);
  // lower_bound of p in l (optimistic reads); *found if the entry there equals p.
  unsigned search(const Leaf* l, const Probe& p, bool* found) const;
  std::optional<std::uint64_t> leaf_version(std::uint64_t lw) const;
  std::pair<std::uint64_t, std::uint64_t> descend_read(const Probe& p) const;
  Leaf* lock_leaf(const Probe& p);
  Leaf* split(Leaf* l, const Probe& p);
  void enter(Leaf* l, unsigned pos, std::uint64_t word, NodeOff node);
  void erase(Leaf* l, unsigned pos);
  bool leave_or_merge(Leaf* l, const Probe& p);

  // the list
  NodeOff walk_start(const Leaf* l, unsigned pos, const Probe& p) const;
  bool walk(NodeOff start, const Probe& p, Pred* out);
  std::uint64_t settle(std::uint64_t* link, std::uint64_t w);
  Pred find_pred(const Leaf* l, unsigned pos, const Probe& p);
  void link_published_first(NodeOff start, NodeOff node);  // Policy::kPublishBeforeLink

  // Readers pin only when they read PM records (bytes keys, out-of-line values): node words
  // of a node freed under an unvalidated read are mapped pool memory read atomically, and the
  // validation that follows fails (the remove changed the leaf's version before the retire).
  std::optional<sync::EpochManager::Guard> pin_for_records() const {
    if (!bytes_ && values_.inline_values()) return std::nullopt;
    return epochs_.pin();
  }
  Code find_word(std::string_view key, std::string* value) const;
  Code insert_once(std::string_view key, std::string_view value);
  Code update_once(std::string_view key, std::string_view value);

  // recovery and verification
  struct Segment;
  struct LeafRun;
  Status rebuild(unsigned threads);
  std::vector<NodeOff> read_hints(std::uint64_t* raw) const;
  void walk_segment(Segment& seg, NodeOff stop) const;
  std::size_t count_segments(std::vector<Segment>& segs, Status* error);
  Status mark_segment(const Segment& seg) const;
  Status mark_all(const std::vector<Segment>& segs, std::size_t used);
  void fill_run(const Segment& seg, std::size_t per_leaf, LeafRun* run);
  void build_from_runs(std::vector<LeafRun>& runs, unsigned threads);
  void repair_links(std::vector<Segment>& segs, const std::vector<LeafRun>& runs,
                    std::uint64_t head);
  std::vector<NodeOff> hint_picks() const;
  Status check_counts(const std::vector<Segment>& segs, std::size_t used) const;
  void count_list(std::uint64_t* records, std::uint64_t* nodes) const;
  void write_hints(const std::vector<NodeOff>& picks);
  void build_dram(const std::vector<std::pair<std::uint64_t, NodeOff>>& entries, double fill);
  std::uint64_t separator_for(std::uint64_t word, NodeOff node);
  Status verify_list(std::vector<NodeOff>* nodes, std::uint64_t* reachable) const;

  std::unique_ptr<pm::Pool> pool_;
  Root* root_ = nullptr;
  index_common::KeyCodec keys_;
  index_common::ValueCodec values_;
  bool bytes_ = false;
  std::size_t node_bytes_ = kNodeBytesWord;
  const std::uint32_t node_size_;
  const std::uint32_t cap_;
  pm::DramArena arena_;
  index_common::InnerTree inner_;
  index_common::SeparatorStore seps_;
  Leaf* first_leaf_ = nullptr;
  // Leaves removed while open (L2), reused by new_leaf before the arena (L3): type-stable, a
  // leaf's memory stays a leaf and its lock word only grows while the tree lives.
  mutable sync::SpinLock free_leaves_mu_;
  std::vector<Leaf*> free_leaves_;
  std::atomic<std::uint64_t> leaves_unlinked_{0};
  std::atomic<std::uint64_t> leaves_merged_{0};
  // Retired nodes and records. Declared after pool_ and seps_: destroyed first, its pending
  // deleters still find them.
  mutable sync::EpochManager epochs_;
  RecoveryStats recovery_;
  HintStats hint_stats_;
  std::uint64_t hint_stride_ = kHintStride;
  std::uint64_t hint_block_ = 0;  // the hint block this session wrote (0: none)
  std::size_t hint_bytes_ = 0;
  bool closed_ = false;
};

}  // namespace pmindex::utree

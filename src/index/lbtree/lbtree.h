// LB+-Tree (paper 001): PM leaves of M x 256 B with distributed and alternative headers, DRAM
// inner nodes (index_common::InnerTree), entry-moving inserts, logless splits, crash-safe
// removal of empty leaves. Persistence steps: PROTOCOL.md (cited in code as `// P3: ...`).
//
// Thread safety: every operation may run concurrently.
//   * Inner nodes: optimistic lock coupling (InnerTree contract).
//   * Leaves: a DRAM version per leaf (LeafVersions, indexed by pool offset / 256) is the
//     writer lock and the readers' seqlock; a writer CASes it from the version it saw while
//     its parent was still valid (so the leaf is still the right one, and still a leaf: a
//     freed leaf is obsolete), then sets the PM lock bit as the paper does, with a release
//     store (only the version lock's holder writes word0; a CAS would be a second locked
//     instruction per write).
//     Readers never write; they read leaf words with `optimistic_read` (acquire) and validate.
//   * Lock order: leaf (then its left neighbour, try-lock only) -> InnerTree SMO mutex.
//     Nobody waits for a leaf lock while holding the SMO mutex.
//   * Separator copies and PM key/value records (bytes keys, out-of-line values): operations
//     pin the epoch manager; a separator that an unlink removes from the inner tree and a
//     record whose slot was removed or overwritten are retired and freed once no pinned reader
//     can hold them (K3). A leaf block that a merge or unlink drops (J6/U4) is retired the
//     same way in those modes (a pinned reader may follow a word it read there before it
//     validates); with integer keys and inline values it is freed at once: its DRAM version
//     only grows, so a stale reader of a recycled leaf fails validation.
//   * verify() first frees what is retired (drain), so reachability matches the allocator.
//   * verify(), bulk_load() and close() expect no concurrent operations.
// Invariants (checked by verify()):
//   (1) the leaf chain from root.head is acyclic, in bounds, and its leaves appear in the same
//       order as the inner tree's leaves; every key of a leaf lies within the inner fences;
//   (2) keys strictly increase within (sorted) and across leaves; each valid slot's
//       fingerprint is the hash of its whole key;
//   (3) the head leaf is never removed; other leaves are non-empty except transiently;
//   (4) the PM bytes reachable from the root equal the allocator's bytes in use.
#pragma once

#include <array>
#include <atomic>
#include <cstdlib>
#include <type_traits>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "index/common/chain_tag.h"
#include "index/common/inner_tree.h"
#include "index/common/key_codec.h"
#include "index/common/close_counts.h"
#include "index/common/root_stamp.h"
#include "index/common/leaf_recovery.h"
#include "index/common/leaf_versions.h"
#include "index/common/scan_assembly.h"
#include "index/common/separator_store.h"
#include "index/lbtree/layout.h"
#include "pmindex/index.h"
#include "pmindex/pm/dram_arena.h"
#include "pmindex/sync/epoch.h"

namespace pmindex::lbtree {

// Documented limits (README / PROTOCOL.md): keys of KeyType::bytes are 0..kMaxKeyBytes bytes
// (the empty key included); values are exactly 8 bytes inline (max_value_size = 8), or
// 0..kMaxValueBytes bytes out of line (max_value_size > 8).
inline constexpr std::uint32_t kMaxKeyBytes = 8192;
inline constexpr std::uint32_t kMaxValueBytes = 65536;
inline constexpr unsigned kInnerKeys = 14;  // 256 B DRAM inner nodes

// Registry entry points (dispatch on the node size to the instantiations).
pm::Layout layout_for(const Options& options);
Status validate(const Options& options);  // before any file is touched
std::size_t default_pool_size(const Options& options);
Result<std::unique_ptr<Index>> create(std::unique_ptr<pm::Pool> pool, const Options& options);
Result<std::unique_ptr<Index>> recover(std::unique_ptr<pm::Pool> pool, const Options& options);

template <unsigned M>
class LBTree final : public Index {
 public:
  using LeafT = Leaf<M>;
  static Result<std::unique_ptr<Index>> create(std::unique_ptr<pm::Pool> pool,
                                               const Options& options);
  static Result<std::unique_ptr<Index>> recover(std::unique_ptr<pm::Pool> pool,
                                                const Options& options);

  ~LBTree() override;
  std::string_view kind() const override { return "lbtree"; }
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
  // Registers the calling thread with the epoch manager (bytes keys pin it per operation).
  ThreadScope attach_thread() override;

  // Experiment hook for the Theorem 3.5 reproduction (tests/index/lbtree/test_lbtree_pm_work.cpp),
  // not a production mode: the paper's "traditional" design of Fig. 8b - an insert takes the
  // first empty slot and never moves entries, a split packs the new leaf from slot 0. Set it
  // before any operation; it is not persistent and not thread-safe to change.
  void set_traditional_inserts(bool on) { traditional_ = on; }

  // Leaf merges done since open (J1-J6; unlinks of empty leaves are not counted), for tests
  // that must see merges happen (the crash suite's SmoTally, the pool-full tests).
  std::uint64_t merges() const { return merges_.load(std::memory_order_relaxed); }

  // Known-bad variant for the crash tests (a checker must be able to fail). Only in the
  // tracing flavour (the crash simulator's build); elsewhere fault_ is a constant `none`.
  enum class Fault : int {
    none,
    merge_unlink_first,  // J4 split in two NAWs: the unlink (alt flip) commits before the
                         // moved entries' bits, so a crash in between loses the right leaf's keys
  };
  void set_fault_for_testing(Fault f) {
    if (f != Fault::none && !pm::kTracing) std::abort();  // tracing flavour only
    fault_ = f;
  }

  // Time spent rebuilding the DRAM inner nodes at the last recovery (part of seconds).
  double rebuild_seconds() const { return rebuild_seconds_; }
  std::uint64_t leaf_count() const;
  // Records and leaves on the chain, for the clean-close counts (quiescent).
  void count_chain(std::uint64_t* records, std::uint64_t* leaves) const;

 private:
  // A search key prepared once per operation (key modes: index_common::KeyCodec).
  using Probe = index_common::KeyCodec::Probe;
  struct SlotRef {
    int block = -1;
    unsigned slot = 0;
    DWord header{};              // the block's active header as read
  };
  struct Pending {               // records to free once a slot's removal is persisted (K3)
    std::uint64_t key_record = 0;
    std::uint64_t value_record = 0;
  };

  explicit LBTree(std::unique_ptr<pm::Pool> pool);
  Status init_root(const Options& o);
  void init_dram();

  // keys (the rest is keys_) and values
  // The probe of a checked key: integer keys are decoded inline (KeyCodec::probe is out of
  // line with a mode test per step).
  Probe probe(std::string_view key) const {
    return keys_.bytes_mode() ? keys_.probe(key) : index_common::KeyCodec::probe_word(key);
  }
  std::uint64_t make_separator(std::uint64_t key_word);
  Code check_value(std::string_view value) const;
  bool read_value(std::uint64_t value_word, std::string* out) const;

  // leaves
  LeafT* leaf_at(std::uint64_t off) const { return pool_->at<LeafT>(off); }
  static std::uint64_t* active_header(LeafT* l, unsigned b, bool alt) {
    return (b == 0 || !alt) ? l->block[b].front : l->block[b].tail;
  }
  static std::uint64_t* inactive_header(LeafT* l, unsigned b, bool alt) {
    return alt ? l->block[b].front : l->block[b].tail;
  }
  [[gnu::always_inline]] static inline DWord load_header(const std::uint64_t* h);
  // The sibling word the alt bit selects (layout.h: successor offset and tag, own tag).
  static std::uint64_t active_sibling(const LeafT* l);
  // Its successor's offset (0 at the end of the chain).
  std::uint64_t next_leaf(std::uint64_t off) const { return sib_off(active_sibling(leaf_at(off))); }
  // R1b / verify: every active sibling word names its successor's own tag, the last one the
  // end mark (layout.h), so a sibling word damaged or redirected is refused after any end.
  Status check_sibling_tags(const std::vector<std::uint64_t>& leaves) const;
  static unsigned header_line(unsigned b, bool alt) { return (b == 0 || !alt) ? 0 : 3; }
  SlotRef find_slot(LeafT* l, const Probe& p) const;
  template <class Match>
  SlotRef find_slot_if(LeafT* l, std::uint8_t fp, Match match) const;
  // u64/f64 keys, inline values: find_word_t in the two forms of the inner search
  // (docs/isa.md), chosen by search_avx2_.
  template <index_common::SearchIsa I>
  [[gnu::always_inline]] inline Code find_word_t(std::string_view key, std::string* value) const;
  // flatten: the key check inlined into both (g++ otherwise kept it a call, ~9 instructions).
  [[gnu::noinline, gnu::flatten]] Code find_word(std::string_view key, std::string* value) const;
  PMINDEX_AVX2_ENTRY [[gnu::noinline, gnu::flatten]] Code find_word_avx2(std::string_view key,
                                                                         std::string* value) const;
  [[gnu::noinline]] Code find_general(std::string_view key, std::string* value) const;
  // find_batch for integer keys with inline values: InnerTree::descend_batch, then the leaf
  // searches of the batch in one pass (their lines were prefetched a round earlier).
  void find_batch_word(const std::string_view* keys, std::string* values, Code* codes,
                       std::size_t n) const;
  // The other modes (byte-string keys, out-of-line values): the same passes, find_general's reads.
  void find_batch_general(const std::string_view* keys, std::string* values, Code* codes,
                          std::size_t n) const;
  bool leaf_empty(LeafT* l) const;
  std::pair<std::uint64_t, std::uint64_t> descend_read(const Probe& p) const;
  template <index_common::SearchIsa I = index_common::kBuiltIsa>  // integer keys
  [[gnu::always_inline]] inline std::pair<std::uint64_t, std::uint64_t> descend_word(
      std::uint64_t word) const;
  std::optional<std::uint64_t> on_leaf(std::uint64_t leaf) const;  // descend's leaf step
  // Locks the leaf covering p for writing; *hint (if given) gets the descent's level-1 node
  // for a split that follows (InnerTree::insert_separator_hinted).
  std::uint64_t lock_leaf_for(const Probe& p,
                              index_common::InnerTree::ParentHint* hint = nullptr);
  void unlock_leaf(std::uint64_t off, bool pm_bit_clear = false);
  bool leaf_insert(LeafT* l, DWord d0, std::uint64_t key_word, std::uint64_t value_word,
                   std::uint8_t fp);
  Code split_insert(std::uint64_t off, std::uint64_t key_word, std::uint64_t value_word,
                    std::uint8_t fp, const index_common::InnerTree::ParentHint& hint);
  // split_insert's steps (lbtree_smo.h). A full leaf's entries, gathered on the stack.
  struct SplitItem {
    unsigned b, s;  // block and slot in the old leaf
    std::uint64_t key;
  };
  using SplitItems = std::array<SplitItem, LeafT::kSlots>;
  // always_inline (also below): one-block leaves keep od and nd in registers only when these
  // steps share split_insert's frame (out of line: +43 instructions per insert, callgrind).
  [[gnu::always_inline]] inline unsigned gather_sorted(LeafT* l, DWord d0, DWord (&od)[M],
                                                       SplitItems& items) const;
  [[gnu::always_inline]] inline void link_separator(
      std::uint64_t off, std::uint64_t sep_key, std::uint64_t new_off,
      const index_common::InnerTree::ParentHint& hint);
  [[gnu::always_inline]] inline void build_upper_half(LeafT* l, DWord (&od)[M],
                                                      const SplitItems& items, unsigned n,
                                                      LeafT* nl, DWord (&nd)[M]) const;
  // bulk_load's steps (lbtree_smo.h): the records' words and the leaves, planned then written.
  struct BulkPlan {
    std::size_t per = 0;                    // records per leaf
    std::vector<std::uint64_t> leaves;      // [0] is the head
    std::vector<std::uint64_t> key_words;   // per record
    std::vector<std::uint64_t> value_words;
  };
  Status check_bulk(std::span<const KeyValue> sorted, double fill) const;
  Status bulk_allocate(std::span<const KeyValue> sorted, BulkPlan* plan);
  void bulk_fill_leaf(std::span<const KeyValue> sorted, const BulkPlan& plan, LeafT* l,
                      std::size_t j, DWord (&hd)[M]) const;
  void bulk_write_chain(std::span<const KeyValue> sorted, const BulkPlan& plan);
  void bulk_commit_head(std::span<const KeyValue> sorted, const BulkPlan& plan);
  // Merge thresholds (PROTOCOL.md J1-J6, "When a leaf merges"): a remove that leaves a non-head
  // leaf with at most kMergeTrigger entries tries to fold it into its left neighbour, which
  // happens when the two together hold at most kMergeMax (an empty leaf is always unlinked).
  static constexpr unsigned kMergeTrigger = LeafT::kSlots / 3;    // 4, 9, 18 of 14, 28, 56
  static constexpr unsigned kMergeMax = LeafT::kSlots * 3 / 4;    // 10, 21, 42
  static_assert(kMergeMax < LeafT::kSlots && kMergeTrigger < LeafT::kSlots / 2);
  unsigned entry_count(LeafT* l) const;
  void try_merge(std::uint64_t off, const Probe& p);
  void merge_into(LeafT* a, LeafT* l, std::uint64_t next);  // J1..J5
  void switch_sibling(LeafT* a, std::uint64_t next);  // U1..U3 / recovery repair
  void release(const Pending& pending);
  // insert/update without the pool_full retry (index_common::retry_after_reclaim)
  Code insert_once(std::string_view key, std::string_view value);
  Code update_once(std::string_view key, std::string_view value);

  // Pins the calling thread while it may read separator copies or PM key/value records (bytes
  // keys, out-of-line values). Integer keys with inline values point nowhere, so those
  // operations pay nothing.
  std::optional<sync::EpochManager::Guard> pin() const {
    if (!keys_.bytes_mode() && inline_values_) return std::nullopt;
    return epochs_.pin();
  }

  // recovery
  Status rebuild(unsigned threads);
  struct RecoveryPolicy;  // LB+-Tree's parts of the shared recovery pass (lbtree.cpp)
  void summarise_leaf(std::uint64_t off, index_common::LeafSummary* in);

  std::unique_ptr<pm::Pool> pool_;
  Root* root_ = nullptr;
  std::uint64_t head_ = 0;
  index_common::KeyCodec keys_;
  bool inline_values_ = true;
  // find's form of the inner search (isa::search_level() when the tree was opened, docs/isa.md).
  bool search_avx2_ = false;
  std::uint32_t max_value_ = 8;
  pm::DramArena arena_;
  index_common::InnerTree inner_;
  // By value (declared after pool_, whose size it needs): a lookup reaches a leaf's version
  // in one load from `this`, not two.
  index_common::LeafVersions versions_;
  index_common::SeparatorStore seps_;
  // The root-to-leaf path of the current split or unlink, used only under inner_.smo_lock():
  // kept between SMOs so that taking a path allocates nothing once it has grown.
  index_common::InnerTree::Path smo_path_;
  // Retired separator copies and PM records. Declared after pool_ and seps_: destroyed first,
  // its pending deleters still find them (SeparatorStore invariant 3).
  mutable sync::EpochManager epochs_;
  RecoveryStats recovery_;
  double rebuild_seconds_ = 0;
  bool closed_ = false;
  bool traditional_ = false;  // set_traditional_inserts
  std::atomic<std::uint64_t> merges_{0};  // merges(); written under the inner tree's SMO mutex
  index_common::TagSource tags_{kEndTag8};  // new leaves' own tags (layout.h sibling words)
  struct NoFault {
    constexpr operator Fault() const { return Fault::none; }
    NoFault& operator=(Fault) { return *this; }
  };
  [[no_unique_address]] std::conditional_t<pm::kTracing, Fault, NoFault> fault_{};
};

}  // namespace pmindex::lbtree

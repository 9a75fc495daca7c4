// FPTree (Oukid et al., SIGMOD 2016; survey 000 §3.2): PM leaves of N unsorted slots with a
// validity bitmap and one-byte fingerprints, DRAM inner nodes (index_common::InnerTree) rebuilt
// at recovery, splits and leaf removals made crash-safe by per-thread micro-logs, in-leaf
// out-of-place updates. Persistence steps: PROTOCOL.md (cited in code as `// I3: ...`).
//
// Thread safety: every operation may run concurrently.
//   * Inner nodes: optimistic lock coupling (InnerTree contract) - the paper's HTM section.
//   * Leaves: the DRAM version of a leaf (LeafVersions) is the writer lock and the readers'
//     seqlock. A writer takes it by CAS from the version it read while the parent was valid,
//     then marks the PM lock word as the paper does. Readers never write; they read leaf
//     words with `optimistic_read` (acquire) and validate the version (the paper's lookups check the
//     leaf lock instead; we validate a DRAM version because there is no HTM).
//   * Lock order: leaf -> InnerTree SMO mutex -> left neighbour (try-lock only: removal of an
//     empty leaf and merge of a sparse one). Nobody waits for a leaf lock while holding the
//     SMO mutex.
//   * Micro-logs: one entry per thread slot (pm::this_thread_slot), used only by that thread.
//   * PM records (bytes keys, out-of-line values) are read by optimistic readers that may hold
//     a stale slot, so a record that leaves the tree is retired through epoch-based
//     reclamation (epochs_) and freed only when no pinned reader can still read it; lookups
//     and scans pin when the key or value mode has records. verify() and close() drain it.
// Invariants (checked by verify()):
//   (1) the leaf chain from root.head is acyclic, in bounds, and lists the leaves in the inner
//       tree's order; every key of a leaf lies within its inner-node fences;
//   (2) keys are distinct and increase across leaves; each valid slot's fingerprint is the
//       hash of its whole key; bitmap bits >= N are clear;
//   (3) the head leaf is never removed; other leaves may be empty (a removal is best effort);
//   (4) every micro-log entry is clear and no leaf is locked when the index is quiescent;
//   (5) the PM bytes reachable from the root equal the allocator's bytes in use.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "index/common/inner_tree.h"
#include "index/common/key_codec.h"
#include "index/common/close_counts.h"
#include "index/common/root_stamp.h"
#include "index/common/leaf_recovery.h"
#include "index/common/leaf_versions.h"
#include "index/common/separator_store.h"
#include "index/common/value_codec.h"
#include "index/fptree/layout.h"
#include "pmindex/index.h"
#include "pmindex/pm/dram_arena.h"
#include "pmindex/pm/persist.h"
#include "pmindex/sync/epoch.h"

namespace pmindex::fptree {

inline constexpr std::uint32_t kMaxKeyBytes = 8192;
// Values: Options::max_value_size 8 = inline 8-byte values (longer: Code::value_too_large,
// shorter: Code::invalid_argument); 9..65536 = any length 0..max_value_size out of line (longer:
// Code::value_too_large); other max_value_size values are refused at creation.
inline constexpr std::uint32_t kMaxValueBytes = index_common::ValueCodec::kMaxValueBytes;
inline constexpr std::uint32_t kLogCount = 512;  // = pm::kMaxThreadSlots

// The DRAM inner fanout (run-time parameter of InnerTree): 128 children for the production
// 64-entry leaves (the survey's setting); 4 for the small test instantiations so that tests
// grow several inner levels with a few hundred keys.
constexpr unsigned inner_keys_for(unsigned n) { return n >= 64 ? 127 : 3; }

// The registry's entry (name "fptree"): leaf size chosen by Options::node_size (192, 320, 576
// or 1152 B = 8, 16, 32 or 64 entries; 0 = 64) and recorded in the pool's layout id.
IndexRegistry::Entry registry_entry();

template <unsigned N>
class FPTree final : public Index {
 public:
  using LeafT = Leaf<N>;
  static constexpr std::size_t kBlock = kLeafBlock<N>;
  // Registry: a new index in a fresh pool / the index of a pool that was open before.
  static Result<std::unique_ptr<Index>> create(std::unique_ptr<pm::Pool> pool, const Options& o);
  static Result<std::unique_ptr<Index>> recover(std::unique_ptr<pm::Pool> pool, const Options& o);
  ~FPTree() override;

  // Index (see pmindex/index.h for the contracts).
  std::string_view kind() const override { return "fptree"; }
  const pm::Pool& pool() const override { return *pool_; }
  Code find(std::string_view key, std::string* value) const override;
  void find_batch(const std::string_view* keys, std::string* values, Code* codes,
                  std::size_t n) const override;
  std::size_t scan(std::string_view start, std::size_t max, ScanBuffer& out) const override;
  Code insert(std::string_view key, std::string_view value) override;
  Code update(std::string_view key, std::string_view value) override;
  Code remove(std::string_view key) override;
  // Sorted, distinct records into an empty index, `fill` of each leaf's slots used (B1..B4):
  // a crash leaves the empty tree or the whole load (one NAW of the head's next commits).
  Status bulk_load(std::span<const KeyValue> sorted, double fill) override;
  Status verify() const override;
  Footprint footprint() const override;
  RecoveryStats recovery_stats() const override { return recovery_; }
  Status close() override;
  // Registers the thread with the record reclamation epochs now (optional: its first pin
  // does it anyway, once).
  ThreadScope attach_thread() override;

  std::uint64_t leaf_count() const;
  // Leaf merges done since open (J1-J7; unlinks of empty leaves are not counted), for tests
  // that must see merges happen (the crash suite's SmoTally, the pool-full tests).
  std::uint64_t merges() const { return merges_.load(std::memory_order_relaxed); }

  // Known-bad variant for the crash tests (a checker must be able to fail). Only in the
  // tracing flavour (the crash simulator's build); elsewhere fault_ is a constant `none`.
  enum class Fault : int {
    none,
    merge_unlink_first,  // J5 (the unlink) before J4 (the moved entries' bitmap NAW): a crash
                         // in between loses the right leaf's keys
  };
  void set_fault_for_testing(Fault f) {
    if (f != Fault::none && !pm::kTracing) std::abort();  // tracing flavour only
    fault_ = f;
  }
  // Seconds of the last recovery's rebuild (R1..R5: logs, chain walk, parallel leaf pass,
  // repairs, inner build); RecoveryStats::seconds is the whole open.
  double rebuild_seconds() const { return rebuild_seconds_; }
  // The DRAM inner tree as text: height, then every leaf in order with its fences (tests
  // compare a 1-thread and an N-thread recovery of the same image with it).
  std::string describe_inner() const;

 private:
  using Probe = index_common::KeyCodec::Probe;
  static constexpr int kNone = -1;

  explicit FPTree(std::unique_ptr<pm::Pool> pool);
  Status init_root(const Options& o);
  void attach(Root* r);

  LeafT* leaf_at(std::uint64_t off) const { return pool_->at<LeafT>(off); }
  MicroLog* my_log() const;
  // Slot of p's key in leaf l, or kNone (reads under the caller's lock or seqlock).
  int find_slot(const LeafT* l, const Probe& p) const;
  // I: the form of the fingerprint compare (docs/isa.md; avx2 only under find_word_avx2).
  template <index_common::SearchIsa I = index_common::kBuiltIsa, class Match>
  int find_slot_if(const LeafT* l, std::uint8_t fp, Match match) const;
  template <index_common::SearchIsa I = index_common::kBuiltIsa>
  static std::uint64_t fp_candidates(const LeafT* l, std::uint8_t fp);  // bit s: fps match
  std::pair<std::uint64_t, std::uint64_t> descend_read(const Probe& p) const;
  template <index_common::SearchIsa I = index_common::kBuiltIsa>  // integer keys
  [[gnu::always_inline]] inline std::pair<std::uint64_t, std::uint64_t> descend_word(
      std::uint64_t word) const;
  std::optional<std::uint64_t> on_leaf(std::uint64_t leaf) const;  // descend's leaf step
  // !has_records_: find_word_t in the two forms of the inner and fingerprint searches
  // (docs/isa.md), chosen by search_avx2_.
  template <index_common::SearchIsa I>
  [[gnu::always_inline]] inline Code find_word_t(std::string_view key, std::string* value) const;
  [[gnu::noinline]] Code find_word(std::string_view key, std::string* value) const;
  PMINDEX_AVX2_ENTRY [[gnu::noinline]] Code find_word_avx2(std::string_view key,
                                                           std::string* value) const;
  [[gnu::noinline]] Code find_general(std::string_view key, std::string* value) const;
  // find_batch without records: InnerTree::descend_batch, then the leaf searches in one pass.
  void find_batch_word(const std::string_view* keys, std::string* values, Code* codes,
                       std::size_t n) const;
  // With records (byte-string keys or out-of-line values): the same passes, find_general's reads.
  void find_batch_general(const std::string_view* keys, std::string* values, Code* codes,
                          std::size_t n) const;
  std::uint64_t lock_leaf_for(const Probe& p);
  bool try_lock_leaf(std::uint64_t off, std::uint64_t version);
  void unlock_leaf(std::uint64_t off, bool obsolete = false);
  Code write_entry(std::string_view key, std::string_view value, bool replace);
  // K3 for a slot's records once the slot is gone (its NAW persisted): retired, then freed
  // after every reader pinned at the time has unpinned.
  void release_records(std::uint64_t key_word, std::uint64_t value_word);
  void retire_record(std::uint64_t record);
  // A pin of epochs_ for a reader, if this key/value mode has PM records at all.
  std::optional<sync::EpochManager::Guard> pin_for_records() const;
  // I1..I4 / U1..U4: writes (key, value, fp) into free slot s and commits with one bitmap NAW
  // whose new value is `bitmap` (which sets s and, for an update, clears the old slot).
  void commit_slot(LeafT* l, unsigned s, std::uint64_t key_word, std::uint64_t value_word,
                   std::uint8_t fp, std::uint64_t bitmap);
  // With `off` locked and full: S1..S8; returns the new (locked) leaf or 0 if PM is full.
  std::uint64_t split(std::uint64_t off, std::uint64_t* sep_word);
  // Makes room for p's key: splits the locked leaf `*off` if full and leaves *off locked
  // (the one covering p) with a free slot.
  Code make_room(std::uint64_t* off, const Probe& p);
  // Merge thresholds (PROTOCOL.md J1-J7, "When"): a remove that leaves a non-head leaf with
  // at most kMergeTrigger entries tries to fold it into its left neighbour, which happens when
  // the two together hold at most kMergeMax (an empty leaf is always unlinked, D3-D6).
  static constexpr unsigned kMergeTrigger = N / 3;      // 2, 5, 10, 21 of 8, 16, 32, 64
  static constexpr unsigned kMergeMax = N * 3 / 4;      // 6, 12, 24, 48
  static_assert(kMergeTrigger < N / 2 && kMergeMax < N && kMergeMax >= 2 * kMergeTrigger);
  // The locked non-head leaf `off` holds at most kMergeTrigger entries: D3..D6 if it is
  // empty, J1..J7 if it fits into its left neighbour, else nothing. Unlocks off.
  void try_merge(std::uint64_t off, const Probe& p);
  void merge_into(LeafT* a, const LeafT* l);  // J2..J5 (A and L locked, the log written)
  static void set_fp(LeafT* l, unsigned s, std::uint8_t fp);
  static std::uint8_t get_fp(const LeafT* l, unsigned s);

  std::uint64_t new_tag() { return tags_.next(); }  // a fresh leaf tag (common/chain_tag.h)

  // recovery
  Status rebuild(unsigned threads);
  // rebuild's steps (fptree.cpp): R1's decisions, then the shared pass with FPTree's parts
  // (R2's per-leaf check, R3..R5's repairs).
  using Relink = std::map<std::uint64_t, std::uint64_t>;  // leaf -> the successor to install
  Status replay_logs(Relink* relink, std::vector<unsigned>* dirty_logs);
  void summarise_leaf(std::uint64_t off, index_common::LeafSummary* sum);
  struct RecoveryPolicy;
  // R2's tag check: each link of the chain (as the logs complete it) names its leaf's tag, the
  // last link is kChainEnd.
  template <class NextOf>
  Status check_links(const std::vector<std::uint64_t>& leaves, NextOf next_of) const;

  std::unique_ptr<pm::Pool> pool_;
  Root* root_ = nullptr;
  MicroLog* logs_ = nullptr;
  std::uint64_t head_ = 0;
  index_common::KeyCodec keys_;
  index_common::ValueCodec values_;
  double rebuild_seconds_ = 0;
  pm::DramArena arena_;
  index_common::InnerTree inner_;
  std::unique_ptr<index_common::LeafVersions> versions_;
  index_common::SeparatorStore seps_;
  RecoveryStats recovery_;
  bool closed_ = false;
  bool has_records_ = false;              // bytes keys or out-of-line values
  bool search_avx2_ = false;  // find's search form: isa::search_level() at open (docs/isa.md)
  index_common::TagSource tags_;
  std::atomic<std::uint64_t> merges_{0};  // merges(); written under the inner tree's SMO mutex
  struct NoFault {
    constexpr operator Fault() const { return Fault::none; }
    NoFault& operator=(Fault) { return *this; }
  };
  [[no_unique_address]] std::conditional_t<pm::kTracing, Fault, NoFault> fault_{};
  mutable sync::EpochManager epochs_;     // last member: its deleters use pool_
};

}  // namespace pmindex::fptree

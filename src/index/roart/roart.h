// roart: ROART (Ma et al., FAST'21), first version: the shared ART core (src/index/common/art/)
// in the pool for the inner part, over LEAF ARRAYS that each hold up to 64 records of one key
// range. README.md: design, what differs from the paper, footprint; PROTOCOL.md: persistence
// steps A1-A9 and recovery R1-R6 (cited in code as // An:, // Rn:).
//
// How a key reaches its array: every array but the last is named in the trie by its range's
// greatest key (its separator `hi`, inclusive; the record's value word is the array's pool
// offset); the last array (range up to +inf) is named by the root's `tail` word. The array of
// key k is the first trie entry with hi >= k, or the tail. An array's range never shrinks while
// it lives: growth, shrinking and splits copy the array and replace it (copy on write); it
// grows when its left neighbour is left empty and leaves the trie (PROTOCOL.md A3e).
//
// Thread safety: every operation may run concurrently.
//   * The trie is art::Tree (its own OLC; art_tree.h). Readers take no locks.
//   * Each leaf array has one lock word (its first word: a run-tagged art::NodeLock word,
//     volatile) taken by every writer of the array (insert, update, remove, grow, shrink,
//     split); readers read the array optimistically and validate its version. A replaced
//     array is unlocked obsolete; whoever meets it starts again from the trie.
//   * The trie entry (or tail word) naming an array is changed only by the array's lock holder.
//     A writer holds one array lock at a time, except A3e, which may wait for the next array
//     (to the right) to finish a crash-interrupted split (PROTOCOL.md A3e): no cycle.
//   * Records, out-of-line values, replaced arrays and split intents leave through the trie's
//     epoch manager; every operation pins it while it holds an offset read without a lock.
//   * verify(), close() and the *_for_testing functions expect no concurrent operations.
// Invariants (checked by verify()):
//   (1) the trie's invariants (art_tree.h (1)-(4)); every trie record's value word names a
//       leaf array, no array is named twice, the tail names one;
//   (2) an array named by separator hi with previous separator lo holds keys in (lo, hi]
//       (the tail: keys > the last separator); keys are distinct;
//   (3) a live slot's fingerprint is fingerprint(key), its prefix word is prefix(key), the
//       occupancy bitmap has exactly the live slots, no reachable array has an intent;
//   (4) every block reachable from the root is owned (the recovery walk marks them all).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "index/common/art/art_tree.h"
#include "index/common/root_stamp.h"
#include "index/common/value_codec.h"
#include "pmindex/index.h"
#include "index/roart/layout.h"

namespace pmindex::roart {

using PmTree = art::Tree<art::PmPlacement>;

class Roart final : public Index {
 public:
  static pm::Layout layout_for(const Options& options);
  static Status validate(const Options& options);
  static std::size_t default_pool_size(const Options& options);
  static Result<std::unique_ptr<Index>> create(std::unique_ptr<pm::Pool> pool,
                                               const Options& options);
  static Result<std::unique_ptr<Index>> recover(std::unique_ptr<pm::Pool> pool,
                                                const Options& options);
  static IndexRegistry::Entry registry_entry();

  ~Roart() override;
  std::string_view kind() const override { return "roart"; }
  Code insert(std::string_view key, std::string_view value) override;
  Code update(std::string_view key, std::string_view value) override;
  Code find(std::string_view key, std::string* value) const override;
  Code remove(std::string_view key) override;
  std::size_t scan(std::string_view start, std::size_t max, ScanBuffer& out) const override;
  Status verify() const override;
  RecoveryStats recovery_stats() const override {
    std::lock_guard<std::mutex> lock(walk_mu_);
    return recovery_;
  }
  Footprint footprint() const override;
  Status close() override;
  const pm::Pool& pool() const override { return *pool_; }

  // Waits for the start-now recovery walk (tests, close).
  Status wait_recovery_walk() const;
  // Structure changes in this run (tests, pmbench).
  std::uint64_t splits() const { return splits_.load(std::memory_order_relaxed); }
  std::uint64_t grows() const { return grows_.load(std::memory_order_relaxed); }
  std::uint64_t shrinks() const { return shrinks_.load(std::memory_order_relaxed); }
  std::uint64_t merges() const { return merges_.load(std::memory_order_relaxed); }
  // Interrupted splits finished at first touch (R6) by every roart index of this process
  // (crash tests: recovered images did meet splits cut between A5 and A8).
  static std::uint64_t finished_splits_total();
  // Interrupted splits undone at first touch because the pool was full (R6u), likewise.
  static std::uint64_t undone_splits_total();
  // Interrupted merges finished (R7) or undone (R7u) by recovery walks of this process.
  static std::uint64_t finished_merges_total();
  // Known-bad variant for the crash suite (tests only, process-wide): when set, merges skip
  // their intent (M1's intent block and M2), so a crash between M3 and M4 loses the left
  // array's records. The crash suite must catch it. The tracing flavour only (elsewhere
  // switching it on aborts).
  static void set_merge_without_intent_for_testing(bool on);
  // Leaf arrays (quiescent; tests and the footprint table).
  std::uint64_t array_count_for_testing() const;
  // Bytes requested from the allocator by every reachable block (root, trie nodes and
  // records, arrays, records, out-of-line values), before rounding to size classes
  // (quiescent; the footprint table; the survey counted requested sizes).
  std::uint64_t requested_bytes_for_testing() const;
  // Deliberate damage so a test sees verify() notice it: 0 breaks a fingerprint, 1 breaks a
  // prefix word, 2 clears a live bit of a bitmap, 3 swaps the tail with the first trie array
  // (keys out of their range). Needs an index with at least one split.
  void corrupt_for_testing(int what);

 private:
  enum class Touch { ok, restart, damaged };
  // Where a key's array is named: the trie entry `hi` or (tail) the root's tail word.
  struct Where {
    std::uint64_t array = 0;
    bool tail = false;
    std::string hi;
  };
  struct Item {
    std::uint64_t prefix;
    std::uint64_t slot;  // slot word
  };

  explicit Roart(std::unique_ptr<pm::Pool> pool);
  Status init_root(std::uint32_t max_key, std::uint32_t max_value);
  void make_tree(std::uint32_t tag);
  void start_walk(std::uint64_t root_off);
  Code check_key(std::string_view key) const;
  Code writable() const;

  // arrays (roart.cpp)
  ArrayHeader* array(std::uint64_t off) const { return pool_->at<ArrayHeader>(off); }
  static unsigned slots_of(const ArrayHeader* a) { return static_cast<unsigned>(a->meta & 0xff); }
  static std::uint64_t* slot_words(ArrayHeader* a) { return reinterpret_cast<std::uint64_t*>(a + 1); }
  static std::uint64_t* prefix_words(ArrayHeader* a) { return slot_words(a) + slots_of(a); }
  const art::Record* record(std::uint64_t slot) const {
    return pool_->at<const art::Record>(slot & kOffsetMask);
  }
  std::string_view key_of(std::uint64_t slot) const {
    const art::Record* r = record(slot);
    return {r->key(), r->key_len};
  }
  Code locate(std::string_view key, Where* w) const;
  Code locate_after(std::string_view hi, Where* w) const;
  // w: where the array was found (its name), for finishing an interrupted split at first touch.
  std::uint64_t read_lock(ArrayHeader* a, const Where& w, Touch* t) const;
  bool admit(ArrayHeader* a, const Where& w, std::uint64_t stale) const;
  std::string check_array(std::uint64_t off) const;
  bool write_lock(ArrayHeader* a, const Where& w, Touch* t) const;
  void unlock(ArrayHeader* a) const;
  void unlock_obsolete(ArrayHeader* a) const;
  int find_slot(ArrayHeader* a, std::string_view key, std::uint16_t fp) const;
  std::uint64_t new_record(std::string_view key, std::uint64_t value, Code* code) const;
  std::uint64_t new_array(unsigned slots, const Item* items, unsigned n, Code* code) const;
  Code replace(const Where& w, std::uint64_t old_array, std::uint64_t new_array) const;
  Code grow_or_split(const Where& w, ArrayHeader* a, std::uint64_t rec_slot);
  Code split(const Where& w, ArrayHeader* a, std::vector<Item>& items);
  void maybe_shrink(const Where& w, ArrayHeader* a);
  // M0: after a remove left an array underfull: with its right neighbour (a locked, named at
  // w; true: merged and a unlocked) or, with no lock held, its left one (kmin: the smallest
  // key the array held).
  bool merge_right(const Where& w, ArrayHeader* a);
  void merge_left(const Where& w, const std::string& kmin);
  // M0 again for key's array, after a merge found no space and deferred frees ran (remove).
  void merge_at(std::string_view key);
  // M1-M5: a (left, named at wa, not the tail) and b (its right neighbour, named at wb), both
  // locked, merged into one array. True: both were left obsolete and unlocked (or damage was
  // flagged); false: nothing changed (both still locked).
  bool merge(const Where& wa, ArrayHeader* a, const Where& wb, ArrayHeader* b);
  // The trie entry of the left neighbour of the array named at w, which held kmin (M0);
  // false if there is none or it is not found within a few entries.
  bool left_of(const Where& w, std::string_view kmin, Where* left) const;
  // seek_ge(from) lands on w's own name (w.tail: on nothing): no separator in [from, w's range).
  bool lands_on(const Where& w, std::string_view from) const;
  bool merge_intent(std::uint64_t ioff) const;
  // The known-bad switch as the merge reads it: a constant false outside the tracing flavour,
  // so the production library has no intent-less merge path.
  static bool merge_without_intent() {
    if constexpr (pm::kTracing) return merge_without_intent_flag();
    return false;
  }
  static bool merge_without_intent_flag();
  bool next_split_settled(const Where& w) const;
  unsigned live_items(ArrayHeader* a, Item* out) const;
  // The smallest key of n >= 1 live items (merge_left's starting point).
  std::string smallest_key(const Item* items, unsigned n) const;
  template <class Op>
  Code with_array(std::string_view key, Op&& op);
  void retire_array(std::uint64_t off) const;
  void retire_record(std::uint64_t slot) const;
  void retire_value(std::uint64_t word) const;
  void retire_intent(std::uint64_t off) const;
  static void free_array(void* self, std::uint64_t off);
  static void free_record(void* self, std::uint64_t off);
  static void free_value(void* self, std::uint64_t word);
  static void free_intent(void* self, std::uint64_t off);
  Code insert_word(std::string_view key, std::uint64_t word);
  Code update_word(std::string_view key, std::uint64_t word, std::uint64_t* old);
  Code remove_word(std::string_view key, std::uint64_t* old);
  Code find_word(std::string_view key, std::uint64_t* word) const;
  // Index::find_many's group: find_word's steps for every key, pass by pass (roart.cpp).
  void find_batch(const std::string_view* keys, std::string* values, Code* codes,
                  std::size_t n) const override;
  // find_word's locate + probe for keys[0, n) with prefetches between passes; keys it cannot
  // answer from one validated visit are set in the returned mask (find_word answers them).
  std::uint64_t probe_batch(const std::string_view* keys, std::size_t n, std::uint64_t* words,
                            Code* got) const;
  // Copies the array's records with key >= from (or > from when `after`) in key order.
  Touch copy_out(ArrayHeader* a, const Where& w, std::string_view from, bool after, std::size_t max,
                 std::vector<std::pair<std::string, std::uint64_t>>* out) const;

  // recovery (recovery.cpp)
  struct Pending {
    std::uint64_t array;
    std::uint64_t intent;
    bool tail;
    std::string hi;
  };
  std::string walk_array(std::uint64_t off, bool tail, std::string_view hi,
                         std::vector<std::uint64_t>* seen, std::vector<Pending>* pending,
                         std::uint64_t* records);
  Status finish_intent(const Pending& p) const;
  std::string walk_merge(const Intent* in, std::vector<std::uint64_t>* seen, std::uint64_t* records);
  std::string walk_slots(ArrayHeader* a, std::uint64_t* records);
  // R7/R7u: the interrupted merge whose intent p.array (the right array B) holds, finished by
  // the walk before any writer runs; false: damage.
  bool finish_merge(const Pending& p);
  // R6u: p's split undone (intent word cleared, the split's blocks retired); false if the
  // array holds a record the split's arrays do not (damage; nothing changed). Lock held.
  bool undo_intent(const Pending& p) const;
  // The records and nodes (trie nodes and leaf arrays) the recovery walk will count, for a
  // clean close; false (no counts) if an array still holds a split intent (the walk counts
  // those differently) or the tree cannot be walked.
  bool count_for_close(std::uint64_t* records, std::uint64_t* nodes) const;

  std::unique_ptr<pm::Pool> pool_;
  Root* root_ = nullptr;
  pm::KeyMode key_mode_ = pm::KeyMode::u64;
  // The survey's copy-first scan (§6.3) instead of the prefix-word sort, for measuring one
  // against the other (PMINDEX_ROART_SCAN=copy_first at create or open; README "Scans").
  bool copy_first_scans_ = false;
  index_common::ValueCodec values_;
  std::unique_ptr<PmTree> tree_;
  std::uint32_t tag_ = 1;
  RecoveryStats recovery_;
  mutable std::atomic<std::uint64_t> splits_{0}, grows_{0}, shrinks_{0}, merges_{0};
  mutable std::mutex walk_mu_;
  mutable std::condition_variable walk_cv_;
  std::atomic<bool> walk_done_{true};
  std::atomic<bool> corrupted_{false};
  Status walk_status_;  // guarded by walk_mu_
  std::thread walker_;
  bool closed_ = false;
};

}  // namespace pmindex::roart

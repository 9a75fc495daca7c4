// art::Tree<Placement>: the adaptive radix tree core (Leis et al., ICDE'13: N4/N16/N48/N256,
// path compression; synchronisation: optimistic lock coupling, Leis et al., DaMoN'16),
// persistent or not by its placement (placement.h). Layouts: art_node.h. Persistence steps
// (cited as // Pn:) are defined in src/index/part/PROTOCOL.md; the DRAM placement runs the
// same code with persist() a no-op.
//
// The tree stores byte-string keys (0..max_key bytes, compared by memcmp then length, so a
// key that is a prefix of another sorts first) with an 8-byte value word each; the caller
// decides what the word means (index/common/value_codec.h for the `part` index).
//
// Thread safety: every operation may run concurrently. Readers take no locks: they read node
// words with acquire loads and validate the node's version (NodeLock) before acting on what
// they read. Writers lock the nodes they change (top-down; a lock taken below a held lock is
// taken by a non-waiting upgrade, or waits only on a child, so there is no cycle).
// Removed nodes and records are freed through the epoch manager (epochs()); callers pin it
// around every operation (the public functions pin on their own).
// Invariants (checked by verify()):
//   (1) a node reached at depth d has level <= d and prefix length >= d - level (level < d
//       only after a crash between P5 and P6, until a writer repairs it, P7);
//   (2) every node holds at least two items (children plus its end record);
//   (3) a live child word's byte is the byte the slot is for, and no two live slots of a node
//       hold the same byte; the accelerators (N4/N16 key bytes, N48 index, count) agree
//       with the child words once the node was touched in this run;
//   (4) every record under a node has the node's full path (key bytes [0, branch depth)) as
//       its key's prefix, a record in an end slot ends at the branch depth, a child record's
//       key has the slot's byte at the branch depth; an in-order walk yields strictly
//       increasing keys.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cassert>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "index/common/art/art_node.h"
#include "index/common/art/placement.h"
#include "pmindex/status.h"
#include "pmindex/sync/epoch.h"

namespace pmindex::art {

// Node counts of a verify() walk, by type (tests check that every transition happened).
struct TreeStats {
  std::uint64_t records = 0;
  std::uint64_t nodes[5] = {0, 0, 0, 0, 0};  // indexed by NodeType
  std::uint64_t stale_prefixes = 0;          // nodes reached below their level (after a crash)
  std::uint32_t max_depth = 0;
};

template <class P>
class Tree {
 public:
  // root_word: the word holding the top child word (0 = empty tree); root_lock: its lock
  // word (a NodeLock word, volatile). run_tag: this run's tag (never 0), see NodeLock.
  Tree(P placement, std::uint64_t* root_word, std::uint64_t* root_lock, std::uint32_t run_tag,
       std::uint32_t max_key)
      : p_(placement), root_word_(root_word), root_lock_(root_lock), tag_(run_tag),
        max_key_(max_key) {}
  Tree(const Tree&) = delete;
  Tree& operator=(const Tree&) = delete;

  sync::EpochManager& epochs() const { return epochs_; }
  std::uint32_t run_tag() const { return tag_; }
  const P& placement() const { return p_; }

  // insert: already_present, pool_full, corrupted. The record is written with `value`.
  Code insert(std::string_view key, std::uint64_t value);
  // update: not_found, corrupted. *old is the replaced value word (the caller releases it
  // through epochs() once no reader can hold it).
  Code update(std::string_view key, std::uint64_t value, std::uint64_t* old);
  // find: not_found, corrupted. Pin epochs() around the call and the use of *value if the
  // value word names memory that an update may release.
  Code find(std::string_view key, std::uint64_t* value) const;
  // The same for a caller that already holds a pin of epochs() (the guard proves it): no
  // second, nested pin per lookup.
  Code find(std::string_view key, std::uint64_t* value, const sync::EpochManager::Guard&) const {
    return restart_loop([&](Olc& o) { return find_once(key, value, o); });
  }
  // find's descent for one 8-byte key (u64 / f64 key types, or an 8-byte bytes key), for a
  // caller that holds a pin of epochs(): the key is one word, each level shifts its byte out
  // of it, and everything but the common case is left to find (issue 20). Returns true with
  // *code (ok or not_found) and, on ok, *value; false when it met anything else (a lock word
  // not "this run's, unlocked, live": another run's word still to be admitted (P10), a
  // damaged node, a writer; a failed validation; a stale level; a node at depth 8): nothing
  // was answered and the caller runs find, which admits, waits, restarts and answers
  // corrupted as before. The reads and validations are find_once's, in the same order.
  [[gnu::always_inline]] bool find_word(std::string_view key, std::uint64_t* value,
                                        Code* code) const;
  // Batched find (Index::find_many) of n <= kMaxBatch keys: find's descent per key as a small
  // state machine, advanced one node per round, round-robin over the batch; each step ends
  // by prefetching the node or record its key visits next, so the batch's misses overlap.
  // codes[i] and values[i] (set on ok only) as find gives them; a key whose attempt restarts
  // or meets damage is looked up again alone by find. Pin epochs() as for find.
  static constexpr std::size_t kMaxBatch = 64;
  void find_batch(const std::string_view* keys, std::size_t n, std::uint64_t* values,
                  Code* codes) const;
  // Bulk load into an empty tree (B1-B2, PROTOCOL.md): n sorted, distinct keys (key_at(i) is
  // key i as a string_view, each of at most the tree's key limit) with value words values[i],
  // built bottom-up, each node of the smallest type that holds its children, then published
  // by one store of the root word. ok; pool_full (nothing left allocated); invalid_argument if
  // the tree was not empty at the publish (nothing changed). Concurrent operations may run;
  // they see the tree empty until the publish.
  template <class KeyAt>
  Code build(std::size_t n, KeyAt key_at, const std::uint64_t* values);
  // Test only: build writes without persisting (P1 skipped), a known-bad the crash suite
  // must catch in adr mode.
  void set_unpersisted_build_for_test() { test_unpersisted_build_ = true; }
  bool empty() const { return load_word(*root_word_) == 0; }
  // Prefix splits (P5-P6) done through this object since it was built: for tests that must
  // see them happen (crash suites' SmoTally). Relaxed: a statistic, safe beside operations.
  std::uint64_t prefix_splits() const { return prefix_splits_.load(std::memory_order_relaxed); }

  // remove: not_found, pool_full (a shrink could not allocate), corrupted. *old as update.
  Code remove(std::string_view key, std::uint64_t* old);
  // Record relocation (part's PROTOCOL.md P11; compaction of a full pool): `key`'s record,
  // if it is still the block at `from`, is copied into the caller's block `to` (at least
  // record_bytes(key.size()) long, unreachable) under the lock of its container, as update
  // takes it: P11a the copy (key, current value word) is written and persisted, P11b its word
  // replaces the old one in the slot (one failure-atomic store, persisted), then the old
  // record is retired through epochs(). ok: moved (the value word now belongs to the copy);
  // not_found: the key is gone or its record is another block (nothing changed, the caller
  // still owns `to`); corrupted. copy_first = false is a known-bad variant for tests only
  // (P11b before the copy is persisted), which the crash simulator must catch.
  Code relocate(std::string_view key, std::uint64_t from, std::uint64_t to,
                bool copy_first = true);
  // Records with key >= start in key order, emit(key, value word) for each, at most `max`.
  // Returns corrupted if damage was met, ok otherwise. Caller pins epochs() while it uses
  // what emit hands it; emit must copy the key.
  // Up to kLazyScanMax records the walk is lazy (children taken one at a time in byte order
  // from the bound's byte: O(depth) node visits for a seek); above it, each node on the way
  // is gathered and sorted once (cheaper per record for long scans). Same results either way.
  template <class Emit>
  Code scan(std::string_view start, std::size_t max, Emit&& emit) const;
  static constexpr std::size_t kLazyScanMax = 16;
  // The first record with key >= `key`: ok with *value (and *key_out, if not null) set,
  // not_found past the last key, or corrupted. One descent along the key's path, then down
  // the first subtree right of where the key leaves the trie (scan(key, 1) answers the
  // same, by an ordered walk).
  Code seek_ge(std::string_view key, std::string* key_out, std::uint64_t* value) const;
  // seek_ge without the key's copy: *key_out views the record's own bytes, readable until
  // the caller's pin of epochs() ends (the caller must hold one).
  Code seek_ge_view(std::string_view key, std::string_view* key_out, std::uint64_t* value) const;
  // The path seek_ge keeps for going back up; a deeper one (keys sharing more than about 30
  // branching bytes) is answered by scan(key, 1) instead.
  static constexpr unsigned kSeekPath = 32;

  // Quiescent full check of invariants (1)-(4); "" when sound. value_ok(word) checks one
  // value word (out-of-line records) and may be null.
  std::string verify(TreeStats* stats, bool allow_stale,
                     bool (*value_ok)(const void*, std::uint64_t), const void* ctx) const;
  // Recovery walk (no locks; writers must be held off): every node and record is checked as
  // at first touch, then mark(ref, bytes, is_record, value word) is called; returns "" or the
  // first damage. Depth is bounded by the key limit, so a cycle ends as damage. Beside
  // writers (part's relocation census) it reads safely under an epoch pin (every word it
  // follows is an acquire load, every block it reaches stays allocated until the pin ends),
  // but its view may be torn and its "damage" a writer's change: a hint only.
  template <class Mark>
  std::string walk(Mark&& mark) const;
  // The root word's target checked as a node's children are at first touch ("" if sound).
  std::string check_top() const {
    const std::uint64_t w = load_word(*root_word_);
    return w == 0 ? std::string{} : check_child(w);
  }

 private:
  struct Olc {
    bool restart = false;
    bool damaged = false;
    bool stop() const { return restart || damaged; }
  };
  struct Prefix {
    std::uint32_t len = 0;      // effective prefix length at the depth the node is reached at
    std::uint32_t avail = 0;    // leading bytes of `stored` that are trusted
    std::uint64_t stored = 0;
    std::string_view src;       // a record key under the node (when bytes beyond avail matter)
    std::uint8_t byte(std::uint32_t depth, std::uint32_t i) const {
      return i < avail ? static_cast<std::uint8_t>(stored >> (8 * i))
                       : static_cast<std::uint8_t>(src[depth + i]);
    }
  };
  struct Entry {
    std::uint8_t byte;
    std::uint64_t word;
    std::uint64_t value;  // scans only: the record's value word, read before validation
                          // (no initialiser: the write paths keep 257-entry arrays on the
                          // stack, which must not be zeroed per call)
  };
  // Where a descent came from: the slot that names the current node and the lock guarding it.
  struct Parent {
    std::uint64_t* lock;
    std::uint64_t version;
    std::uint64_t* slot;
  };

  template <class T>
  T* at(std::uint64_t w) const { return p_.template at<T>(target_of(w)); }
  NodeHeader* node(std::uint64_t w) const { return at<NodeHeader>(w); }
  const Record* record(std::uint64_t w) const { return at<const Record>(w); }
  std::string_view key_of(std::uint64_t w) const {
    const Record* r = record(w);
    return {r->key(), r->key_len};
  }
  // key_of(w) == key, with 8-byte keys (u64 and f64 key types) compared as one word: a lookup
  // ends at a record, and the memcmp call cost about 20 instructions of it (callgrind).
  bool key_equals(std::uint64_t w, std::string_view key) const {
    const Record* r = record(w);
    if (r->key_len != key.size()) return false;
    if (key.size() != 8) return std::memcmp(r->key(), key.data(), key.size()) == 0;
    std::uint64_t a = 0, b = 0;
    std::memcpy(&a, r->key(), 8);
    std::memcpy(&b, key.data(), 8);
    return a == b;
  }

  // --- locks (NodeLock in art_node.h) -------------------------------------------------------
  std::uint64_t read_lock(std::uint64_t& word, NodeHeader* n, Olc& o) const;
  void check(const std::uint64_t& word, std::uint64_t v, Olc& o) const {
    pm::yield_point("art.check");
    if (NodeLock::load(word) != v) o.restart = true;
  }
  bool upgrade(std::uint64_t& word, std::uint64_t& v) const {
    pm::yield_point("art.upgrade");
    std::uint64_t expected = v;
    if (!P::cas(&word, expected, v + NodeLock::kLocked)) return false;
    v += NodeLock::kLocked;
    return true;
  }
  bool write_lock(std::uint64_t& word, NodeHeader* n, Olc& o) const {
    for (;;) {
      std::uint64_t v = read_lock(word, n, o);
      if (o.stop()) return false;
      if (upgrade(word, v)) return true;
    }
  }
  // The holder is the only writer of a held word; release (publish): the critical section's
  // writes reach the next holder and validating readers.
  static void unlock(std::uint64_t& word) {
    P::publish(&word, NodeLock::bump(NodeLock::load(word), NodeLock::kLocked));
  }
  static void unlock_obsolete(std::uint64_t& word) {
    P::publish(&word, NodeLock::bump(NodeLock::load(word), NodeLock::kLocked + 1));
  }
  bool admit(NodeHeader* n, std::uint64_t stale) const;
  std::string check_node(const NodeHeader* n) const;
  std::string check_child(std::uint64_t w) const;
  void rebuild_accelerators(NodeHeader* n) const;

  // --- node access --------------------------------------------------------------------------
  // Inlined: both run at every node of every descent, and out of line each cost a call, spills
  // and the Prefix's stores through memory (callgrind: about 15 instructions per node).
  std::uint64_t* find_slot(NodeHeader* n, std::uint8_t b) const { return slot_of(n, b); }
  // find_slot's body, inlined where it is called: find_word and insert_word (a call per level
  // cost about 6 instructions of a lookup; inlined everywhere it made ROART's inserts longer).
  [[gnu::always_inline]] std::uint64_t* slot_of(NodeHeader* n, std::uint8_t b) const;
  unsigned collect(const NodeHeader* n, Entry* out) const;
  static void set_accel_byte(std::uint64_t* words, unsigned i, std::uint8_t b);
  [[gnu::always_inline]] bool prefix_at(const NodeHeader* n, std::uint32_t depth, Prefix* out) const;
  std::string_view any_key(NodeHeader* n, Olc& o) const;
  std::uint32_t match_prefix(NodeHeader* n, Prefix& p, std::string_view key, std::uint32_t depth,
                             Olc& o) const;
  static std::uint64_t bytes_word(std::string_view src, std::uint32_t from, std::uint32_t len);

  // --- writes -------------------------------------------------------------------------------
  // persist = false only for the known-bad build (set_unpersisted_build_for_test).
  std::uint64_t new_record(std::string_view key, std::uint64_t value, Code* code,
                           bool persist = true) const;
  std::uint64_t new_node(NodeType t, std::uint64_t shape, std::uint64_t prefix,
                         std::uint64_t end, const Entry* e, unsigned n, Code* code,
                         bool persist = true) const;
  // build's steps (art_build_impl.h).
  template <class KeyAt>
  std::uint64_t build_range(std::size_t lo, std::size_t hi, std::uint32_t depth, KeyAt& key_at,
                            const std::uint64_t* values, std::vector<Entry>& pending, Code* code);
  std::uint64_t build_record(std::string_view key, std::uint64_t value, Code* code) const;
  void discard(std::uint64_t w) const;
  void publish_persist(std::uint64_t* word, std::uint64_t v) const {
    p_.publish(word, v);
    p_.persist(word, sizeof *word);
  }
  // The count is read and written by the lock holder only (volatile, never persisted).
  void set_count(NodeHeader* n, unsigned count) const {
    const std::uint16_t c = static_cast<std::uint16_t>(count);
    p_.write(&n->count, &c, sizeof c);
  }
  void insert_in_place(NodeHeader* n, std::uint8_t b, std::uint64_t w) const;
  void repair_if_stale(NodeHeader* n, std::uint32_t depth, std::string_view key) const;
  void retire_node(std::uint64_t w) const { epochs_.retire(const_cast<Tree*>(this), &free_node, target_of(w)); }
  void retire_record(std::uint64_t w) const { epochs_.retire(const_cast<Tree*>(this), &free_record, target_of(w)); }
  static void free_node(void* ctx, std::uint64_t ref);
  static void free_record(void* ctx, std::uint64_t ref);

  // Repeats one optimistic attempt (`once(olc)`, a *_once below) under one epoch pin until it
  // neither restarts nor meets a damaged node (then: corrupted).
  template <class Once>
  Code with_restarts(Once&& once) const;
  template <class Once>
  Code restart_loop(Once&& once) const;  // with_restarts without the pin: the caller holds one
  Code insert_once(std::string_view key, std::uint64_t value, Olc& o);
  // insert's descent for an 8-byte key, as find_word's (issue 20), ending in add_child or
  // leaf_split: true with *code when it answered, false (nothing changed) when insert_once
  // must run: another run's or a held lock word, a failed validation, a prefix to split, a
  // stale level, the empty tree, a restart or damage met by add_child / leaf_split.
  bool insert_word(std::string_view key, std::uint64_t value, Code* code);
  Code leaf_split(Parent pa, std::uint64_t w, std::uint32_t depth, std::string_view key,
                  std::uint64_t value, Olc& o);
  Code prefix_split(Parent pa, std::uint64_t w, std::uint64_t v, Prefix& p, std::uint32_t mis,
                    std::uint32_t depth, std::string_view key, std::uint64_t value, Olc& o);
  Code add_child(Parent pa, std::uint64_t w, std::uint64_t v, std::uint32_t node_depth,
                 std::uint32_t branch, std::string_view key, std::uint64_t value, Olc& o);
  Code find_once(std::string_view key, std::uint64_t* value, Olc& o) const;
  Code seek_ge_once(std::string_view key, std::string_view* key_out, std::uint64_t* value,
                    bool* deep, Olc& o) const;
  // seek_ge_once's steps (art_scan_impl.h): a node on the kept path, the position, the key
  // against a node's path, the child to enter, the climb back up the path.
  struct SeekStep {
    NodeHeader* n;
    std::uint64_t v;
    std::uint32_t branch;  // the node's branch depth: its children sit at branch + 1
    unsigned next;         // the first byte right of the path taken through it (<= 256)
  };
  struct SeekCursor;
  [[gnu::always_inline]] int seek_compare(NodeHeader* n, Prefix& p, std::uint32_t depth,
                                          std::string_view key, Olc& o) const;
  [[gnu::always_inline]] std::uint64_t seek_child(NodeHeader* n, std::uint32_t branch,
                                                  std::string_view key, bool* least,
                                                  unsigned* b) const;
  bool seek_climb(SeekStep* path, unsigned& top, SeekCursor& c, Olc& o) const;
  Code remove_once(std::string_view key, std::uint64_t* old, Olc& o);
  Code update_once(std::string_view key, std::uint64_t value, std::uint64_t* old, Olc& o);
  Code relocate_once(std::string_view key, std::uint64_t from, std::uint64_t to,
                     bool copy_first, Olc& o);
  Code remove_in(Parent pa, std::uint64_t w, std::uint64_t v, std::uint32_t node_depth,
                 std::uint32_t branch, std::uint64_t* rslot, std::string_view key,
                 std::uint64_t* old, Olc& o);
  Code collapse(Parent pa, std::uint64_t w, std::uint32_t node_depth, std::uint32_t branch,
                std::uint64_t remaining, Olc& o);
  // Where update and remove found `key`'s record: the slot and the lock guarding it (the
  // container node's, or the root lock when the record is the root word), and for a record in
  // a node, that node with the slot naming it (its parent's), its depth and branch depth.
  struct Found {
    std::uint64_t* lock = nullptr;
    std::uint64_t version = 0;
    std::uint64_t* slot = nullptr;
    std::uint64_t rec = 0;
    std::uint64_t node = 0;  // 0: the record is the root word
    Parent pa{};
    std::uint32_t node_depth = 0, branch = 0;
  };
  Code locate(std::string_view key, Found* f, Olc& o) const;

  // The node an ordered walk came from (or the root lock) and the version it validated: a
  // child is entered only while that version holds (lock coupling, as the point operations do).
  struct Via {
    const std::uint64_t* lock;
    std::uint64_t version;
  };
  bool enter_node(std::uint64_t w, Via via, std::uint32_t depth, std::string_view bound,
                  NodeHeader** n, std::uint64_t* v, bool* bounded, std::uint32_t* branch,
                  Olc& o) const;
  std::uint64_t next_child(const NodeHeader* n, unsigned from) const;
  template <class Emit>
  bool seek_word(std::uint64_t w, Via via, std::uint32_t depth, bool bounded,
                 std::string_view bound, bool inclusive, std::size_t max, std::size_t& count,
                 Emit& emit, Olc& o, std::string& last) const;
  template <class Emit>
  bool scan_word(std::uint64_t w, Via via, std::uint32_t depth, bool bounded,
                 std::string_view bound, bool inclusive, std::size_t max, std::size_t& count,
                 Emit& emit, Olc& o, std::string& last) const;
  std::string verify_word(std::uint64_t w, std::uint32_t depth, std::string& path,
                          std::uint8_t slot_byte, bool is_end, std::string& prev, bool& any,
                          TreeStats* st, bool allow_stale,
                          bool (*value_ok)(const void*, std::uint64_t), const void* ctx) const;
  template <class Emit>
  bool emit_record(std::uint64_t w, std::uint64_t value, bool bounded, std::string_view bound,
                   bool inclusive, std::size_t max, std::size_t& count, Emit& emit,
                   std::string& last) const;
  template <class Mark>
  std::string walk_word(std::uint64_t w, std::uint32_t depth, Mark& mark) const;

  P p_;
  std::uint64_t* root_word_;
  std::uint64_t* root_lock_;
  const std::uint32_t tag_;
  const std::uint32_t max_key_;
  mutable sync::EpochManager epochs_;
  std::atomic<std::uint64_t> prefix_splits_{0};
  bool test_unpersisted_build_ = false;
};

}  // namespace pmindex::art

#include "index/common/art/art_tree_impl.h"
#include "index/common/art/art_build_impl.h"

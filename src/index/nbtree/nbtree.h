// NBTree (paper 002): a lock-free persistent B+-tree whose leaves have two layers, a DRAM
// metadata layer and a PM key-value layer of unsorted 16 B entries. Persistence steps and the
// concurrency protocol are numbered in PROTOCOL.md; the code cites them (`// I3: ...`).
// Persistent layouts: layout.h.
//
// Thread safety: every public operation may be called from any thread concurrently, except
// bulk_load(), verify(), close() and set_hooks(), which need a quiescent index.
//   * Leaf operations are lock-free (FAA/CAS on the DRAM metadata, CAS on PM words), except
//     that two inserts of the SAME key into the same leaf wait for each other (I2), and an
//     SMO, before its new leaves become reachable, waits for the updates and deletes already
//     in flight on its old leaf to finish their sync-on-write (S8b, W2). The link
//     phase of an SMO is lock-free and cooperative (CAS into both layers' lists, S9..S12);
//     only its parent install (S13) takes the inner-node writer lock (no HTM on this CPU).
//     A merge of two adjacent leaves (M0..M7) is the same SMO with two sources: optional
//     (any obstacle gives up), cooperative, and its parent write takes the same lock.
//     Key 0 (u64/f64) lives in a side record guarded by its own spin lock (Z1..Z4). Keys of
//     KeyType::bytes live in PM key records the entries point to (K1..K5).
//   * Inner nodes are read without locks: each node has a version (odd = being written) that
//     readers validate (seqlock); writers hold inner_mu_ (N1..N3).
// Invariants (verify() checks them on a quiescent tree):
//   (1) the DRAM leaf chain and the PM block chain visit the same leaves in the same order, and
//       leaf ranges tile the key space in that order (u64: [low, high] over [1, 2^64-1];
//       bytes: [low, high) by memcmp from "" to no bound);
//   (2) every committed live slot holds a key in its leaf's range (bytes: a readable key
//       record), no key is live twice, and its fingerprint matches; committed bits lie below
//       min(num, capacity);
//   (3) inner nodes are sorted, their children's ranges nest inside theirs, and the leaves they
//       reach in order are exactly the leaf chain;
//   (4) a quiescent leaf has no SMO in progress (smo bit clear, no copy_ptr).
#pragma once

#include <atomic>
#include <thread>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "index/common/key_codec.h"
#include "index/common/node_search.h"
#include "index/common/root_stamp.h"
#include "index/common/separator_store.h"
#include "index/nbtree/layout.h"
#include "pmindex/pm/dram_arena.h"
#include "pmindex/pm/persist.h"
#include "pmindex/index.h"
#include "pmindex/sync/epoch.h"
#include "pmindex/sync/spin_lock.h"

namespace pmindex::nbtree {

namespace detail {
// The full fence of the Dekker-style handshakes between a writer of an old leaf and the SMO
// that publishes copy_ptr / sets the smo bit (W1, S3): each side stores, fences, then loads.
inline void full_fence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
// One round of a wait: a scheduling point for the crash simulator, then a yield.
inline void spin_pause(const char* tag) {
  pm::yield_point(tag);
  std::this_thread::yield();
}
}  // namespace detail

// The "no upper bound" value of a leaf's or inner node's `high` (both key modes).
inline constexpr std::uint64_t kNoHigh = ~std::uint64_t{0};

// The little-endian integer of 8 bytes read with memcpy (a no-op on x86).
inline std::uint64_t le_to_native(std::uint64_t v) {
  if constexpr (std::endian::native == std::endian::little) return v;
  return __builtin_bswap64(v);
}

// --- DRAM metadata layer ----------------------------------------------------------------------

struct SmoDesc;
struct MergeDesc;

// Leaf metadata (DRAM). The range never changes: an SMO replaces the leaf with one or two new
// leaves instead of resizing it, and a merge replaces two adjacent leaves with one (M). Range
// words ("bounds"), see NBTree's order helpers:
//   u64/f64: [low, high], both inclusive integers; the first leaf starts at 1 (key 0: Z*).
//   bytes:   [low, high) by memcmp, low a SeparatorStore word (the first leaf: ""), high the
//            next leaf's low (the same word) or kNoHigh.
// Cache layout: one 64 B line for the fields every lookup reads (bitmap, flag, copy_ptr,
// data_off, range), the next line for the fingerprints, so a lookup touches two adjacent DRAM
// lines of metadata before its PM entry.
struct alignas(64) Leaf {
  // commit bitmap: bits 0..62 committed slots | bit 63 smo (set by S1; cleared only by the
  // roll-back of an SMO whose copy found the pool full, S2x)
  static constexpr std::uint64_t kSmoBit = std::uint64_t{1} << 63;
  // flag bits
  static constexpr std::uint32_t kSynced = 1;  // sync phase finished (S8)
  static constexpr std::uint32_t kLinked = 2;  // link phase finished (S14)
  static constexpr std::uint32_t kSealed = 4;  // no new update/delete may start here (S8a, W2)
  // slot states (state[])
  static constexpr std::uint8_t kFree = 0;     // not claimed, or claimed but not announced
  static constexpr std::uint8_t kPending = 1;  // claimed, key announced in keys[] (I2)
  static constexpr std::uint8_t kDone = 2;     // committed (bitmap) or given up

  std::atomic<std::uint64_t> bitmap{0};
  std::atomic<std::uint32_t> num{0};
  std::atomic<std::uint32_t> flag{0};
  std::atomic<SmoDesc*> copy_ptr{nullptr};
  // Next leaf in key order; bit 0 (frozen) is set by this leaf's link phase (S9) and never
  // cleared. Read only by link phases, recovery and verify (untag()).
  std::atomic<Leaf*> next{nullptr};
  static bool frozen(Leaf* p) { return (reinterpret_cast<std::uintptr_t>(p) & 1) != 0; }
  static Leaf* untag(Leaf* p) {
    return reinterpret_cast<Leaf*>(reinterpret_cast<std::uintptr_t>(p) & ~std::uintptr_t{1});
  }
  static Leaf* with_frozen(Leaf* p) {
    return reinterpret_cast<Leaf*>(reinterpret_cast<std::uintptr_t>(p) | 1);
  }
  std::uint64_t data_off = 0;  // the PM block (immutable)
  std::uint64_t low = 1, high = ~std::uint64_t{0};
  // Committed slots whose key a delete (D2, or a sync's S6 delete) cleared: live records =
  // popcount(committed) - deleted. Read by the merge trigger (M0) only.
  std::atomic<std::uint32_t> deleted{0};
  // Fingerprints, eight per word (slot i: byte i % 8 of word i / 8), so a lookup compares
  // eight at a time (SWAR, find_slot). A slot's byte is written once (fetch_or into a zero
  // byte: slots are never reused within a leaf), before the slot's commit CAS (I6).
  alignas(64) std::atomic<std::uint64_t> fpw[8] = {};
  std::uint8_t fp(int i) const {
    return static_cast<std::uint8_t>(fpw[i >> 3].load(std::memory_order_relaxed) >>
                                     ((i & 7) * 8));
  }
  void set_fp(int i, std::uint8_t f) {
    fpw[i >> 3].fetch_or(std::uint64_t{f} << ((i & 7) * 8), std::memory_order_relaxed);
  }
  std::atomic<std::uint8_t> state[kMaxSlots] = {};
  // Writers of a committed slot in flight, from before their CAS to the end of their
  // sync-on-write (W2): the SMO's drain (S8b) waits for them. ADR also uses it for R1: a reader
  // that sees it non-zero writes the entry's line back itself before returning what it read.
  std::atomic<std::uint8_t> pending[kMaxSlots] = {};
  // The key each claimed slot announced (I2); also lets the sync phase know a deleted key.
  std::atomic<std::uint64_t> keys[kMaxSlots] = {};
  // The copy gate (S2g): helpers in S2..S3 (count) | kGateClosed while a roll-back (S2x) runs.
  static constexpr std::uint32_t kGateClosed = std::uint32_t{1} << 31;
  std::atomic<std::uint32_t> copiers{0};
  // The merge (M) that names this leaf as its left (P) or right (E) source, or null, or a
  // finished attempt (cancelled / aborted), or kMergeRetired once the leaf was replaced.
  // Written only by a merger's CAS (M1) and by the replacing SMO's S14 (exchange).
  std::atomic<MergeDesc*> merge{nullptr};
};

static_assert(offsetof(Leaf, fpw) == 64 && offsetof(Leaf, deleted) + 4 <= 64);

// What an SMO built: copy_ptr points here (S3). Immutable once published.
struct SmoDesc {
  Leaf* leaves[2] = {nullptr, nullptr};
  int count = 0;               // 1 or 2 new leaves
  std::uint64_t split = 0;     // two leaves: keys >= split go to leaves[1] (a bound word)
  std::uint8_t map_leaf[kMaxSlots];  // old slot -> new leaf index, 0xff = not copied
  std::uint8_t map_slot[kMaxSlots];
  // A merge's descriptor (M2): one per source, both naming the one new leaf. The left
  // source's descriptor owns the right one's (`partner`) until M3 publishes both.
  MergeDesc* merge = nullptr;
  SmoDesc* partner = nullptr;
};

// A merge of two adjacent leaves (M0..M7): `left` (P) and `right` (E) become one new leaf.
// Referenced by both leaves' `merge` words (refs counts them); freed through the epochs.
struct MergeDesc {
  static constexpr std::uint8_t kIntent = 0;     // M1 in progress: a helper may cancel it
  static constexpr std::uint8_t kConfirmed = 1;  // both smo bits are the merge's
  static constexpr std::uint8_t kCancelled = 2;  // never confirmed: the bits are ordinary SMOs'
  static constexpr std::uint8_t kAborted = 3;    // confirmed, then rolled back before M3
  Leaf* left = nullptr;
  Leaf* right = nullptr;
  std::atomic<std::uint8_t> state{kIntent};
  std::atomic<int> refs{0};
  bool live() const {
    const std::uint8_t s = state.load(std::memory_order_seq_cst);
    return s == kIntent || s == kConfirmed;
  }
};
inline MergeDesc* const kMergeRetired = reinterpret_cast<MergeDesc*>(std::uintptr_t{1});

// Inner node (DRAM). children[i] covers [keys[i], keys[i+1]) (bound words, as Leaf: in u64
// mode high and the last child's range are inclusive); keys[0] == low. Readers
// validate `version` (N2); writers hold inner_mu_ and make it odd while writing (N1).
struct Inner {
  static constexpr int kMaxFanout = 64;
  std::atomic<std::uint64_t> version{0};
  std::atomic<int> count{0};
  int level = 1;  // 1: children are leaves
  std::atomic<std::uint64_t> high{~std::uint64_t{0}};  // inclusive; B-link high key
  std::atomic<Inner*> sibling{nullptr};                // B-link right sibling
  std::atomic<std::uint64_t> keys[kMaxFanout] = {};
  std::atomic<void*> children[kMaxFanout] = {};
};

// --- test hooks ---------------------------------------------------------------------------------

enum class HookPoint : int {
  insert_before_commit_cas,  // I6
  update_before_cas,         // U2
  delete_before_cas,         // D2
  sync_before_cas,           // S7 / W1 / R3 (any sync CAS)
  smo_started,               // S1 done
  smo_before_copy_ptr_cas,   // copy phase built, S3 next
  smo_after_copy_ptr,        // copy phase done (S3)
  smo_drain_wait,            // S8b: an update/delete of the old leaf is in flight; waiting
  smo_after_sync,            // sync phase done (S8)
  smo_link_before_pm,        // link phase, DRAM predecessor switched, S11 (PM) next
  smo_link_after_list,       // link phase, lists switched, parent not yet installed (S13)
  smo_done,                  // S14 (only the helper that set the flag)
  inner_node_written,        // N1: an inner-node write finished (inner_mu_ held; leaf null)
};
std::string_view to_string(HookPoint p);

// Called at each point when installed. Hooks exist only in the tracing flavour (the test
// flavour, issue 16): in production and counting builds the hook points compile to nothing
// (no pointer load on the insert, update, delete or SMO paths) and set_hooks() with a
// non-null object aborts. inner_node_written runs with inner_mu_ held; the link hooks run
// without locks (every helper of a link phase passes them).
class Hooks {
 public:
  virtual ~Hooks() = default;
  virtual void at(HookPoint point, const Leaf* leaf) = 0;
};

// --- the index ----------------------------------------------------------------------------------

class NBTree final : public Index {
 public:
  static pm::Layout layout_for(const Options& options);
  static Status validate(const Options& options);  // before any file is touched
  static std::size_t default_pool_size(const Options& options);
  static Result<std::unique_ptr<Index>> create(std::unique_ptr<pm::Pool> pool,
                                               const Options& options);
  static Result<std::unique_ptr<Index>> recover(std::unique_ptr<pm::Pool> pool,
                                                const Options& options);

  ~NBTree() override;
  std::string_view kind() const override { return "nbtree"; }
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
  // Registers the calling thread with the epoch manager now (optional: its first operation
  // does it anyway; the registration lasts until the thread exits or the index goes).
  ThreadScope attach_thread() override;

  // --- for tests ---
  static constexpr bool kHooks = pm::kTracing;  // hook points compiled in (tracing flavour)
  void set_hooks(Hooks* hooks) {
    if (hooks != nullptr && !kHooks) std::abort();  // tracing flavour only
    hooks_.store(hooks, std::memory_order_release);
  }
  // Frees every retired leaf and record now (quiescent index only).
  void collect_garbage() { epochs_.drain(); }
  int leaf_capacity() const { return cap_; }
  // ADR: how often a reader found a write in flight on its slot and persisted the line itself
  // (R1) -- the run-time cost of refusing dirty reads.
  std::uint64_t reader_persists() const {
    return reader_persists_.load(std::memory_order_relaxed);
  }
  std::size_t leaf_count() const;
  // Merges that reached M5p (their durability point), for tests' coverage rules.
  std::uint64_t merges_linked() const { return merges_linked_.load(std::memory_order_relaxed); }
  // Merges on (default) or off: a test that needs the leaf layout of a split-only tree.
  void set_merges_for_testing(bool on) { merges_on_ = on; }
  // The leaf that currently covers `key` (quiescent index only).
  Leaf* leaf_for_testing(std::uint64_t key) const;
  // The PM value word of `key` among `leaf`'s committed slots (any state), for white-box checks.
  bool peek_for_testing(const Leaf* leaf, std::uint64_t key, std::uint64_t* word) const;
  // Breaks an invariant on purpose so a test can check that verify() notices.
  void corrupt_for_testing(int what);
  // Known-bad variants for the crash tests (a checker must be able to fail). Set on a
  // quiescent index. They exist only in the tracing flavour (the crash simulator's build): in
  // production and counting builds fault_ is a constant `none`, so the write path's comparisons
  // with it fold away and no known-bad path is compiled in.
  enum class Fault : int {
    none,
    skip_insert_persist,  // I5 without its write-back: a completed insert can be lost (ADR)
    skip_reader_persist,  // R1 skipped: a reader can return a value a crash loses (ADR)
    skip_merge_link_persist,  // M5p without its write-back: a completed merge can be lost (ADR)
    skip_sync_stop_persist,   // S5b skipped: a helper links before another's sync write-back
  };
  void set_fault_for_testing(Fault f) {
    if (f != Fault::none && !pm::kTracing) std::abort();  // tracing flavour only
    fault_ = f;
  }

 private:
  NBTree(std::unique_ptr<pm::Pool> pool, std::uint32_t node_size, std::uint32_t max_value,
         std::uint32_t max_key);

  // keys and values. A Probe is a search key prepared once per operation (KeyCodec's; in
  // u64/f64 mode its fingerprint is NBTree's own one-multiply hash of the key word).
  using Probe = index_common::KeyCodec::Probe;
  Code make_probe(std::string_view key, Probe* p) const;
  Probe probe_of_word(std::uint64_t key_word) const;  // a key word read from a slot
  bool is_key(std::uint64_t stored, const Probe& p) const {
    return bytes_ ? stored != 0 && keys_.matches(stored, p) : stored == p.word;
  }
  std::uint64_t new_key_record(std::string_view key, Code* code);  // K1 (bytes mode)
  void retire_key(std::uint64_t key_word);  // K3 after an epoch (bytes mode; no-op otherwise)
  Code encode_value(std::string_view value, std::uint64_t* word);
  // Inline: on every lookup's path (issue 16); records other than 8 bytes: read_record_value.
  void read_value(std::uint64_t word, std::string* out) const {
    const std::uint64_t p = payload_of(word);
    if ((p & kOutOfLine) == 0) {
      // The 8 bytes straight into the caller's string (no temporary, and no reallocation
      // once it holds 8 bytes).
      const std::uint64_t bytes = (p & kLittleEndian) == 0 ? le_to_native(__builtin_bswap64(p))
                                                           : le_to_native(p & ~kLittleEndian);
      if (out->size() != 8) out->resize(8);
      std::memcpy(out->data(), &bytes, 8);
      return;
    }
    const auto* rec = pool_->at<ValueRecord>(p & ~kOutOfLine);
    if (rec->length == 8 && out->size() == 8) {  // the common 8-byte value: no call
      std::memcpy(out->data(), rec + 1, 8);
      return;
    }
    read_record_value(word, out);
  }
  void read_record_value(std::uint64_t word, std::string* out) const;
  void free_value(std::uint64_t word);           // immediately (never published)
  void retire_value(std::uint64_t word);         // after an epoch

  // PM access
  Entry* entries(const Leaf* leaf) const {
    return reinterpret_cast<Entry*>(pool_->at<char>(leaf->data_off) + sizeof(BlockHeader));
  }
  BlockHeader* block(const Leaf* leaf) const { return pool_->at<BlockHeader>(leaf->data_off); }
  // The PM link naming `leaf` (its offset and its block's tag), or the chain's end mark.
  std::uint64_t link_to(const Leaf* leaf) const {
    return leaf != nullptr ? index_common::make_link(leaf->data_off, block(leaf)->tag)
                           : index_common::kChainEnd;
  }
  static std::uint8_t fingerprint(std::uint64_t key);
  bool adr() const { return mode_ == pm::Mode::adr; }
  void hook(HookPoint p, const Leaf* leaf) const {
    if constexpr (kHooks) {
      // acquire: pairs with set_hooks' release, so the hook object is seen fully built.
      if (Hooks* h = hooks_.load(std::memory_order_acquire)) [[unlikely]] h->at(p, leaf);
    }
  }

  // Order of the DRAM layer (leaf ranges, inner separators, splits) over bound words; see
  // Leaf. The u64 descent (find_leaf) does not use these: it compares integers directly.
  bool probe_ge(const Probe& p, std::uint64_t bound) const {  // key >= bound (a low / sep)
    return bytes_ ? bound != 0 && p.bytes >= index_common::SeparatorStore::view(bound)
                  : p.word >= bound;
  }
  bool probe_above(const Probe& p, std::uint64_t high) const {  // key beyond a leaf's high
    return high != kNoHigh &&
           (bytes_ ? p.bytes >= index_common::SeparatorStore::view(high) : p.word > high);
  }
  bool in_range(const Leaf* l, const Probe& p) const {
    return probe_ge(p, l->low) && !probe_above(p, l->high);
  }
  bool bound_less(std::uint64_t a, std::uint64_t b) const { return keys_.separator_less(a, b); }
  bool bound_eq(std::uint64_t a, std::uint64_t b) const;
  std::uint64_t high_before(std::uint64_t sep) const { return bytes_ ? sep : sep - 1; }
  std::uint64_t make_bound(std::string_view key_bytes, std::uint64_t key_word);  // a low / split
  Probe probe_of_bound(std::uint64_t bound) const;

  // leaf operations
  Leaf* find_leaf(const Probe& p) const;
  Leaf* find_leaf_before(std::uint64_t low) const;  // the leaf holding the keys just below low
  template <class Order>
  Leaf* descend(const Order& order) const;
  template <class Order>
  static void* snapshot(const Inner* node, const Order& order, Inner** right);
  template <class Order>
  static Leaf* resolve(Leaf* leaf, const Order& order);
  // The committed slot holding the key, or -1; *key_word: the slot's key word.
  int find_slot(const Leaf* leaf, const Probe& p, std::uint64_t bitmap,
                std::uint64_t* key_word = nullptr) const;
  // I: the form of the fingerprint compare (docs/isa.md; avx2 only under find_u64_avx2).
  template <bool kBytes, index_common::SearchIsa I = index_common::kBuiltIsa>
  int find_slot_in(const Leaf* leaf, const Probe& p, std::uint64_t bitmap,
                   std::uint64_t* key_word) const;
  // Reads one committed slot: key, value, key again (a delete clears the key before it clears
  // an out-of-line value, so a changed key means the value may be stale). R1: in ADR mode a
  // reader that finds a writer in flight on the slot writes the line back itself, so it never
  // returns a value a crash could still take away. Inline: on every lookup's path.
  std::uint64_t read_word(const Leaf* leaf, int slot, std::uint64_t* key_out) const {
    Entry* e = &entries(leaf)[slot];
    const std::uint64_t k1 = pm::load_acquire(&e->key);
    const std::uint64_t w = pm::load_acquire(&e->value);
    const std::uint64_t k2 = pm::load_acquire(&e->key);
    if (adr() && leaf->pending[slot].load(std::memory_order_seq_cst) != 0 &&
        fault_ != Fault::skip_reader_persist) [[unlikely]] {
      pm::persist(e, sizeof(Entry));  // R1
      reader_persists_.fetch_add(1, std::memory_order_relaxed);
    }
    *key_out = (k1 == k2) ? k1 : 0;
    return w;
  }
  bool wait_for_lower_inserts(const Leaf* leaf, int slot, const Probe& p) const;
  // insert/update without the pool_full retry (index_common::retry_after_reclaim)
  Code insert_once(std::string_view key, std::string_view value);
  Code update_once(std::string_view key, std::string_view value);
  Code insert_word(const Probe& p, std::uint64_t key_word, std::uint64_t word);
  Code update_word(const Probe& p, std::uint64_t word, std::uint64_t* old_word);
  Code remove_key(const Probe& p);
  Code find_word(const Probe& p, std::uint64_t* word) const;
  Code find_in_leaf(Leaf* leaf, const Probe& p, std::uint64_t* word) const;  // find_word's leaf part
  template <bool kBytes, index_common::SearchIsa I = index_common::kBuiltIsa>
  Code find_in_leaf_t(Leaf* leaf, const Probe& p, std::uint64_t* word) const;
  Code find_general(std::string_view key, std::string* value) const;  // find's uncommon keys
  // find's integer-key path in the two forms of the inner and fingerprint searches
  // (docs/isa.md), chosen by search_avx2_. Both out of line: with one form inlined, find
  // saved its registers before the test (19 instructions where a tail call takes 3).
  template <index_common::SearchIsa I>
  [[gnu::always_inline]] inline Code find_u64(std::string_view key, std::string* value) const;
  [[gnu::noinline]] Code find_u64_baseline(std::string_view key, std::string* value) const;
  PMINDEX_AVX2_ENTRY [[gnu::noinline]] Code find_u64_avx2(std::string_view key,
                                                          std::string* value) const;
  void begin_write(Leaf* leaf, int slot) const;
  void end_write(Leaf* leaf, int slot, const void* line) const;
  bool enter_write(Leaf* leaf, int slot) const;  // W2: false if the leaf is sealed
  void leave_write(Leaf* leaf, int slot) const;
  void drain_writers(Leaf* leaf) const;          // S8b

  // SMO
  // Helps the SMO that owns `leaf`'s smo bit (C1): a split or copy, or a merge (M).
  void help_smo(Leaf* leaf);
  SmoDesc* copy_and_publish(Leaf* leaf);  // S2g, S2, S3 (or S2x)
  SmoDesc* roll_back_smo(Leaf* leaf);     // S2x
  SmoDesc* copy_phase(Leaf* leaf);
  void sync_slot(Leaf* old_leaf, int slot, const SmoDesc* d) const;
  void link_phase(Leaf* leaf, SmoDesc* d);
  void help_link(Leaf* leaf);
  Leaf* new_leaf(std::uint64_t low, std::uint64_t high, Code* code);
  void continue_chain(Leaf* last, Leaf* succ);  // S9 / M5: the new chain's last link
  void destroy_unpublished(SmoDesc* d);

  // merge SMO (M0..M7, smo.cpp)
  void maybe_merge(Leaf* right);                 // M0: after a delete emptied `right`
  bool start_merge(Leaf* left, Leaf* right);     // M1; false: gave up
  bool merge_inner_left(const std::vector<Inner*>& path);  // M0b (inner_mu_ held)
  MergeDesc* confirmed_merge(Leaf* leaf) const;  // the merge owning leaf's smo bit, or null
  void help_merge(MergeDesc* md);                // M2..M7, cooperative
  SmoDesc* merge_copy_and_publish(MergeDesc* md);  // M2, M3 on the left leaf (its gate)
  SmoDesc* merge_copy_phase(MergeDesc* md, Code* code);
  SmoDesc* abort_merge(MergeDesc* md);           // M2x (inside the left leaf's gate)
  void undo_freeze(Leaf* leaf);                  // S2x on one leaf (enters its gate)
  void destroy_unpublished_merge(SmoDesc* d);
  void merge_link(MergeDesc* md, SmoDesc* d);    // M5..M7
  bool adjacent_in_parent(const Leaf* left, const Leaf* right) const;  // inner_mu_ held
  void install_merge_in_parent(Leaf* left, Leaf* right, Leaf* merged);  // M6
  void release_merge(MergeDesc* md);             // a leaf word's reference dropped
  // Whether this thread's last merge gave up for want of space (M2x); clears the mark.
  static bool merge_found_pool_full();
  bool merge_pair(const void* a, const void* b) const;  // published merge a|b (inner split)

  // inner nodes
  void install_in_parent(Leaf* old_leaf, SmoDesc* d);
  // Inserts separator `key` -> `child` into path[level_index]; if `replace_from` is set, the
  // same node write also swaps that child pointer for `replace_to` (S13: one atomic change).
  void insert_into_inner(std::vector<Inner*>& path, int level_index, std::uint64_t key,
                         void* child, void* replace_from = nullptr, void* replace_to = nullptr);
  std::vector<Inner*> path_to(std::uint64_t low) const;  // inner_mu_ held; low: a bound word
  void build_inner_from_leaves(const std::vector<Leaf*>& leaves);
  void free_dram();
  // Leaf metadata and inner nodes live in dram_, an arena of transparent huge pages: a lookup
  // reads one random leaf's metadata, which on 4 KiB pages is a TLB miss on top of the cache
  // miss. make_dram value-initialises a T there (std::bad_alloc when DRAM is exhausted, as
  // new); drop_dram destroys it and returns the block to the arena.
  template <class T>
  T* make_dram() {
    void* p = dram_.allocate(sizeof(T));
    if (p == nullptr) throw std::bad_alloc();
    return new (p) T();
  }
  template <class T>
  void drop_dram(T* p) {
    if (p == nullptr) return;
    p->~T();
    dram_.deallocate(p, sizeof(T));
  }
  std::uint64_t pm_allocate(std::size_t bytes, Code* code);
  void pm_free(std::uint64_t off, std::size_t bytes);

  // key 0 (side record in the root)
  Code zero_insert(std::uint64_t word);
  Code zero_update(std::uint64_t word);
  Code zero_remove();
  Code zero_find(std::uint64_t* word) const;

  // recovery
  Status init_root();
  Status rebuild();
  // rebuild's steps (recovery.cpp): one block's live entries, and the checks of a value record.
  struct BlockKeys;
  using Repairs = std::vector<std::pair<std::uint64_t*, std::uint64_t>>;
  std::string load_block_entries(std::uint64_t off, const Entry* e, Leaf* leaf, BlockKeys* keys,
                                 Repairs* repairs);
  Status mark_value_record(std::uint64_t word, std::uint64_t where);
  Status finish_rebuild(std::vector<Leaf*>& leaves, const Repairs& repairs, std::size_t walked);
  // bulk_load's steps (recovery.cpp): the input checked and encoded (K1 records written), the
  // filled blocks (B1), and their chain persisted and published (B2-B4).
  struct BulkRecord;
  Status encode_bulk(std::span<const KeyValue> sorted, std::vector<BulkRecord>* recs);
  void free_bulk(const std::vector<BulkRecord>& recs);
  Status fill_bulk_leaves(const std::vector<BulkRecord>& recs, std::size_t begin, double fill,
                          std::vector<Leaf*>* leaves);
  void publish_bulk(const std::vector<Leaf*>& leaves, Leaf* old_head);
  // Records (keys set, key 0's side record included) and blocks on the PM chain, read-only
  // (close, quiescent); kNoCount if the chain fails its bounded walk.
  void count_chain(std::uint64_t* records, std::uint64_t* blocks) const;
  Status verify_leaf(const Leaf* leaf, std::uint64_t* live) const;
  Status verify_inner(const Inner* node, std::uint64_t low, std::uint64_t high,
                      std::vector<const Leaf*>* leaves) const;

  std::unique_ptr<pm::Pool> pool_;
  Root* root_ = nullptr;
  pm::Mode mode_ = pm::Mode::adr;
  pm::KeyMode key_mode_ = pm::KeyMode::u64;
  bool bytes_ = false;  // key_mode_ == bytes
  bool search_avx2_ = false;  // find's search form: isa::search_level() at open (docs/isa.md)
  std::uint64_t first_low_ = 1;  // the first leaf's low: 1 (u64) or the bound ""
  std::uint32_t node_size_;
  int cap_;
  int fanout_;
  std::uint32_t max_value_;
  std::atomic<Inner*> root_node_{nullptr};
  std::atomic<Leaf*> head_{nullptr};
  index_common::TagSource tags_;  // new blocks' own tags (new_leaf)
  // The installed Hooks in the tracing flavour; elsewhere an empty stand-in that holds none.
  struct NoHooks {
    Hooks* load(std::memory_order) const { return nullptr; }
    void store(Hooks*, std::memory_order) {}
  };
  [[no_unique_address]] std::conditional_t<kHooks, std::atomic<Hooks*>, NoHooks> hooks_{};
  // Spin locks (pm::yield_point in the spin loop), not std::mutex: a holder may be parked by
  // the crash simulator's deterministic scheduler at a traced store inside the section.
  mutable sync::SpinLock inner_mu_;      // inner-node writers (S13, N1, bulk build)
  mutable sync::SpinLock zero_mu_;       // key 0's side record (Z1)
  // Serialises this tree's calls into the pool allocator. The allocator's central lock is a
  // std::mutex held across a traced store (raising the persisted high-water mark); taken
  // only under this spin lock it is never contended, so a simulated thread parked inside it
  // cannot block another one (crash simulator). Allocation is off the common path (SMOs and
  // out-of-line values only).
  mutable sync::SpinLock alloc_mu_;
  // A Fault in the tracing flavour; elsewhere an empty constant that reads as Fault::none.
  struct NoFault {
    constexpr operator Fault() const { return Fault::none; }
    constexpr NoFault& operator=(Fault) { return *this; }
  };
  [[no_unique_address]] std::conditional_t<pm::kTracing, Fault, NoFault> fault_{};
  std::vector<Inner*> all_inner_;     // every inner node, for freeing (inner_mu_)
  // Declared before epochs_: the epoch manager's last deleters return leaves to it.
  pm::DramArena dram_;
  index_common::KeyCodec keys_;        // the key mode (bytes: PM key records, K1..K5)
  // Bytes mode: DRAM copies of range bounds. A merge retires the bound between its two leaves
  // (M7); other published bounds live as long as the index; an SMO that lost S3
  // retires its unpublished split bound. Declared before epochs_ (SeparatorStore (3)).
  index_common::SeparatorStore seps_;
  mutable sync::EpochManager epochs_;  // E1: replaced leaves and value records
  mutable std::atomic<std::uint64_t> reader_persists_{0};  // relaxed: a statistic
  std::atomic<std::uint64_t> merges_linked_{0};            // relaxed: a statistic
  bool merges_on_ = true;
  RecoveryStats recovery_;
  bool closed_ = false;
};

}  // namespace pmindex::nbtree

// APEX (paper 004): a persistent learned index. Inner and data nodes live in PM; data nodes are
// model-addressed hash-like arrays with probe-and-stash; DRAM holds only rebuildable
// accelerators and metadata. Persistence steps: PROTOCOL.md (cited as // A<n>).
//
// Thread safety (paper §5; details in PROTOCOL.md "Concurrency"):
//   * Readers (find, scan) take no lock: they traverse with acquire loads of the child slots,
//     then validate the versions of the data node's optimistic locks (one per 256 PA records),
//     restarting from the root when a lock is obsolete (the node was replaced by an SMO).
//   * Writers (insert, update, remove) lock the one or two record locks covering their probe
//     window, left to right (everyone goes right: no deadlock). SA slots are claimed by CAS on
//     the stash bitmap; extended stash blocks are under DataMeta::ext_mu.
//   * An SMO locks top-down: the grandparent's RW lock (InnerMeta::mu, or root_mu_ for the
//     root word) shared, the parent's shared (exclusive to replace the parent itself: inner
//     expansion), the data node's SMO mutex, then every record lock of the data node, left to
//     to right. It re-checks, under those locks, that the path is still current. A replaced
//     data node's locks are released obsolete; a replaced inner node's meta is marked obsolete.
//   * Replaced nodes and their DRAM state are reclaimed through epochs (epochs_): every
//     operation is pinned while it can hold a node address.
//   * smo_mu_: SMOs hold it shared; the recovery walk, bulk load, verify, stats and footprint
//     hold it exclusive. verify/stats/footprint also need writers to be quiescent.
//   * Operations on one key find DRAM state from DRAM (leaf_fast: root_meta_, then each
//     InnerMeta's shadow of its child slots; PROTOCOL.md R4); scans, SMOs and slow paths find
//     it through the node header (`dram`, valid when L == tag). A missing state is built
//     under metas_mu_, which also owns every state (metas_) and guards shadow stores.
//   * Lazy recovery never trusts PM: a node is checked when its DRAM state is built (first
//     touch in a session: offsets, sizes, model, records; see PROTOCOL.md R4) and trusted
//     after that; traversals are depth-bounded. A damaged node makes the operation answer
//     Code::corrupted and the index refuse every later write (corrupted_).
// Invariants (checked by verify()):
//   (1) the root is an inner node; every inner node's children, in slot order, cover its
//       [lo, hi] exactly: a child occupying slots [s, e] has [lo, hi] equal to the keys the
//       parent's model routes to [s, e]; a child occupies one run of consecutive slots;
//   (2) the smallest (0) and largest (2^64-1) ordered keys lie in different data nodes, so each
//       data node has an invalid key (hi + 1 or lo - 1) outside its range;
//   (3) every record in a data node has lo <= key <= hi or key == invalid_key (free slot);
//       a PA record at slot i was predicted at p with p <= i < p + D; keys are unique;
//   (4) the DRAM accelerators agree with PM: fingerprints and free bits of PA slots, the stash
//       bitmap, and every stash record appears in exactly one overflow bucket of its group.
#pragma once

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>  // std::shared_lock
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "index/apex/layout.h"
#include "index/apex/model.h"
#include "index/common/prefetch.h"
#include "pmindex/index.h"
#include "pmindex/sync/epoch.h"
#include "pmindex/sync/optimistic_lock.h"
#include "pmindex/sync/shared_spin_lock.h"
#include "pmindex/sync/spin_lock.h"

namespace pmindex::apex {

// DRAM accelerator for 16 PA records (24 B).
//   fp[i]  fingerprint of the key in PA slot base+i (valid when the slot is used)
//   word   bits 0-15 free bitmap (1 = free) | bits 16-63 address of the overflow bucket chain
struct Accelerator {
  std::uint8_t fp[kGroup];
  std::uint64_t word;
};
static_assert(sizeof(Accelerator) == 24);
inline constexpr std::uint64_t kFreeMask = 0xffff;
inline constexpr unsigned kBucketShift = 16;

// Overflow bucket (DRAM): 15 entries, each bits 56-63 fingerprint | bits 0-55 PM offset of a
// stash record (0 = empty), then the next bucket of the chain.
struct OverflowBucket {
  std::uint64_t entry[15];
  OverflowBucket* next;
};
inline constexpr unsigned kFpShift = 56;
inline constexpr std::uint64_t kOffsetMask = (std::uint64_t{1} << kFpShift) - 1;

struct ExtInfo {
  std::uint64_t off;    // block offset
  std::uint16_t used;   // bit i: record i used
};

// All DRAM state of one data node, rebuilt from PM on first access in a generation.
// Record locks per data node: a node holds at most 256 KiB / 16 B PA records.
inline constexpr std::uint32_t kMaxRecordLocks = (kDefaultDataMax / 16 + 255) / 256;

// What a lookup needs of a node's PM header, copied to DRAM when the node is admitted (its
// first touch in a session, after its checks) and immutable after that: a node's model,
// range and sizes never change (SMOs build new nodes). `last` = slots - 1 as a double (the
// clamp of predict_slot, one conversion less per lookup).
struct SearchModel {
  double slope = 0;
  double intercept = 0;
  std::uint64_t lo = 0;
  double last = 0;
  std::uint32_t slots = 1;
};
// predict_slot over a SearchModel: the same slot for the same key (same operations).
// Branch-free (issue 16: two fewer compares and jumps per level), with predict_slot's result
// for every v: v <= 0 and NaN give 0 (maxsd returns its second operand when either is NaN),
// v >= last gives last = slots - 1 exactly, anything between truncates.
inline std::uint32_t search_slot(const SearchModel& m, double x) {
  double v = m.slope * x + m.intercept;
  v = v > 0 ? v : 0.0;
  v = v < m.last ? v : m.last;
  return static_cast<std::uint32_t>(v);
}

struct alignas(64) DataMeta {
  // Search state (issue 16): a lookup reads the model and the PA address from here, in the
  // line that also holds lock 0, and touches PM only for the records.
  SearchModel model;      // PA model: slots = pa_slots
  std::uint64_t hi = 0;   // the node's range is [model.lo, hi]
  const Record* pa = nullptr;
  std::uint64_t off = 0;  // the node's pool offset
  // One optimistic lock per 256 PA records (paper §5). A writer locks the one or two locks
  // covering its probe window [p, p+16), left to right (no deadlock: everyone goes right);
  // readers validate the same locks. The window's accelerator groups and the overflow bucket
  // of group p/16 lie inside those locks' 256-record blocks. An SMO takes smo_mu, then every
  // lock, and releases them obsolete if it replaced the node (`retired` set under smo_mu).
  // Inline (not a separate array): a lookup reads the model and lock 0 from the DataMeta's
  // first line, locks 1..8 from the second.
  sync::OptimisticLock locks[kMaxRecordLocks];
  std::uint32_t num_locks = 0;
  std::vector<Accelerator> accel;
  // Bit per SA slot, 1 = used. Writers under different locks claim SA slots by CAS on the
  // word (acq_rel), and release them with fetch_and after writing the invalid key.
  std::vector<std::uint64_t> stash_used;
  sync::SpinLock ext_mu;                  // extended stash: allocation, `ext` and its bits
  std::vector<ExtInfo> ext;               // extended stash blocks in chain order
  // Counters (relaxed: exact only when quiescent — SMOs read them under the exclusive tree
  // lock; inserts use them only to decide whether to try an SMO).
  std::atomic<std::uint64_t> num_keys{0};
  std::atomic<std::uint64_t> num_stash{0};  // records in SA or extended stash (overflowed)
  std::uint64_t keys() const { return num_keys.load(std::memory_order_relaxed); }
  std::uint64_t stashed() const { return num_stash.load(std::memory_order_relaxed); }
  void add_keys(std::int64_t d) { num_keys.fetch_add(static_cast<std::uint64_t>(d), std::memory_order_relaxed); }
  void add_stash(std::int64_t d) { num_stash.fetch_add(static_cast<std::uint64_t>(d), std::memory_order_relaxed); }
  double created_cost = 1.0;              // search cost when built (cost model baseline)
  std::uint64_t built_keys = 0;           // keys when this DRAM state was built
  // Inserts since the DRAM state was built (relaxed; the cost-deviation trigger): all of them,
  // those that went to SA / extended stash, and the overflow buckets (DRAM) plus extended
  // stash blocks (PM) they allocated — the paper's insert cost (§4.4). Plain load + store, not
  // fetch_add: writers under different record locks of one node may lose an increment, which
  // only delays a heuristic, and a locked RMW issued after an insert's clwb + sfence waits for
  // that write-back (measured: one extra fetch_add there cost ~20 % of insert throughput).
  // For the same reason inserts and deletes count num_keys/num_stash before their persist.
  std::atomic<std::uint64_t> ins_total{0};
  std::atomic<std::uint64_t> ins_stash{0};
  std::atomic<std::uint64_t> ins_allocs{0};
  void note_insert(bool stash, std::uint64_t allocs) {
    bump(ins_total, 1);
    if (stash) bump(ins_stash, 1);
    if (allocs != 0) bump(ins_allocs, allocs);
  }
  static void bump(std::atomic<std::uint64_t>& c, std::uint64_t d) {
    c.store(c.load(std::memory_order_relaxed) + d, std::memory_order_relaxed);
  }
  // An SMO failed: retry only once num_keys reaches it (relaxed: a heuristic threshold).
  std::atomic<std::uint64_t> smo_retry_at{0};
  sync::SpinLock smo_mu;                  // per-data-node SMO lock (paper §5)
  // Contraction/merge after deletes: try again only below this many keys (relaxed heuristic).
  std::atomic<std::uint64_t> contract_below{~std::uint64_t{0}};
  bool retired = false;                   // guarded by smo_mu: replaced by an SMO
  ~DataMeta();
  // acquire: a reader that finds a bucket sees its entries as the writer published them.
  OverflowBucket* bucket(std::uint32_t group) const {
    return reinterpret_cast<OverflowBucket*>(sync::optimistic_read(accel[group].word) >>
                                             kBucketShift);
  }
  // Lock holder only; release: pairs with bucket().
  void set_bucket(std::uint32_t group, OverflowBucket* b) {
    sync::locked_write(accel[group].word, (accel[group].word & kFreeMask) |
                                              (reinterpret_cast<std::uint64_t>(b) << kBucketShift));
  }
  void set_word(std::uint32_t group, std::uint64_t w) { sync::locked_write(accel[group].word, w); }
};

// DRAM state of one inner node: the reader-writer lock SMOs take (paper §5). Shared: an SMO
// of a child switches that child's slots (disjoint slots per child); exclusive: the node itself
// is replaced (inner expansion), after which `obsolete` is set and everyone who then locks it
// restarts from the root.
//
// Search state (issue 16): the node's model, and `child`, a DRAM shadow of its child slots:
// per slot the DRAM state of the child (a DataMeta*, or an InnerMeta* | kInnerTag), or 0 when
// not resolved yet. Lookups descend through these alone (no PM read until the data node's
// records). An entry is written only under metas_mu_ and only while the PM slot still holds
// the child it was resolved from; switch_children stores the PM slot first and then clears
// the entry under metas_mu_, so an entry never outlives its PM slot's value (resolve_child).
struct InnerMeta {
  SearchModel model;  // routing model: slots = fanout
  std::unique_ptr<std::atomic<std::uintptr_t>[]> child;
  const std::uint64_t* pm_child = nullptr;  // the node's PM child slots
  sync::SharedSpinLock mu;
  bool obsolete = false;  // guarded by mu
};
inline constexpr std::uintptr_t kInnerTag = 1;

inline std::uint8_t fingerprint(std::uint64_t key) {
  std::uint64_t h = key * 0x9e3779b97f4a7c15ull;
  h ^= h >> 29;
  return static_cast<std::uint8_t>(h >> 56);
}

// Test hooks of the recovery walk's start, process-wide, read by the open (issue 18's walk-race
// test, tests/index/apex/test_apex_crash.cpp). Tracing flavour only: the production and counting
// libraries never read them. `before_lock` runs on the walker thread before it takes smo_mu_
// (a test holds the walker there); `skip_open_wait` makes the open return without waiting for
// the walker to hold smo_mu_: the race 4153ec7 fixed, so the test can show that it fails.
struct WalkTestHooks {
  std::function<void()> before_lock;
  bool skip_open_wait = false;
};
WalkTestHooks& walk_test_hooks();

class Apex final : public Index {
 public:
  static pm::Layout layout_for(const Options& options);
  static Status validate(const Options& options);  // before any file is touched
  static std::size_t default_pool_size(const Options& options);
  static Result<std::unique_ptr<Index>> create(std::unique_ptr<pm::Pool> pool,
                                               const Options& options);
  static Result<std::unique_ptr<Index>> recover(std::unique_ptr<pm::Pool> pool,
                                                const Options& options);

  ~Apex() override;
  ThreadScope attach_thread() override;
  std::string_view kind() const override { return "apex"; }
  Code insert(std::string_view key, std::string_view value) override;
  Code update(std::string_view key, std::string_view value) override;
  Code find(std::string_view key, std::string* value) const override;
  void find_batch(const std::string_view* keys, std::string* values, Code* codes,
                  std::size_t n) const override;
  Code remove(std::string_view key) override;
  std::size_t scan(std::string_view start, std::size_t max, ScanBuffer& out) const override;
  Status bulk_load(std::span<const KeyValue> sorted, double fill) override;
  Status verify() const override;
  RecoveryStats recovery_stats() const override;
  Footprint footprint() const override;
  Status close() override;
  const pm::Pool& pool() const override { return *pool_; }

  // Node statistics (for tests and, later, the paper's Table 1).
  // Table 1 of the paper: depth (average over data nodes, maximum), node counts, stash ratio
  // (SA slots / (PA + SA) slots, averaged over data nodes) and overflow ratio (records in SA
  // or extended stash / records).
  struct Stats {
    std::uint64_t inner_nodes = 0, data_nodes = 0, ext_blocks = 0, records = 0, stash_records = 0;
    // PM bytes requested for the reachable nodes (allocator rounding and the root object,
    // logs and free blocks not included): inner nodes, data nodes, extended stash blocks.
    std::uint64_t inner_bytes = 0, data_bytes = 0, ext_bytes = 0;
    std::uint32_t max_depth = 0;
    double avg_depth = 0, avg_stash_ratio = 0, overflow_ratio = 0;
    std::uint64_t depth_sum = 0;
    double stash_ratio_sum = 0;
    std::uint64_t expansions = 0, sideways_splits = 0, downward_splits = 0, inner_expansions = 0,
                  contractions = 0, merges = 0, collapses = 0;
  };
  Stats stats() const;
  // The SMO counters of stats() alone: no lock and no walk, so safe beside running operations
  // (the crash suites read them after every operation); every other field is 0.
  Stats smo_counts() const;
  // Test hook: a raw pointer to the PM record of `key` (nullptr if absent), so a test can
  // corrupt PM and check that verify() notices.
  Record* debug_record(std::string_view key);
  // Test hook: the data node that holds `key`'s range (nullptr for a bad key).
  DataNode* debug_data_node(std::string_view key);
  // Test hook: waits for the background recovery walk to finish.
  void wait_recovery_walk();
  // Test hook: called (under the index lock) at every persistence step of every SMO with the
  // SMO kind and step ("expand_data:undo"; steps undo, built, redo, half-switched, switched,
  // done); a crash test
  // snapshots the pool file there and recovers each snapshot.
  void set_smo_hook(std::function<void(std::string_view)> hook) { smo_hook_ = std::move(hook); }
  // Test-only faults: known-bad variants that the crash suites must catch. The tracing flavour
  // only (production aborts); read off the hot paths, once per SMO.
  enum class Fault : int {
    none,
    // A merge or collapse switches its parent slots (A16) without staging REDO first (A15
    // skipped): a crash inside or right after A16 recovers as UNDO, which frees the new node
    // that some slots already name.
    merge_switch_in_undo,
  };
  void set_fault_for_testing(Fault f) {
    if (f != Fault::none && !pm::kTracing) std::abort();
    fault_ = f;
  }

 private:
  struct PathStep {
    std::uint64_t inner;
    std::uint32_t slot;
  };
  struct Location {
    Record* rec = nullptr;
    enum class Where : std::uint8_t { none, pa, sa, ext } where = Where::none;
    std::uint32_t index = 0;  // PA/SA slot, or ext block index * 15 + record
  };
  struct Counters {  // relaxed: statistics
    std::atomic<std::uint64_t> expansions{0}, sideways{0}, downward{0}, inner_expansions{0},
        contractions{0}, merges{0}, collapses{0};
  };

  explicit Apex(std::unique_ptr<pm::Pool> pool);
  // Inline (issue 16): the key is one load and a byte swap, no call into index.cpp.
  Code check_key(std::string_view key, std::uint64_t* out) const {
    if (key.size() != 8) return Code::invalid_argument;
    std::uint64_t be;
    std::memcpy(&be, key.data(), 8);
    const std::uint64_t k = __builtin_bswap64(be);  // the big-endian encoding (encode_u64)
    if (kt_ == KeyType::f64 && std::isnan(f64_of(k))) return Code::invalid_argument;
    *out = k;
    return Code::ok;
  }
  Status init_empty(std::uint64_t data_max, std::uint64_t inner_max, KeyType kt);

  // --- traversal and node access (apex.cpp) --------------------------------------------------
  // The data node `key` routes to; 0 if a node on the way is damaged (recorded by damaged()).
  std::uint64_t traverse(std::uint64_t key, std::vector<PathStep>* path) const;
  // Descends from `off` (at depth `depth`) to the data node routing `key`, admitting inner
  // nodes not yet checked in this session; 0 if one is damaged or the path is deeper than
  // kMaxDepth (a cycle).
  std::uint64_t walk_down(std::uint64_t off, std::uint64_t key, std::vector<PathStep>* path,
                          std::size_t depth) const;
  // traverse() + meta_for() + the node's range holds `key` (a sound tree routes nowhere else);
  // nullptr if not (damaged() was called).
  DataMeta* leaf(std::uint64_t key, std::uint64_t* off, std::vector<PathStep>* path) const;
  // leaf() for operations on one key (issue 16): the descent through the DRAM search state
  // (root_meta_, InnerMeta::child, DataMeta::model), inline, without a path and without
  // reading PM. A slot not resolved yet is resolved from PM (resolve_child); anything else
  // (a damaged node, a key outside the node's range, a path deeper than kMaxDepth) falls
  // back to leaf() from the root, which checks and reports it. `off` may be nullptr.
  // kU64: the caller has checked kt_ == KeyType::u64, so the model input is the plain
  // difference (no key-type test per level; find's fast path).
  template <bool kU64 = false>
  [[gnu::always_inline]] DataMeta* leaf_fast(std::uint64_t key, std::uint64_t* off) const {
    if (DataMeta* m = descend<kU64, true>(key)) [[likely]] {
      if (off != nullptr) *off = m->off;
      return m;
    }
    std::uint64_t unused = 0;  // off may be nullptr (find: the offset is not needed)
    return leaf(key, off != nullptr ? off : &unused, nullptr);
  }
  // leaf_fast's descent: nullptr where it must fall back to leaf(). kResolve: a root or child
  // slot whose DRAM state is not built yet is resolved from PM (resolve_root/resolve_child);
  // without it the descent gives up there instead (find's flat path makes no call).
  template <bool kU64, bool kResolve>
  [[gnu::always_inline]] DataMeta* descend(std::uint64_t key) const {
    // acquire: pairs with the release stores of resolve_root / resolve_child, which publish
    // fully built states.
    const InnerMeta* im = root_meta_.load(std::memory_order_acquire);
    if (im == nullptr) [[unlikely]] {
      if constexpr (!kResolve) return nullptr;
      im = resolve_root();
      if (im == nullptr) return nullptr;
    }
    for (std::uint32_t depth = 0; depth < kMaxDepth; ++depth) {
      const std::uint32_t slot = search_slot(im->model, x_of<kU64>(key, im->model.lo));
      std::uintptr_t c = im->child[slot].load(std::memory_order_acquire);
      if (c == 0) [[unlikely]] {
        if constexpr (!kResolve) return nullptr;
        c = resolve_child(*im, slot);
        if (c == 0) return nullptr;
      }
      if ((c & kInnerTag) == 0) {
        DataMeta* m = reinterpret_cast<DataMeta*>(c);
        if (key < m->model.lo || key > m->hi) [[unlikely]] return nullptr;  // leaf() reports it
        return m;
      }
      im = reinterpret_cast<const InnerMeta*>(c & ~kInnerTag);  // never null: tagged states
    }
    return nullptr;  // deeper than kMaxDepth: leaf() reports the cycle
  }
  // leaf_fast's slow paths: the root's / a child slot's DRAM state, resolved from PM and
  // (while the PM word still holds what was resolved) stored for the next lookups. nullptr /
  // 0 if the node is damaged.
  const InnerMeta* resolve_root() const;
  std::uintptr_t resolve_child(const InnerMeta& im, std::uint32_t slot) const;
  // Clears the DRAM shadow of slots [s, e] of `parent` (0: the root) after switch_children.
  void unshadow(std::uint64_t parent, std::uint32_t s, std::uint32_t e);
  // Resolves every slot of the tree (bulk load: the DRAM state is built there, not by the
  // first lookups).
  void resolve_all(const InnerMeta& im, std::uint32_t depth) const;
  template <bool kU64 = false>
  double x_of(std::uint64_t key, std::uint64_t lo) const {
    if constexpr (kU64) return static_cast<double>(key - lo);  // model_input's u64 case
    return model_input(kt_, key, lo);
  }
  std::uint32_t route(const InnerNode* in, std::uint64_t key) const {
    return predict_slot({in->slope, in->intercept}, x_of(key, in->lo), in->fanout);
  }
  std::uint32_t predict(const DataNode* dn, std::uint64_t key) const {
    return predict_slot({dn->slope, dn->intercept}, x_of(key, dn->lo), dn->pa_slots);
  }
  // base_: the pool's mapping (fixed for the pool's life), one load less than pool_->at.
  DataNode* data(std::uint64_t off) const { return reinterpret_cast<DataNode*>(base_ + off); }
  InnerNode* inner(std::uint64_t off) const { return reinterpret_cast<InnerNode*>(base_ + off); }
  // acquire: the header word also carries L, which a first accessor publishes concurrently.
  NodeType type_of(std::uint64_t off) const {
    return static_cast<NodeType>(pm::load_acquire(pool_->at<std::uint64_t>(off)) & kTypeMask);
  }

  // --- data node operations (data_node.cpp) ---------------------------------------------------
  // The locks covering the probe window of `key`: [first, last] (last = first or first + 1).
  struct LockSpan {
    std::uint32_t first, last;
    std::uint32_t p = kNoPrediction;  // the key's predicted PA slot (computed once per op)
  };
  static constexpr std::uint32_t kNoPrediction = ~std::uint32_t{0};
  LockSpan lock_span(const DataMeta& m, std::uint64_t key) const {
    const std::uint32_t p = search_slot(m.model, x_of(key, m.model.lo));
    const std::uint32_t end = std::min(p + kProbeDistance, m.model.slots) - 1;
    // Start loading the predicted PA lines now: the caller reads the span's lock next (usually
    // a DRAM miss of its own), and the key is almost always in the first two lines (§4.1).
    const char* rec = reinterpret_cast<const char*>(&m.pa[p]);
    index_common::prefetch_lines(rec, 128);
    return {p / 256, end / 256, p};
  }
  // Locks the span left to right; false (nothing held) if the node is obsolete.
  bool lock_window(DataMeta& m, LockSpan span) const;
  void unlock_window(DataMeta& m, LockSpan span) const;
  // The node's DRAM state, built (and the node checked) on first touch; nullptr if damaged.
  DataMeta* meta_for(std::uint64_t off) const {
    DataNode* dn = data(off);
    // acquire: pairs with the release store of L in build_meta, so `dram` (stored before it)
    // is visible.
    const std::uint64_t tv = pm::load_acquire(&dn->type_version);
    if ((tv >> kVersionShift) == tag_) [[likely]]
      return reinterpret_cast<DataMeta*>(pm::load_acquire(&dn->dram));
    return build_meta(off);
  }
  DataMeta* build_meta(std::uint64_t off) const;  // meta_for's slow path
  // nullptr, with *why set, if the node or one of its records is damaged.
  std::unique_ptr<DataMeta> rebuild_meta(std::uint64_t off, std::string* why) const;
  bool rebuild_ext(std::uint64_t off, DataMeta& m, std::string* why) const;
  // `p`: the key's prediction if the caller has it (kNoPrediction: computed here).
  Location locate(std::uint64_t off, const DataMeta& m, std::uint64_t key, bool use_pa_fp,
                  std::uint32_t p = kNoPrediction) const;
  // The stash part of locate: the stash record of `key` indexed by the overflow buckets of
  // its predicted slot p's group, or nullptr.
  const Record* find_stash(const DataMeta& m, std::uint64_t key, std::uint32_t p) const;
  // find_batch's probe step: find's optimistic read of `key` in the window `span` (PA, then
  // the stash), validated by the window's record locks; false if they forced a restart.
  [[gnu::always_inline]] inline bool probe_window(const DataMeta& dm, const LockSpan& span,
                                                  std::uint64_t key, const Record** rec,
                                                  std::uint64_t* payload) const;
  // scan's read of one data node: the records >= cur it must return and the cutoff key up to
  // which they are complete (PROTOCOL.md "Scans"), validated by the record locks; false if
  // the node became obsolete (the caller re-descends).
  bool scan_node(const DataNode* dn, const DataMeta& m, std::uint64_t cur, std::size_t need,
                 std::vector<Record>& recs,
                 std::vector<std::pair<std::uint32_t, std::uint64_t>>& versions,
                 std::uint64_t* cutoff) const;
  // find after check_key, for the calling thread already pinned: the general loop (any key
  // type, a probe window over two record locks, a locked or replaced node, the stash).
  [[gnu::noinline]] Code find_pinned(std::uint64_t k, std::string* value) const;
  // find's cold exits (tail calls, so find itself stays a leaf function): end the flat pin
  // and take the general way; end it when items are pending; size the caller's buffer.
  [[gnu::noinline, gnu::cold]] Code find_unpin_any(sync::EpochManager::FlatPin pin,
                                                   std::uint64_t k, std::string* value) const;
  [[gnu::noinline, gnu::cold]] Code find_unpin_pending(sync::EpochManager::FlatPin pin, Code c,
                                                       std::uint64_t payload,
                                                       std::string* value) const;
  [[gnu::noinline, gnu::cold]] static Code store_payload(std::uint64_t payload,
                                                         std::string* value);
  [[gnu::noinline]] Code find_any(std::string_view key, std::string* value) const;
  // ok, already_present, or pool_full; `needs_smo` set when the node is too dense.
  Code insert_into(std::uint64_t off, DataMeta& m, std::uint64_t key, std::uint64_t payload,
                   std::uint32_t p = kNoPrediction);
  void erase_at(std::uint64_t off, DataMeta& m, const Location& loc, std::uint64_t key);
  // Returns true if it allocated a new overflow bucket.
  bool bucket_add(DataMeta& m, std::uint32_t group, std::uint64_t key, std::uint64_t rec_off);
  void bucket_remove(DataMeta& m, std::uint32_t group, std::uint64_t rec_off);
  void collect(std::uint64_t off, std::vector<Record>& out) const;  // valid records, unsorted
  double search_cost(const DataMeta& m) const;
  // The inner node's DRAM state; nullptr if the node is damaged (admit_inner).
  InnerMeta* inner_meta_for(std::uint64_t off) const;
  // Runs an SMO for the insert of `key` (re-traversing and locking top-down first).
  // `contract`: shrink a node below the lower density bound instead (after a delete).
  Code smo_locked(std::uint64_t key, bool contract);
  // An insert into the node must first run an SMO: density above kDensityUpper, or the
  // inserts since it was built cost more than kCostDeviation x its built cost (cost_drifted).
  bool needs_smo(const DataNode* dn, const DataMeta& m) const;
  bool cost_drifted(const DataMeta& m) const;
  bool too_sparse(const DataNode* dn, const DataMeta& m) const;
  // Takes every record lock of `m` left to right; false (none held) if the node is obsolete.
  bool lock_all(DataMeta& m) const;
  // Retires a replaced node: its blocks and DRAM state are freed once no pinned operation can
  // hold its address (epochs). A18.
  void retire_node(std::uint64_t off);
  // Descends from the deepest node of `path` whose range holds `key` (the whole path is
  // re-walked from the root if none does); returns the data node.
  std::uint64_t descend(std::uint64_t key, std::vector<PathStep>& path) const;

  // --- building nodes (build.cpp) -------------------------------------------------------------
  // Builds and persists a data node holding `recs` (sorted, inside [lo, hi]); not published.
  std::uint64_t build_data(const std::vector<Record>& recs, std::uint64_t lo, std::uint64_t hi,
                           double stash_ratio, std::uint64_t total_slots, Code* code);
  // build_data's PA and SA sizes for about `total_slots` slots at stash ratio `stash_ratio`.
  void data_shape(std::uint64_t total_slots, double stash_ratio, std::uint64_t* pa,
                  std::uint64_t* sa) const;
  static std::uint64_t slots_for(std::uint64_t n) {  // slots holding n+1 keys at density 0.6
    return static_cast<std::uint64_t>(std::ceil(static_cast<double>(n + 1) / kDensityInit));
  }
  std::uint64_t max_data_slots() const { return (data_max_ - sizeof(DataNode)) / 16; }
  // Smallest key k in [lo, hi] with route(k) >= slot, or hi+1 (as `none`) if there is none.
  // `base` is the model's base key (the inner node's lo); returns false if no key in [lo, hi]
  // routes to `slot` or beyond.
  bool boundary(const LinearModel& m, std::uint32_t fanout, std::uint64_t base, std::uint64_t lo,
                std::uint64_t hi, std::uint32_t slot, std::uint64_t* out) const;
  void free_node(std::uint64_t off);
  void free_block(std::uint64_t off, std::size_t bytes);

  // --- SMOs (smo.cpp) -------------------------------------------------------------------------
  // Makes room for an insert into the full data node `off`. Returns ok if an SMO ran (the
  // caller retries from the root), unsupported if none was possible (insert into the stash).
  // `parent_exclusive`: the caller holds the parent's lock exclusively, so an inner
  // expansion may replace it; otherwise smo() returns Code::busy when it wants one.
  // `parent_replaced`: set when it ran an inner expansion (the data node stays).
  Code smo(std::uint64_t off, const std::vector<PathStep>& path, std::uint64_t key,
           bool parent_exclusive, bool* parent_replaced);
  // smo's sideways choice: the slot boundary in (s, e] of inner node `p` that balances the
  // sorted `recs` best, or 0 if every boundary leaves one side empty.
  std::uint32_t sideways_boundary(const InnerNode* p, const std::vector<Record>& recs,
                                  std::uint32_t s, std::uint32_t e) const;
  Code expand_data(std::uint64_t off, std::uint64_t parent, std::uint32_t s, std::uint32_t e,
                   std::uint64_t key);
  Code split_sideways(std::uint64_t off, std::uint64_t parent, std::uint32_t s, std::uint32_t e,
                      std::uint32_t m, std::uint64_t key);
  Code split_downward(std::uint64_t off, std::uint64_t parent, std::uint32_t s, std::uint32_t e,
                      std::uint64_t key);
  // Where a merged node goes: the parent's slot run of the two nodes, or (a collapse) the
  // grandparent's slot run of the parent, which the merged node then replaces.
  struct MergeTarget {
    std::uint64_t node;  // inner node whose slots are switched
    std::uint32_t s, e;
    bool collapse;
  };
  // Merges the data node `off` with its neighbour `other` (adjacent slot runs of one parent)
  // into one node over both ranges, linked at `to`; the old nodes stay for the caller.
  Code merge_data(std::uint64_t off, std::uint64_t other, std::uint64_t parent,
                  const MergeTarget& to, std::uint64_t key);
  // Under the locks smo_locked took on `off`: merge it with a sparse neighbour (collapsing the
  // parent when the two fill it: busy unless the parent is held exclusively), or contract it.
  Code contract_locked(std::uint64_t off, DataMeta& m, const std::vector<PathStep>& path,
                       bool parent_exclusive, std::uint64_t key);
  enum class InnerExpansion : std::uint8_t { doubling, extend_right, extend_left };
  Code expand_inner(std::uint64_t off, std::uint64_t parent, std::uint32_t s, std::uint32_t e,
                    std::uint64_t key, InnerExpansion how);
  SmoLog* my_log() const;
  void log_begin(SmoLog* log, SmoKind kind, std::uint64_t old_node, std::uint64_t parent,
                 std::uint64_t key, std::uint32_t s, std::uint32_t e, std::uint32_t m);
  void log_stage(SmoLog* log, SmoStage stage, SmoKind kind);
  void switch_children(std::uint64_t parent, std::uint32_t s, std::uint32_t e, std::uint64_t to);
  void slot_range(std::uint64_t parent, std::uint64_t child, std::uint32_t slot,
                  std::uint32_t* s, std::uint32_t* e) const;

  // --- bulk load (bulk_load.cpp) --------------------------------------------------------------
  std::uint64_t bulk_build(std::span<const Record> recs, std::uint64_t lo, std::uint64_t hi,
                           bool is_root, double fill, Code* code);
  struct BulkPlan;  // an inner node's model and child groups (bulk_load.cpp)
  // bulk_build's choice of inner node for `recs` (fanout 0: none separates them).
  BulkPlan bulk_plan(std::span<const Record> recs, const std::vector<double>& xs,
                     std::uint64_t lo, std::uint64_t hi, bool is_root, std::uint64_t cap) const;
  // Builds the children of `plan` and persists the inner node over them (A19); 0 on failure.
  std::uint64_t bulk_inner(std::span<const Record> recs, std::uint64_t lo, std::uint64_t hi,
                           const BulkPlan& plan, double fill, Code* code);
  void free_tree(std::uint64_t off);
  double simulate_overflow(std::span<const Record> recs, std::uint64_t lo, std::uint32_t pa) const;

  // --- recovery and verification (recovery.cpp, verify.cpp) -----------------------------------
  // First-touch checks: what is wrong with the node at `off`, empty if nothing. inner: header,
  // fanout, model, every child offset (in the heap, aligned, not the node itself). data: the
  // header only (offset, type, range, invalid key, sizes, stash ratio, model); rebuild_meta
  // checks the records and the extended stash chain.
  std::string inner_damage(std::uint64_t off) const;
  std::string data_header_damage(std::uint64_t off) const;
  // Checks an inner node not yet admitted in this session and builds its DRAM state (L := tag);
  // false (damaged() called) if it is damaged.
  bool admit_inner(std::uint64_t off) const;
  // Records damage found at `off`: from now on writes answer Code::corrupted. Returns it.
  Code damaged(std::uint64_t off, std::string_view what) const;
  bool refusing_writes() const {
    // relaxed: a flag only; nothing else is published through it.
    return corrupted_.load(std::memory_order_relaxed);
  }
  Status replay_logs();
  Status walk_and_mark(std::uint64_t off, std::uint32_t depth,
                       std::unordered_set<std::uint64_t>& seen_inner);
  void start_recovery_walk();
  // Records and nodes as walk_and_mark counts them, read-only (close, quiescent); false if a
  // node fails its first-touch check or the tree has a cycle (then nothing is recorded).
  bool count_tree(std::uint64_t off, std::uint32_t depth, std::unordered_set<std::uint64_t>& seen,
                  std::uint64_t* records, std::uint64_t* nodes) const;
  Status verify_node(std::uint64_t off, std::uint64_t lo, std::uint64_t hi, std::uint32_t depth,
                     std::uint64_t* records) const;
  Status verify_data(std::uint64_t off, std::uint64_t* records) const;
  // verify_data's second half: the node's DataMeta `m` against what its PM holds.
  Status verify_data_meta(std::uint64_t off, const DataMeta& m, std::size_t keys,
                          const std::vector<const Record*>& stash,
                          const std::vector<std::uint64_t>& ext_chain) const;
  // false if it met a damaged node (then `s` is partial).
  bool stats_node(std::uint64_t off, std::uint32_t depth, Stats* s) const;
  void add_smo_counts(Stats* s) const;  // smo_counts()'s counters into *s

  std::unique_ptr<pm::Pool> pool_;
  char* base_ = nullptr;  // pool_->base()
  Root* root_ = nullptr;
  KeyType kt_ = KeyType::u64;
  std::uint64_t data_max_ = kDefaultDataMax;
  std::uint64_t inner_max_ = kInnerMaxCap;
  std::uint64_t generation_ = 0;  // G: the pool generation of this session
  // L value of DRAM states built in this session: G + 1 in bits 0-15, random bits 16-55, so
  // a stale L left in PM never equals it (even if the pool's generation word went back).
  std::uint64_t tag_ = 1;
  mutable sync::SharedSpinLock smo_mu_;
  mutable sync::SharedSpinLock root_mu_;  // the "parent lock" of the root word (root_node)
  mutable sync::SpinLock metas_mu_;
  mutable std::unordered_map<std::uint64_t, std::unique_ptr<DataMeta>> metas_;
  mutable std::unordered_map<std::uint64_t, std::unique_ptr<InnerMeta>> inner_metas_;
  // The root's DRAM state (leaf_fast), nullptr until resolved; cleared (under metas_mu_)
  // whenever the root word changes.
  mutable std::atomic<const InnerMeta*> root_meta_{nullptr};
  mutable std::unordered_set<std::uint64_t> bad_nodes_;  // failed their check; under metas_mu_
  mutable std::atomic<bool> corrupted_{false};           // damage seen: writes are refused
  mutable sync::SpinLock damage_mu_;
  mutable Status damage_;  // the first damage seen (guarded by damage_mu_)
  mutable sync::EpochManager epochs_;
  Counters counters_;
  RecoveryStats recovery_;
  // Start-now recovery: blocks below recovery_hwm_ that are unlinked before the walk finished
  // are left to finish_recovery (unmarked = free); others are freed normally.
  std::uint64_t recovery_hwm_ = 0;
  std::uint64_t walk_records_ = 0;  // records the recovery walk counted (walker thread only)
  // True while the recovery walk runs: verify() waits for it (its record count is the base
  // the close-count comparison subtracts; pmpool check verifies right after the open).
  std::atomic<bool> walk_running_{false};
  // Set by the walker once it holds smo_mu_; the open returns only then (start_recovery_walk).
  std::atomic<bool> walk_holds_smo_{false};
  bool walk_pending_ = false;  // written by the walker under smo_mu_ exclusive; read under it
  std::vector<std::pair<std::uint64_t, std::size_t>> deferred_frees_;
  std::thread walker_;
  Status walk_status_;
  std::chrono::steady_clock::time_point open_start_;
  mutable std::atomic<bool> first_answer_{false};
  // first_answer_ && kt_ == u64, in one byte: find's test for its flat path.
  mutable std::atomic<bool> flat_find_{false};
  mutable std::atomic<double> first_answer_seconds_{0};
  void note_answer() const;
  struct AnswerNote {
    const Apex* index;
    ~AnswerNote() { index->note_answer(); }
  };
  bool closed_ = false;
  std::function<void(std::string_view)> smo_hook_;
  Fault fault_ = Fault::none;  // set_fault_for_testing
  std::atomic<SmoKind> current_kind_{SmoKind::none};  // relaxed: for the test hook only
  void step(std::string_view name) {
    static constexpr std::string_view kNames[] = {"none", "expand_data", "split_sideways",
                                                  "split_downward", "expand_inner", "merge",
                                                  "collapse"};
    if (smo_hook_) {
      smo_hook_(std::string(kNames[static_cast<int>(current_kind_.load(std::memory_order_relaxed))]) +
                ":" + std::string(name));
    }
  }
};

}  // namespace pmindex::apex

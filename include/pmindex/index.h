/// \file
/// The native API: what users program against. (tree_api in bench/ is only PiBench's
/// compatibility layer.)
///
///   auto idx = pmindex::Index::open({.kind = "lbtree", .path = "/dev/shm/pmindex/a.pool",
///                                     .pool_size = 1 << 30});
///   if (!idx.ok()) { std::cerr << idx.status().to_string(); ... }
///   (*idx)->insert(pmindex::encode_u64(42), pmindex::encode_u64(7));
///
/// Keys are byte strings compared by memcmp. The key type fixed at pool creation says how an
/// index may interpret them:
///   KeyType::u64    exactly 8 bytes, the big-endian encoding of the integer (encode_u64)
///   KeyType::f64    exactly 8 bytes, the order-preserving encoding of a double (encode_f64);
///                   NaN is refused with Code::invalid_argument
///   KeyType::bytes  1..max_key_size bytes of anything (NUL bytes included); some indexes also
///                   accept the empty key (see each index's README section)
/// Values are byte strings up to the index's documented limit (8 bytes for most indexes; larger
/// values, where supported, are stored out of line). A value longer than the limit is
/// Code::value_too_large in every index. In a fixed 8-byte value mode (APEX always; LB+-Tree
/// and FPTree with max_value_size 8) a shorter value is Code::invalid_argument; NBTree and the
/// reference index take any length up to the limit.
///
/// Thread safety: every operation may be called concurrently from several threads, unless an
/// index documents otherwise (the reference index serialises with one mutex). A thread
/// registers with an index's epoch-based reclamation at its first operation and stays
/// registered until it exits or the index is destroyed (include/pmindex/sync/epoch.h), so no
/// operation pays a register + unregister; a ThreadScope (attach_thread) is optional.
/// Destroying an index while threads that used it are still alive is allowed once none of
/// them runs an operation on it (their operations happen before the destructor, e.g. joined
/// or past an OpenMP barrier, as in PiBench); a thread that touches a destroyed index is a
/// misuse (undefined behaviour), and one inside an operation at that moment aborts the process.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pmindex/pm/layout.h"
#include "pmindex/pm/persist.h"
#include "pmindex/pm/pool.h"
#include "pmindex/pm/thread_slot.h"
#include "pmindex/status.h"

namespace pmindex {

/// How an index interprets its keys (fixed at pool creation; see the file comment).
using KeyType = pm::KeyMode;

// --- key encodings ----------------------------------------------------------------------------
std::string encode_u64(std::uint64_t v);                ///< 8 bytes, big-endian
std::uint64_t decode_u64(std::string_view bytes);       ///< requires bytes.size() == 8
std::string encode_f64(double v);                       ///< 8 bytes, order-preserving
double decode_f64(std::string_view bytes);             ///< requires bytes.size() == 8
/// The raw 64-bit forms of the same encodings (big-endian bytes read as an integer).
std::uint64_t f64_to_ordered(double v);
double ordered_to_f64(std::uint64_t v);  ///< the inverse of f64_to_ordered

/// What Index::open does when the pool file exists or does not.
enum class OpenMode : std::uint8_t {
  open_or_create,  ///< open the pool if it exists (recovering it), create it otherwise
  create,          ///< create; fail if the file exists unless overwrite
  open,            ///< open; fail if missing
};

/// PACTree's switches (Options::pactree; src/index/pactree/README.md "Updater"). updater and
/// stats are not stored in the pool, so each open may pick its own; search_layer is fixed at
/// creation.
struct PacTreeOptions {
  /// Who applies logged structure changes to the search layer. automatic: the background
  /// thread, except in the tracing flavour, where the writers apply them synchronously (the
  /// crash simulator enumerates the synchronous mode's steps).
  enum class Updater : std::uint8_t { automatic, background, synchronous };
  Updater updater = Updater::automatic;  ///< see Updater; automatic by default
  /// Print one line on stderr at close: updater mode, SMOs applied, pending entries (and their
  /// maximum), last-mile hops, log slots overwritten.
  bool stats = false;
  /// Placements of the search layer (see search_layer).
  enum class SearchLayer : std::uint8_t { automatic, dram, pm };
  /// Where the search layer (the trie of the data nodes' anchors) lives. Chosen when the pool
  /// is created and recorded in it: dram (rebuilt from the anchors at every open) or pm (the
  /// trie in the pool: no rebuild). automatic: dram for a new pool, the pool's own at open; an
  /// explicit choice that differs from an existing pool's is refused (invalid_argument, the
  /// pool unchanged).
  SearchLayer search_layer = SearchLayer::automatic;
};

/// DPTree's switches (Options::dptree; src/index/dptree/README.md). Not stored in the pool: each
/// open may pick its own.
struct DPTreeOptions {
  /// Who merges a full buffer into the base tree. automatic: the environment variable
  /// PMINDEX_DPTREE_MERGE (background or sync) if set, else background, except in the tracing
  /// flavour, where the writers merge synchronously (the crash simulator enumerates the
  /// synchronous mode's steps).
  enum class Merge : std::uint8_t { automatic, background, synchronous };
  Merge merge = Merge::automatic;  ///< see Merge; automatic by default
  /// Print one line on stderr at close: merges (in the background, failed, partial) and how
  /// often and how long writers waited for a running merge.
  bool stats = false;
};

/// Everything Index::open needs: which index, where its pool lives, and the limits a new pool
/// is created with (an existing pool's layout must match them unless layout_from_pool).
struct Options {
  std::string kind = "reflist";     ///< which index (IndexRegistry::names())
  std::string path;                 ///< pool file; empty: anonymous DRAM memory (no file)
  /// Maximum pool size in bytes (0: the index's default for `expected_records`). A file pool
  /// starts at initial_pool_size and grows in chunks as the index needs space, up to this;
  /// past it (or when the file system is full) inserts answer pool_full. docs/pool-format.md.
  std::size_t pool_size = 0;
  std::size_t initial_pool_size = 0;  ///< create: 0 is 64 MiB (or pool_size if smaller)
  std::size_t expected_records = 1'000'000;  ///< sizes the default pool_size
  pm::Mode persistence = pm::Mode::adr;     ///< adr, eadr or dram (pm/persist.h)
  std::uint32_t node_size = 0;      ///< bytes; 0: the index's default
  KeyType key_type = KeyType::u64;  ///< fixed at creation
  std::uint32_t max_key_size = 8;   ///< KeyType::bytes only
  std::uint32_t max_value_size = 8;  ///< bytes; larger values are stored out of line where supported
  OpenMode open_mode = OpenMode::open_or_create;  ///< create, open, or either
  bool overwrite = false;           ///< create over an existing file
  unsigned recovery_threads = 1;    ///< for indexes that rebuild in parallel
  /// Open only: take node size and key type from the pool's header instead of these options
  /// (tools that open any pool of a kind, e.g. pmpool check).
  bool layout_from_pool = false;
  /// Open only: map the pool copy-on-write (MAP_PRIVATE). Recovery and operations work on a
  /// private copy; nothing ever reaches the file. pmpool check uses it.
  bool private_mapping = false;
  /// File pools: map every page of the pool file before operations need it (at open or create
  /// and at each growth), as the originals' benchmarks touch their whole pools before a run;
  /// first-touch page faults then stay out of operations. Costs a pass over the file's pages at
  /// open. pm::PoolOptions::prefault; Index::pool().prefaulted() says whether the kernel did it.
  bool prefault = false;
  PacTreeOptions pactree;           ///< kind "pactree" only; other kinds ignore it
  DPTreeOptions dptree;             ///< kind "dptree" only; other kinds ignore it
};

/// One record of a bulk load's sorted input.
struct KeyValue {
  std::string_view key;    ///< the record's key
  std::string_view value;  ///< its value
};

/// Records produced by scan(): keys and values packed in one buffer, reused across calls.
class ScanBuffer {
 public:
  void clear() { bytes_.clear(); entries_.clear(); }  ///< empties it, keeping its capacity
  void append(std::string_view key, std::string_view value);  ///< copies one record in
  std::size_t size() const { return entries_.size(); }  ///< records held
  std::string_view key(std::size_t i) const;    ///< record i's key, valid until the next change
  std::string_view value(std::size_t i) const;  ///< record i's value, valid until the next change

 private:
  struct Entry { std::uint32_t key_off, key_len, value_off, value_len; };
  std::vector<char> bytes_;
  std::vector<Entry> entries_;
};

/// What opening the pool found and did (Index::recovery_stats()).
struct RecoveryStats {
  bool clean_shutdown = false;      ///< the previous session closed cleanly
  bool created = false;             ///< the pool was created, not recovered
  double seconds = 0;               ///< open -> index answers requests
  std::uint64_t records = 0;        ///< records found (when records_counted)
  bool records_counted = true;      ///< false: recovery is lazy (APEX) and did not walk the records
  std::uint64_t nodes = 0;          ///< PM nodes walked
  std::uint64_t repaired = 0;       ///< interrupted operations finished or rolled back
  unsigned threads = 1;             ///< threads recovery used
  /// What the pool's open found worth telling although it opened (pm::Pool::open_warning): a
  /// torn or damaged header state copy, or a pool last written in a weaker persistence mode
  /// (eadr, dram) that was not shut down cleanly, opened in adr. Empty otherwise.
  std::string warning;
};

/// Memory the index holds now (Index::footprint()).
struct Footprint {
  std::uint64_t pm_bytes = 0;       ///< PM bytes in use (allocator)
  std::uint64_t pm_reserved = 0;    ///< PM bytes carved from the heap
  std::uint64_t dram_bytes = 0;     ///< DRAM bytes held by the index (inner nodes, metadata)
};

namespace detail {

/// The record count behind Index::size(): a base (records found at recovery) plus one counter
/// per thread slot, summed on read. Only the slot's owner writes its counter, so an insert pays
/// a load and a store to a line no other thread writes (no shared counter, no RMW); a reader
/// sums the slots (relaxed: a count taken while writers run is a snapshot of no particular
/// instant, and exact once they stopped and the reader synchronized with them).
class RecordCount {
 public:
  void add(std::int64_t delta) {
    auto& n = slots_[pm::this_thread_slot()].n;
    n.store(n.load(std::memory_order_relaxed) + delta, std::memory_order_relaxed);
  }
  /// Lazy recovery: the base is unknown until set_base() (size() waits for it).
  void base_pending() { known_.store(false, std::memory_order_relaxed); }
  void set_base(std::uint64_t records) {
    base_.store(static_cast<std::int64_t>(records), std::memory_order_relaxed);
    known_.store(true, std::memory_order_release);  // pairs with total()'s acquire
    known_.notify_all();
  }
  /// The count, plus `extra` records the kind counts itself (Index::deferred_records).
  std::uint64_t total(std::int64_t extra = 0) const {
    known_.wait(false, std::memory_order_acquire);
    std::int64_t sum = base_.load(std::memory_order_relaxed) + extra;
    for (const Slot& s : slots_) sum += s.n.load(std::memory_order_relaxed);
    return sum < 0 ? 0 : static_cast<std::uint64_t>(sum);
  }

 private:
  struct alignas(64) Slot {
    std::atomic<std::int64_t> n{0};
  };
  std::array<Slot, pm::kMaxThreadSlots> slots_{};
  std::atomic<std::int64_t> base_{0};
  std::atomic<bool> known_{true};
};

}  // namespace detail

/// A persistent range index in a pool: the interface every kind implements. Create or reopen
/// one with Index::open; keys and values are byte strings (see the file comment). Answers are
/// Code values: ok, or the reason (already_present, not_found, pool_full, corrupted, ...).
class Index {
 public:
  /// Opens or creates the pool named by options.path and the index in it.
  static Result<std::unique_ptr<Index>> open(const Options& options);

  /// Without close(), leaves the pool as a crash would (recovery runs at the next open).
  virtual ~Index() = default;
  /// The registered name of this index ("lbtree", ...).
  virtual std::string_view kind() const = 0;

  /// Adds a record; already_present (nothing changed) if the key is there. Durable on ok.
  virtual Code insert(std::string_view key, std::string_view value) = 0;
  /// Replaces the value of a present key; not_found if absent. Durable on ok.
  virtual Code update(std::string_view key, std::string_view value) = 0;
  /// Inserts, or updates if the key is present. The default tries insert, then update, and
  /// retries while a concurrent remove or insert makes both miss.
  virtual Code upsert(std::string_view key, std::string_view value);
  /// Copies the key's value into *value (may be nullptr to test presence); not_found if absent.
  virtual Code find(std::string_view key, std::string* value) const = 0;
  /// Batched point lookups: codes[i] (and values[i]) as find(keys[i], &values[i]) gives them;
  /// `values` empty asks for presence only (find(key, nullptr)). The keys are independent, so
  /// an index advances their descents together and prefetches each key's next node before it
  /// steps the next key: the cache misses of a batch overlap instead of following one
  /// another. Groups of kFindBatch keys at a time (a larger batch is split); nothing is
  /// allocated per call once each values[i] holds 8 bytes (inline values). Concurrency is
  /// find's: each answer is one find could have given at some moment during the call (per
  /// key, not a snapshot of the batch). Returns invalid_argument (and looks nothing up) if
  /// codes.size() != keys.size() or values is neither empty nor keys.size() long; ok otherwise
  /// (the per-key answers are in codes).
  Code find_many(std::span<const std::string_view> keys, std::span<std::string> values,
                 std::span<Code> codes) const;
  static constexpr std::size_t kFindBatch = 32;  ///< keys find_many advances together
  /// Removes the key's record; not_found if absent. Durable on ok.
  virtual Code remove(std::string_view key) = 0;
  /// Up to `max` records with key >= start, ascending. Returns the count (also out.size()).
  virtual std::size_t scan(std::string_view start, std::size_t max, ScanBuffer& out) const = 0;
  /// Loads sorted, distinct records into an empty index, filling nodes to `fill` (0, 1].
  virtual Status bulk_load(std::span<const KeyValue> sorted, double fill);

  /// Checks every structural invariant; the message names the first violation.
  virtual Status verify() const = 0;
  /// What the open that made this object found and did.
  virtual RecoveryStats recovery_stats() const = 0;
  /// PM and DRAM the index holds now.
  virtual Footprint footprint() const = 0;
  /// Persists what is left and marks the pool cleanly shut down. The destructor without
  /// close() leaves the pool as a crash would (recovery runs at the next open).
  virtual Status close() = 0;
  /// The pool the index lives in (for tools, footprint and the crash simulator).
  virtual const pm::Pool& pool() const = 0;

  /// Per-thread attach for epoch-based reclamation. Optional: a thread registers at its first
  /// operation anyway and stays registered until it exits or the index goes; a scope only
  /// does that registration early. Destroying a scope touches nothing of the index, so a
  /// thread_local scope may outlive the index it came from.
  class ThreadScope {
   public:
    ThreadScope() = default;  ///< a scope that does nothing at its end
    /// A scope that calls `detach` at its end.
    explicit ThreadScope(std::function<void()> detach) : detach_(std::move(detach)) {}
    ThreadScope(ThreadScope&&) = default;             ///< moves the detach along
    ThreadScope& operator=(ThreadScope&&) = default;  ///< moves the detach along
    ~ThreadScope() { if (detach_) detach_(); }        ///< runs the detach, if any
   private:
    std::function<void()> detach_;
  };
  /// Registers the calling thread now (see ThreadScope); the default does nothing.
  virtual ThreadScope attach_thread() { return {}; }

  /// Records in the index. Every kind counts the records it finds at recovery and keeps
  /// per-thread counts of acknowledged inserts and removes, summed here: no walk of the index
  /// and no shared counter on the insert path. Exact whenever no insert or remove is in flight
  /// (one in flight may or may not be counted). Kinds that recover lazily (APEX, P-ART:
  /// recovery_stats().records_counted is false at open) learn the recovered count from their
  /// background recovery walk: until it ends size() waits for it (the walk is already running;
  /// the call adds no work), and afterwards it is off by at most the number of inserts and
  /// removes acknowledged between the open and the end of that walk (exact if the caller wrote
  /// nothing before size() first returned).
  std::uint64_t size() const { return records_.total(deferred_records()); }

 protected:
  /// Records acknowledged but counted by the kind itself rather than per operation, added to
  /// size(); the default has none. DPTree's blind upserts are known to add a record or not only
  /// when a merge places them, so it counts them then, or on demand here.
  virtual std::int64_t deferred_records() const { return 0; }
  /// find_many's group: n <= kFindBatch keys, values nullptr for presence only. The default
  /// calls find once per key (an index whose structure offers no overlap keeps it; its README
  /// says so).
  virtual void find_batch(const std::string_view* keys, std::string* values, Code* codes,
                          std::size_t n) const;
  /// For size(): each kind passes the code of every insert/remove it answers, the records a
  /// bulk load added, and the records its recovery found.
  Code count_insert(Code c) {
    if (c == Code::ok) records_.add(1);
    return c;
  }
  /// As count_insert, for removes.
  Code count_remove(Code c) {
    if (c == Code::ok) records_.add(-1);
    return c;
  }
  /// Records a bulk load added.
  void count_loaded(std::size_t records) { records_.add(static_cast<std::int64_t>(records)); }
  /// Records recovery found (ends the wait of a lazily recovering kind's size()).
  void set_recovered_records(std::uint64_t records) { records_.set_base(records); }
  /// Lazy recovery: size() waits until set_recovered_records().
  void recovered_records_pending() { records_.base_pending(); }

 private:
  detail::RecordCount records_;
};

/// What an index is, in the survey's terms (its Table 2 columns, plus recovery): reports draw the
/// design matrix from these, so a new index fills them when it registers.
struct IndexTraits {
  std::string_view architecture;    ///< e.g. "B+-tree; DRAM (inner) + PM (leaf)"
  std::string_view node_structure;  ///< e.g. "unsorted leaf; fingerprints"
  std::string_view concurrency;     ///< e.g. "optimistic locks (inner) + leaf locks"
  std::string_view variable_keys;   ///< "pointer (PM key records)", "inlined", or "no" and why
  std::string_view allocator;       ///< the PM allocator and how it avoids leaks
  std::string_view numa;            ///< NUMA awareness
  std::string_view recovery;        ///< what opening a pool does, and its cost
};

/// Index kinds by name. Each built-in index adds one entry in src/index/registry.cpp; an index
/// defined outside the library registers at run time with add() (examples/external_index/).
/// Index::open does the common part (create-or-open decision, pool creation and header checks)
/// and then calls the entry's create (fresh pool) or recover (existing pool, or a crash image),
/// so a registered kind is opened by name, crash-tested by the crash driver and run by pmbench
/// (`pmbench --plugin LIB`) exactly like a built-in one.
class IndexRegistry {
 public:
  using PoolPtr = std::unique_ptr<pm::Pool>;  ///< an open pool handed to create/recover
  /// One index kind: its name, how it lays out and validates a pool, and how it builds or
  /// recovers an index in one.
  struct Entry {
    std::string name;         ///< the kind's name, Options::kind ([a-z0-9_], <= 15 bytes)
    std::string description;  ///< one line for pmbench --help and reports
    /// The layout id a pool made with these options carries (kind, node size, key mode).
    pm::Layout (*layout)(const Options&);
    /// Refuses options this kind cannot create a pool with (node size, key and value limits).
    /// Index::open calls it before any file is created or replaced.
    Status (*validate)(const Options&);
    /// The maximum pool size when Options::pool_size is 0 (from expected_records).
    std::size_t (*default_pool_size)(const Options&);
    /// Builds an empty index on a freshly created pool (options already validated).
    Result<std::unique_ptr<Index>> (*create)(PoolPtr pool, const Options&);
    /// Validates and recovers the index in an existing pool (never trusting its contents),
    /// then calls pool->commit_open().
    Result<std::unique_ptr<Index>> (*recover)(PoolPtr pool, const Options&);
    IndexTraits traits;  ///< the kind's design, in the survey's terms
  };
  /// Every kind: the built-in ones, then the added ones in the order they were added.
  static std::vector<Entry> entries();
  /// The kind named `name`, or nullptr. The pointer stays valid for the process's lifetime.
  static const Entry* find(std::string_view name);
  /// Every kind's name, in entries() order.
  static std::vector<std::string> names();
  /// True for the kinds compiled into the library, false for added ones and unknown names.
  static bool built_in(std::string_view name);

  /// Registers an index kind defined outside the library. Refused with Code::invalid_argument
  /// (and nothing registered) when the name is empty, longer than a pool header's 15-byte kind
  /// field, not made of [a-z0-9_] or already taken, or when a function pointer is missing.
  /// Thread-safe; a kind cannot be removed. Register before opening pools of that kind.
  static Status add(Entry entry);
};

/// A plugin library for `pmbench --plugin` exports this C symbol, which registers its kinds with
/// IndexRegistry::add (examples/pair_log_plugin.cpp):
///   extern "C" pmindex::Status pmindex_register_plugin();
inline constexpr const char* kPluginEntryPoint = "pmindex_register_plugin";
/// The type of a plugin's kPluginEntryPoint function.
using PluginEntryPoint = Status (*)();

/// The instruction-set level this library was compiled for (README "Minimum CPU"): "x86-64-v2"
/// (the baseline: SSE4.2 and POPCNT; the packaged library) or "x86-64-v2+avx2" (built with
/// PMINDEX_ISA=avx2, as the benchmark presets are). Never fails; thread-safe.
std::string_view isa_level();

/// Whether this CPU runs the library's level: ok, or Code::unsupported naming the missing
/// extensions. A library whose level the CPU lacks never gets this far: at load time, before
/// any of its other code runs, it prints this message to stderr and exits with status 132 (what
/// the SIGILL it prevents would give). Thread-safe.
Status isa_check();

}  // namespace pmindex

// The native API: what users program against. (tree_api in bench/ is only PiBench's
// compatibility layer.)
//
//   auto idx = pmindex::Index::open({.kind = "lbtree", .path = "/dev/shm/pmindex/a.pool",
//                                     .pool_size = 1 << 30});
//   if (!idx.ok()) { std::cerr << idx.status().to_string(); ... }
//   (*idx)->insert(pmindex::encode_u64(42), pmindex::encode_u64(7));
//
// Keys are byte strings compared by memcmp. The key type fixed at pool creation says how an
// index may interpret them:
//   KeyType::u64    exactly 8 bytes, the big-endian encoding of the integer (encode_u64)
//   KeyType::f64    exactly 8 bytes, the order-preserving encoding of a double (encode_f64);
//                   NaN is refused with Code::invalid_argument
//   KeyType::bytes  1..max_key_size bytes of anything (NUL bytes included); some indexes also
//                   accept the empty key (see each index's README section)
// Values are byte strings up to the index's documented limit (8 bytes for most indexes; larger
// values, where supported, are stored out of line). A value longer than the limit is
// Code::value_too_large in every index. In a fixed 8-byte value mode (APEX always; LB+-Tree
// and FPTree with max_value_size 8) a shorter value is Code::invalid_argument; NBTree and the
// reference index take any length up to the limit.
//
// Thread safety: every operation may be called concurrently from several threads, unless an
// index documents otherwise (the reference index serialises with one mutex). A thread
// registers with an index's epoch-based reclamation at its first operation and stays
// registered until it exits or the index is destroyed (include/pmindex/sync/epoch.h), so no
// operation pays a register + unregister; a ThreadScope (attach_thread) is optional.
// Destroying an index while threads that used it are still alive is allowed once none of
// them runs an operation on it (their operations happen before the destructor, e.g. joined
// or past an OpenMP barrier, as in PiBench); a thread that touches a destroyed index is a
// misuse (undefined behaviour), and one inside an operation at that moment aborts the process.
#pragma once

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
#include "pmindex/status.h"

namespace pmindex {

using KeyType = pm::KeyMode;

// --- key encodings ----------------------------------------------------------------------------
std::string encode_u64(std::uint64_t v);                // 8 bytes, big-endian
std::uint64_t decode_u64(std::string_view bytes);       // requires bytes.size() == 8
std::string encode_f64(double v);                       // 8 bytes, order-preserving
double decode_f64(std::string_view bytes);
// The raw 64-bit forms of the same encodings (big-endian bytes read as an integer).
std::uint64_t f64_to_ordered(double v);
double ordered_to_f64(std::uint64_t v);

enum class OpenMode : std::uint8_t {
  open_or_create,  // open the pool if it exists (recovering it), create it otherwise
  create,          // create; fail if the file exists unless overwrite
  open,            // open; fail if missing
};

struct Options {
  std::string kind = "reflist";     // which index (IndexRegistry::names())
  std::string path;                 // pool file; empty: anonymous DRAM memory (no file)
  std::size_t pool_size = 0;        // bytes; 0: the index's default for `expected_records`
  std::size_t expected_records = 1'000'000;
  pm::Mode persistence = pm::Mode::adr;
  std::uint32_t node_size = 0;      // bytes; 0: the index's default
  KeyType key_type = KeyType::u64;
  std::uint32_t max_key_size = 8;   // KeyType::bytes only
  std::uint32_t max_value_size = 8;
  OpenMode open_mode = OpenMode::open_or_create;
  bool overwrite = false;           // create over an existing file
  unsigned recovery_threads = 1;    // for indexes that rebuild in parallel
  // Open only: take node size and key type from the pool's header instead of these options
  // (tools that open any pool of a kind, e.g. pmpool check).
  bool layout_from_pool = false;
  // Open only: map the pool copy-on-write (MAP_PRIVATE). Recovery and operations work on a
  // private copy; nothing ever reaches the file. pmpool check uses it.
  bool private_mapping = false;
};

struct KeyValue {
  std::string_view key;
  std::string_view value;
};

// Records produced by scan(): keys and values packed in one buffer, reused across calls.
class ScanBuffer {
 public:
  void clear() { bytes_.clear(); entries_.clear(); }
  void append(std::string_view key, std::string_view value);
  std::size_t size() const { return entries_.size(); }
  std::string_view key(std::size_t i) const;
  std::string_view value(std::size_t i) const;

 private:
  struct Entry { std::uint32_t key_off, key_len, value_off, value_len; };
  std::vector<char> bytes_;
  std::vector<Entry> entries_;
};

struct RecoveryStats {
  bool clean_shutdown = false;      // the previous session closed cleanly
  bool created = false;             // the pool was created, not recovered
  double seconds = 0;               // open -> index answers requests
  std::uint64_t records = 0;        // records found (when records_counted)
  bool records_counted = true;      // false: recovery is lazy (APEX) and did not walk the records
  std::uint64_t nodes = 0;          // PM nodes walked
  std::uint64_t repaired = 0;       // interrupted operations finished or rolled back
  unsigned threads = 1;
  // What the pool's open found worth telling although it opened (pm::Pool::open_warning): a
  // torn or damaged header state copy, or a pool last written in a weaker persistence mode
  // (eadr, dram) that was not shut down cleanly, opened in adr. Empty otherwise.
  std::string warning;
};

struct Footprint {
  std::uint64_t pm_bytes = 0;       // PM bytes in use (allocator)
  std::uint64_t pm_reserved = 0;    // PM bytes carved from the heap
  std::uint64_t dram_bytes = 0;     // DRAM bytes held by the index (inner nodes, metadata)
};

class Index {
 public:
  // Opens or creates the pool named by options.path and the index in it.
  static Result<std::unique_ptr<Index>> open(const Options& options);

  virtual ~Index() = default;
  virtual std::string_view kind() const = 0;

  virtual Code insert(std::string_view key, std::string_view value) = 0;  // already_present
  virtual Code update(std::string_view key, std::string_view value) = 0;  // not_found
  virtual Code upsert(std::string_view key, std::string_view value);      // insert or update
  virtual Code find(std::string_view key, std::string* value) const = 0;  // not_found
  virtual Code remove(std::string_view key) = 0;                          // not_found
  // Up to `max` records with key >= start, ascending. Returns the count (also out.size()).
  virtual std::size_t scan(std::string_view start, std::size_t max, ScanBuffer& out) const = 0;
  // Loads sorted, distinct records into an empty index, filling nodes to `fill` (0, 1].
  virtual Status bulk_load(std::span<const KeyValue> sorted, double fill);

  // Checks every structural invariant; the message names the first violation.
  virtual Status verify() const = 0;
  virtual RecoveryStats recovery_stats() const = 0;
  virtual Footprint footprint() const = 0;
  // Persists what is left and marks the pool cleanly shut down. The destructor without
  // close() leaves the pool as a crash would (recovery runs at the next open).
  virtual Status close() = 0;
  // The pool the index lives in (for tools, footprint and the crash simulator).
  virtual const pm::Pool& pool() const = 0;

  // Per-thread attach for epoch-based reclamation. Optional: a thread registers at its first
  // operation anyway and stays registered until it exits or the index goes; a scope only
  // does that registration early. Destroying a scope touches nothing of the index, so a
  // thread_local scope may outlive the index it came from.
  class ThreadScope {
   public:
    ThreadScope() = default;
    explicit ThreadScope(std::function<void()> detach) : detach_(std::move(detach)) {}
    ThreadScope(ThreadScope&&) = default;
    ThreadScope& operator=(ThreadScope&&) = default;
    ~ThreadScope() { if (detach_) detach_(); }
   private:
    std::function<void()> detach_;
  };
  virtual ThreadScope attach_thread() { return {}; }
};

// What an index is, in the survey's terms (its Table 2 columns, plus recovery): reports draw the
// design matrix from these, so a new index fills them when it registers.
struct IndexTraits {
  std::string_view architecture;    // e.g. "B+-tree; DRAM (inner) + PM (leaf)"
  std::string_view node_structure;  // e.g. "unsorted leaf; fingerprints"
  std::string_view concurrency;     // e.g. "optimistic locks (inner) + leaf locks"
  std::string_view variable_keys;   // "pointer (PM key records)", "inlined", or "no" and why
  std::string_view allocator;       // the PM allocator and how it avoids leaks
  std::string_view numa;            // NUMA awareness
  std::string_view recovery;        // what opening a pool does, and its cost
};

// Index kinds by name. Each index adds one entry in src/index/registry.cpp. Index::open does
// the common part (create-or-open decision, pool creation and header checks) and then calls
// the entry's create (fresh pool) or recover (existing pool, or a crash image).
class IndexRegistry {
 public:
  using PoolPtr = std::unique_ptr<pm::Pool>;
  struct Entry {
    std::string name;
    std::string description;
    // The layout id a pool made with these options carries (kind, node size, key mode).
    pm::Layout (*layout)(const Options&);
    // Refuses options this kind cannot create a pool with (node size, key and value limits).
    // Index::open calls it before any file is created or replaced.
    Status (*validate)(const Options&);
    // Pool bytes to reserve when Options::pool_size is 0 (from expected_records).
    std::size_t (*default_pool_size)(const Options&);
    // Builds an empty index on a freshly created pool (options already validated).
    Result<std::unique_ptr<Index>> (*create)(PoolPtr pool, const Options&);
    // Validates and recovers the index in an existing pool (never trusting its contents),
    // then calls pool->commit_open().
    Result<std::unique_ptr<Index>> (*recover)(PoolPtr pool, const Options&);
    IndexTraits traits;
  };
  static const std::vector<Entry>& entries();
  static const Entry* find(std::string_view name);
  static std::vector<std::string> names();
};

}  // namespace pmindex

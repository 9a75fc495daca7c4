// What pmbench drives: one interface over the three kinds of index it can run.
//
//   NativeTarget    a built-in pmindex index through pmindex::Index (bulk load, key types,
//                   pool-full errors, footprint, recovery)
//   TreeApiTarget   any PiBench tree_api shared library, loaded by path (dlopen, create_tree)
//   DRAM comparators  stdmap / btreemap (std::map, absl::btree_map behind a shared_mutex) and
//                   tbbmap (tbb::concurrent_map): pmbench-internal adapters, not pmindex
//                   indexes — they have no pool and do not belong in the library's registry.
//
// Thread safety: a Target is shared by all worker threads; each thread makes its own Session
// (per-thread state: the index's ThreadScope, scan and value buffers) and calls only it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pmindex/index.h"

namespace pmbench {

struct Config;

// A scan's records as views into the session's buffer, valid until its next scan.
struct ScanResult {
  std::vector<std::pair<std::string_view, std::string_view>> records;
  // False when the scan returned a count but no records (a tree_api wrapper that leaves
  // values_out null, as PiBench's own wrappers may: PiBench never reads it).
  bool records_returned = true;
};

class Session {
 public:
  virtual ~Session() = default;
  // value: the found value (a view into a session buffer, valid until the next call).
  virtual bool find(std::string_view key, std::string_view* value) = 0;
  // Batched lookups (pmbench --batch): found[i] and values[i] as find(keys[i], &values[i])
  // would give them (values valid until the next call). The default calls find per key; a
  // built-in index answers through Index::find_many.
  virtual void find_many(std::span<const std::string_view> keys,
                         std::span<std::string_view> values, bool* found);
  virtual bool insert(std::string_view key, std::string_view value) = 0;
  virtual bool update(std::string_view key, std::string_view value) = 0;
  virtual bool remove(std::string_view key) = 0;
  // Returns the count; fills `out` (when not null) with the records.
  virtual std::size_t scan(std::string_view start, int count, ScanResult* out) = 0;
  // The last failed operation's pmindex code, when the target has one (for error reports).
  virtual pmindex::Code last_code() const { return pmindex::Code::ok; }
  // A built-in index's own interface (this session's thread attached), for the single-type loop
  // that calls Index::find and insert directly; null for other targets.
  virtual pmindex::Index* native_index() { return nullptr; }

 private:
  std::vector<std::string> batch_values_;  // the default find_many's copies of the values
};

struct TargetInfo {
  std::string name;                 // as given on the command line
  std::string kind;                 // "builtin", "tree_api" or "dram"
  std::string load_method = "insert";  // "insert" or "bulk_load"
  bool emulated_pm = false;         // numbers measured on a non-DAX pool
  std::string backing;              // dax / tmpfs / anonymous / ... ("" for DRAM and tree_api)
  std::string durability;
  std::string prefault;             // --prefault: "on", "refused by the kernel"; "" when not asked
  std::string pool_path;
};

class Target {
 public:
  virtual ~Target() = default;
  virtual std::unique_ptr<Session> session() = 0;
  virtual const TargetInfo& info() const = 0;
  // Loads sorted records through a native bulk loader; false if the target has none.
  virtual bool bulk_load(std::span<const pmindex::KeyValue> /*sorted*/, double /*fill*/,
                         std::string* /*error*/) { return false; }
  virtual bool can_bulk_load() const { return false; }
  // Bytes in use after load: {dram, pm}; -1 where the target cannot tell.
  virtual std::pair<std::int64_t, std::int64_t> footprint() const { return {-1, -1}; }
  // PM bytes in use counted at their requested sizes (the survey's Table 3 measure), -1 if unknown.
  virtual std::int64_t pm_requested_bytes() const { return -1; }
  // Structural check of the whole index ("" if fine or unsupported).
  virtual std::string verify() const { return ""; }
  // Close cleanly (built-in indexes: persist and mark the pool clean).
  virtual std::string close() { return ""; }
  // The built-in index (recovery measurement needs it), or null.
  virtual pmindex::Index* native() { return nullptr; }
};

// The DRAM comparators' names (stdmap, btreemap, tbbmap).
std::vector<std::string> dram_comparator_names();
std::unique_ptr<Target> make_dram_target(const std::string& name);

// A built-in index by name. `fresh`: create (overwriting) instead of opening.
// `usage_error` (optional) is set when the index refuses the options themselves (a key type
// it does not support, a bad node size), as opposed to a pool it cannot open.
std::unique_ptr<Target> make_native_target(const Config& c, const std::string& pool_path,
                                           bool fresh, std::string* error,
                                           bool* usage_error = nullptr);
// A tree_api library by path.
// Variable-length keys (Config::variable_keys) set PMINDEX_TREE_VARIABLE_KEYS=1 for the
// library (see tree_api.h); a library that then refuses to create the tree is a usage error.
std::unique_ptr<Target> make_tree_api_target(const Config& c, const std::string& pool_path,
                                             std::string* error, bool* usage_error = nullptr);

}  // namespace pmbench

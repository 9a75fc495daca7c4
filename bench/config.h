// pmbench's command line: PiBench's flags and defaults plus pmbench's extensions
// (docs/pmbench.md lists them all). parse_command_line() validates every value; an invalid
// one gets a one-line message naming the flag and exit code 2.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "distribution.h"
#include "keys.h"

namespace pmbench {

// rmw: YCSB-F's read-modify-write, one operation made of a find and an update of the same key
// (it succeeds when both do). PiBench has no such operation; pmbench counts it on its own.
enum class OpType : std::uint8_t { read, insert, update, remove, scan, rmw };
inline constexpr int kOpTypes = 6;
const char* op_name(OpType t);
inline const char* op_name(int t) { return op_name(static_cast<OpType>(t)); }

enum class RunMode : std::uint8_t { operation, time };

// Time mode pre-generates at most this many operations (all threads together).
inline constexpr std::uint64_t kMaxTimeModeOperations = std::uint64_t{1} << 27;
// Time mode sizes a built-in index's pool before it knows the run's speed (the schedule is
// sized after the load), so it assumes at most this many inserts per second per thread: above
// every insert rate measured here (the fastest, LB+-Tree in dram mode, 4.3 Mops/s).
inline constexpr double kTimeModeInsertBound = 5e6;

struct Config {
  std::string target;               // positional: built-in name or path to a tree_api library
  std::vector<std::string> plugins; // --plugin: libraries that register index kinds
  std::uint64_t records = 1'000'000;
  std::uint64_t operations = 1'000'000;
  unsigned threads = 1;
  std::string key_prefix;
  std::size_t key_size = 8;
  std::size_t value_size = 8;
  double ratio[kOpTypes] = {1, 0, 0, 0, 0, 0};  // read, insert, update, remove, scan, rmw
  int scan_size = 100;
  // --batch: reads issued in groups of up to this many consecutive reads, through
  // Index::find_many (built-in indexes; other targets look the keys up one by one). 1: off.
  unsigned batch = 1;
  unsigned sampling_ms = 1000;
  DistKind distribution = DistKind::uniform;
  double skew = 0.2;                // PiBench's default for selfsimilar; zipfian default 0.99
  bool skew_given = false;
  std::uint64_t seed = 1729;
  std::string pool_path;
  std::size_t pool_size = 0;
  bool skip_load = false;
  bool prefault = false;  // map the pool's pages before the run (Options::prefault)
  // Size a built-in index's pool for at least this many records (0: from the run alone). A pool
  // loaded once for several runs (bench/experiment.py's shared loads) must hold the inserts of
  // the run that ends its use.
  std::uint64_t expect_records = 0;
  double latency_sampling = 0.0;
  RunMode mode = RunMode::operation;
  double seconds = 20;
  // extensions
  std::string persistence = "adr";
  std::string json_path;
  std::string csv_path;
  bool list = false;
  bool probe_memory = false;        // measure memory latency (memprobe.h) instead of a run
  unsigned probe_mib = 256;         // its working set
  bool verify = false;
  // Post-load validation checks every loaded record (lookups, absent keys, a full ordered scan
  // counting them) instead of a sample; --verify implies it.
  bool full_validation = false;
  std::string dataset;               // a file, or gen:lognormal / gen:longlat
  std::string dataset_format = "auto";  // auto | sosd | text (bench/dataset.h)
  // Set by the driver, not a flag: the dataset's keys are variable-length (text), and
  // key_size then holds the longest key.
  bool variable_keys = false;
  std::string workload;             // ycsb-a .. ycsb-f
  unsigned repeat = 1;
  bool warmup = false;
  std::string key_type = "u64";     // u64 | double | bytes
  // How keys' bytes order: "memcmp" (big-endian key words, pmbench's own) or "pibench" (the
  // key word little-endian, as PiBench hands keys to its wrappers, which compare them as
  // integers). pibench is for tree_api libraries with fixed-size keys only.
  std::string key_order = "memcmp";
  std::uint32_t node_size = 0;
  std::string pactree_updater = "auto";  // auto | background | sync (Options::pactree.updater)
  bool pactree_stats = false;            // Options::pactree.stats: the updater's line at close
  bool dptree_stats = false;             // dptree: its merge counters on stderr at close
  std::string pactree_search = "auto";   // auto | dram | pm (Options::pactree.search_layer)
  bool bulk_load = false;
  double fill = 1.0;
  unsigned value_bits = 48;
  bool progress = true;             // a progress bar when stdout is a terminal
  bool quiet = false;
  // Recovery measurement: after the run, close cleanly ("clean") or kill -9 a child that holds
  // the index ("crash"), reopen, time until the index answers and until throughput recovers.
  std::string recovery;             // "", "clean" or "crash"

  bool has_removes() const { return ratio[static_cast<int>(OpType::remove)] > 0; }
  // Each thread operates only on ids it owns (needed with removes and in conformance mode).
  bool owned_ids() const { return has_removes() || verify; }
  KeyKind key_kind() const;
  // Records the index may hold by the end of the run: the loaded ones plus one per insert
  // (operation mode: its inserts; time mode: kTimeModeInsertBound per thread for the run's
  // length, within the inserts' share of kMaxTimeModeOperations). Built-in pools are sized
  // from it unless pool_size is given.
  std::uint64_t expected_records() const;
  std::uint64_t expected_by_this_run() const;  // the same without --expect_records
  // Every flag and its value, for the JSON "config" block.
  std::vector<std::pair<std::string, std::string>> as_pairs() const;
};

// Parses argv into *out. Returns -1 to go on, or the exit code to exit with (0 for --help,
// 2 for an invalid value; the message has been written to `err`, help text to `out_stream`).
int parse_command_line(int argc, const char* const* argv, Config* out, std::ostream& out_stream,
                       std::ostream& err);

}  // namespace pmbench

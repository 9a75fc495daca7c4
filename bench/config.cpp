#include "config.h"

#include <CLI/CLI.hpp>

#include "dataset.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <sstream>

namespace pmbench {

const char* op_name(OpType t) {
  switch (t) {
    case OpType::read: return "read";
    case OpType::insert: return "insert";
    case OpType::update: return "update";
    case OpType::remove: return "remove";
    case OpType::scan: return "scan";
    case OpType::rmw: return "rmw";
  }
  return "?";
}

std::uint64_t Config::expected_records() const {
  return std::max(expect_records, expected_by_this_run());
}

std::uint64_t Config::expected_by_this_run() const {
  if (mode == RunMode::operation) return records + operations;  // at most one insert per op
  // A thread inserts at most kTimeModeInsertBound a second whatever else it does (in a
  // read-mostly mix the reads are fast, so the inserts' share of the run does not bound them),
  // and the schedule holds at most its share of kMaxTimeModeOperations inserts.
  const double ratio_insert = ratio[static_cast<int>(OpType::insert)];
  const double inserts =
      ratio_insert <= 0 ? 0.0
                        : std::min(kTimeModeInsertBound * seconds * threads,
                                   ratio_insert * static_cast<double>(kMaxTimeModeOperations));
  return records + std::max<std::uint64_t>(operations, static_cast<std::uint64_t>(inserts));
}

KeyKind Config::key_kind() const {
  if (key_type == "double") return KeyKind::f64;
  if (key_type == "bytes") return KeyKind::bytes;
  return KeyKind::u64;
}

std::vector<std::pair<std::string, std::string>> Config::as_pairs() const {
  auto num = [](auto v) {
    std::ostringstream s;
    s.precision(17);
    s << v;
    return s.str();
  };
  return {
      {"index", target}, {"records", num(records)}, {"operations", num(operations)},
      {"threads", num(threads)}, {"key_prefix", key_prefix}, {"key_size", num(key_size)},
      {"value_size", num(value_size)}, {"read_ratio", num(ratio[0])},
      {"insert_ratio", num(ratio[1])}, {"update_ratio", num(ratio[2])},
      {"remove_ratio", num(ratio[3])}, {"scan_ratio", num(ratio[4])},
      {"rmw_ratio", num(ratio[5])},
      {"scan_size", num(scan_size)}, {"batch", num(batch)}, {"sampling_ms", num(sampling_ms)},
      {"distribution", to_string(distribution)}, {"skew", num(skew)}, {"seed", num(seed)},
      {"pool_path", pool_path}, {"pool_size", num(pool_size)},
      {"skip_load", skip_load ? "true" : "false"}, {"prefault", prefault ? "true" : "false"}, {"expect_records", num(expect_records)}, {"latency_sampling", num(latency_sampling)},
      {"mode", mode == RunMode::time ? "time" : "operation"}, {"seconds", num(seconds)},
      {"persistence", persistence}, {"verify", verify ? "true" : "false"},
      {"full_validation", full_validation ? "true" : "false"},
      {"dataset", dataset}, {"dataset_format", dataset_format}, {"workload", workload}, {"repeat", num(repeat)},
      {"warmup", warmup ? "true" : "false"}, {"key_type", key_type},
      {"key_order", key_order},
      {"node_size", num(node_size)}, {"bulk_load", bulk_load ? "true" : "false"},
      {"pactree_updater", pactree_updater}, {"pactree_stats", pactree_stats ? "true" : "false"},
      {"dptree_stats", dptree_stats ? "true" : "false"},
      {"pactree_search", pactree_search},
      {"fill", num(fill)}, {"value_bits", num(value_bits)}, {"recovery", recovery},
  };
}

namespace {

// Thrown for a value CLI11's validators cannot express (ratios, skew by distribution).
struct Invalid {
  std::string message;
};

// Upper bounds for counts: far above any run this machine class can hold, low enough that
// sizes derived from them (pools, schedules) cannot wrap.
constexpr std::uint64_t kMaxCount = 10'000'000'000;           // records, operations
constexpr std::uint64_t kMaxPoolSize = std::uint64_t{1} << 50;  // 1 PiB

// A whole-number flag in [lo, hi]. The text itself is checked: CLI11 reads "-5" into an
// unsigned as 2^64 - 5, which then ran away or aborted in a length_error.
CLI::Validator whole_number(std::uint64_t lo, std::uint64_t hi) {
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return CLI::Validator(
      [lo, hi, range](std::string& s) -> std::string {
        std::uint64_t v = 0;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (s.empty() || ec == std::errc::invalid_argument || end != s.data() + s.size())
          return "must be a whole number in " + range + ", got '" + s + "'";
        if (ec == std::errc::result_out_of_range || v < lo || v > hi)
          return "must be in " + range + ", got " + s;
        return {};
      },
      range);
}

// A byte count with an optional binary suffix: 1048576, 64K, 512M, 8G, 1T (also KiB/MiB/...
// and KB/MB/...: all powers of 1024). 0 keeps the index's default.
bool parse_size(const std::string& s, std::uint64_t* out) {
  std::uint64_t v = 0;
  const char* end = s.data() + s.size();
  const auto [p, ec] = std::from_chars(s.data(), end, v);
  if (s.empty() || ec != std::errc{}) return false;
  std::string unit(p, end);
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  static const std::pair<const char*, int> kUnits[] = {{"", 0}, {"B", 0}, {"K", 10}, {"M", 20},
                                                       {"G", 30}, {"T", 40}, {"P", 50}};
  for (const auto& [name, shift] : kUnits) {
    const std::string n = name;
    if (unit != n && unit != n + "B" && unit != n + "IB") continue;
    if (shift > 0 && v > (std::numeric_limits<std::uint64_t>::max() >> shift)) return false;
    *out = v << shift;
    return true;
  }
  return false;
}

void apply_pool_size(const std::string& text, Config& c) {
  std::uint64_t bytes = 0;
  if (!parse_size(text, &bytes) || bytes > kMaxPoolSize)
    throw Invalid{"--pool_size must be a byte count up to 1P, optionally with a suffix "
                  "(64K, 512M, 8G, 1T), got '" + text + "'"};
  if (bytes != 0 && bytes < (std::uint64_t{64} << 10))
    throw Invalid{"--pool_size must be 0 (the index's default) or at least 64K, got '" + text + "'"};
  c.pool_size = static_cast<std::size_t>(bytes);
}

void apply_workload(Config& c) {
  if (c.workload.empty()) return;
  // YCSB core workloads (Cooper et al., SoCC 2010): A-C, E and F with zipfian 0.99 requests;
  // D with "latest" (reads favour the most recently inserted ids); F's read-modify-write is
  // its own operation (rmw: a find then an update of the same key).
  struct W { const char* name; double r, i, u, d, s, rmw; DistKind dist; };
  static const W kW[] = {{"ycsb-a", .5, 0, .5, 0, 0, 0, DistKind::zipfian},
                         {"ycsb-b", .95, 0, .05, 0, 0, 0, DistKind::zipfian},
                         {"ycsb-c", 1, 0, 0, 0, 0, 0, DistKind::zipfian},
                         {"ycsb-d", .95, .05, 0, 0, 0, 0, DistKind::latest},
                         {"ycsb-e", 0, .05, 0, 0, .95, 0, DistKind::zipfian},
                         {"ycsb-f", .5, 0, 0, 0, 0, .5, DistKind::zipfian}};
  for (const W& w : kW) {
    if (c.workload == w.name) {
      const double r[kOpTypes] = {w.r, w.i, w.u, w.d, w.s, w.rmw};
      std::copy(r, r + kOpTypes, c.ratio);
      c.distribution = w.dist;
      if (!c.skew_given) c.skew = 0.99;
      return;
    }
  }
  throw Invalid{"--workload must be one of ycsb-a .. ycsb-f, got '" + c.workload + "'"};
}

void validate(Config& c) {
  if (c.list || c.probe_memory) return;
  if (c.target.empty()) throw Invalid{"missing the index: a built-in name (see --list) or a path to a tree_api library"};
  apply_workload(c);
  double sum = 0;
  for (double r : c.ratio) {
    if (!(r >= 0 && r <= 1)) throw Invalid{"operation ratios (-r -i -u -d -s --rmw_ratio) must be in [0, 1]"};
    sum += r;
  }
  if (std::fabs(sum - 1.0) > 1e-9) {
    std::ostringstream m;
    m.precision(17);
    m << "operation ratios (-r -i -u -d -s --rmw_ratio) must sum to 1 (within 1e-9), got " << sum;
    throw Invalid{m.str()};
  }
  if (c.distribution == DistKind::selfsimilar && !(c.skew > 0 && c.skew <= 0.5))
    throw Invalid{"--skew for SELFSIMILAR must be in (0, 0.5]"};
  if (zipf_like(c.distribution) && !(c.skew >= 0 && c.skew < 1))
    throw Invalid{"--skew for ZIPFIAN and LATEST must be in [0, 1)"};
  if (c.key_size < 8) throw Invalid{"--key_size must be at least 8"};
  if (c.key_prefix.size() + 8 > c.key_size && !c.key_prefix.empty())
    throw Invalid{"--key_prefix is too long: prefix + 8 hash bytes must fit in --key_size"};
  if (c.key_type != "bytes" && c.key_size != 8)
    throw Invalid{"--key_size other than 8 needs --key_type bytes"};
  if (c.key_order == "pibench" && c.key_type == "bytes" && !c.dataset.empty())
    throw Invalid{"--key_order pibench needs fixed-size integer keys, not a bytes dataset"};
  if (c.value_size == 0) throw Invalid{"--value_size must be at least 1"};
  if (c.mode == RunMode::time && !(c.seconds > 0)) throw Invalid{"--seconds must be > 0"};
  if (c.bulk_load && c.skip_load) throw Invalid{"--bulk_load and --skip_load exclude each other"};
  if (!c.dataset.empty() && c.key_size != 8)
    throw Invalid{"--key_size does not apply to --dataset (SOSD and generated keys are 8 bytes; "
                  "text keys keep their own lengths)"};
  if (!c.dataset.empty()) {
    DatasetFormat f{};
    if (!resolve_dataset_format(c.dataset_format, c.dataset, &f))
      throw Invalid{"--dataset_format must be auto, sosd or text, got '" + c.dataset_format + "'"};
    if (f == DatasetFormat::text && c.key_type != "bytes")
      throw Invalid{"a text dataset has variable-length keys: it needs --key_type bytes"};
    if (c.dataset == "gen:longlat" && c.key_type != "double")
      throw Invalid{"gen:longlat makes double keys: it needs --key_type double"};
    if (c.dataset == "gen:lognormal" && c.key_type == "double")
      throw Invalid{"gen:lognormal makes uint64 keys: --key_type u64 or bytes"};
    if (f == DatasetFormat::generated && c.dataset != "gen:longlat" && c.dataset != "gen:lognormal")
      throw Invalid{"--dataset " + c.dataset + ": unknown generator (gen:lognormal, gen:longlat)"};
  }
}

// Options given as words that are resolved after parsing (parse_command_line).
struct SpelledOptions {
  std::string distribution = "UNIFORM";
  std::string mode = "operation";
  std::string pool_size = "0";
};

// What runs: sizes, the operation mix, keys and their distribution, the run's length.
void add_workload_options(CLI::App& app, Config& c, SpelledOptions* raw) {
  app.add_option("-n,--records", c.records, "records to load")
      ->check(whole_number(0, kMaxCount))->capture_default_str();
  app.add_option("-p,--operations", c.operations, "operations to run (operation mode)")
      ->check(whole_number(0, kMaxCount))->capture_default_str();
  app.add_option("-t,--threads", c.threads, "worker threads")
      ->check(whole_number(1, 1024))->capture_default_str();
  app.add_option("-f,--key_prefix", c.key_prefix, "key prefix (key_size > 8)");
  app.add_option("-k,--key_size", c.key_size, "key bytes")
      ->check(whole_number(1, 65536))->capture_default_str();
  app.add_option("-v,--value_size", c.value_size, "value bytes")
      ->check(whole_number(1, 65536))->capture_default_str();
  app.add_option("-r,--read_ratio", c.ratio[0], "read ratio")->capture_default_str();
  app.add_option("-i,--insert_ratio", c.ratio[1], "insert ratio")->capture_default_str();
  app.add_option("-u,--update_ratio", c.ratio[2], "update ratio")->capture_default_str();
  app.add_option("-d,--remove_ratio", c.ratio[3], "remove ratio")->capture_default_str();
  app.add_option("-s,--scan_ratio", c.ratio[4], "scan ratio")->capture_default_str();
  app.add_option("--rmw_ratio", c.ratio[5], "read-modify-write ratio (find + update, YCSB-F)")
      ->capture_default_str();
  app.add_option("--scan_size", c.scan_size, "records per scan")
      ->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--batch", c.batch,
                 "reads issued in batches of up to N consecutive reads (Index::find_many; "
                 "a batched read's latency is its batch's)")
      ->check(whole_number(1, 1024))->capture_default_str();
  app.add_option("--distribution", raw->distribution, "UNIFORM|SELFSIMILAR|ZIPFIAN|LATEST (any case)")
      ->capture_default_str();
  app.add_option("--skew", c.skew, "selfsimilar (0,0.5]; zipfian [0,1)")->capture_default_str();
  app.add_option("--seed", c.seed, "random seed")
      ->check(whole_number(0, std::numeric_limits<std::uint64_t>::max()))->capture_default_str();
  app.add_option("--latency_sampling", c.latency_sampling, "fraction of operations timed")
      ->check(CLI::Range(0.0, 1.0))->capture_default_str();
  app.add_option("-m,--mode", raw->mode, "operation|time")->capture_default_str();
  app.add_option("--seconds", c.seconds, "run length in time mode")
      ->check(CLI::Range(0.0, 604800.0))->capture_default_str();
  app.add_option("--dataset", c.dataset,
                 "keys from a file (SOSD binary, or text with one key per line) or a generator "
                 "(gen:lognormal, gen:longlat)");
  app.add_option("--dataset_format", c.dataset_format,
                 "auto (gen:* generated, *.txt text, else SOSD) | sosd | text")
      ->capture_default_str();
  app.add_option("--workload", c.workload, "ycsb-a .. ycsb-f (sets the ratios; zipfian 0.99, D latest 0.99)");
  app.add_option("--repeat", c.repeat, "repeat load+run N times")
      ->check(whole_number(1, 1000))->capture_default_str();
  app.add_flag("--warmup", c.warmup, "an untimed read pass over loaded keys before the run");
  app.add_option("--key_type", c.key_type, "u64|double|bytes (built-in indexes)")
      ->check(CLI::IsMember({"u64", "double", "bytes"}))->capture_default_str();
  app.add_option("--key_order", c.key_order,
                 "memcmp|pibench: key bytes ordered by memcmp, or as PiBench wrappers order them "
                 "(little-endian integer key words; tree_api libraries only)")
      ->check(CLI::IsMember({"memcmp", "pibench"}))->capture_default_str();
  app.add_option("--value_bits", c.value_bits, "value bits used (48 like a pointer, 64 all)")
      ->check(whole_number(1, 64))->capture_default_str();
}

// Where the records live: the pool, the persistence mode, the load, recovery.
void add_pool_options(CLI::App& app, Config& c, SpelledOptions* raw) {
  app.add_option("--pool_path", c.pool_path, "pool file (default: a temporary file under /dev/shm/pmindex)");
  app.add_option("--pool_size", raw->pool_size,
                 "pool bytes, suffixes K M G T (powers of 1024; 0: the index's default)")
      ->capture_default_str();
  app.add_flag("--skip_load", c.skip_load, "open the existing pool at --pool_path instead of loading");
  app.add_flag("--prefault", c.prefault,
               "built-in indexes: map every page of the pool file at open and at each growth, so "
               "operations take no first-touch page faults (as the originals' drivers touch their pools)");
  app.add_option("--expect_records", c.expect_records,
                 "size the pool for at least N records (a pool later runs reopen and insert into)")
      ->check(whole_number(0, 10'000'000'000));
  app.add_option("--persistence", c.persistence, "adr|eadr|dram")
      ->check(CLI::IsMember({"adr", "eadr", "dram"}))->capture_default_str();
  app.add_flag("--bulk_load", c.bulk_load, "load sorted records through the native bulk loader");
  app.add_option("--fill", c.fill, "bulk-load fill factor (0,1]")
      ->check(CLI::Range(0.000001, 1.0))->capture_default_str();
  app.add_option("--recovery", c.recovery, "measure recovery after the run: clean|crash")
      ->check(CLI::IsMember({"clean", "crash"}));
}

// Which index, and options of particular indexes.
void add_index_options(CLI::App& app, Config& c) {
  app.add_option("index", c.target, "built-in index name (see --list) or path to a tree_api library");
  app.set_version_flag("--version", std::string("pmbench ") + PMINDEX_VERSION_STRING);
  app.add_option("--plugin", c.plugins,
                 "load a library that registers index kinds (repeatable; docs/pmbench.md)")
      ->allow_extra_args(false);  // one library per --plugin, not every word after it
  app.add_option("--node_size", c.node_size, "node bytes (built-in indexes; 0: default)")
      ->check(whole_number(0, 1 << 20));
  app.add_option("--pactree_updater", c.pactree_updater,
                 "pactree: who applies SMOs to the search layer (auto: background)")
      ->check(CLI::IsMember({"auto", "background", "sync"}))->capture_default_str();
  app.add_flag("--pactree_stats", c.pactree_stats,
               "pactree: print the updater's lag and SMO counts on stderr at close");
  app.add_flag("--dptree_stats", c.dptree_stats,
               "dptree: print merges and the time writers waited for them on stderr at close");
  app.add_option("--pactree_search", c.pactree_search,
                 "pactree: search layer in dram or pm, fixed at pool creation (auto: the pool's; "
                 "dram for a new pool)")
      ->check(CLI::IsMember({"auto", "dram", "pm"}))->capture_default_str();
}

// What is reported, and the modes that only report (--list, --probe_memory, --verify).
void add_output_options(CLI::App& app, Config& c) {
  app.add_option("--sampling_ms", c.sampling_ms, "throughput sampling period (ms)")
      ->check(whole_number(1, 3'600'000))->capture_default_str();
  app.add_option("--json", c.json_path, "write results as JSON to FILE");
  app.add_option("--csv", c.csv_path, "write results as CSV to FILE");
  app.add_flag("--list", c.list, "print the built-in index names and exit");
  app.add_flag("--probe_memory", c.probe_memory,
               "measure the machine's random-access memory latency (4 KiB and huge pages) and exit");
  app.add_option("--probe_mib", c.probe_mib, "--probe_memory's working set (MiB)")
      ->check(whole_number(2, 65536))->capture_default_str();
  app.add_flag("--verify", c.verify, "conformance mode: check every result, stop at the first mismatch");
  app.add_flag("--full_validation", c.full_validation,
               "after the load, check every record (default: a sample; --verify implies it)");
  app.add_flag("!--no_progress", c.progress, "no progress bar");
  app.add_flag("-q,--quiet", c.quiet, "no human summary on stdout");
}

}  // namespace

int parse_command_line(int argc, const char* const* argv, Config* out, std::ostream& out_stream,
                       std::ostream& err) {
  Config& c = *out;
  CLI::App app{"pmbench: a PiBench-compatible benchmark for persistent-memory range indexes"};
  SpelledOptions spelled;
  add_index_options(app, c);
  add_workload_options(app, c, &spelled);
  add_pool_options(app, c, &spelled);
  add_output_options(app, c);
  try {
    app.parse(argc, argv);
    c.skew_given = app.count("--skew") > 0;
    apply_pool_size(spelled.pool_size, c);
    // Conformance runs use all 64 value bits unless told otherwise, so an index that steals
    // value bits is caught.
    if (c.verify && app.count("--value_bits") == 0) c.value_bits = 64;
    if (!parse_distribution(spelled.distribution, &c.distribution))
      throw Invalid{"--distribution must be UNIFORM, SELFSIMILAR, ZIPFIAN or LATEST, got '" +
                    spelled.distribution + "'"};
    // A dataset's keys decide the key type unless --key_type says otherwise (a contradiction
    // is refused in validate()).
    if (app.count("--key_type") == 0 && !c.dataset.empty()) {
      DatasetFormat f{};
      if (resolve_dataset_format(c.dataset_format, c.dataset, &f) && f == DatasetFormat::text)
        c.key_type = "bytes";
      if (c.dataset == "gen:longlat") c.key_type = "double";
    }
    if (spelled.mode == "operation") c.mode = RunMode::operation;
    else if (spelled.mode == "time") c.mode = RunMode::time;
    else throw Invalid{"--mode must be operation or time, got '" + spelled.mode + "'"};
    validate(c);
  } catch (const CLI::CallForHelp&) {
    out_stream << app.help();
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    out_stream << app.help();
    return 0;
  } catch (const CLI::CallForVersion& e) {
    out_stream << e.what() << "\n";
    return 0;
  } catch (const CLI::ParseError& e) {
    err << "pmbench: " << e.what() << " (see --help)\n";
    return 2;
  } catch (const Invalid& e) {
    err << "pmbench: " << e.message << "\n";
    return 2;
  }
  return -1;
}

}  // namespace pmbench

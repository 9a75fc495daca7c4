#include "driver.h"

#include <malloc.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "dataset.h"
#include "pmindex/index.h"

namespace pmbench {

using Clock = std::chrono::steady_clock;

// One find per key; each value is copied out, since find's view lasts only until the next call.
void Session::find_many(std::span<const std::string_view> keys,
                        std::span<std::string_view> values, bool* found) {
  if (batch_values_.size() < keys.size()) batch_values_.resize(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    std::string_view v;
    found[i] = find(keys[i], &v);
    batch_values_[i].assign(v);
    values[i] = batch_values_[i];
  }
}

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string hex(std::string_view bytes) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (unsigned char ch : bytes) { s += d[ch >> 4]; s += d[ch & 15]; }
  return s;
}

PmTotals read_pm_counters() {
  const auto& c = pmindex::pm::Runtime::counters();
  PmTotals t;
  t.flushes = c.flushes;
  t.fences = c.fences;
  t.lines_written = c.lines_written;
  t.media_bytes_read = c.media_bytes_read;
  t.media_bytes_written = c.media_bytes_written;
  return t;
}
PmTotals operator-(PmTotals a, const PmTotals& b) {
  a.flushes -= b.flushes; a.fences -= b.fences; a.lines_written -= b.lines_written;
  a.media_bytes_read -= b.media_bytes_read; a.media_bytes_written -= b.media_bytes_written;
  return a;
}

// The cost of one steady_clock::now() pair, subtracted from every latency sample.
double clock_overhead_ns() {
  std::vector<std::int64_t> d(2001);
  for (auto& x : d) {
    const auto a = Clock::now();
    const auto b = Clock::now();
    x = std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
  }
  std::nth_element(d.begin(), d.begin() + d.size() / 2, d.end());
  return static_cast<double>(d[d.size() / 2]);
}

// Terminal progress bar (only when stdout is a terminal and --no_progress is absent).
struct Progress {
  bool on;
  const char* what;
  void show(double fraction) const {
    if (!on) return;
    const int width = 40;
    const int fill = static_cast<int>(std::clamp(fraction, 0.0, 1.0) * width);
    std::fprintf(stdout, "\r%-6s [%s%s] %5.1f%%", what, std::string(fill, '#').c_str(),
                 std::string(width - fill, ' ').c_str(), 100.0 * std::clamp(fraction, 0.0, 1.0));
    std::fflush(stdout);
  }
  void done() const {
    if (!on) return;
    std::fprintf(stdout, "\r%80s\r", "");
    std::fflush(stdout);
  }
};

struct alignas(64) Counter {
  std::atomic<std::uint64_t> done{0};
};

// --- load -------------------------------------------------------------------------------

// --bulk_load: every record generated and sorted first (untimed), then one bulk_load call.
bool bulk_load(const Config& c, const WorkloadSpec& spec, Target& target, RunResult* r,
               std::string* error) {
  if (!target.can_bulk_load()) {
    *error = "--bulk_load needs a built-in index (tree_api has no bulk load)";
    return false;
  }
  // Keys back to back (fixed or variable length), then the records as views into them.
  std::vector<std::uint64_t> offsets(1, 0);
  for (std::uint64_t id = 0; id < c.records; ++id) offsets.push_back(offsets.back() + spec.keys.length(id));
  const std::size_t vs = spec.values.value_size();
  std::vector<char> keys(offsets.back()), values(c.records * vs);
  std::vector<pmindex::KeyValue> sorted;
  sorted.reserve(c.records);
  for (std::uint64_t id = 0; id < c.records; ++id) {
    spec.keys.write(id, keys.data() + offsets[id]);
    spec.values.write(id, 0, values.data() + id * vs);
    sorted.push_back({std::string_view(keys.data() + offsets[id], offsets[id + 1] - offsets[id]),
                      std::string_view(values.data() + id * vs, vs)});
  }
  // memcmp order (string_view compares bytes as unsigned char)
  std::sort(sorted.begin(), sorted.end(),
            [](const pmindex::KeyValue& a, const pmindex::KeyValue& b) { return a.key < b.key; });
  r->harness_bytes = std::max<std::uint64_t>(
      r->harness_bytes, offsets.capacity() * 8 + keys.capacity() + values.capacity() +
                            sorted.capacity() * sizeof(pmindex::KeyValue));
  const auto t0 = Clock::now();
  if (!target.bulk_load(sorted, c.fill, error)) return false;
  r->load_seconds = seconds_since(t0);
  r->loaded = sorted.size();
  return true;
}

// Loads by insert: thread t inserts ids t, t+T, ... Each key and value is computed from its id
// just before its insert (a few ns beside an insert's microsecond, and no O(records) arrays:
// a 100M-record load needs no gigabytes of pre-generated keys).
bool load(const Config& c, const WorkloadSpec& spec, Target& target, RunResult* r,
          std::string* error) {
  if (c.bulk_load) return bulk_load(c, spec, target, r, error);
  const Progress bar{c.progress && !c.quiet && ::isatty(1) != 0, "load"};
  std::vector<Counter> done(c.threads);
  std::atomic<bool> failed{false};
  std::string first_error;
  std::mutex error_mutex;
  std::vector<std::thread> workers;
  const auto t0 = Clock::now();
  for (unsigned t = 0; t < c.threads; ++t) {
    workers.emplace_back([&, t] {
      auto s = target.session();
      std::string key, value;
      std::size_t i = 0;
      for (std::uint64_t id = t; id < c.records; id += c.threads, ++i) {
        key.resize(spec.keys.length(id));
        spec.keys.write(id, key.data());
        value.resize(spec.values.value_size());
        spec.values.write(id, 0, value.data());
        if (!s->insert(key, value)) {
          std::lock_guard lock(error_mutex);
          if (!failed.exchange(true))
            first_error = "load: insert of id " + std::to_string(id) + " (key " + hex(key) +
                          ") failed: " + std::string(pmindex::to_string(s->last_code()));
          return;
        }
        if ((i & 1023) == 0) done[t].done.store(i, std::memory_order_relaxed);
        if (failed.load(std::memory_order_relaxed)) return;
      }
      done[t].done.store(i, std::memory_order_relaxed);
    });
  }
  if (bar.on) {
    for (;;) {
      std::uint64_t sum = 0;
      for (auto& d : done) sum += d.done.load(std::memory_order_relaxed);
      bar.show(c.records ? static_cast<double>(sum) / c.records : 1.0);
      if (sum >= c.records || failed.load()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    bar.done();
  }
  for (auto& w : workers) w.join();
  r->load_seconds = seconds_since(t0);
  if (failed) {
    *error = first_error;
    return false;
  }
  r->loaded = c.records;
  return true;
}

// Keys never loaded must be absent (without a full scan this is what shows a wrapper does not
// answer every key). Hash keys only: a dataset's ids beyond it have no key of their own.
std::string validate_absent(const Config& c, const WorkloadSpec& spec, Session& s) {
  if (spec.keys.dataset() != nullptr) return "";
  std::string_view got;
  for (std::uint64_t id = c.records; id < c.records + 1000; ++id) {
    const std::string k = spec.keys.make(id);
    if (s.find(k, &got)) return "key of id " + std::to_string(id) + " (" + hex(k) + ") was never loaded but is found";
  }
  return "";
}

// The first scan of a non-empty index came back with no records: say what cannot be checked.
// A count without records must still be the count asked for (or every record).
std::string scan_without_records(const Config& c, std::size_t n, ValidationReport* what) {
  if (n == 0) {
    what->scan_order = "not checked (scan returns nothing on a non-empty index: not implemented)";
    what->scan_values = "not checked (scan returns nothing)";
    what->record_count = "not checked (no scan)";
    return "";
  }
  const std::size_t want = std::min<std::uint64_t>(c.records, 1000);
  if (n != want)
    return "a scan from the smallest key returned a count of " + std::to_string(n) +
           " without records, expected " + std::to_string(want);
  what->scan_order = "not checked (the wrapper returns no scan records; the count is checked)";
  what->scan_values = "not checked (the wrapper returns none)";
  what->record_count = "not checked (the wrapper's scans return no records)";
  return "";
}

// What an earlier run on a reopened pool (--skip_load) did to the loaded records, from the
// pool's sidecar file (see run_once): values an update rewrote can no longer be checked.
constexpr const char* kValuesUpdated = "not checked (an earlier run on this pool updated them)";

// One record a validation scan returned: a loaded key with (values_known) its loaded value.
std::string check_scanned(const Config& c, const WorkloadSpec& spec, std::string_view k,
                          std::string_view v, bool values_known) {
  std::uint64_t id = 0;
  if (!spec.keys.id_of(k, &id) || id >= c.records)
    return "scan returned key " + hex(k) + ", which was never loaded";
  if (values_known && v != spec.values.make(id, 0))
    return "scan: key " + hex(k) + " has value " + hex(v) + ", expected " + hex(spec.values.make(id, 0));
  return "";
}

// The full scan of validate_load, in chunks from `start`.
std::string validate_full_scan(const Config& c, const WorkloadSpec& spec, Session& s,
                               std::string start, bool values_known, ValidationReport* what) {
  std::string prev;
  std::uint64_t seen = 0;
  ScanResult res;
  // Each chunk restarts AT the last key seen and skips it (a successor key would need one
  // more byte, or big-endian +1 arithmetic that only fixed-size keys have).
  constexpr std::size_t kChunk = 1000;
  for (bool first = true;; first = false) {
    const std::size_t n = s.scan(start, static_cast<int>(kChunk + (first ? 0 : 1)), &res);
    if (first && c.records > 0 && (n == 0 || !res.records_returned))
      return scan_without_records(c, n, what);
    if (n != res.records.size()) return "scan returned a count different from its records";
    std::size_t fresh = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const auto& [k, v] = res.records[i];
      if (!first && i == 0) {
        if (k != std::string_view(prev))
          return "full scan: a scan from the last key seen " + hex(prev) + " started at " + hex(k);
        continue;
      }
      if (seen > 0 && !spec.keys.less(prev, k))
        return "full scan out of order at record " + std::to_string(seen) + ": " + hex(prev) +
               " then " + hex(k);
      if (std::string e = check_scanned(c, spec, k, v, values_known); !e.empty()) return "full " + e;
      prev.assign(k);
      ++seen;
      ++fresh;
    }
    if (fresh < kChunk) break;
    start = prev;
  }
  if (seen != c.records)
    return "full scan returned " + std::to_string(seen) + " records, " + std::to_string(c.records) + " loaded";
  what->scan_order = "checked";
  what->scan_values = values_known ? "checked" : kValuesUpdated;
  what->record_count = "checked";
  return "";
}

// The sampled scans of validate_load: one chunk of 1000 from the smallest possible key (it must
// return min(1000, records) records), then kSampledScans scans of 100 from random loaded keys
// (each must start at its key). Every record: ascending, a loaded key, its loaded value. Two
// checks stand in for the full scan's count, so a scan that skips records is caught without
// walking the index: every looked-up sample key (`sample`, sorted) within a scan's range must
// be among its records, and a second scan started at the first scan's second record must
// return the same records from there on. A scan that returns fewer records than asked must
// have reached the largest key (a scan from its last record returns that record alone).
constexpr int kSampledScans = 64;
std::string validate_sampled_scans(const Config& c, const WorkloadSpec& spec, Session& s,
                                   const std::string& smallest, const std::vector<std::string>& sample,
                                   bool values_known, ValidationReport* what) {
  ScanResult res, again;
  std::vector<std::string> got;
  auto chunk = [&](std::string_view start, int asked, bool starts_at_key) -> std::string {
    const std::size_t n = s.scan(start, asked, &res);
    if (n != res.records.size()) return "scan returned a count different from its records";
    if (starts_at_key && (n == 0 || res.records[0].first != start))
      return "scan from loaded key " + hex(start) + " did not start at it";
    got.clear();
    for (std::size_t i = 0; i < n; ++i) {
      const auto& [k, v] = res.records[i];
      if (i > 0 && !spec.keys.less(got.back(), k))
        return "sampled scan from " + hex(start) + " out of order at record " + std::to_string(i) +
               ": " + hex(got.back()) + " then " + hex(k);
      if (std::string e = check_scanned(c, spec, k, v, values_known); !e.empty()) return "sampled " + e;
      got.emplace_back(k);
    }
    if (n == 0) return "";
    // Sample keys inside [first, last] returned: `sample` is sorted in the key order.
    const auto less = [&](const std::string& a, const std::string& b) { return spec.keys.less(a, b); };
    for (auto it = std::lower_bound(sample.begin(), sample.end(), got.front(), less);
         it != sample.end() && !spec.keys.less(got.back(), *it); ++it)
      if (!std::binary_search(got.begin(), got.end(), *it, less))
        return "a scan from " + hex(start) + " skipped loaded key " + hex(*it);
    if (n >= 3) {  // the overlapping scan from the second record
      const std::size_t m = s.scan(got[1], static_cast<int>(n - 1), &again);
      for (std::size_t i = 0; i < n - 1; ++i)
        if (i >= m || again.records[i].first != std::string_view(got[i + 1]))
          return "scans disagree: from " + hex(start) + " record " + std::to_string(i + 1) + " is " +
                 hex(got[i + 1]) + ", from " + hex(got[1]) + " record " + std::to_string(i) + " is " +
                 (i < m ? hex(again.records[i].first) : std::string("missing"));
    }
    if (n < static_cast<std::size_t>(asked) && s.scan(got.back(), 2, &again) != 1)
      return "a scan from " + hex(start) + " stopped after " + std::to_string(n) +
             " records before the largest key";
    return "";
  };
  const std::size_t first_n = s.scan(smallest, 1000, &res);
  if (c.records > 0 && (first_n == 0 || !res.records_returned))
    return scan_without_records(c, first_n, what);
  const std::size_t want = std::min<std::uint64_t>(c.records, 1000);
  if (first_n != want)
    return "a scan of 1000 from the smallest key returned " + std::to_string(first_n) +
           " records, expected " + std::to_string(want);
  if (std::string e = chunk(smallest, 1000, false); !e.empty()) return e;
  Xoshiro256ss rng(c.seed, 0x5ca75);
  for (int i = 0; i < kSampledScans && c.records > 0; ++i)
    if (std::string e = chunk(spec.keys.make(rng.below(c.records)), 100, true); !e.empty()) return e;
  what->scan_order = "sampled (1 scan of 1000 from the smallest key, " + std::to_string(kSampledScans) +
                     " of 100 from random loaded keys, each checked against the sampled keys in its "
                     "range and an overlapping scan)";
  what->scan_values = values_known ? "sampled (the records of those scans)" : kValuesUpdated;
  what->record_count = "not checked (sampled validation; --full_validation or --verify counts every record)";
  return "";
}

// After load (or after reopening a pool with --skip_load): loaded keys answer with their
// values, keys never loaded are absent, and scans return loaded keys in ascending key order
// (the format's order) with their values. Full (--full_validation, --verify): every loaded key
// is looked up and one ordered scan over the whole index counts exactly `records` keys.
// Sampled (the default; issue 26: a full check of 100M records took longer than the load):
// kSampledLookups random loaded ids plus the smallest and largest, and the scans of
// validate_sampled_scans. A scan that hands back no records (a PiBench wrapper that never
// sets values_out) or nothing at all (no scan) leaves the lookups as the check; `what` says
// which parts were checked and why the others were not. `values_known` is false when an
// earlier run on a reopened pool updated values: presence and order are checked, values not.
constexpr std::uint64_t kSampledLookups = 65536;
std::string validate_load(const Config& c, const WorkloadSpec& spec, Target& target,
                          bool values_known, ValidationReport* what) {
  const bool full = c.verify || c.full_validation;
  what->kind = full ? "full" : "sampled";
  auto s = target.session();
  std::string_view got;
  auto lookup = [&](std::uint64_t id) -> std::string {
    const std::string k = spec.keys.make(id);
    if (!s->find(k, &got)) return "loaded key of id " + std::to_string(id) + " (" + hex(k) + ") not found";
    if (values_known && got != spec.values.make(id, 0))
      return "loaded key of id " + std::to_string(id) + " has value " + hex(got) + ", expected " +
             hex(spec.values.make(id, 0));
    return "";
  };
  const bool every_key = full || c.records <= kSampledLookups;
  std::vector<std::string> sample;  // the looked-up keys, for the sampled scans
  if (every_key) {
    for (std::uint64_t id = 0; id < c.records; ++id) {
      if (std::string e = lookup(id); !e.empty()) return e;
      if (!full) sample.push_back(spec.keys.make(id));
    }
  } else {
    Xoshiro256ss rng(c.seed, 0x5a3b1e);
    for (std::uint64_t i = 0; i < kSampledLookups + 2; ++i) {
      const std::uint64_t id = i == 0 ? 0 : i == 1 ? c.records - 1 : rng.below(c.records);
      if (std::string e = lookup(id); !e.empty()) return e;
      sample.push_back(spec.keys.make(id));
    }
  }
  std::sort(sample.begin(), sample.end(),
            [&](const std::string& a, const std::string& b) { return spec.keys.less(a, b); });
  if (std::string e = validate_absent(c, spec, *s); !e.empty()) return e;
  what->lookups = every_key ? std::string("checked")
                            : "sampled (" + std::to_string(kSampledLookups + 2) + " of " +
                                  std::to_string(c.records) + " keys)";
  if (!values_known) what->lookups += ", presence only (an earlier run on this pool updated the values)";
  // Start at the smallest possible key of the format (fixed keys), or at the smallest loaded
  // key (variable-length keys: not every index accepts the empty key).
  std::string start;
  if (spec.keys.variable()) {
    for (std::uint64_t id = 0; id < c.records; ++id) {
      const std::string k = spec.keys.make(id);
      if (id == 0 || k < start) start = k;
    }
  } else {
    start.assign(spec.keys.key_size(), '\0');
    if (spec.keys.key_size() > 8) std::memcpy(start.data(), c.key_prefix.data(), c.key_prefix.size());
  }
  if (full) return validate_full_scan(c, spec, *s, std::move(start), values_known, what);
  return validate_sampled_scans(c, spec, *s, start, sample, values_known, what);
}

// --- conformance --------------------------------------------------------------------------

// The ids thread t owns and their current value versions, ordered by key.
class Model {
 public:
  Model(const WorkloadSpec& s, unsigned t) : s_(s), t_(t), map_(KeyLess{&s.keys}) {
    for (std::uint64_t id : load_ids(s.records, s.threads, t)) map_[s.keys.make(id)] = {id, 0};
  }
  bool owns(std::uint64_t id) const {
    return id < s_.records ? id % s_.threads == t_ : (id - s_.records) % s_.threads == t_;
  }
  // Checks the result of schedule op i and applies it. Returns "" or the mismatch.
  // rmw: `value` is what its find returned.
  std::string check(const Schedule& sc, std::size_t i, std::string_view key, bool ok,
                    std::string_view value, const ScanResult& scan) {
    const OpType type = sc.types[i];
    const std::uint64_t id = sc.ids[i];
    const std::string w(key);
    auto it = map_.find(w);
    const bool present = it != map_.end();
    auto fail = [&](const std::string& what) {
      return std::string(op_name(type)) + " of id " + std::to_string(id) + " (key " +
             hex(key) + "): " + what;
    };
    switch (type) {
      case OpType::read:
        if (ok != present) return fail(present ? "not found, but it is present" : "found, but it is absent");
        if (ok) {
          const std::string want = s_.values.make(id, it->second.second);
          if (value != want) return fail("value " + hex(value) + ", expected " + hex(want));
        }
        return "";
      case OpType::insert:
        if (ok == present) return fail(present ? "succeeded on a present key" : "failed on an absent key");
        map_[w] = {id, sc.version(i)};
        return "";
      case OpType::update:
        if (ok != present) return fail(present ? "failed on a present key" : "succeeded on an absent key");
        if (ok) it->second.second = sc.version(i);
        return "";
      case OpType::remove:
        if (ok != present) return fail(present ? "failed on a present key" : "succeeded on an absent key");
        if (ok) map_.erase(it);
        return "";
      case OpType::scan:
        return check_scan(key, scan, fail);
      case OpType::rmw:
        if (ok != present) return fail(present ? "failed on a present key" : "succeeded on an absent key");
        if (ok) {
          const std::string want = s_.values.make(id, it->second.second);
          if (value != want) return fail("read value " + hex(value) + ", expected " + hex(want));
          it->second.second = sc.version(i);
        }
        return "";
    }
    return "";
  }

 private:
  template <class Fail>
  std::string check_scan(std::string_view start, const ScanResult& scan, Fail fail) {
    if (scan.records.size() > static_cast<std::size_t>(s_.scan_size))
      return fail("returned " + std::to_string(scan.records.size()) + " records, asked for " +
                  std::to_string(s_.scan_size));
    for (std::size_t j = 0; j < scan.records.size(); ++j) {
      const auto& [k, v] = scan.records[j];
      if (s_.keys.less(k, start)) return fail("record " + std::to_string(j) + " key " + hex(k) + " is below the start key");
      if (j > 0 && !s_.keys.less(scan.records[j - 1].first, k))
        return fail("records " + std::to_string(j - 1) + ".." + std::to_string(j) + " out of order");
      std::uint64_t rid = 0;
      if (!s_.keys.id_of(k, &rid)) return fail("record " + std::to_string(j) + " key " + hex(k) + " was never inserted");
      if (owns(rid)) {
        auto it = map_.find(std::string(k));
        if (it == map_.end()) return fail("returned key " + hex(k) + " which is absent");
        const std::string want = s_.values.make(rid, it->second.second);
        if (v != want) return fail("record key " + hex(k) + " value " + hex(v) + ", expected " + hex(want));
      }
    }
    // Completeness over the keys this thread owns: every one in [start, last returned] (or
    // every one >= start when fewer than scan_size came back) must have been returned.
    const bool full = scan.records.size() == static_cast<std::size_t>(s_.scan_size);
    const std::string_view hi = scan.records.empty() ? std::string_view() : scan.records.back().first;
    std::size_t j = 0;
    for (auto it = map_.lower_bound(std::string(start)); it != map_.end(); ++it) {
      if (full && s_.keys.less(hi, it->first)) break;
      const std::string& want = it->first;
      while (j < scan.records.size() && s_.keys.less(scan.records[j].first, want)) ++j;
      if (j == scan.records.size() || scan.records[j].first != want)
        return fail("missed present key " + hex(want) + " (" + std::to_string(scan.records.size()) +
                    " records returned)");
    }
    return "";
  }

  const WorkloadSpec& s_;
  unsigned t_;
  // key -> id, version, in the key format's order (memcmp, or PiBench's integer order)
  std::map<std::string, std::pair<std::uint64_t, std::uint32_t>, KeyLess> map_;
};

// --- run ----------------------------------------------------------------------------------

struct ThreadOutcome {
  std::array<OpResult, kOpTypes> ops;
  PmTotals pm_total;
  std::uint64_t executed = 0;
  bool exhausted = false;
  std::string verify_error;
  std::uint64_t checked = 0;
  bool pool_full = false;  // an operation failed with Code::pool_full: the run is void
};

// One worker thread's measured run over its schedule: the loop (run), a run of consecutive
// reads as one find_many (read_batch), one operation (one_op), and the conformance check of
// an answer (checked).
class ThreadRun {
 public:
  ThreadRun(const Config& c, const WorkloadSpec& spec, const Schedule& sc, unsigned t,
            Target& target, std::atomic<bool>& stop, Counter& progress, double overhead_ns,
            ThreadOutcome* out)
      : c_(c), sc_(sc), t_(t), session_(target.session()), stop_(stop), progress_(progress),
        overhead_(static_cast<std::int64_t>(overhead_ns)), out_(out),
        batch_(std::max(1u, c.batch)), key_buf_(sc.key_buffer()),
        batch_bufs_(batch_ > 1 ? batch_ : 0, key_buf_), batch_keys_(batch_bufs_.size()),
        batch_values_(batch_bufs_.size()), batch_found_(new bool[batch_]) {
    if (c.verify) model_ = std::make_unique<Model>(spec, t);
  }

  void run(std::atomic<int>& ready, std::atomic<bool>& go) {
    ready.fetch_add(1, std::memory_order_acq_rel);
    while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
    TimedSection::enter();
    const PmTotals pm_start = read_pm_counters();
    const std::size_t i = model_ || batch_ > 1 ? loop<false>()
                          : single_type()         ? single_type_loop()
                                                  : loop<true>();
    out_->pm_total = read_pm_counters() - pm_start;
    TimedSection::leave();
    out_->executed = i;
    out_->exhausted = c_.mode == RunMode::time && i == sc_.size() && !stop_.load();
  }

 private:
  // The measured loop; returns the operations executed. kPlain: no conformance model and no
  // batches (the common case), compiled without their tests. The loop's instructions between
  // two operations decide how far the CPU overlaps their cache misses: 30 more per operation
  // (the check called out of line) cost LB+-Tree's 10M-key lookups 20-30% (issue 16).
  template <bool kPlain>
  std::size_t loop() {
    std::size_t i = 0;
    const std::size_t n = sc_.size();
    while (i < n && !stop_.load(std::memory_order_relaxed)) {
      // --batch: consecutive reads go to the session as one find_many of up to c.batch keys.
      const bool ok = !kPlain && batch_ > 1 && sc_.types[i] == OpType::read ? read_batch(&i)
                                                                             : one_op<kPlain>(&i);
      progress_.done.store(i, std::memory_order_relaxed);
      if (!ok) break;
    }
    return i;
  }

  // Every operation a read, or every one an insert; none timed; no PM counting.
  bool single_type() const {
    const auto count = [&](OpType t) { return sc_.counts[static_cast<int>(t)]; };
    return !pmindex::pm::kCounting && sc_.timed_count == 0 &&
           (count(OpType::read) == sc_.size() || count(OpType::insert) == sc_.size());
  }

  // loop<true> for a read-only or insert-only schedule with nothing per operation but the key,
  // the value and the call, as the originals' drivers run theirs: a built-in index called
  // directly (not through the session's virtual wrapper), plain 8-byte keys computed inline,
  // results and the progress counter updated once per stride. Same keys, values, answers and
  // counts as loop<true>, and the same stop at the first pool_full. Why it matters: the
  // instructions between two operations decide how many of their cache misses the CPU
  // overlaps (APEX's 10M-key lookups: 220 -> 149 instructions per operation, ~1.3x).
  std::size_t single_type_loop() {
    if (sc_.stored_keys() || !sc_.key_format->hashed_u64_be())
      return single_type_loop_with([this](std::size_t i) { return sc_.key(i, key_buf_); });
    char* word = key_buf_.data();  // 8 bytes: the key is its word
    const std::uint64_t* ids = sc_.ids.data();
    return single_type_loop_with([word, ids](std::size_t i) {
      store_be64(word, key_hash(ids[i]));
      return std::string_view(word, 8);
    });
  }

  template <class KeyOf>
  std::size_t single_type_loop_with(KeyOf key_of) {
    using pmindex::Code;
    pmindex::Index* index = session_->native_index();
    // A session reports failure as false; its last code may be ok (tree_api): count it failed.
    const auto failed = [this] {
      const Code c = session_->last_code();
      return c == Code::ok ? Code::not_found : c;
    };
    if (sc_.counts[static_cast<int>(OpType::read)] == sc_.size()) {
      if (index == nullptr) {
        return each(OpType::read, [&](std::size_t i) {
          return session_->find(key_of(i), &value_) ? Code::ok : failed();
        });
      }
      std::string value;
      return each(OpType::read, [&](std::size_t i) { return index->find(key_of(i), &value); });
    }
    if (index == nullptr) {
      return each(OpType::insert, [&](std::size_t i) {
        return session_->insert(key_of(i), sc_.value(i, value_buf_)) ? Code::ok : failed();
      });
    }
    return each(OpType::insert, [&](std::size_t i) {
      return index->insert(key_of(i), sc_.value(i, value_buf_));
    });
  }

  template <class Op>
  std::size_t each(OpType type, Op op) {
    constexpr std::size_t kStride = 64;
    const std::size_t n = sc_.size();
    std::size_t i = 0, succeeded = 0;
    bool full = false;
    while (i < n && !full && !stop_.load(std::memory_order_relaxed)) {
      const std::size_t end = std::min(n, i + kStride);
      while (i < end) {
        const pmindex::Code c = op(i++);
        succeeded += c == pmindex::Code::ok ? 1 : 0;
        if (c == pmindex::Code::pool_full) {
          full = true;  // as in one_op: what follows would measure a full pool
          break;
        }
      }
      progress_.done.store(i, std::memory_order_relaxed);
    }
    if (full) {
      out_->pool_full = true;
      stop_.store(true, std::memory_order_relaxed);
    }
    OpResult& r = out_->ops[static_cast<int>(type)];
    r.completed += i;
    r.succeeded += succeeded;
    return i;
  }

  std::int64_t since(Clock::time_point t0) const {
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0);
    return std::max<std::int64_t>(0, ns.count() - overhead_);
  }

  // Reads from *i on, as one find_many; advances *i past them. False: stop (a check failed).
  bool read_batch(std::size_t* i) {
    const std::size_t n = sc_.size();
    std::size_t m = 1;
    while (m < batch_ && *i + m < n && sc_.types[*i + m] == OpType::read) ++m;
    for (std::size_t k = 0; k < m; ++k) batch_keys_[k] = sc_.key(*i + k, batch_bufs_[k]);
    PmTotals before;
    if constexpr (pmindex::pm::kCounting) before = read_pm_counters();
    const Clock::time_point t0 = Clock::now();
    session_->find_many({batch_keys_.data(), m}, {batch_values_.data(), m}, batch_found_.get());
    // Every key of the batch has its answer when the batch returns: that is its latency.
    const std::int64_t ns = since(t0);
    OpResult& r = out_->ops[static_cast<int>(OpType::read)];
    if constexpr (pmindex::pm::kCounting) {
      pmindex::pm::Runtime::end_operation();
      r.pm += read_pm_counters() - before;
    }
    for (std::size_t k = 0; k < m; ++k) {
      if (sc_.timed[*i + k] != 0) r.latency.record(static_cast<std::uint64_t>(ns));
      ++r.completed;
      r.succeeded += batch_found_[k] ? 1 : 0;
      if (!checked(*i + k, batch_keys_[k], batch_found_[k], batch_values_[k], " (batched read)")) {
        *i += k + 1;
        return false;
      }
    }
    *i += m;
    return true;
  }

  // Operation *i; advances *i. False: stop (a check failed).
  template <bool kPlain>
  bool one_op(std::size_t* i) {
    const OpType type = sc_.types[*i];
    const std::string_view key = sc_.key(*i, key_buf_);
    PmTotals before;
    if constexpr (pmindex::pm::kCounting) before = read_pm_counters();
    const bool timed = sc_.timed[*i] != 0;
    Clock::time_point t0;
    if (timed) t0 = Clock::now();
    const bool ok = execute(type, *i, key);
    if (!ok && session_->last_code() == pmindex::Code::pool_full) {
      // Everything after this measures a full pool, not the index: stop every thread.
      out_->pool_full = true;
      stop_.store(true, std::memory_order_relaxed);
    }
    OpResult& r = out_->ops[static_cast<int>(type)];
    if (timed) r.latency.record(static_cast<std::uint64_t>(since(t0)));
    if constexpr (pmindex::pm::kCounting) {
      pmindex::pm::Runtime::end_operation();
      r.pm += read_pm_counters() - before;
    }
    ++r.completed;
    r.succeeded += ok ? 1 : 0;
    return kPlain ? (++*i, true) : checked((*i)++, key, ok, value_, "");
  }

  bool execute(OpType type, std::size_t i, std::string_view key) {
    if (type == OpType::read) return session_->find(key, &value_);  // most runs' only type
    switch (type) {
      case OpType::read: return session_->find(key, &value_);
      case OpType::insert: return session_->insert(key, sc_.value(i, value_buf_));
      case OpType::update: return session_->update(key, sc_.value(i, value_buf_));
      case OpType::remove: return session_->remove(key);
      case OpType::scan: return session_->scan(key, c_.scan_size, model_ ? &scan_ : nullptr) > 0;
      case OpType::rmw: {
        // YCSB-F: read the record, then write a new value back (one operation, one latency).
        bool ok = session_->find(key, &value_);
        if (ok && model_) {
          rmw_read_.assign(value_);
          value_ = rmw_read_;
        }
        return ok && session_->update(key, sc_.value(i, value_buf_));
      }
    }
    return false;
  }

  // With --verify: the model's check of operation i's answer, outside the timed section.
  // False (and every thread told to stop) if it disagrees.
  bool checked(std::size_t i, std::string_view key, bool ok, std::string_view value,
               const char* what) {
    return !model_ || model_checked(i, key, ok, value, what);
  }
  [[gnu::noinline]] bool model_checked(std::size_t i, std::string_view key, bool ok,
                                       std::string_view value, const char* what) {
    TimedSection::leave();  // checking is not generation, but keep the books honest
    const std::string e = model_->check(sc_, i, key, ok, value, scan_);
    TimedSection::enter();
    ++out_->checked;
    if (e.empty()) return true;
    out_->verify_error = "thread " + std::to_string(t_) + ", operation " + std::to_string(i) +
                         what + ": " + e;
    stop_.store(true, std::memory_order_relaxed);
    return false;
  }

  const Config& c_;
  const Schedule& sc_;
  const unsigned t_;
  std::unique_ptr<Session> session_;
  std::atomic<bool>& stop_;
  Counter& progress_;
  const std::int64_t overhead_;
  ThreadOutcome* const out_;
  std::unique_ptr<Model> model_;
  ScanResult scan_;
  std::string_view value_;
  std::string rmw_read_;  // conformance: what an rmw's find returned
  const std::size_t batch_;
  std::string key_buf_, value_buf_;
  std::vector<std::string> batch_bufs_;
  std::vector<std::string_view> batch_keys_;
  std::vector<std::string_view> batch_values_;
  std::unique_ptr<bool[]> batch_found_;
};

void run_thread(const Config& c, const WorkloadSpec& spec, const Schedule& sc, unsigned t,
                Target& target, std::atomic<int>& ready, std::atomic<bool>& go,
                std::atomic<bool>& stop, Counter& progress, double overhead_ns,
                ThreadOutcome* out) {
  ThreadRun(c, spec, sc, t, target, stop, progress, overhead_ns, out).run(ready, go);
}

// Time mode: a short calibration run of reads on loaded keys sizes the pre-generated buffer.
std::uint64_t calibrate_operations(const Config& c, const WorkloadSpec& spec, Target& target) {
  const std::uint64_t probe = std::min<std::uint64_t>(20000, std::max<std::uint64_t>(c.records, 1));
  std::vector<std::string> keys;
  Xoshiro256ss rng(c.seed, 0xca11b);
  for (std::uint64_t i = 0; i < probe; ++i) keys.push_back(spec.keys.make(c.records ? rng.below(c.records) : i));
  auto s = target.session();
  std::string_view v;
  const auto t0 = Clock::now();
  std::uint64_t done = 0;
  while (seconds_since(t0) < 0.1) {
    for (const auto& k : keys) s->find(k, &v);
    done += keys.size();
  }
  const double rate = done / seconds_since(t0);  // one thread, reads: an upper bound for writes
  const double want = rate * c.seconds * 1.5 * c.threads;
  const double cap = static_cast<double>(kMaxTimeModeOperations);
  return static_cast<std::uint64_t>(std::clamp(want, 10000.0 * c.threads, cap));
}

void warmup(const Config& c, const WorkloadSpec& spec, Target& target) {
  auto s = target.session();
  std::string_view v;
  Xoshiro256ss rng(c.seed, 0x3a53);
  const std::uint64_t n = std::min<std::uint64_t>(c.records, 100000);
  std::vector<std::string> keys;
  for (std::uint64_t i = 0; i < n; ++i) keys.push_back(spec.keys.make(rng.below(c.records)));
  for (const auto& k : keys) s->find(k, &v);
}

// --- recovery -----------------------------------------------------------------------------

// Read throughput in windows of 10 ms over pre-generated loaded keys.
struct ReadProbe {
  std::vector<std::string> keys;
  std::size_t next = 0;
  double window(Session& s) {
    std::string_view v;
    const auto t0 = Clock::now();
    std::uint64_t n = 0;
    while (seconds_since(t0) < 0.01) {
      for (int j = 0; j < 64; ++j, ++n) s.find(keys[next++ % keys.size()], &v);
    }
    return n / seconds_since(t0);
  }
};

bool measure_recovery(const Config& c, const WorkloadSpec& spec, std::unique_ptr<Target>& target,
                      const std::string& pool_path, RecoveryResult* r) {
  r->kind = c.recovery;
  if (target->native() == nullptr || pool_path.empty()) {
    r->error = "recovery needs a built-in index with a pool file";
    return false;
  }
  ReadProbe probe;
  Xoshiro256ss rng(c.seed, 0x4ec0);
  for (int i = 0; i < 4096; ++i) probe.keys.push_back(spec.keys.make(rng.below(std::max<std::uint64_t>(1, c.records))));
  {
    auto s = target->session();
    // The median of 21 windows: robust to a noisy shared machine (a max would rarely be met
    // again, so "back to normal" would wait for luck).
    std::vector<double> windows;
    for (int w = 0; w < 21; ++w) windows.push_back(probe.window(*s));
    std::nth_element(windows.begin(), windows.begin() + 10, windows.end());
    r->baseline_ops_per_second = windows[10];
  }
  const std::string closed = target->close();
  target.reset();
  if (!closed.empty()) {
    r->error = "close: " + closed;
    return false;
  }
  if (c.recovery == "crash") {
    // A child reopens the pool and inserts fresh ids until it is killed with SIGKILL.
    int pipefd[2];
    if (::pipe(pipefd) != 0) { r->error = "pipe failed"; return false; }
    const pid_t child = ::fork();
    if (child == 0) {
      ::close(pipefd[0]);
      std::string err;
      auto t = make_native_target(c, pool_path, /*fresh=*/false, &err);
      if (!t) ::_exit(3);
      auto s = t->session();
      const std::uint64_t base = c.records + c.operations * 4 + 1'000'000'000ull;
      for (std::uint64_t j = 0;; ++j) {
        (void)s->insert(spec.keys.make(base + j), spec.values.make(base + j, 0));
        if (j == 1000) { char x = 1; (void)!::write(pipefd[1], &x, 1); }
      }
    }
    ::close(pipefd[1]);
    char x = 0;
    const bool started = ::read(pipefd[0], &x, 1) == 1;
    ::close(pipefd[0]);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    if (!started) { r->error = "the crash child could not open the pool"; return false; }
  }
  const auto t0 = Clock::now();
  std::string err;
  target = make_native_target(c, pool_path, /*fresh=*/false, &err);
  r->reopen_seconds = seconds_since(t0);
  if (!target) { r->error = "reopen: " + err; return false; }
  auto s = target->session();
  std::string_view v;
  (void)s->find(probe.keys[0], &v);
  r->answer_seconds = seconds_since(t0);
  const auto rs = target->native()->recovery_stats();
  r->records_found = rs.records;
  r->records_counted = rs.records_counted;
  r->clean_shutdown = rs.clean_shutdown;
  while (seconds_since(t0) < 5.0) {
    if (probe.window(*s) >= 0.9 * r->baseline_ops_per_second) {
      r->normal_seconds = seconds_since(t0);
      break;
    }
  }
  const std::string bad = target->verify();
  if (!bad.empty()) { r->error = "verify after recovery: " + bad; return false; }
  return true;
}

}  // namespace

namespace {

// The temporary pool's path for the signal handlers: a fixed buffer (nothing allocated or
// locked in a handler) armed with an atomic flag (lock-free, so signal-safe), plus the pid
// that owns it so the recovery child, which inherits the handlers, never removes it.
char g_temp_pool[4096];
std::atomic<bool> g_temp_pool_armed{false};
pid_t g_temp_pool_owner = 0;

extern "C" void remove_temp_pool_and_reraise(int sig) {
  // acquire: pairs with the release in TemporaryPool, so the path bytes are complete.
  if (g_temp_pool_armed.load(std::memory_order_acquire) && ::getpid() == g_temp_pool_owner)
    ::unlink(g_temp_pool);
  ::signal(sig, SIG_DFL);  // then die of the signal, so the exit status still says which
  ::raise(sig);
}

// Removes the temporary pool on every exit path pmbench controls: scope exit (returns and
// exceptions caught in main) and SIGINT, SIGTERM, SIGHUP, SIGQUIT and SIGABRT (an abort).
class TemporaryPool {
 public:
  TemporaryPool(bool on, const std::string& path) : on_(on && path.size() < sizeof g_temp_pool) {
    if (!on_) return;
    std::memcpy(g_temp_pool, path.c_str(), path.size() + 1);
    g_temp_pool_owner = ::getpid();
    g_temp_pool_armed.store(true, std::memory_order_release);  // publishes the path bytes
    static const bool installed = [] {
      for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGABRT}) {
        struct sigaction sa{};
        sa.sa_handler = remove_temp_pool_and_reraise;
        sigemptyset(&sa.sa_mask);
        ::sigaction(sig, &sa, nullptr);
      }
      return true;
    }();
    (void)installed;
  }
  ~TemporaryPool() {
    if (!on_) return;
    g_temp_pool_armed.store(false, std::memory_order_release);
    ::unlink(g_temp_pool);
  }
  TemporaryPool(const TemporaryPool&) = delete;
  TemporaryPool& operator=(const TemporaryPool&) = delete;

 private:
  bool on_;
};

}  // namespace

namespace {

// A named pool's sidecar, `<pool>.pmbench`: what the runs on it did, so a later --skip_load
// run (bench/experiment.py shares one load across workloads) validates what still holds. One
// "key value" per line: records N, key_size, value_size, value_bits, key_type,
// values_updated 0|1 (an update or rmw succeeded), keys_changed 0|1 (an insert or remove
// succeeded, or a crash-recovery child inserted).
struct PoolHistory {
  std::uint64_t records = 0, key_size = 0, value_size = 0, value_bits = 0;
  std::string key_type;
  bool values_updated = false, keys_changed = false;
};

std::string sidecar_path(const std::string& pool) { return pool + ".pmbench"; }

bool read_history(const std::string& pool, PoolHistory* h) {
  std::ifstream in(sidecar_path(pool));
  if (!in) return false;
  std::string k;
  while (in >> k) {
    if (k == "records") in >> h->records;
    else if (k == "key_size") in >> h->key_size;
    else if (k == "value_size") in >> h->value_size;
    else if (k == "value_bits") in >> h->value_bits;
    else if (k == "key_type") in >> h->key_type;
    else if (k == "values_updated") in >> h->values_updated;
    else if (k == "keys_changed") in >> h->keys_changed;
    else in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return true;
}

bool write_history(const std::string& pool, const PoolHistory& h) {
  std::ofstream out(sidecar_path(pool), std::ios::trunc);
  out << "records " << h.records << "\nkey_size " << h.key_size << "\nvalue_size " << h.value_size
      << "\nvalue_bits " << h.value_bits << "\nkey_type " << h.key_type << "\nvalues_updated "
      << h.values_updated << "\nkeys_changed " << h.keys_changed << "\n";
  return static_cast<bool>(out);
}

// --skip_load: the pool must hold the records this run expects, as loaded (same count and
// format, no key added or removed since). Returns "" or why not.
std::string check_history(const Config& c, const PoolHistory& h) {
  if (h.records != c.records)
    return "the pool was loaded with " + std::to_string(h.records) + " records, -n says " +
           std::to_string(c.records);
  if (h.key_size != c.key_size || h.value_size != c.value_size || h.value_bits != c.value_bits ||
      h.key_type != c.key_type)
    return "the pool was loaded with other keys or values (key_size " + std::to_string(h.key_size) +
           ", value_size " + std::to_string(h.value_size) + ", value_bits " + std::to_string(h.value_bits) +
           ", key_type " + h.key_type + ")";
  if (h.keys_changed)
    return "an earlier run on this pool inserted or removed keys; --skip_load needs the keys as "
           "loaded (load it again)";
  return "";
}

std::int64_t peak_rss_bytes() {
  struct rusage ru{};
  if (::getrusage(RUSAGE_SELF, &ru) != 0) return -1;
  return static_cast<std::int64_t>(ru.ru_maxrss) * 1024;  // Linux: KiB
}

}  // namespace

bool is_builtin(const std::string& name) { return pmindex::IndexRegistry::find(name) != nullptr; }

std::string default_pool_path(const Config& c, bool* temporary) {
  if (!c.pool_path.empty()) {
    *temporary = false;
    return c.pool_path;
  }
  *temporary = true;
  return std::string(pmindex::pm::kDefaultPoolDir) + "/pmbench-" + std::to_string(::getpid()) + ".pool";
}

namespace {

// One run's state shared by its steps (run_once below reads as the run's outline).
struct RunState {
  Config c;
  std::shared_ptr<const Dataset> dataset;
  bool temporary = false;
  std::string pool_path;
  std::optional<TemporaryPool> remove_pool;  // declared before the target: removed after it
  std::unique_ptr<Target> target;
  PoolHistory history;
  std::vector<Schedule> schedules;
  std::optional<WorkloadSpec> spec;  // the measured run's (operations known after calibration)
  Clock::time_point phase_start = Clock::now();

  // Closes the current phase of the JSON "phases" breakdown under `name`.
  void next_phase(RunResult* r, const char* name) {
    r->phase_seconds.emplace_back(name, seconds_since(phase_start));
    phase_start = Clock::now();
  }
  bool named_pool() const { return !temporary && target && target->native() != nullptr; }
};

// The dataset first: a text dataset's longest key sizes the index (max_key_size).
bool resolve_dataset(RunState& st, RunResult* r, std::string* error) {
  Config& c = st.c;
  if (!c.dataset.empty()) {
    DatasetFormat format{};
    if (!resolve_dataset_format(c.dataset_format, c.dataset, &format)) {
      *error = "--dataset_format must be auto, sosd or text";
      r->usage_error = true;
      return false;
    }
    st.dataset = load_dataset(c.dataset, format, c.records + c.operations, c.seed, error);
    if (!st.dataset) return false;
    if (st.dataset->size() < c.records) {
      *error = c.dataset + ": " + std::to_string(st.dataset->size()) +
               " distinct keys, fewer than --records " + std::to_string(c.records);
      return false;
    }
    if (st.dataset->variable_length()) {
      if (c.key_type != "bytes") {
        *error = c.dataset + " is a text dataset (variable-length keys): it needs --key_type bytes";
        r->usage_error = true;
        return false;
      }
      c.key_size = std::max<std::size_t>(st.dataset->max_length, 1);
      c.variable_keys = true;
    }
  }
  r->max_key_size = c.key_size;
  r->variable_keys = c.variable_keys;
  return true;
}

// The target the run measures: a DRAM comparator, a built-in index on a pool file (armed for
// removal before the file exists), or a tree_api library given by path.
bool open_target(RunState& st, RunResult* r, std::string* error) {
  const Config& c = st.c;
  const bool tree_api_path = c.target.find('/') != std::string::npos || c.target.ends_with(".so");
  if (c.key_order == "pibench" && (!tree_api_path || c.variable_keys)) {
    *error = c.variable_keys ? "--key_order pibench needs fixed-size keys, not a text dataset"
                             : "--key_order pibench is for tree_api libraries (given by path); "
                               "built-in indexes and DRAM comparators order keys by memcmp";
    r->usage_error = true;
    return false;
  }
  if (c.prefault && !is_builtin(c.target)) {
    *error = "--prefault maps the pages of a built-in index's pool file; " + c.target +
             " has no pool of ours (a tree_api library maps its own)";
    r->usage_error = true;
    return false;
  }
  if (auto dram = make_dram_target(c.target)) {
    st.target = std::move(dram);
  } else if (is_builtin(c.target)) {
    st.pool_path = default_pool_path(c, &st.temporary);
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(st.pool_path).parent_path(), ec);
    st.remove_pool.emplace(st.temporary, st.pool_path);  // armed before the file exists
    st.target = make_native_target(c, st.pool_path, /*fresh=*/!c.skip_load, error, &r->usage_error);
  } else if (tree_api_path) {
    st.pool_path = c.pool_path;
    st.target = make_tree_api_target(c, st.pool_path, error, &r->usage_error);
  } else {
    std::string names;
    for (const auto& n : pmindex::IndexRegistry::names()) names += " " + n;
    for (const auto& n : dram_comparator_names()) names += " " + n;
    *error = "unknown index '" + c.target + "' (built-in:" + names +
             "; a tree_api library is given by path)";
    r->usage_error = true;
    return false;
  }
  if (!st.target) return false;
  const TargetInfo& info = st.target->info();
  r->target_kind = info.kind;
  r->load_method = c.skip_load ? "skip" : info.load_method;
  r->backing = info.backing;
  r->durability = info.durability;
  r->prefault = info.prefault;
  r->emulated_pm = info.emulated_pm;
  return true;
}

// Load, or take a kept pool's records (--skip_load) after checking its history sidecar.
bool load_or_reopen(RunState& st, const WorkloadSpec& base, RunResult* r, std::string* error) {
  const Config& c = st.c;
  if (!c.skip_load) {
    std::error_code ec_ignored;
    if (st.named_pool()) std::filesystem::remove(sidecar_path(st.pool_path), ec_ignored);  // a new load
    if (!load(c, base, *st.target, r, error)) return false;
    st.history.records = c.records;
    st.history.key_size = c.key_size;
    st.history.value_size = c.value_size;
    st.history.value_bits = c.value_bits;
    st.history.key_type = c.key_type;
    return true;
  }
  r->loaded = c.records;
  if (st.named_pool() && read_history(st.pool_path, &st.history)) {
    if (std::string e = check_history(c, st.history); !e.empty()) {
      *error = "--skip_load: " + e;
      return false;
    }
    r->pool_history = st.history.values_updated ? "reopened; earlier runs updated values"
                                                : "reopened; records as loaded";
  } else if (st.named_pool()) {
    r->pool_history = "reopened; no record of earlier runs (assumed as loaded)";
  }
  return true;
}

// A reopened pool of a kind that recovers lazily (recovery_stats().records_counted false:
// APEX, part, roart) is walked in the background, and its writers wait for that walk. The
// measured run must start from the state a load leaves, so the walk's end is awaited here:
// size() returns once it is done (Index::size(); the call adds no work to the walk).
void await_recovery_walk(RunState& st) {
  if (pmindex::Index* idx = st.target->native()) (void)idx->size();
}

// Footprint after load and the post-load validation (values only while no run updated them).
bool footprint_and_validate(RunState& st, const WorkloadSpec& base, std::size_t malloc_before,
                            RunResult* r, std::string* error) {
  const auto [dram, pm] = st.target->footprint();
  r->dram_bytes = dram;
  r->pm_bytes = pm;
  r->pm_requested_bytes = st.target->pm_requested_bytes();
  r->malloc_delta_bytes = static_cast<std::int64_t>(::mallinfo2().uordblks) -
                          static_cast<std::int64_t>(malloc_before);
  const auto t0 = Clock::now();
  r->validate_error = validate_load(st.c, base, *st.target, !st.history.values_updated, &r->validation);
  r->validate_seconds = seconds_since(t0);
  if (!r->validate_error.empty()) {
    *error = "post-load validation failed: " + r->validate_error;
    return false;
  }
  return true;
}

// The measured run's operations (time mode: calibrated, within the dataset's spare keys), its
// schedules, and the harness's own memory.
bool plan_run(RunState& st, const WorkloadSpec& base, RunResult* r, std::string* error) {
  const Config& c = st.c;
  const auto& dataset = st.dataset;
  std::uint64_t ops = c.mode == RunMode::time ? calibrate_operations(c, base, *st.target) : c.operations;
  const double insert_ratio = c.ratio[static_cast<int>(OpType::insert)];
  if (dataset && insert_ratio > 0 && c.mode == RunMode::time) {
    // Inserts take fresh dataset keys: keep the time-mode buffer within the dataset.
    const double spare = static_cast<double>(dataset->size() - c.records) - c.threads;
    ops = std::min<std::uint64_t>(ops, static_cast<std::uint64_t>(std::max(0.0, spare / insert_ratio)));
  }
  st.spec.emplace(WorkloadSpec::from(c, ops, dataset));
  st.schedules = build_schedules(*st.spec);
  if (dataset) {
    for (const auto& s : st.schedules)
      for (std::size_t i = 0; i < s.size(); ++i)
        if (s.types[i] == OpType::insert && s.ids[i] >= dataset->size()) {
          *error = c.dataset + ": the run inserts more keys than the dataset holds beyond --records (" +
                   std::to_string(dataset->size()) + " distinct keys)";
          return false;
        }
  }
  for (const auto& s : st.schedules) {
    r->scheduled += s.size();
    r->expected_misses += s.expected_misses;
    r->schedule_bytes += s.bytes();
  }
  if (dataset)
    r->dataset_bytes = dataset->keys.capacity() * 8 + dataset->by_key.capacity() * 16 +
                       dataset->text_bytes.capacity() + dataset->text_offsets.capacity() * 8 +
                       dataset->text_sorted_ids.capacity() * 8;
  r->harness_bytes = r->dataset_bytes + std::max(r->harness_bytes, r->schedule_bytes);
  return true;
}

// Page faults the process has taken so far (minor and major, every thread).
std::uint64_t page_faults() {
  rusage u{};
  return ::getrusage(RUSAGE_SELF, &u) == 0 ? static_cast<std::uint64_t>(u.ru_minflt + u.ru_majflt) : 0;
}

// The measured run: one worker per thread, started together; this thread samples throughput
// every --sampling_ms, enforces the time-mode deadline and draws the progress bar.
void run_workers(RunState& st, RunResult* r, std::vector<ThreadOutcome>* outcomes) {
  const Config& c = st.c;
  std::vector<Counter> progress(c.threads);
  std::atomic<int> ready{0};
  std::atomic<bool> go{false}, stop{false};
  std::atomic<int> finished{0};
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < c.threads; ++t)
    workers.emplace_back([&, t] {
      run_thread(c, *st.spec, st.schedules[t], t, *st.target, ready, go, stop, progress[t],
                 r->clock_overhead_ns, &(*outcomes)[t]);
      finished.fetch_add(1, std::memory_order_acq_rel);
    });
  while (ready.load(std::memory_order_acquire) < static_cast<int>(c.threads)) std::this_thread::yield();
  const Progress bar{c.progress && !c.quiet && ::isatty(1) != 0, "run"};
  const std::uint64_t faults0 = page_faults();
  const auto t0 = Clock::now();
  go.store(true, std::memory_order_release);
  const auto period = std::chrono::milliseconds(c.sampling_ms);
  std::uint64_t last = 0;
  auto next = t0 + period;
  while (finished.load(std::memory_order_acquire) < static_cast<int>(c.threads)) {
    const auto now = Clock::now();
    if (c.mode == RunMode::time && now - t0 >= std::chrono::duration<double>(c.seconds))
      stop.store(true, std::memory_order_relaxed);
    if (now >= next) {
      std::uint64_t sum = 0;
      for (auto& p : progress) sum += p.done.load(std::memory_order_relaxed);
      r->throughput_series.push_back((sum - last) / std::chrono::duration<double>(period).count());
      last = sum;
      next += period;
      bar.show(c.mode == RunMode::time ? seconds_since(t0) / c.seconds
                                       : static_cast<double>(sum) / std::max<std::uint64_t>(1, r->scheduled));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min<unsigned>(c.sampling_ms, 5)));
  }
  for (auto& w : workers) w.join();
  r->run_seconds = seconds_since(t0);
  r->run_page_faults = page_faults() - faults0;
  bar.done();
}

// The threads' counts, latencies and PM work summed into the run's result; false (with the
// reason) when an operation met a full pool.
bool merge_outcomes(const std::vector<ThreadOutcome>& outcomes, RunResult* r, std::string* error) {
  for (const auto& o : outcomes) {
    for (int k = 0; k < kOpTypes; ++k) {
      r->ops[k].completed += o.ops[k].completed;
      r->ops[k].succeeded += o.ops[k].succeeded;
      r->ops[k].latency.merge(o.ops[k].latency);
      r->ops[k].pm += o.ops[k].pm;
      r->latency_all.merge(o.ops[k].latency);
    }
    r->pm_total += o.pm_total;
    r->schedule_exhausted = r->schedule_exhausted || o.exhausted;
    r->checked += o.checked;
    if (r->verify_error.empty() && !o.verify_error.empty()) r->verify_error = o.verify_error;
  }
  for (const auto& op : r->ops) {
    r->completed += op.completed;
    r->succeeded += op.succeeded;
  }
  const auto filled = [](const ThreadOutcome& o) { return o.pool_full; };
  if (std::any_of(outcomes.begin(), outcomes.end(), filled)) {
    *error = "the pool filled up during the run (an operation failed with pool_full after " +
             std::to_string(r->succeeded) + " operations succeeded); give a larger --pool_size " +
             "(bytes; the default is sized for --records plus the inserts the run can make)";
    return false;
  }
  return true;
}

// After the run: the index's own structural check (with --verify or --full_validation only:
// it walks the whole index, seconds per run at millions of records, issue 26) and recovery.
bool check_and_recover(RunState& st, RunResult* r, std::string* error) {
  const Config& c = st.c;
  r->verified = c.verify;
  r->structure_checked = c.verify || c.full_validation;
  if (r->structure_checked) r->structure_error = st.target->verify();
  if (c.verify && r->verify_error.empty() && !r->structure_error.empty())
    r->verify_error = "index verify() after the run: " + r->structure_error;
  if (!c.recovery.empty()) {
    r->has_recovery = true;
    if (!measure_recovery(c, *st.spec, st.target, st.pool_path, &r->recovery)) {
      *error = "recovery: " + r->recovery.error;
      return false;
    }
  }
  return true;
}

// A named pool is left cleanly closed so --skip_load can reopen it, with its history sidecar
// saying whether this run changed values or keys.
bool close_named_pool(RunState& st, const RunResult& r, std::string* error) {
  if (!st.named_pool()) return true;
  const std::string e = st.target->close();
  if (!e.empty()) {
    *error = "close: " + e;
    return false;
  }
  const auto succeeded = [&](OpType t) { return r.ops[static_cast<int>(t)].succeeded > 0; };
  PoolHistory& h = st.history;
  h.values_updated = h.values_updated || succeeded(OpType::update) || succeeded(OpType::rmw);
  h.keys_changed = h.keys_changed || succeeded(OpType::insert) || succeeded(OpType::remove) ||
                   st.c.recovery == "crash";
  if (!write_history(st.pool_path, h)) {
    *error = "cannot write " + sidecar_path(st.pool_path);
    return false;
  }
  return true;
}

}  // namespace

bool run_once(const Config& config, unsigned repeat, RunResult* r, std::string* error) {
  (void)repeat;
  RunState st;
  st.c = config;
  if (!resolve_dataset(st, r, error)) return false;
  const std::size_t malloc_before = ::mallinfo2().uordblks;
  st.phase_start = Clock::now();
  if (!open_target(st, r, error)) return false;
  st.next_phase(r, "open");
  const WorkloadSpec base = WorkloadSpec::from(st.c, st.c.operations, st.dataset);
  if (!load_or_reopen(st, base, r, error)) return false;
  st.next_phase(r, "load");
  if (st.c.skip_load) {
    await_recovery_walk(st);
    st.next_phase(r, "recovery walk");
  }
  if (!footprint_and_validate(st, base, malloc_before, r, error)) return false;
  st.next_phase(r, "validate");
  if (!plan_run(st, base, r, error)) return false;
  if (st.c.warmup) warmup(st.c, *st.spec, *st.target);
  r->clock_overhead_ns = clock_overhead_ns();
  st.next_phase(r, "schedule");
  std::vector<ThreadOutcome> outcomes(st.c.threads);
  run_workers(st, r, &outcomes);
  st.next_phase(r, "run");
  if (!merge_outcomes(outcomes, r, error)) return false;
  if (!check_and_recover(st, r, error)) return false;
  st.next_phase(r, "check and recovery");
  r->peak_rss_bytes = peak_rss_bytes();
  if (!close_named_pool(st, *r, error)) return false;
  st.next_phase(r, "close");
  return true;
}

}  // namespace pmbench

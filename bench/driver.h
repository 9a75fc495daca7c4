// The benchmark proper: load, post-load validation, the timed run (operation or time mode),
// conformance checking (--verify) and the recovery measurement.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "config.h"
#include "histogram.h"
#include "target.h"
#include "workload.h"

namespace pmbench {

// Persistence work from pmindex's substrate counters (pm::Runtime::counters()).
struct PmTotals {
  std::uint64_t flushes = 0, fences = 0, lines_written = 0, media_bytes_read = 0,
                media_bytes_written = 0;
  PmTotals& operator+=(const PmTotals& o) {
    flushes += o.flushes; fences += o.fences; lines_written += o.lines_written;
    media_bytes_read += o.media_bytes_read; media_bytes_written += o.media_bytes_written;
    return *this;
  }
};

struct OpResult {
  std::uint64_t completed = 0, succeeded = 0;
  Histogram latency;
  PmTotals pm;  // counting binary only (per-op attribution needs end_operation())
};

struct RecoveryResult {
  std::string kind;                 // "clean" or "crash"
  double reopen_seconds = 0;        // open() returned
  double answer_seconds = 0;        // open() + first find answered
  double normal_seconds = -1;       // until a 10 ms read window reaches 90% of the baseline
  double baseline_ops_per_second = 0;
  std::uint64_t records_found = 0;
  bool records_counted = true;  // false: the index recovers lazily and did not count them
  bool clean_shutdown = false;
  std::string error;
};

// What post-load validation checked: "checked", "not checked (why)", or "" (not reached).
// kind: "full" (every record; --full_validation, --verify) or "sampled" (the default).
struct ValidationReport {
  std::string kind, lookups, scan_order, scan_values, record_count;
};

struct RunResult {
  std::string target_kind, load_method, backing, durability;
  std::string prefault;  // TargetInfo::prefault
  bool emulated_pm = false;
  // load
  std::uint64_t loaded = 0;
  double load_seconds = 0;
  double validate_seconds = 0;
  std::string validate_error;
  ValidationReport validation;
  // run
  double run_seconds = 0;
  // Page faults the process took during the run (getrusage, every thread: the harness's are
  // few; first touches of pool or DRAM-arena pages the index grows into are the rest).
  std::uint64_t run_page_faults = 0;
  std::uint64_t completed = 0, succeeded = 0;
  std::array<OpResult, kOpTypes> ops;
  Histogram latency_all;
  std::vector<double> throughput_series;   // ops/s per --sampling_ms interval
  double clock_overhead_ns = 0;
  bool schedule_exhausted = false;         // time mode: a thread ran out of pre-generated ops
  std::uint64_t scheduled = 0;
  std::uint64_t expected_misses = 0;       // ops scheduled on a thread with no live id

  // persistence work in the run phase (all operations)
  PmTotals pm_total;
  // memory after load
  std::int64_t dram_bytes = -1, pm_bytes = -1, malloc_delta_bytes = 0;
  std::int64_t pm_requested_bytes = -1;  // PM in use at requested sizes (survey Table 3)
  // pmbench's own memory, apart from the index: the largest of its data structures alive at
  // once (schedules, dataset keys, bulk-load arrays, conformance models), counted from their
  // sizes; and the process's peak RSS (index, harness and the pool pages touched, together).
  std::uint64_t harness_bytes = 0;
  std::uint64_t schedule_bytes = 0, dataset_bytes = 0, model_bytes = 0;
  std::int64_t peak_rss_bytes = -1;
  // --skip_load: what earlier runs on the pool did, from its sidecar ("" when there is none).
  std::string pool_history;
  // conformance
  bool verified = false;
  std::string verify_error;                // empty: every result matched
  std::uint64_t checked = 0;
  std::string structure_error;             // the index's own verify() after the run
  bool structure_checked = false;          // verify() ran (--verify, --full_validation)
  // Wall seconds of each phase, in order: open, load, validate, schedule (calibration and
  // generation), run, check and recovery, close. The target's destruction comes after.
  std::vector<std::pair<std::string, double>> phase_seconds;
  RecoveryResult recovery;
  bool has_recovery = false;
  // The run could not start because of the options (an index that does not support the key
  // type, a dataset that contradicts --key_type): main exits with 2, as for a bad flag.
  bool usage_error = false;
  // The keys the run used: fixed key_size, or variable-length up to max_key_size (text).
  std::size_t max_key_size = 8;
  bool variable_keys = false;

  double throughput() const { return run_seconds > 0 ? completed / run_seconds : 0; }
};

// Runs one repeat: make the target, load, validate, run, (recovery). Returns false with
// `error` set when the target cannot be opened or a check failed fatally.
bool run_once(const Config& c, unsigned repeat, RunResult* out, std::string* error);

// The pool file a run uses and whether pmbench made it up (then it is removed at the end).
std::string default_pool_path(const Config& c, bool* temporary);

bool is_builtin(const std::string& name);

}  // namespace pmbench

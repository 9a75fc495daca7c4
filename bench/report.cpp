#include "report.h"

#include <sys/utsname.h>

#include <cmath>
#include <fstream>
#include <iomanip>
#include <thread>

#include "pmindex/index.h"
#include "pmindex/pm/persist.h"
#include "pmindex/sync/asymmetric_fence.h"

#ifndef PMBENCH_GIT_REVISION
#define PMBENCH_GIT_REVISION "unknown"
#endif
#ifndef PMBENCH_BUILD_TYPE
#define PMBENCH_BUILD_TYPE "unknown"
#endif

namespace pmbench {

using nlohmann::ordered_json;

namespace {

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      const auto p = line.find(':');
      return p == std::string::npos ? line : line.substr(p + 2);
    }
  return "unknown";
}

const char* pm_source() {
  return pmindex::pm::kCounting
             ? "pmbench-counting (pmindex_counting): flushes/fences counted always; lines_written and "
               "media bytes from the per-operation line set and the XPBuffer model (end_operation() "
               "after every op)"
             : "pmbench (production pmindex): flushes and fences only; lines_written and media bytes "
               "need pmbench-counting (null here)";
}

ordered_json percentiles(const Histogram& h) {
  ordered_json j;
  j["samples"] = h.count();
  j["min"] = h.min();
  j["p50"] = h.percentile(50);
  j["p90"] = h.percentile(90);
  j["p99"] = h.percentile(99);
  j["p999"] = h.percentile(99.9);
  j["p9999"] = h.percentile(99.99);
  j["p99999"] = h.percentile(99.999);
  j["max"] = h.max();
  j["mean"] = h.mean();
  return j;
}

ordered_json pm_per_op(const PmTotals& t, std::uint64_t ops, bool counting) {
  const double n = ops == 0 ? 1.0 : static_cast<double>(ops);
  ordered_json j;
  j["flushes"] = t.flushes / n;
  j["fences"] = t.fences / n;
  if (counting) {
    j["lines_written"] = t.lines_written / n;
    j["media_bytes_read"] = t.media_bytes_read / n;
    j["media_bytes_written"] = t.media_bytes_written / n;
  } else {
    j["lines_written"] = nullptr;
    j["media_bytes_read"] = nullptr;
    j["media_bytes_written"] = nullptr;
  }
  return j;
}

}  // namespace

ordered_json environment(const Config& c, const RunResult* first) {
  ordered_json e;
  e["cpu"] = cpu_model();
  e["cores"] = std::thread::hardware_concurrency();
  utsname u{};
  if (::uname(&u) == 0) e["kernel"] = std::string(u.sysname) + " " + u.release + " " + u.machine;
  e["persistence"] = c.persistence;
  e["adr_instruction"] = std::string(pmindex::pm::Runtime::adr_instruction());
  e["ebr_fences"] = pmindex::sync::AsymmetricFence::enabled()
                        ? "asymmetric (membarrier)"
                        : "symmetric (seq_cst fences)";
  if (first != nullptr) {
    e["pool_backing"] = first->backing.empty() ? (first->target_kind == "dram" ? "none (DRAM index)" : "unknown")
                                               : first->backing;
    e["durability"] = first->durability;
    e["emulated_pm"] = first->emulated_pm;
    e["pool_prefault"] = first->prefault.empty() ? "off" : first->prefault;
  }
  e["build_type"] = PMBENCH_BUILD_TYPE;
  e["git_revision"] = PMBENCH_GIT_REVISION;
  e["pm_flavour"] = std::string(pmindex::pm::to_string(pmindex::pm::kFlavour));
  e["isa_level"] = std::string(pmindex::isa_level());  // README "Minimum CPU"
  e["compiler"] = __VERSION__;
  e["clock"] = "std::chrono::steady_clock, per-sample overhead subtracted";
  return e;
}

ordered_json to_json(const Config& c, const RunResult& r) {
  const bool counting = pmindex::pm::kCounting;
  ordered_json j;
  j["target"] = {{"name", c.target}, {"kind", r.target_kind}, {"load_method", r.load_method},
                 {"emulated_pm", r.emulated_pm}, {"variable_keys", r.variable_keys},
                 {"max_key_size", r.max_key_size}};
  j["load"] = {{"records", r.loaded}, {"seconds", r.load_seconds},
               {"throughput", r.load_seconds > 0 ? r.loaded / r.load_seconds : 0.0},
               {"validate_seconds", r.validate_seconds},
               {"validation", {{"kind", r.validation.kind},
                               {"lookups", r.validation.lookups},
                               {"scan_order", r.validation.scan_order},
                               {"scan_values", r.validation.scan_values},
                               {"record_count", r.validation.record_count}}},
               {"pool_history", r.pool_history}};
  j["run"] = {{"seconds", r.run_seconds}, {"completed", r.completed}, {"succeeded", r.succeeded},
              {"throughput", r.throughput()}, {"scheduled", r.scheduled}, {"expected_misses", r.expected_misses},
              {"schedule_exhausted", r.schedule_exhausted},
              {"clock_overhead_ns", r.clock_overhead_ns}, {"page_faults", r.run_page_faults}};
  ordered_json ops, lat, pm;
  for (int k = 0; k < kOpTypes; ++k) {
    const OpResult& o = r.ops[k];
    ops[op_name(k)] = {{"completed", o.completed}, {"succeeded", o.succeeded},
                       {"throughput", r.run_seconds > 0 ? o.completed / r.run_seconds : 0.0}};
    lat[op_name(k)] = percentiles(o.latency);
    if (counting) pm[op_name(k)] = pm_per_op(o.pm, o.completed, true);
  }
  lat["all"] = percentiles(r.latency_all);
  j["ops"] = ops;
  j["latency_ns"] = lat;
  pm["all"] = pm_per_op(r.pm_total, r.completed, counting);
  // The per-operation averages over all operations also at the top of "pm" (issue 4's keys).
  const ordered_json all = pm["all"];
  for (const auto& [k, v] : all.items()) pm[k] = v;
  pm["source"] = pm_source();
  pm["per_type"] = counting;
  j["pm"] = pm;
  j["memory"] = {{"dram_bytes", r.dram_bytes < 0 ? ordered_json(nullptr) : ordered_json(r.dram_bytes)},
                 {"pm_bytes", r.pm_bytes < 0 ? ordered_json(nullptr) : ordered_json(r.pm_bytes)},
                 {"pm_requested_bytes", r.pm_requested_bytes < 0 ? ordered_json(nullptr)
                                                                 : ordered_json(r.pm_requested_bytes)},
                 {"malloc_delta_bytes", r.malloc_delta_bytes},
                 {"harness_bytes", r.harness_bytes},
                 {"harness_bytes_per_record", r.loaded > 0 ? static_cast<double>(r.harness_bytes) / r.loaded : 0.0},
                 {"harness", {{"schedule_bytes", r.schedule_bytes}, {"dataset_bytes", r.dataset_bytes},
                              {"note", "pmbench's own data, counted from its structures' sizes (schedules, "
                                       "dataset keys, bulk-load arrays); not the conformance model of --verify"}}},
                 {"peak_rss_bytes", r.peak_rss_bytes < 0 ? ordered_json(nullptr) : ordered_json(r.peak_rss_bytes)},
                 {"note", "dram_bytes/pm_bytes from Index::footprint() after load (built-in indexes; "
                          "pm_bytes at allocator class sizes, pm_requested_bytes at requested sizes); "
                          "malloc_delta_bytes: glibc mallinfo2 in-use delta over load (all targets); "
                          "harness_bytes: pmbench's own memory, not the index's; peak_rss_bytes: the "
                          "whole process (index, harness and the pool pages it touched)"}};
  j["throughput_series"] = {{"interval_ms", c.sampling_ms}, {"ops_per_second", r.throughput_series}};
  j["verify"] = {{"enabled", r.verified}, {"checked", r.checked},
                 {"passed", r.verified ? ordered_json(r.verify_error.empty()) : ordered_json(nullptr)},
                 {"error", r.verify_error}, {"structure_error", r.structure_error},
                 {"structure_checked", r.structure_checked}};
  ordered_json phases = ordered_json::object();
  for (const auto& [name, sec] : r.phase_seconds) phases[name] = sec;
  j["phases"] = phases;
  if (r.has_recovery) {
    const RecoveryResult& rc = r.recovery;
    j["recovery"] = {{"kind", rc.kind}, {"reopen_seconds", rc.reopen_seconds},
                     {"answer_seconds", rc.answer_seconds},
                     {"normal_throughput_seconds", rc.normal_seconds < 0 ? ordered_json(nullptr) : ordered_json(rc.normal_seconds)},
                     {"baseline_read_ops_per_second", rc.baseline_ops_per_second},
                     {"records_found", rc.records_counted ? ordered_json(rc.records_found) : ordered_json(nullptr)}, {"clean_shutdown", rc.clean_shutdown},
                     {"error", rc.error}};
  }
  return j;
}

ordered_json document(const Config& c, const std::vector<RunResult>& runs) {
  ordered_json d;
  ordered_json cfg;
  for (const auto& [k, v] : c.as_pairs()) cfg[k] = v;
  d["config"] = cfg;
  d["environment"] = environment(c, runs.empty() ? nullptr : &runs.front());
  if (!runs.empty()) {
    const ordered_json first = to_json(c, runs.front());
    for (const auto& [k, v] : first.items()) d[k] = v;
  }
  ordered_json reps = ordered_json::array();
  double sum = 0, sq = 0;
  for (const auto& r : runs) {
    reps.push_back(to_json(c, r));
    sum += r.throughput();
    sq += r.throughput() * r.throughput();
  }
  const double n = runs.empty() ? 1 : static_cast<double>(runs.size());
  const double mean = sum / n;
  d["summary"] = {{"repeats", runs.size()}, {"throughput_mean", mean},
                  {"throughput_stdev", std::sqrt(std::max(0.0, sq / n - mean * mean))}};
  d["repeats"] = reps;
  return d;
}

void write_human(std::ostream& out, const Config& c, const std::vector<RunResult>& runs,
                 const ordered_json& env) {
  out << "Environment:\n";
  for (const auto& [k, v] : env.items()) out << "  " << k << ": " << (v.is_string() ? v.get<std::string>() : v.dump()) << "\n";
  out << "Benchmark: " << c.target << ", " << c.threads << " thread(s), "
      << (c.mode == RunMode::time ? "time mode" : "operation mode") << ", "
      << to_string(c.distribution) << (c.distribution != DistKind::uniform ? " skew " + std::to_string(c.skew) : "")
      << (c.verify ? ", CONFORMANCE MODE (timings not meaningful)" : "") << "\n";
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const RunResult& r = runs[i];
    out << std::fixed << std::setprecision(3);
    if (runs.size() > 1) out << "Repeat " << i + 1 << ":\n";
    if (r.emulated_pm && r.target_kind == "builtin")
      out << "  NOTE: PM emulated (" << r.backing << "): " << r.durability << "\n";
    out << "Load (" << r.load_method << "): " << r.loaded << " records in " << r.load_seconds << " s ("
        << std::setprecision(0) << (r.load_seconds > 0 ? r.loaded / r.load_seconds : 0) << " ops/s)\n";
    if (!r.pool_history.empty()) out << "Pool: " << r.pool_history << "\n";
    if (!r.validation.lookups.empty())
      out << "Validation (" << r.validation.kind << "): lookups: " << r.validation.lookups
          << "; scan order: " << r.validation.scan_order << "; scan values: "
          << r.validation.scan_values << "; record count: " << r.validation.record_count << "\n";
    out << std::setprecision(3) << "Run: " << r.completed << " operations in " << r.run_seconds
        << " s (" << r.run_page_faults << " page faults)\n";
    // A recovery run's operations feed the recovery timer (see "Recovery" below); their rate
    // measures nothing worth printing.
    if (!r.has_recovery)
      out << "  Throughput: " << std::setprecision(0) << r.throughput() << " ops/s, succeeded "
          << r.succeeded << "\n";
    for (int k = 0; k < kOpTypes; ++k) {
      const OpResult& o = r.ops[k];
      if (o.completed == 0) continue;
      out << "  " << op_name(k) << ": completed " << o.completed << ", succeeded " << o.succeeded
          << " (" << std::setprecision(1) << 100.0 * o.succeeded / o.completed << "%)";
      if (o.latency.count() > 0)
        out << "; latency ns p50 " << o.latency.percentile(50) << " p90 " << o.latency.percentile(90)
            << " p99 " << o.latency.percentile(99) << " p99.9 " << o.latency.percentile(99.9)
            << " p99.99 " << o.latency.percentile(99.99) << " max " << o.latency.max();
      out << "\n";
    }
    const double n = r.completed ? static_cast<double>(r.completed) : 1.0;
    out << std::setprecision(2) << "  PM per op: flushes " << r.pm_total.flushes / n << ", fences "
        << r.pm_total.fences / n;
    if (pmindex::pm::kCounting)
      out << ", lines written " << r.pm_total.lines_written / n
          << ", media bytes written " << r.pm_total.media_bytes_written / n
          << ", media read-modify-write bytes read " << r.pm_total.media_bytes_read / n
          << " (counting build; loads are not traced, so reads by lookups and scans are not "
             "measured)";
    out << "\n";
    if (r.dram_bytes >= 0) {
      out << "  Footprint after load: DRAM " << r.dram_bytes << " B, PM " << r.pm_bytes << " B";
      if (r.pm_requested_bytes >= 0) out << " (" << r.pm_requested_bytes << " B requested)";
      out << "\n";
    }
    out << "  malloc in use after load: " << r.malloc_delta_bytes << " B\n";
    out << "  Harness memory (pmbench's own, not the index's): " << r.harness_bytes << " B ("
        << std::setprecision(1) << (r.loaded > 0 ? static_cast<double>(r.harness_bytes) / r.loaded : 0.0)
        << " B per record; schedules " << r.schedule_bytes << " B, dataset " << r.dataset_bytes
        << " B); process peak RSS " << r.peak_rss_bytes << " B\n";
    if (!r.phase_seconds.empty()) {
      out << std::setprecision(2) << "  Phases (s):";
      for (const auto& [name, sec] : r.phase_seconds) out << " " << name << " " << sec << ";";
      out << "\n";
    }
    if (r.schedule_exhausted) out << "  WARNING: a thread ran out of pre-generated operations before --seconds\n";
    if (r.verified)
      out << "  Conformance: " << (r.verify_error.empty() ? "PASSED" : "FAILED") << " (" << r.checked
          << " results checked)" << (r.verify_error.empty() ? "" : "\n  first mismatch: " + r.verify_error) << "\n";
    if (r.has_recovery) {
      const RecoveryResult& rc = r.recovery;
      out << std::setprecision(4) << "  Recovery (" << rc.kind << "): reopen " << rc.reopen_seconds
          << " s, answers after " << rc.answer_seconds << " s, normal throughput after "
          << rc.normal_seconds << " s\n";
    }
  }
}

void write_csv(std::ostream& out, const Config& c, const std::vector<RunResult>& runs) {
  out << "index,kind,threads,mode,distribution,skew,repeat,op,completed,succeeded,seconds,throughput,"
         "lat_samples,lat_p50,lat_p90,lat_p99,lat_p999,lat_p9999,lat_max,flushes_per_op,fences_per_op,"
         "lines_written_per_op,media_bytes_read_per_op,media_bytes_written_per_op,dram_bytes,pm_bytes,"
         "load_seconds,emulated_pm\n";
  out << std::setprecision(10);
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const RunResult& r = runs[i];
    auto row = [&](const std::string& op, std::uint64_t completed, std::uint64_t succeeded,
                   const Histogram& h, const PmTotals& pm, bool have_pm) {
      const double n = completed ? static_cast<double>(completed) : 1.0;
      out << c.target << "," << r.target_kind << "," << c.threads << ","
          << (c.mode == RunMode::time ? "time" : "operation") << "," << to_string(c.distribution)
          << "," << c.skew << "," << i << "," << op << "," << completed << "," << succeeded << ","
          << r.run_seconds << "," << (r.run_seconds > 0 ? completed / r.run_seconds : 0) << ","
          << h.count() << "," << h.percentile(50) << "," << h.percentile(90) << ","
          << h.percentile(99) << "," << h.percentile(99.9) << "," << h.percentile(99.99) << ","
          << h.max() << ",";
      if (have_pm) out << pm.flushes / n << "," << pm.fences / n << ",";
      else out << ",,";
      if (have_pm && pmindex::pm::kCounting)
        out << pm.lines_written / n << "," << pm.media_bytes_read / n << "," << pm.media_bytes_written / n;
      else out << ",,";
      out << "," << (r.dram_bytes < 0 ? std::string() : std::to_string(r.dram_bytes)) << ","
          << (r.pm_bytes < 0 ? std::string() : std::to_string(r.pm_bytes)) << "," << r.load_seconds
          << "," << (r.emulated_pm ? 1 : 0) << "\n";
    };
    for (int k = 0; k < kOpTypes; ++k)
      if (r.ops[k].completed > 0)
        row(op_name(k), r.ops[k].completed, r.ops[k].succeeded, r.ops[k].latency, r.ops[k].pm,
            pmindex::pm::kCounting);
    row("all", r.completed, r.succeeded, r.latency_all, r.pm_total, true);
  }
}

}  // namespace pmbench

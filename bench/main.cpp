// pmbench: a PiBench-compatible benchmark for persistent-memory range indexes.
// Usage: pmbench <built-in name | path/to/tree_api.so> [PiBench flags] [extensions]
// Exit codes: 0 success, 1 a run failed (open error, validation or conformance mismatch,
// out of memory), 2 invalid command line.
#include <dlfcn.h>

#include <cstdio>
#include <exception>
#include <fstream>
#include <iostream>

#include <nlohmann/json.hpp>

#include "config.h"
#include "driver.h"
#include "memprobe.h"
#include "report.h"
#include "pmindex/index.h"
#include "target.h"

namespace {

// --probe_memory: the latency every emulated-PM result stands on (memprobe.h).
int probe_memory(const pmbench::Config& c) {
  const pmbench::MemoryLatency m =
      pmbench::probe_memory_latency(std::size_t{c.probe_mib} << 20);
  if (!m.error.empty()) {
    std::cerr << "pmbench: memory probe: " << m.error << "\n";
    return 1;
  }
  nlohmann::ordered_json j;
  j["memory_latency"] = {{"bytes", m.bytes},        {"hops", m.hops},
                         {"ns_4k_pages", m.ns_4k},  {"ns_huge_pages", m.ns_huge},
                         {"huge_bytes", m.huge_bytes}};
  j["environment"] = pmbench::environment(c, nullptr);
  if (!c.quiet) {
    std::cout << "Memory latency (pointer chase over " << (m.bytes >> 20) << " MiB, " << m.hops
              << " dependent loads):\n  4 KiB pages: " << m.ns_4k << " ns\n  huge pages:  "
              << m.ns_huge << " ns (" << (m.huge_bytes >> 20) << " MiB backed by THP)\n";
  }
  if (!c.json_path.empty()) {
    std::ofstream f(c.json_path);
    f << j.dump(2) << "\n";
    if (!f) {
      std::cerr << "pmbench: cannot write " << c.json_path << "\n";
      return 1;
    }
  }
  return 0;
}

// --list --json FILE: every index with its registry description and design traits (the survey
// report's Table 2 is drawn from this), and the DRAM comparators.
int write_index_list(const std::string& path) {
  nlohmann::json list = nlohmann::json::array();
  for (const pmindex::IndexRegistry::Entry& e : pmindex::IndexRegistry::entries()) {
    const pmindex::IndexTraits& t = e.traits;
    list.push_back({{"name", e.name},
                    {"kind", pmindex::IndexRegistry::built_in(e.name) ? "builtin" : "plugin"},
                    {"description", e.description},
                    {"traits",
                     {{"architecture", t.architecture},
                      {"node_structure", t.node_structure},
                      {"concurrency", t.concurrency},
                      {"variable_keys", t.variable_keys},
                      {"allocator", t.allocator},
                      {"numa", t.numa},
                      {"recovery", t.recovery}}}});
  }
  for (const auto& n : pmbench::dram_comparator_names())
    list.push_back({{"name", n}, {"kind", "dram"}, {"description", "DRAM comparator (one lock)"}});
  std::ofstream f(path);
  f << list.dump(2) << "\n";
  if (!f) {
    std::cerr << "pmbench: cannot write " << path << "\n";
    return 1;
  }
  return 0;
}

// --plugin LIB: a library built against pmindex's headers, not linked with pmindex, that
// registers index kinds (IndexRegistry::add) from its exported entry point. It runs on the
// pmindex inside this binary, which exports its symbols for that. Loaded once, never unloaded.
bool load_plugins(const pmbench::Config& c) {
  for (const std::string& path : c.plugins) {
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      std::cerr << "pmbench: --plugin " << path << ": " << dlerror() << "\n";
      return false;
    }
    auto entry = reinterpret_cast<pmindex::PluginEntryPoint>(dlsym(lib, pmindex::kPluginEntryPoint));
    if (entry == nullptr) {
      std::cerr << "pmbench: --plugin " << path << ": no " << pmindex::kPluginEntryPoint
                << " symbol (see examples/pair_log_plugin.cpp)\n";
      return false;
    }
    if (const pmindex::Status s = entry(); !s.ok()) {
      std::cerr << "pmbench: --plugin " << path << ": " << s.to_string() << "\n";
      return false;
    }
  }
  return true;
}

}  // namespace

int run(int argc, char** argv) {
  pmbench::Config c;
  const int code = pmbench::parse_command_line(argc, argv, &c, std::cout, std::cerr);
  if (code >= 0) return code;
  if (!load_plugins(c)) return 2;
  if (c.list) {
    for (const auto& n : pmindex::IndexRegistry::names())
      std::cout << n << (pmindex::IndexRegistry::built_in(n) ? "\tbuilt-in PM index\n" : "\tplugin PM index\n");
    for (const auto& n : pmbench::dram_comparator_names()) std::cout << n << "\tDRAM comparator\n";
    if (!c.json_path.empty()) return write_index_list(c.json_path);
    return 0;
  }
  if (c.probe_memory) return probe_memory(c);
  std::vector<pmbench::RunResult> runs;
  int status = 0;
  for (unsigned rep = 0; rep < c.repeat; ++rep) {
    pmbench::RunResult r;
    std::string error;
    if (!pmbench::run_once(c, rep, &r, &error)) {
      std::cerr << "pmbench: " << error << "\n";
      return r.usage_error ? 2 : 1;
    }
    runs.push_back(std::move(r));
    if (!runs.back().verify_error.empty()) {
      status = 1;
      break;  // conformance stops at the first mismatch
    }
  }
  const auto doc = pmbench::document(c, runs);
  if (!c.quiet) pmbench::write_human(std::cout, c, runs, doc["environment"]);
  if (!c.json_path.empty()) {
    std::ofstream f(c.json_path);
    f << doc.dump(2) << "\n";
    if (!f) { std::cerr << "pmbench: cannot write " << c.json_path << "\n"; return 1; }
  }
  if (!c.csv_path.empty()) {
    std::ofstream f(c.csv_path);
    pmbench::write_csv(f, c, runs);
    if (!f) { std::cerr << "pmbench: cannot write " << c.csv_path << "\n"; return 1; }
  }
  if (status != 0) std::cerr << "pmbench: conformance FAILED: " << runs.back().verify_error << "\n";
  return status;
}

int main(int argc, char** argv) {
  // Line-buffered even into a pipe or file (std::cout writes through stdio): a run that is
  // killed or times out keeps every line printed so far.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    // Caught, not left to std::terminate, so every scope unwinds (the temporary pool goes).
    std::cerr << "pmbench: " << e.what() << "\n";
    return 1;
  }
}

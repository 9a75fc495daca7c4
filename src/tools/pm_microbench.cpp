// pm_microbench: the substrate micro-benchmark (the README's main job until pmbench lands).
// Measures, side by side in one run, what one persist of a cache line costs in each
// persistence mode, and reflist insert/find throughput per mode, on anonymous DRAM and on a
// /dev/shm pool. Writes a Markdown report. PM is emulated: numbers are DRAM/tmpfs numbers.
#include <chrono>
#include <filesystem>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "pmindex/index.h"

namespace {

using Clock = std::chrono::steady_clock;
using pmindex::pm::Mode;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Row {
  std::string what;
  std::string mode;
  std::string backing;
  double value;
  std::string unit;
};

double persist_ns(Mode mode, std::size_t iters) {
  pmindex::pm::PoolOptions po;
  po.size = 8 << 20;
  po.mode = mode;
  po.layout = {"microbench", 0, pmindex::pm::KeyMode::u64, 0};
  auto pool = pmindex::pm::Pool::create(po);
  if (!pool.ok()) return -1;
  auto* base = (*pool)->at<std::uint64_t>((*pool)->allocator().allocate(1 << 20));
  const auto t = Clock::now();
  for (std::size_t i = 0; i < iters; ++i) {
    std::uint64_t* w = base + (i * 8) % (1 << 17);
    pmindex::pm::store(w, std::uint64_t{i});
    pmindex::pm::persist(w, 8);
  }
  return seconds_since(t) * 1e9 / static_cast<double>(iters);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pm_microbench: substrate micro-benchmark (emulated PM)"};
  std::size_t records = 200000;
  std::string out = "out/microbench.md";
  app.add_option("-n,--records", records, "records per reflist run")->check(CLI::Range(1000, 10000000));
  app.add_option("-o,--output", out, "Markdown report path");
  CLI11_PARSE(app, argc, argv);

  std::vector<Row> rows;
  for (Mode m : {Mode::adr, Mode::eadr, Mode::dram}) {
    rows.push_back({"store + persist (8 B)", std::string(pmindex::pm::to_string(m)), "anonymous",
                    persist_ns(m, 2'000'000), "ns/op"});
  }
  std::vector<std::uint64_t> keys(records);
  std::mt19937_64 rng(1729);
  for (auto& k : keys) k = rng();
  for (const std::string backing : {"anonymous", "tmpfs"}) {
    for (Mode m : {Mode::adr, Mode::eadr, Mode::dram}) {
      pmindex::Options o;
      o.kind = "reflist";
      o.persistence = m;
      o.expected_records = records;
      o.open_mode = pmindex::OpenMode::create;
      o.overwrite = true;
      if (backing == "tmpfs") o.path = "/dev/shm/pmindex/microbench.pool";
      auto idx = pmindex::Index::open(o);
      if (!idx.ok()) {
        std::fprintf(stderr, "%s\n", idx.status().to_string().c_str());
        return 1;
      }
      auto t = Clock::now();
      for (auto k : keys) (void)(*idx)->insert(pmindex::encode_u64(k), pmindex::encode_u64(k));
      const double ins = static_cast<double>(records) / seconds_since(t) / 1e6;
      std::string v;
      t = Clock::now();
      for (auto k : keys) (void)(*idx)->find(pmindex::encode_u64(k), &v);
      const double fnd = static_cast<double>(records) / seconds_since(t) / 1e6;
      const std::string mode(pmindex::pm::to_string(m));
      const std::string b((*idx)->pool().backing() == pmindex::pm::Backing::anonymous ? "anonymous"
                                                                                     : "tmpfs");
      rows.push_back({"reflist insert", mode, b, ins, "Mops/s"});
      rows.push_back({"reflist find", mode, b, fnd, "Mops/s"});
      idx.value().reset();
      if (!o.path.empty()) std::remove(o.path.c_str());
    }
  }

  std::filesystem::create_directories(std::filesystem::path(out).parent_path());
  std::ofstream md(out);
  md << "# pmindex substrate micro-benchmark\n\n"
     << "PM is **emulated** (no Optane on this machine): 'anonymous' is DRAM, 'tmpfs' a file in "
        "/dev/shm. adr mode issues " << pmindex::pm::Runtime::adr_instruction()
     << " + sfence; eadr only sfence; dram nothing. " << records
     << " random 8-byte keys for reflist (the reference index: a sorted list with a DRAM map, "
        "not a performance contender).\n\n| measurement | mode | backing | value | unit |\n|---|---|---|---|---|\n";
  for (const Row& r : rows) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "| %s | %s | %s | %.3f | %s |\n", r.what.c_str(),
                  r.mode.c_str(), r.backing.c_str(), r.value, r.unit.c_str());
    md << buf;
    std::fputs(buf, stdout);
  }
  std::printf("\nreport: %s\n", out.c_str());
  return 0;
}

// apex_tool: APEX measurements that pmbench does not print.
//
//   apex_tool table1 --keys lognormal|longlat|uniform|FILE --records N [--load bulk|insert|half]
//       Node statistics in the style of the APEX paper's Table 1 (average and maximum depth,
//       inner and data node counts, stash ratio, overflow ratio), plus the SMO counts and the
//       PM/DRAM footprint, as one JSON object. FILE is a SOSD binary file (uint64 count, then
//       little-endian keys; doubles with --key_type double).
//         lognormal: ALEX's generator, lognormal(mu 0, sigma 2) samples x 1e9 as u64.
//         longlat:   synthetic stand-in for ALEX's longlat (180 * floor(longitude) + latitude,
//                    doubles) with clustered "coastline" coordinates; use the GSHHG dataset
//                    from bench/datasets.py when it is available.
//   apex_tool warmup --kind apex|lbtree|... --pool FILE --records N [--seconds S]
//       Loads N uniform keys into a pool file, closes it, kill -9s a child that reopened it and
//       was inserting, then reopens and prints the time to the first answered request and a
//       read-throughput series in 10 ms windows (the warm-up curve, paper Fig. 13) as JSON.
#include <CLI/CLI.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dataset.h"
#include "index/apex/apex.h"
#include "pmindex/index.h"

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Keys as 8-byte index keys, sorted and distinct.
std::vector<std::string> make_keys(const std::string& kind, std::size_t n, std::uint64_t seed,
                                   pmindex::KeyType* kt) {
  std::mt19937_64 rng(seed);
  std::vector<std::string> out;
  if (kind == "lognormal" || kind == "uniform") {
    *kt = pmindex::KeyType::u64;
    std::lognormal_distribution<double> ln(0.0, 2.0);
    std::vector<std::uint64_t> v;
    while (v.size() < n) {
      const std::size_t want = n - v.size();
      for (std::size_t i = 0; i < want + want / 8 + 16; ++i) {
        if (kind == "uniform") {
          v.push_back(rng());
        } else {
          const double x = ln(rng) * 1e9;
          if (x < 1.8e19) v.push_back(static_cast<std::uint64_t>(x));
        }
      }
      std::sort(v.begin(), v.end());
      v.erase(std::unique(v.begin(), v.end()), v.end());
      if (v.size() > n) {
        std::shuffle(v.begin(), v.end(), rng);
        v.resize(n);
        std::sort(v.begin(), v.end());
      }
    }
    for (std::uint64_t k : v) out.push_back(pmindex::encode_u64(k));
    return out;
  }
  if (kind == "longlat") {
    *kt = pmindex::KeyType::f64;
    // Clustered coordinates: 64 "coastline" centres, points spread along them.
    std::uniform_real_distribution<double> ulon(-180, 180), ulat(-70, 80);
    std::vector<std::pair<double, double>> centres;
    for (int i = 0; i < 64; ++i) centres.push_back({ulon(rng), ulat(rng)});
    std::normal_distribution<double> spread(0.0, 3.0);
    std::vector<double> v;
    while (v.size() < n) {
      for (std::size_t i = v.size(); i < n + 16; ++i) {
        const auto& c = centres[rng() % centres.size()];
        const double lon = std::clamp(c.first + spread(rng), -180.0, 179.999999);
        const double lat = std::clamp(c.second + spread(rng) / 2, -90.0, 90.0);
        v.push_back(180.0 * std::floor(lon) + lat);
      }
      std::sort(v.begin(), v.end());
      v.erase(std::unique(v.begin(), v.end()), v.end());
      if (v.size() > n) {
        std::shuffle(v.begin(), v.end(), rng);
        v.resize(n);
        std::sort(v.begin(), v.end());
      }
    }
    for (double d : v) out.push_back(pmindex::encode_f64(d));
    return out;
  }
  // SOSD file, read by pmbench's loader: the header count is checked against the file size
  // before anything is allocated (a corrupt count is refused with a message naming the file);
  // the distinct keys come back shuffled with the seed, so the first n are a uniform sample.
  std::string error;
  const auto file = pmbench::load_sosd(kind, seed, &error);
  if (file == nullptr) throw std::runtime_error(error);
  std::vector<std::string> keys;
  for (std::uint64_t i = 0; i < std::min<std::uint64_t>(n, file->keys.size()); ++i) {
    const std::uint64_t w = file->keys[i];
    if (*kt == pmindex::KeyType::f64) {
      double d = 0;
      std::memcpy(&d, &w, 8);
      if (!std::isnan(d)) keys.push_back(pmindex::encode_f64(d));
    } else {
      keys.push_back(pmindex::encode_u64(w));
    }
  }
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  return keys;
}

int table1(const std::string& keys_kind, std::size_t n, const std::string& load,
           std::uint32_t node_size, bool f64_file, std::uint64_t seed) {
  pmindex::KeyType kt = f64_file ? pmindex::KeyType::f64 : pmindex::KeyType::u64;
  const std::vector<std::string> keys = make_keys(keys_kind, n, seed, &kt);
  pmindex::Options o;
  o.kind = "apex";
  o.key_type = kt;
  o.node_size = node_size;
  o.expected_records = keys.size();
  o.pool_size = std::max<std::size_t>(std::size_t{256} << 20, keys.size() * 64);
  auto r = pmindex::Index::open(o);
  if (!r.ok()) {
    std::cerr << r.status().to_string() << "\n";
    return 1;
  }
  auto idx = std::move(r).value();
  const std::string val(8, '\x01');
  const auto t0 = Clock::now();
  std::size_t bulk = load == "bulk" ? keys.size() : load == "half" ? keys.size() / 2 : 0;
  std::vector<std::string> loaded, rest;
  if (load == "half") {
    // Every other key bulk-loaded, the rest inserted in random order (APEX's setup).
    for (std::size_t i = 0; i < keys.size(); ++i) (i % 2 == 0 ? loaded : rest).push_back(keys[i]);
  } else if (bulk != 0) {
    loaded = keys;
  } else {
    rest = keys;
  }
  if (!loaded.empty()) {
    std::vector<pmindex::KeyValue> kv;
    for (const auto& k : loaded) kv.push_back({k, val});
    if (auto s = idx->bulk_load(kv, 1.0); !s.ok()) {
      std::cerr << s.to_string() << "\n";
      return 1;
    }
  }
  std::shuffle(rest.begin(), rest.end(), std::mt19937_64(seed + 1));
  for (const auto& k : rest) {
    if (idx->insert(k, val) != pmindex::Code::ok) {
      std::cerr << "insert failed\n";
      return 1;
    }
  }
  const double load_s = since(t0);
  const auto st = dynamic_cast<pmindex::apex::Apex&>(*idx).stats();
  const auto fp = idx->footprint();
  std::printf(
      "{\"keys\":\"%s\",\"records\":%zu,\"load\":\"%s\",\"node_size\":%u,\"load_seconds\":%.3f,"
      "\"avg_depth\":%.3f,\"max_depth\":%u,\"inner_nodes\":%llu,\"data_nodes\":%llu,"
      "\"stash_ratio\":%.4f,\"overflow_ratio\":%.4f,\"ext_blocks\":%llu,"
      "\"expansions\":%llu,\"sideways_splits\":%llu,\"downward_splits\":%llu,"
      "\"inner_expansions\":%llu,\"inner_bytes\":%llu,\"data_bytes\":%llu,\"pm_bytes\":%llu,"
      "\"dram_bytes\":%llu}\n",
      keys_kind.c_str(), keys.size(), load.c_str(), node_size, load_s, st.avg_depth,
      st.max_depth, static_cast<unsigned long long>(st.inner_nodes),
      static_cast<unsigned long long>(st.data_nodes), st.avg_stash_ratio, st.overflow_ratio,
      static_cast<unsigned long long>(st.ext_blocks),
      static_cast<unsigned long long>(st.expansions),
      static_cast<unsigned long long>(st.sideways_splits),
      static_cast<unsigned long long>(st.downward_splits),
      static_cast<unsigned long long>(st.inner_expansions),
      static_cast<unsigned long long>(st.inner_bytes), static_cast<unsigned long long>(st.data_bytes),
      static_cast<unsigned long long>(fp.pm_bytes), static_cast<unsigned long long>(fp.dram_bytes));
  return 0;
}

int warmup(const std::string& kind, const std::string& path, std::size_t n, double seconds,
           std::uint64_t seed) {
  pmindex::KeyType kt = pmindex::KeyType::u64;
  const std::vector<std::string> keys = make_keys("uniform", n, seed, &kt);
  pmindex::Options o;
  o.kind = kind;
  o.path = path;
  o.overwrite = true;
  o.expected_records = n * 2;
  o.pool_size = std::max<std::size_t>(std::size_t{512} << 20, n * 160);
  const std::string val(8, '\x02');
  {
    auto r = pmindex::Index::open(o);
    if (!r.ok()) {
      std::cerr << r.status().to_string() << "\n";
      return 1;
    }
    auto idx = std::move(r).value();
    std::vector<pmindex::KeyValue> kv;
    for (const auto& k : keys) kv.push_back({k, val});
    if (auto s = idx->bulk_load(kv, 0.7); !s.ok()) {
      // No bulk load: insert in random order.
      std::vector<std::string> shuffled = keys;
      std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937_64(seed));
      for (const auto& k : shuffled) (void)idx->insert(k, val);
    }
    if (auto s = idx->close(); !s.ok()) {
      std::cerr << s.to_string() << "\n";
      return 1;
    }
  }
  o.overwrite = false;
  // A child reopens the pool and inserts until SIGKILL.
  int pipefd[2];
  if (::pipe(pipefd) != 0) return 1;
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(pipefd[0]);
    auto r = pmindex::Index::open(o);
    if (!r.ok()) ::_exit(3);
    auto idx = std::move(r).value();
    std::mt19937_64 rng(seed + 7);
    for (std::uint64_t j = 0;; ++j) {
      (void)idx->insert(pmindex::encode_u64(rng()), val);
      if (j == 1000) {
        char x = 1;
        (void)!::write(pipefd[1], &x, 1);
      }
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
  if (!started) {
    std::cerr << "the child could not open the pool\n";
    return 1;
  }
  std::vector<std::string> probe;
  std::mt19937_64 rng(seed + 3);
  for (int i = 0; i < 1 << 16; ++i) probe.push_back(keys[rng() % keys.size()]);
  const auto t0 = Clock::now();
  auto r = pmindex::Index::open(o);
  const double reopen = since(t0);
  if (!r.ok()) {
    std::cerr << r.status().to_string() << "\n";
    return 1;
  }
  auto idx = std::move(r).value();
  std::string v;
  const bool found = idx->find(probe[0], &v) == pmindex::Code::ok;
  const double answer = since(t0);
  std::printf("{\"kind\":\"%s\",\"records\":%zu,\"reopen_seconds\":%.6f,\"answer_seconds\":%.6f,"
              "\"first_found\":%s,\"series\":[",
              kind.c_str(), keys.size(), reopen, answer, found ? "true" : "false");
  std::size_t next = 0;
  bool first = true;
  while (since(t0) < seconds) {
    const double start = since(t0);
    const auto w0 = Clock::now();
    std::uint64_t ops = 0;
    while (since(w0) < 0.01) {
      for (int j = 0; j < 64; ++j, ++ops) (void)idx->find(probe[next++ % probe.size()], &v);
    }
    std::printf("%s[%.3f,%.0f]", first ? "" : ",", start, ops / since(w0));
    first = false;
  }
  std::printf("]}\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"APEX measurements: Table 1 node statistics, recovery warm-up curve"};
  app.require_subcommand(1);
  std::string keys = "lognormal", load = "bulk", kind = "apex", pool;
  std::size_t records = 1'000'000;
  std::uint32_t node_size = 0;
  double seconds = 2.0;
  std::uint64_t seed = 42;
  bool f64 = false;
  auto* t1 = app.add_subcommand("table1", "node statistics (paper Table 1)");
  t1->add_option("--keys", keys, "lognormal, longlat, uniform or a SOSD file");
  t1->add_option("--records", records);
  t1->add_option("--load", load, "bulk, insert or half (bulk every other key, insert the rest)");
  t1->add_option("--node_size", node_size, "maximum data node bytes (0: 256 KiB)");
  t1->add_flag("--f64", f64, "a SOSD file of doubles");
  t1->add_option("--seed", seed);
  auto* wu = app.add_subcommand("warmup", "time to first request after kill -9, warm-up curve");
  wu->add_option("--kind", kind);
  wu->add_option("--pool", pool)->required();
  wu->add_option("--records", records);
  wu->add_option("--seconds", seconds);
  wu->add_option("--seed", seed);
  CLI11_PARSE(app, argc, argv);
  try {
    if (t1->parsed()) return table1(keys, records, load, node_size, f64, seed);
    return warmup(kind, pool, records, seconds, seed);
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}

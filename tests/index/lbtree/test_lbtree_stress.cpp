// Two-thread stress of mixed insert/delete/update/lookup/scan against per-thread oracles.
// Each thread owns the keys k with k % 2 == its id, so both threads share every leaf (splits,
// leaf removal and inner-node SMOs race) while each thread can check its own keys exactly.
// Time-boxed by PMINDEX_STRESS_SECONDS (default 2), split over node sizes 256 B and 1 KiB.
// Run under TSan (cmake --preset tsan) for the race check.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <random>
#include <thread>

#include "pmindex/index.h"

namespace pmindex {
namespace {

double stress_seconds() {
  const char* s = std::getenv("PMINDEX_STRESS_SECONDS");
  return s != nullptr ? std::max(0.1, std::atof(s)) : 2.0;
}

void run_stress(std::uint32_t node_size, double seconds) {
  Options o;
  o.kind = "lbtree";
  o.pool_size = 64 << 20;
  o.node_size = node_size;
  auto r = Index::open(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::unique_ptr<Index> idx = std::move(r).value();
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(seconds));
  std::map<std::string, std::string> oracles[2];
  std::atomic<int> failures{0};
  std::atomic<std::uint64_t> ops{0};
  auto worker = [&](int id) {
    auto scope = idx->attach_thread();
    std::map<std::string, std::string>& mine = oracles[id];
    std::mt19937_64 rng(1234 + id);
    std::string got;
    ScanBuffer buf;
    auto fail = [&](const char* what, std::uint64_t k) {
      if (failures.fetch_add(1) < 10) ADD_FAILURE() << "thread " << id << ": " << what << " key " << k;
    };
    std::uint64_t n = 0;
    // Grow for a while, then keep the size roughly stable (removes catch up with inserts).
    while ((n & 255) != 0 || std::chrono::steady_clock::now() < deadline) {
      ++n;
      const std::uint64_t kn = (rng() % 4000) * 2 + static_cast<std::uint64_t>(id);
      const std::string k = encode_u64(kn);
      const std::string v = encode_u64(rng() | (std::uint64_t{1} << 63));
      switch (rng() % 6) {
        case 0:
        case 1: {
          const bool fresh = mine.emplace(k, v).second;
          if (idx->insert(k, v) != (fresh ? Code::ok : Code::already_present)) fail("insert", kn);
          break;
        }
        case 2: {
          auto it = mine.find(k);
          if (idx->update(k, v) != (it == mine.end() ? Code::not_found : Code::ok)) fail("update", kn);
          if (it != mine.end()) it->second = v;
          break;
        }
        case 3:
          if (idx->remove(k) != (mine.erase(k) ? Code::ok : Code::not_found)) fail("remove", kn);
          break;
        case 4: {
          auto it = mine.find(k);
          const Code c = idx->find(k, &got);
          if (c != (it == mine.end() ? Code::not_found : Code::ok) ||
              (it != mine.end() && got != it->second))
            fail("find", kn);
          (void)idx->find(encode_u64(kn ^ 1), &got);  // the other thread's key: just race
          break;
        }
        case 5: {
          idx->scan(k, 30, buf);
          // Sorted, and my keys in the scanned range are exactly my oracle's.
          auto it = mine.lower_bound(k);
          for (std::size_t j = 0; j < buf.size(); ++j) {
            if (j > 0 && !(buf.key(j - 1) < buf.key(j))) fail("scan order", kn);
            if (decode_u64(buf.key(j)) % 2 != static_cast<std::uint64_t>(id)) continue;
            if (it == mine.end() || it->first != buf.key(j) || it->second != buf.value(j)) {
              fail("scan content", kn);
              break;
            }
            ++it;
          }
          if (buf.size() == 30 && it != mine.end() && it->first < buf.key(29)) fail("scan missed", kn);
          if (buf.size() < 30 && it != mine.end()) fail("scan ended early", kn);
          break;
        }
      }
    }
    ops.fetch_add(n);
  };
  std::thread a(worker, 0), b(worker, 1);
  a.join();
  b.join();
  EXPECT_EQ(failures.load(), 0);
  const Status s = idx->verify();
  ASSERT_TRUE(s.ok()) << s.to_string();
  std::map<std::string, std::string> all = oracles[0];
  all.insert(oracles[1].begin(), oracles[1].end());
  ScanBuffer buf;
  ASSERT_EQ(idx->scan(std::string(), all.size() + 1, buf), all.size());
  std::size_t i = 0;
  for (const auto& [k, v] : all) {
    ASSERT_EQ(buf.key(i), k);
    ASSERT_EQ(buf.value(i), v);
    ++i;
  }
  std::printf("node %u B: %llu operations, %zu keys at the end\n", node_size,
              static_cast<unsigned long long>(ops.load()), all.size());
}

TEST(LBTreeStress, TwoThreadsAgainstOracle) {
  const double t = stress_seconds();
  run_stress(256, t / 2);
  run_stress(1024, t / 2);
}

}  // namespace
}  // namespace pmindex

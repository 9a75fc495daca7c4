// Two threads against per-thread oracles (disjoint key sets), with cross-thread finds (values
// name their key, hybrid_stress.h's keyed_value: a torn or foreign value fails) and scans, on
// a small node size so SMOs race with lookups. Duration: PMINDEX_STRESS_SECONDS (default 2).
// Run under TSan by the `stress` CI job.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "index/apex/apex.h"
#include "index/common/hybrid_stress.h"
#include "pmindex/index.h"

namespace pmindex {
namespace {

std::string val(std::uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }

double stress_seconds() {
  const char* s = std::getenv("PMINDEX_STRESS_SECONDS");
  return s != nullptr ? std::atof(s) : 2.0;
}

// Small nodes: SMOs all the time. 16 KiB nodes: several 256-record locks per node, so the
// two threads write under different locks of one node and race on the stash bitmap.
class ApexStress : public ::testing::TestWithParam<std::uint32_t> {};

using Oracle = std::map<std::string, std::string>;
using Deadline = std::chrono::steady_clock::time_point;

// Phase 1, one thread: random insert / update / remove / find / scan until the deadline or a
// failure of either thread. Thread t owns keys with low bit t; half dense (SMO-heavy), half
// spread out. Its own keys' answers are exact (against `mine`); scans must ascend.
void mixed_worker(Index& idx, int t, Deadline deadline, std::atomic<bool>& failed,
                  Oracle& mine) {
  auto scope = idx.attach_thread();
  std::mt19937_64 rng(100 + t);
  std::string got;
  ScanBuffer buf;
  std::uint64_t ops = 0;
  while (!failed.load(std::memory_order_relaxed) &&
         (ops++ % 64 != 0 || std::chrono::steady_clock::now() < deadline)) {
    std::uint64_t k = (rng() % 2 == 0) ? rng() % 20000 : rng();
    k = (k & ~std::uint64_t{1}) | static_cast<std::uint64_t>(t);
    const std::string key = encode_u64(k), v = hybrid_test::keyed_value(k, rng());
    bool ok = true;
    switch (rng() % 6) {
      case 0: case 1: {
        const bool fresh = mine.emplace(key, v).second;
        ok = idx.insert(key, v) == (fresh ? Code::ok : Code::already_present);
        break;
      }
      case 2: {
        auto it = mine.find(key);
        ok = idx.update(key, v) == (it == mine.end() ? Code::not_found : Code::ok);
        if (it != mine.end()) it->second = v;
        break;
      }
      case 3:
        ok = idx.remove(key) == (mine.erase(key) ? Code::ok : Code::not_found);
        break;
      case 4: {
        auto it = mine.find(key);
        const Code c = idx.find(key, &got);
        ok = it == mine.end() ? c == Code::not_found : (c == Code::ok && got == it->second);
        // The other thread's key: absent, or a whole value written for it (not torn).
        const Code other = idx.find(encode_u64(k ^ 1), &got);
        ok = ok && (other == Code::not_found ||
                    (other == Code::ok && hybrid_test::is_keyed_value(k ^ 1, got)));
        break;
      }
      default: {
        const std::size_t n = idx.scan(key, 20, buf);
        for (std::size_t j = 1; j < n; ++j) ok = ok && buf.key(j - 1) < buf.key(j);
      }
    }
    if (!ok) failed.store(true, std::memory_order_relaxed);
  }
}

// Phase 2, one thread: removes all its keys (each then not found), with a scan every 8
// removes that must ascend.
void drain_worker(Index& idx, const Oracle& mine, std::atomic<bool>& failed) {
  auto scope = idx.attach_thread();
  std::string v;
  ScanBuffer buf;
  std::size_t i = 0;
  for (const auto& [k, _] : mine) {
    if (idx.remove(k) != Code::ok) failed.store(true, std::memory_order_relaxed);
    if (idx.find(k, &v) != Code::not_found) failed.store(true, std::memory_order_relaxed);
    if (++i % 8 == 0) {
      const std::size_t n = idx.scan(k, 10, buf);
      for (std::size_t j = 1; j < n; ++j)
        if (!(buf.key(j - 1) < buf.key(j))) failed.store(true, std::memory_order_relaxed);
    }
  }
}

// Runs body(0) and body(1) on two threads and waits for both.
template <class Body>
void on_two_threads(Body body) {
  std::thread a(body, 0), b(body, 1);
  a.join();
  b.join();
}

TEST_P(ApexStress, TwoThreadsAgainstOracles) {
  Options o;
  o.kind = "apex";
  o.pool_size = 256 << 20;
  o.node_size = GetParam();
  auto r = Index::open(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::unique_ptr<Index> idx = std::move(r).value();
  const Deadline deadline = std::chrono::steady_clock::now() +
                            std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                std::chrono::duration<double>(stress_seconds()));
  std::atomic<bool> failed{false};
  Oracle oracle[2];
  on_two_threads([&](int t) { mixed_worker(*idx, t, deadline, failed, oracle[t]); });
  ASSERT_FALSE(failed.load());
  const Status s = idx->verify();
  ASSERT_TRUE(s.ok()) << s.to_string();
  std::string got;
  for (const auto& m : oracle) {
    for (const auto& [k, v] : m) {
      ASSERT_EQ(idx->find(k, &got), Code::ok);
      ASSERT_EQ(got, v);
    }
  }
  // Phase 2: both threads delete all their keys (merges, collapses of emptied inner nodes and
  // contractions race with each other and with the other thread's lookups and scans).
  on_two_threads([&](int t) { drain_worker(*idx, oracle[t], failed); });
  ASSERT_FALSE(failed.load());
  const Status s2 = idx->verify();
  ASSERT_TRUE(s2.ok()) << s2.to_string();
  ScanBuffer buf;
  EXPECT_EQ(idx->scan(encode_u64(0), 10, buf), 0u);
  const apex::Apex::Stats st = dynamic_cast<apex::Apex&>(*idx).stats();
  std::cout << "[ info     ] SMOs: " << st.expansions << " expansions, " << st.sideways_splits
            << " sideways, " << st.downward_splits << " downward, " << st.inner_expansions
            << " inner expansions, " << st.merges << " merges (" << st.collapses
            << " collapses), " << st.contractions << " contractions\n";
  EXPECT_GT(st.expansions + st.sideways_splits + st.downward_splits, 0u);
  EXPECT_GT(st.merges + st.contractions, 0u);
}

INSTANTIATE_TEST_SUITE_P(NodeSizes, ApexStress, ::testing::Values(2048u, 16384u));

// Issue 19's collapse under concurrency: keys in dense clusters far apart (each cluster makes
// the root's model route it to one slot, so its node splits downward: inner nodes of their
// own), then two threads remove interleaved keys while a third finds and scans. Emptied inner
// nodes collapse while the other remover merges their neighbours and readers descend
// through them; every remove ok, verify() clean, and collapses ran.
TEST(ApexStressCollapse, TwoThreadsEmptyInnerNodes) {
  Options o;
  o.kind = "apex";
  o.pool_size = 64 << 20;
  o.node_size = 1024;
  auto r = Index::open(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::unique_ptr<Index> idx = std::move(r).value();
  std::vector<std::uint64_t> keys;
  for (std::uint64_t c = 1; c <= 8; ++c)
    for (std::uint64_t i = 0; i < 600; ++i) keys.push_back((c << 58) + i * 7);
  for (std::uint64_t k : keys) ASSERT_EQ(idx->insert(encode_u64(k), val(k)), Code::ok);
  std::atomic<bool> failed{false}, done{false};
  auto drain = [&](std::size_t t) {
    auto scope = idx->attach_thread();
    for (std::size_t i = t; i < keys.size(); i += 2)
      if (idx->remove(encode_u64(keys[i])) != Code::ok) failed.store(true, std::memory_order_relaxed);
  };
  auto read = [&] {
    auto scope = idx->attach_thread();
    std::string v;
    ScanBuffer buf;
    for (std::size_t i = 0; !done.load(std::memory_order_relaxed); i = (i + 97) % keys.size()) {
      const Code c = idx->find(encode_u64(keys[i]), &v);
      if (c != Code::ok && c != Code::not_found) failed.store(true, std::memory_order_relaxed);
      if (c == Code::ok && v != val(keys[i])) failed.store(true, std::memory_order_relaxed);
      const std::size_t n = idx->scan(encode_u64(keys[i]), 10, buf);
      for (std::size_t j = 1; j < n; ++j)
        if (!(buf.key(j - 1) < buf.key(j))) failed.store(true, std::memory_order_relaxed);
    }
  };
  std::thread reader(read), a(drain, 0), b(drain, 1);
  a.join();
  b.join();
  done.store(true, std::memory_order_relaxed);
  reader.join();
  ASSERT_FALSE(failed.load());
  const Status s = idx->verify();
  ASSERT_TRUE(s.ok()) << s.to_string();
  const apex::Apex::Stats st = dynamic_cast<apex::Apex&>(*idx).stats();
  std::cout << "[ info     ] " << st.merges << " merges (" << st.collapses << " collapses), "
            << st.inner_nodes << " inner nodes left\n";
  EXPECT_GT(st.collapses, 0u);
}

}  // namespace
}  // namespace pmindex

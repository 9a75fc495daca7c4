// Two-thread stress of the substrate (run under TSan by the test command): the allocator's
// thread caches and central lists, and the reference index's operations, against oracles.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <thread>

#include "pmindex/index.h"
#include "pmindex/pm/pool.h"

namespace pmindex {
namespace {

double stress_seconds() {
  const char* s = std::getenv("PMINDEX_STRESS_SECONDS");
  return s != nullptr ? std::atof(s) : 2.0;
}

template <class F>
void run_for(double seconds, F&& step) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    for (int i = 0; i < 256; ++i) step();
  }
}

TEST(Stress, AllocatorNeverHandsOutABlockTwice) {
  pm::PoolOptions po;
  po.size = 32 << 20;
  po.layout = {"stress", 0, pm::KeyMode::u64, 0};
  auto pool = pm::Pool::create(po);
  ASSERT_TRUE(pool.ok());
  pm::Pool& p = **pool;
  std::atomic<bool> failed{false};
  auto worker = [&](std::uint64_t tag) {
    std::mt19937_64 rng(tag);
    std::vector<std::pair<std::uint64_t, std::size_t>> mine;
    run_for(stress_seconds(), [&] {
      if (mine.size() < 500 && (mine.empty() || rng() % 3 != 0)) {
        const std::size_t size = 64 * (1 + rng() % 40);
        const std::uint64_t off = p.allocator().allocate(size);
        if (off == 0) return;
        // Stamp every word: another owner of the same bytes would overwrite the stamp.
        auto* w = p.at<std::uint64_t>(off);
        for (std::size_t i = 0; i < size / 8; ++i) w[i] = tag ^ off;
        mine.emplace_back(off, size);
      } else {
        const std::size_t i = rng() % mine.size();
        const auto [off, size] = mine[i];
        const auto* w = p.at<std::uint64_t>(off);
        for (std::size_t j = 0; j < size / 8; ++j)
          if (w[j] != (tag ^ off)) failed.store(true, std::memory_order_relaxed);
        p.allocator().deallocate(off, size);
        mine[i] = mine.back();
        mine.pop_back();
      }
    });
    for (auto [off, size] : mine) p.allocator().deallocate(off, size);
  };
  std::thread a(worker, 0x1111), b(worker, 0x2222);
  a.join();
  b.join();
  EXPECT_FALSE(failed.load()) << "a block was owned by two threads at once";
  EXPECT_EQ(p.allocator().stats().bytes_in_use, 0u);
}

// The 16/32 B classes and the reclaim pass under two threads: mostly small blocks, a pool small
// enough that allocations keep running out and trigger reclaim passes while the other thread
// allocates and frees. Each block is stamped with its own allocation number.
TEST(Stress, AllocatorSmallClassesAndReclaimNeverHandOutABlockTwice) {
  pm::PoolOptions po;
  po.size = 512 << 10;
  po.layout = {"stress", 0, pm::KeyMode::u64, 0};
  auto pool = pm::Pool::create(po);
  ASSERT_TRUE(pool.ok());
  pm::Pool& p = **pool;
  std::atomic<bool> failed{false};
  std::atomic<std::uint64_t> full{0};
  auto worker = [&](std::uint64_t tag) {
    std::mt19937_64 rng(tag);
    struct Held {
      std::uint64_t off;
      std::size_t size;
      unsigned char stamp;
    };
    std::vector<Held> mine;
    std::uint64_t seq = tag;
    run_for(stress_seconds(), [&] {
      if (mine.size() < 400 && (mine.empty() || rng() % 3 != 0)) {
        const std::size_t size = rng() % 4 != 0 ? 1 + rng() % 32 : 33 + rng() % 4064;
        const std::uint64_t off = p.allocator().allocate(size);
        if (off == 0) {
          full.fetch_add(1, std::memory_order_relaxed);
          return;
        }
        const auto stamp = static_cast<unsigned char>(++seq * 2 + tag % 2);
        std::memset(p.at<unsigned char>(off), stamp, size);
        mine.push_back({off, size, stamp});
      } else {
        const std::size_t i = rng() % mine.size();
        const Held h = mine[i];
        const auto* b = p.at<const unsigned char>(h.off);
        for (std::size_t j = 0; j < h.size; ++j)
          if (b[j] != h.stamp) failed.store(true, std::memory_order_relaxed);
        p.allocator().deallocate(h.off, h.size);
        mine[i] = mine.back();
        mine.pop_back();
      }
    });
    for (const Held& h : mine) p.allocator().deallocate(h.off, h.size);
  };
  std::thread a(worker, 0x1111), b(worker, 0x2222);
  a.join();
  b.join();
  EXPECT_FALSE(failed.load()) << "a block was owned by two owners at once";
  EXPECT_GT(full.load(), 0u) << "the pool never ran out: no reclaim pass was exercised";
  EXPECT_EQ(p.allocator().stats().bytes_in_use, 0u);
}

TEST(Stress, ReferenceIndexTwoThreadsAgainstOracles) {
  Options o;
  o.pool_size = 64 << 20;
  auto idx = Index::open(o);
  ASSERT_TRUE(idx.ok());
  Index& ix = **idx;
  std::atomic<bool> failed{false};
  auto worker = [&](std::uint64_t tid) {
    std::mt19937_64 rng(tid);
    std::map<std::uint64_t, std::uint64_t> oracle;  // this thread's keys: k % 2 == tid
    std::string v;
    ScanBuffer buf;
    run_for(stress_seconds(), [&] {
      const std::uint64_t k = (rng() % 2000) * 2 + tid;
      const std::uint64_t val = rng();
      switch (rng() % 4) {
        case 0:
          if ((ix.insert(encode_u64(k), encode_u64(val)) == Code::ok) != oracle.emplace(k, val).second)
            failed = true;
          break;
        case 1:
          if ((ix.remove(encode_u64(k)) == Code::ok) != (oracle.erase(k) == 1)) failed = true;
          break;
        case 2: {
          auto it = oracle.find(k);
          const Code c = ix.find(encode_u64(k), &v);
          if ((c == Code::ok) != (it != oracle.end())) failed = true;
          if (c == Code::ok && it != oracle.end() && decode_u64(v) != it->second) failed = true;
          break;
        }
        case 3:
          ix.scan(encode_u64(k), 10, buf);  // other thread's keys interleave: just must not crash
          for (std::size_t i = 1; i < buf.size(); ++i)
            if (!(buf.key(i - 1) < buf.key(i))) failed = true;
          break;
      }
    });
  };
  std::thread a(worker, 0), b(worker, 1);
  a.join();
  b.join();
  EXPECT_FALSE(failed.load());
  EXPECT_TRUE(ix.verify().ok());
}

}  // namespace
}  // namespace pmindex

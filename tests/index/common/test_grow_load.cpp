// The load of issue 19's "Must prove": N random u64 keys inserted one by one into every index,
// in a file pool that starts at the default initial size (64 MiB) and grows, with the default
// maximum for expected_records = N. Reports, per kind, the file's final size, the heap touched
// (high-water mark) and carved (allocator bytes_reserved), the bytes in live blocks and their
// ratios. Unit run: N = 200,000 (CI, prints only). Long run (test_grow_load_long):
// N = PMINDEX_GROW_RECORDS = 100,000,000, one kind at a time with --gtest_filter, and checks
// carved / live <= 1.3 (issue 19) and that the file grew past its initial size:
//
//   cmake --build --preset release --target test_grow_load
//   PMINDEX_GROW_RECORDS=100000000 build/release/tests/test_grow_load --gtest_filter='*/apex'
#include <sys/stat.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "pmindex/index.h"
#include "pmindex/pm/pool.h"
#include "support/temp_dir.h"

namespace pmindex {
namespace {

using pmindex::testing::TempDir;

std::uint64_t records() {
  const char* env = std::getenv("PMINDEX_GROW_RECORDS");
  return env != nullptr ? std::strtoull(env, nullptr, 10) : 200'000;
}

std::uint64_t mix(std::uint64_t x) {  // splitmix64: distinct inputs give distinct outputs
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

double mib(std::uint64_t b) { return static_cast<double>(b) / (1u << 20); }

class GrowLoad : public ::testing::TestWithParam<std::string> {};

TEST_P(GrowLoad, RandomInsertsIntoAGrowingPool) {
  const std::uint64_t n = records();
  TempDir dir;
  const std::string path = dir.file("load.pool");
  Options o;
  o.kind = GetParam();
  o.path = path;
  o.expected_records = n;
  o.open_mode = OpenMode::create;
  auto opened = Index::open(o);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  Index& idx = **opened;
  const auto start = std::chrono::steady_clock::now();
  for (std::uint64_t i = 0; i < n; ++i) {
    const Code c = idx.insert(encode_u64(mix(i)), encode_u64(i));
    ASSERT_EQ(c, Code::ok) << "insert " << i << " of " << n;
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const pm::Pool& pool = idx.pool();
  const std::uint64_t touched = pool.heap_high_water() - pool.heap_begin();
  const Footprint fp = idx.footprint();
  struct stat st{};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  const auto file = static_cast<std::uint64_t>(st.st_size);
  std::printf("[grow-load] %s: %llu records in %.0f s; file %.0f MiB of max %.0f MiB; "
              "heap touched %.1f MiB, carved %.1f MiB, live %.1f MiB; touched/live %.2f, "
              "carved/live %.2f\n",
              o.kind.c_str(), static_cast<unsigned long long>(n), secs, mib(file),
              mib(pool.size()), mib(touched), mib(fp.pm_reserved), mib(fp.pm_bytes),
              static_cast<double>(touched) / static_cast<double>(fp.pm_bytes),
              static_cast<double>(fp.pm_reserved) / static_cast<double>(fp.pm_bytes));
  // Where carved-but-free bytes sit: the classes holding free blocks in the central lists.
  for (const pm::SizeClassStats& c : pool.allocator().stats().classes) {
    if (c.blocks_free == 0) continue;
    std::printf("[grow-load]   class %zu B: %llu in use, %llu free (%.1f MiB)\n", c.block_size,
                static_cast<unsigned long long>(c.blocks_in_use),
                static_cast<unsigned long long>(c.blocks_free),
                mib(c.blocks_free * c.block_size));
  }
  EXPECT_LE(file, pool.size());
  EXPECT_LE(pool.heap_high_water(), file);
  if (n >= 10'000'000) {
    EXPECT_GT(file, pm::kDefaultInitialPoolSize) << "the pool never grew";
    EXPECT_LE(static_cast<double>(fp.pm_reserved), 1.3 * static_cast<double>(fp.pm_bytes));
  }
  // Spot check, then drop the pool without a clean close (the directory goes anyway).
  std::string got;
  for (std::uint64_t i = 0; i < n; i += n / 1000 + 1) {
    ASSERT_EQ(idx.find(encode_u64(mix(i)), &got), Code::ok) << i;
    ASSERT_EQ(got, encode_u64(i));
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, GrowLoad,
                         ::testing::Values("reflist", "lbtree", "fptree", "nbtree", "apex",
                                           "utree", "part"),
                         [](const auto& p) { return p.param; });
INSTANTIATE_TEST_SUITE_P(Survey, GrowLoad, ::testing::Values("pactree", "dptree", "roart"),
                         [](const auto& p) { return p.param; });

}  // namespace
}  // namespace pmindex

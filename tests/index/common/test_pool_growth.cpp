// Growable pools (issue 19 item 4), for every index kind: a pool whose file starts at 64 KiB
// grows under inserts to its 8 MiB maximum (128x), answers pool_full there and stays correct;
// the grown pool reopens with every record; a file extended by a crash mid-extension (longer
// than the high-water mark, not a whole chunk) recovers; a grown pool cut below its high-water
// mark is refused. Label: unit (1-10 s per kind under ASan on the loaded 2-core VM).
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "pmindex/index.h"
#include "pmindex/pm/pool.h"
#include "support/temp_dir.h"

namespace pmindex {
namespace {

using pmindex::testing::TempDir;

constexpr std::size_t kMax = std::size_t{8} << 20;

std::uint64_t mix(std::uint64_t x) {  // splitmix64: distinct inputs give distinct outputs
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

Options grow_options(const std::string& kind, const std::string& path) {
  Options o;
  o.kind = kind;
  o.path = path;
  o.pool_size = kMax;
  o.initial_pool_size = pm::kMinPoolSize;
  o.open_mode = OpenMode::create;
  return o;
}

std::size_t file_size(const std::string& path) {
  struct stat st{};
  return stat(path.c_str(), &st) == 0 ? static_cast<std::size_t>(st.st_size) : 0;
}

void expect_contents(Index& idx, const std::map<std::string, std::string>& want) {
  ASSERT_TRUE(idx.verify().ok()) << idx.verify().to_string();
  std::string got;
  for (const auto& [k, v] : want) {
    ASSERT_EQ(idx.find(k, &got), Code::ok) << "key " << pmindex::decode_u64(k);
    ASSERT_EQ(got, v);
  }
}

class PoolGrowth : public ::testing::TestWithParam<std::string> {};

TEST_P(PoolGrowth, GrowsToTheMaximumUnderInsertsAndReopens) {
  TempDir dir;
  const std::string path = dir.file("grow.pool");
  std::map<std::string, std::string> acked;
  {
    auto opened = Index::open(grow_options(GetParam(), path));
    ASSERT_TRUE(opened.ok()) << opened.status().to_string();
    EXPECT_EQ(file_size(path), pm::kMinPoolSize);
    Code code = Code::ok;
    for (std::uint64_t i = 0; i < 4'000'000; ++i) {
      const std::string k = encode_u64(mix(i)), v = encode_u64(i);
      code = (*opened)->insert(k, v);
      if (code != Code::ok) break;
      acked.emplace(k, v);
    }
    EXPECT_EQ(code, Code::pool_full);
    EXPECT_EQ(file_size(path), kMax) << "the pool did not grow to its maximum";
    EXPECT_GT(acked.size(), 20'000u);
    expect_contents(**opened, acked);
  }
  Options o = grow_options(GetParam(), path);
  o.open_mode = OpenMode::open;
  auto reopened = Index::open(o);
  ASSERT_TRUE(reopened.ok()) << reopened.status().to_string();
  expect_contents(**reopened, acked);
}

// A crash while the pool is growing: the child inserts (growing the file several times) and
// dies without a clean close; the file is then longer than anything the heap used, by an odd
// amount, as an extension cut short by the crash leaves it. It recovers with every record.
TEST_P(PoolGrowth, FileExtendedByACrashMidExtensionRecovers) {
  TempDir dir;
  const std::string path = dir.file("crash.pool");
  constexpr std::uint64_t kRecords = 30'000;
  const pid_t pid = fork();
  if (pid == 0) {
    auto opened = Index::open(grow_options(GetParam(), path));
    if (!opened.ok()) _exit(10);
    for (std::uint64_t i = 0; i < kRecords; ++i)
      if ((*opened)->insert(encode_u64(mix(i)), encode_u64(i)) != Code::ok) _exit(11);
    _exit(0);  // no close: what kill -9 leaves
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  const std::size_t grown = file_size(path);
  ASSERT_GT(grown, pm::kMinPoolSize);
  auto info = pm::Pool::inspect(path);
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_FALSE(info->clean_shutdown);
  ASSERT_LE(info->heap_high_water, grown);
  ASSERT_LT(grown + 3 * 4096 + 100, kMax);
  ASSERT_EQ(truncate(path.c_str(), static_cast<off_t>(grown + 3 * 4096 + 100)), 0);
  Options o = grow_options(GetParam(), path);
  o.open_mode = OpenMode::open;
  auto reopened = Index::open(o);
  ASSERT_TRUE(reopened.ok()) << reopened.status().to_string();
  std::map<std::string, std::string> want;
  for (std::uint64_t i = 0; i < kRecords; ++i) want.emplace(encode_u64(mix(i)), encode_u64(i));
  expect_contents(**reopened, want);
  // And it grows on from the odd size.
  for (std::uint64_t i = kRecords; i < 2 * kRecords; ++i)
    ASSERT_EQ((*reopened)->insert(encode_u64(mix(i)), encode_u64(i)), Code::ok) << i;
}

TEST_P(PoolGrowth, GrownPoolCutBelowItsHighWaterMarkIsRefused) {
  TempDir dir;
  const std::string path = dir.file("cut.pool");
  {
    auto opened = Index::open(grow_options(GetParam(), path));
    ASSERT_TRUE(opened.ok()) << opened.status().to_string();
    for (std::uint64_t i = 0; i < 30'000; ++i)
      ASSERT_EQ((*opened)->insert(encode_u64(mix(i)), encode_u64(i)), Code::ok);
  }
  auto info = pm::Pool::inspect(path);
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  ASSERT_GT(info->heap_high_water, 2 * pm::kMinPoolSize) << "the pool never grew";
  ASSERT_EQ(truncate(path.c_str(), static_cast<off_t>(info->heap_high_water - 4096)), 0);
  Options o = grow_options(GetParam(), path);
  o.open_mode = OpenMode::open;
  auto reopened = Index::open(o);
  ASSERT_FALSE(reopened.ok());
  EXPECT_EQ(reopened.status().code(), Code::corrupted);
  EXPECT_NE(reopened.status().message().find("truncated"), std::string::npos)
      << reopened.status().message();
}

INSTANTIATE_TEST_SUITE_P(Kinds, PoolGrowth,
                         ::testing::Values("reflist", "lbtree", "fptree", "nbtree", "apex",
                                           "utree", "part"),
                         [](const auto& p) { return p.param; });
INSTANTIATE_TEST_SUITE_P(Roart, PoolGrowth, ::testing::Values("roart"),
                         [](const auto& p) { return p.param; });

}  // namespace
}  // namespace pmindex

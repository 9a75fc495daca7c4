// Golden pool images of each released format version: the current one must keep opening with
// its data; a retired one must be refused with the way to upgrade, and upgrade.
// To (re)generate an image for a NEW format version only:
//   PMINDEX_WRITE_GOLDEN=tests/golden/v<N>-reflist.pool build/.../test_golden
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "pmindex/index.h"
#include "support/temp_dir.h"

namespace pmindex {
namespace {

constexpr int kRecords = 100;

TEST(Golden, WriteIfAsked) {
  const char* out = std::getenv("PMINDEX_WRITE_GOLDEN");
  if (out == nullptr) GTEST_SKIP() << "set PMINDEX_WRITE_GOLDEN=PATH to write a golden image";
  Options o;
  o.path = out;
  o.pool_size = 64 * 1024;
  o.open_mode = OpenMode::create;
  o.overwrite = true;
  auto idx = Index::open(o);
  ASSERT_TRUE(idx.ok()) << idx.status().to_string();
  for (std::uint64_t k = 0; k < kRecords; ++k)
    ASSERT_EQ((*idx)->insert(encode_u64(k), encode_u64(k * k)), Code::ok);
  ASSERT_TRUE((*idx)->close().ok());
}

TEST(Golden, Version2ReflistOpens) {
  testing::TempDir dir;
  const std::string copy = dir.file("v2.pool");
  std::filesystem::copy_file(std::string(PMINDEX_GOLDEN_DIR) + "/v2-reflist.pool", copy);
  Options o;
  o.path = copy;
  o.open_mode = OpenMode::open;
  auto idx = Index::open(o);
  ASSERT_TRUE(idx.ok()) << idx.status().to_string();
  EXPECT_TRUE((*idx)->recovery_stats().clean_shutdown);
  EXPECT_TRUE((*idx)->recovery_stats().warning.empty()) << (*idx)->recovery_stats().warning;
  ASSERT_TRUE((*idx)->verify().ok());
  std::string v;
  for (std::uint64_t k = 0; k < kRecords; ++k) {
    ASSERT_EQ((*idx)->find(encode_u64(k), &v), Code::ok) << k;
    EXPECT_EQ(decode_u64(v), k * k);
  }
  EXPECT_EQ((*idx)->recovery_stats().records, static_cast<std::uint64_t>(kRecords));
}

// Format version 2 checksums the header state; version-1 pools are refused with the way out
// (pmpool upgrade), refused unchanged, and open with all their data once upgraded.
TEST(Golden, Version1ReflistIsRefusedThenUpgraded) {
  testing::TempDir dir;
  const std::string copy = dir.file("v1.pool");
  std::filesystem::copy_file(std::string(PMINDEX_GOLDEN_DIR) + "/v1-reflist.pool", copy);
  const auto before = std::filesystem::file_size(copy);
  Options o;
  o.path = copy;
  o.open_mode = OpenMode::open;
  auto refused = Index::open(o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::unsupported);
  EXPECT_NE(refused.status().message().find("pmpool upgrade " + copy), std::string::npos)
      << refused.status().to_string();
  EXPECT_EQ(std::filesystem::file_size(copy), before);

  ASSERT_TRUE(pm::upgrade_pool_file(copy).ok());
  const Status twice = pm::upgrade_pool_file(copy);
  EXPECT_EQ(twice.code(), Code::invalid_argument) << twice.to_string();
  auto info = pm::Pool::inspect(copy);
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_EQ(info->format_version, 2u);
  EXPECT_EQ(info->last_mode, 0u) << "version 1 did not record the mode";
  auto idx = Index::open(o);
  ASSERT_TRUE(idx.ok()) << idx.status().to_string();
  EXPECT_TRUE((*idx)->recovery_stats().clean_shutdown);
  ASSERT_TRUE((*idx)->verify().ok());
  std::string v;
  for (std::uint64_t k = 0; k < kRecords; ++k) {
    ASSERT_EQ((*idx)->find(encode_u64(k), &v), Code::ok) << k;
    EXPECT_EQ(decode_u64(v), k * k);
  }
  EXPECT_EQ((*idx)->recovery_stats().records, static_cast<std::uint64_t>(kRecords));
}

// A damaged version-1 pool is not upgraded (and not changed).
TEST(Golden, DamagedVersion1IsNotUpgraded) {
  testing::TempDir dir;
  const std::string copy = dir.file("v1.pool");
  std::filesystem::copy_file(std::string(PMINDEX_GOLDEN_DIR) + "/v1-reflist.pool", copy);
  {
    std::fstream f(copy, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);  // a uuid byte: the checksum no longer matches
    f.put('\x5a');
  }
  const Status s = pm::upgrade_pool_file(copy);
  EXPECT_EQ(s.code(), Code::corrupted) << s.to_string();
}

}  // namespace
}  // namespace pmindex

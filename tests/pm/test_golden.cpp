// Golden pool images of each released format version must keep opening, with their data.
// To (re)generate an image for a NEW format version only:
//   PMINDEX_WRITE_GOLDEN=tests/golden/v<N>-reflist.pool build/.../test_golden
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

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

TEST(Golden, Version1ReflistStillOpens) {
  testing::TempDir dir;
  const std::string copy = dir.file("v1.pool");
  std::filesystem::copy_file(std::string(PMINDEX_GOLDEN_DIR) + "/v1-reflist.pool", copy);
  Options o;
  o.path = copy;
  o.open_mode = OpenMode::open;
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

}  // namespace
}  // namespace pmindex

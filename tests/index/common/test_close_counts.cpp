// Issue 18 item 4 (clean shutdown): lbtree and fptree count their records and leaves at close
// (pm::Pool::close_clean) and the next open's recovery walk compares its own counts with them.
// A mismatch is refused as corrupted; an unclean end leaves no counts, so nothing is compared.
#include <fstream>
#include <iterator>
#include <string>

#include <gtest/gtest.h>

#include "pmindex/index.h"
#include "support/temp_dir.h"

namespace pmindex {
namespace {

using pmindex::testing::TempDir;

constexpr std::uint64_t kRecords = 3000;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

class CloseCounts : public ::testing::TestWithParam<std::string> {
 protected:
  Options options(const std::string& path, OpenMode mode) const {
    Options o;
    o.kind = GetParam();
    o.path = path;
    o.pool_size = 16 << 20;
    o.open_mode = mode;
    return o;
  }
};

TEST_P(CloseCounts, CleanCloseRecordsCountsAndOpenComparesThem) {
  TempDir dir;
  const std::string path = dir.file("p.pool");
  {
    auto idx = Index::open(options(path, OpenMode::create));
    ASSERT_TRUE(idx.ok()) << idx.status().to_string();
    for (std::uint64_t k = 0; k < kRecords; ++k)
      ASSERT_EQ((*idx)->insert(encode_u64(k * 7), encode_u64(k)), Code::ok);
    ASSERT_TRUE((*idx)->close().ok());
  }
  auto info = pm::Pool::inspect(path);
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_EQ(info->records_at_close, kRecords);
  ASSERT_NE(info->nodes_at_close, pm::kNoCount);
  EXPECT_GT(info->nodes_at_close, 10u) << "expected a chain of many leaves";
  const std::string pristine = read_file(path);
  {
    auto idx = Index::open(options(path, OpenMode::open));  // the counts match
    ASSERT_TRUE(idx.ok()) << idx.status().to_string();
    EXPECT_EQ((*idx)->recovery_stats().records, kRecords);
  }
  // Known-bad: counts that disagree with the chain (what a chain cut short by a zeroed page
  // looks like after a clean close), both header copies consistent.
  for (const int which : {0, 1}) {
    std::string bad = pristine;
    pm::HeaderState st{};
    ASSERT_TRUE(pm::image_state(bad.data(), &st));
    (which == 0 ? st.records_at_close : st.nodes_at_close) += 1;
    pm::set_image_state(bad.data(), st);
    write_file(path, bad);
    auto idx = Index::open(options(path, OpenMode::open));
    ASSERT_FALSE(idx.ok()) << (which == 0 ? "records" : "leaves") << " count not compared";
    EXPECT_EQ(idx.status().code(), Code::corrupted);
    EXPECT_NE(idx.status().message().find("last clean close counted"), std::string::npos)
        << idx.status().to_string();
    EXPECT_EQ(read_file(path), bad) << "a refused open changed the file";
  }
  // An open without close (a crash) clears the counts: the next open compares nothing.
  write_file(path, pristine);
  {
    auto idx = Index::open(options(path, OpenMode::open));
    ASSERT_TRUE(idx.ok()) << idx.status().to_string();
    ASSERT_EQ((*idx)->insert(encode_u64(1), encode_u64(1)), Code::ok);
  }
  info = pm::Pool::inspect(path);
  ASSERT_TRUE(info.ok());
  EXPECT_FALSE(info->clean_shutdown);
  EXPECT_EQ(info->records_at_close, pm::kNoCount);
  auto idx = Index::open(options(path, OpenMode::open));
  ASSERT_TRUE(idx.ok()) << idx.status().to_string();
  EXPECT_EQ((*idx)->recovery_stats().records, kRecords + 1);
}

INSTANTIATE_TEST_SUITE_P(LeafChainKinds, CloseCounts, ::testing::Values("lbtree", "fptree"),
                         [](const auto& p) { return p.param; });

}  // namespace
}  // namespace pmindex

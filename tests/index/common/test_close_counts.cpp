// Issue 18 item 4 (clean shutdown): every PM kind counts its records and leaves/nodes at close
// (pm::Pool::close_clean) and the next open's recovery walk compares its own counts with them.
// A mismatch is refused as corrupted: by the open for the kinds that walk at open, by the
// background walk or verify() (what pmpool check runs) for the lazy ones (apex, part, roart). An
// unclean end leaves no counts, so nothing is compared.
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

// Lazy recovery: the open answers at once; damage shows in verify() (and writes are refused).
bool lazy(const std::string& kind) {
  return kind == "apex" || kind == "part" || kind == "roart";
}

// Kinds whose close() leaves the pool unclean when the background walk found damage.
bool close_keeps_damage(const std::string& kind) { return kind == "part" || kind == "roart"; }

// The open (or, for a lazy kind, verify() after it) with the counts of `path`: ok or the
// refusal.
Status open_and_check(const Options& o) {
  auto idx = Index::open(o);
  if (!idx.ok()) return idx.status();
  return lazy(o.kind) ? (*idx)->verify() : Status::Ok();
}

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
  // dptree counts its base tree only (the buffer is replayed from the log it lives in).
  if (GetParam() == "dptree") {
    EXPECT_GT(info->records_at_close, 0u);
    EXPECT_LE(info->records_at_close, kRecords);
  } else {
    EXPECT_EQ(info->records_at_close, kRecords);
  }
  ASSERT_NE(info->nodes_at_close, pm::kNoCount);
  EXPECT_GT(info->nodes_at_close, 1u) << "expected a chain or tree of many nodes";
  const std::string pristine = read_file(path);
  {
    auto idx = Index::open(options(path, OpenMode::open));  // the counts match
    ASSERT_TRUE(idx.ok()) << idx.status().to_string();
    ASSERT_TRUE((*idx)->verify().ok()) << (*idx)->verify().to_string();
    EXPECT_EQ((*idx)->size(), kRecords);
    // The session's own writes are part of what verify() expects (lazy kinds compare there).
    ASSERT_EQ((*idx)->insert(encode_u64(kRecords * 7 + 1), encode_u64(1)), Code::ok);
    ASSERT_EQ((*idx)->remove(encode_u64(7)), Code::ok);
    ASSERT_EQ((*idx)->remove(encode_u64(14)), Code::ok);
    ASSERT_TRUE((*idx)->verify().ok()) << (*idx)->verify().to_string();
  }
  write_file(path, pristine);
  // Known-bad: counts that disagree with the chain (what a chain cut short by a zeroed page
  // looks like after a clean close), both header copies consistent.
  for (const int which : {0, 1}) {
    std::string bad = pristine;
    pm::HeaderState st{};
    ASSERT_TRUE(pm::image_state(bad.data(), &st));
    (which == 0 ? st.records_at_close : st.nodes_at_close) += 1;
    pm::set_image_state(bad.data(), st);
    write_file(path, bad);
    const Status s = open_and_check(options(path, OpenMode::open));
    ASSERT_FALSE(s.ok()) << (which == 0 ? "records" : "nodes") << " count not compared";
    EXPECT_EQ(s.code(), Code::corrupted);
    EXPECT_NE(s.message().find("last clean close counted"), std::string::npos) << s.to_string();
    if (!lazy(GetParam())) {
      EXPECT_EQ(read_file(path), bad) << "a refused open changed the file";
    }
    if (close_keeps_damage(GetParam())) {
      // Known-bad: a close after the walk found damage must not mark the pool clean (it
      // would record the damaged tree's counts, and the next open would accept it whole).
      write_file(path, bad);  // the open above cleared the counts
      auto idx = Index::open(options(path, OpenMode::open));
      ASSERT_TRUE(idx.ok()) << idx.status().to_string();
      EXPECT_EQ((*idx)->verify().code(), Code::corrupted);
      EXPECT_FALSE((*idx)->close().ok()) << "close hid the walk's damage";
      auto after = pm::Pool::inspect(path);
      ASSERT_TRUE(after.ok()) << after.status().to_string();
      EXPECT_FALSE(after->clean_shutdown) << "a damaged pool was marked clean at close";
    }
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
  EXPECT_EQ((*idx)->size(), kRecords + 1);
  EXPECT_TRUE((*idx)->verify().ok()) << (*idx)->verify().to_string();
}

INSTANTIATE_TEST_SUITE_P(PmKinds, CloseCounts,
                         ::testing::Values("lbtree", "fptree", "reflist", "nbtree", "utree",
                                           "apex", "part", "pactree", "dptree", "roart"),
                         [](const auto& p) { return p.param; });

}  // namespace
}  // namespace pmindex

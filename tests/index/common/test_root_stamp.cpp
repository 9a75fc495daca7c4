// Issue 18 item 5: every index's root records its layout (kind, node size, key mode, variant:
// src/index/common/root_stamp.h) and recovery compares it with the pool header. A header whose
// key type was changed and whose checksum was then fixed (u64 keys would be read as doubles)
// must be refused as corrupted by every registered kind, and leave the file unchanged.
#include <fstream>
#include <iterator>
#include <string>

#include <gtest/gtest.h>

#include "pmindex/index.h"
#include "support/temp_dir.h"

namespace pmindex {
namespace {

using pmindex::testing::TempDir;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

class RootStamp : public ::testing::TestWithParam<std::string> {};

TEST_P(RootStamp, HeaderWithAnotherKeyTypeIsRefused) {
  TempDir dir;
  const std::string path = dir.file("p.pool");
  Options o;
  o.kind = GetParam();
  o.path = path;
  o.pool_size = 8 << 20;
  o.open_mode = OpenMode::create;
  {
    auto idx = Index::open(o);
    ASSERT_TRUE(idx.ok()) << idx.status().to_string();
    for (std::uint64_t k = 1; k <= 64; ++k)
      ASSERT_EQ((*idx)->insert(encode_u64(k << 20), encode_u64(k)), Code::ok);
    ASSERT_TRUE((*idx)->close().ok());
  }
  o.open_mode = OpenMode::open;
  o.layout_from_pool = true;  // as pmpool check opens: the header is believed for the layout
  {
    auto idx = Index::open(o);  // the untouched pool opens (the stamp matches)
    ASSERT_TRUE(idx.ok()) << idx.status().to_string();
  }
  const std::string pristine = read_file(path);
  for (const pm::KeyMode other : {pm::KeyMode::f64, pm::KeyMode::bytes}) {
    std::string bad = pristine;
    auto* h = reinterpret_cast<pm::PoolHeader*>(bad.data());
    h->key_mode = static_cast<std::uint32_t>(other);
    h->checksum = pm::header_checksum(*h);
    write_file(path, bad);
    auto idx = Index::open(o);
    ASSERT_FALSE(idx.ok()) << GetParam() << " accepted key mode " << pm::to_string(other);
    EXPECT_EQ(idx.status().code(), Code::corrupted) << idx.status().to_string();
    // Refused by the stamp, not by a check a kind happens to have of its own.
    EXPECT_NE(idx.status().message().find("the index root was built as"), std::string::npos)
        << idx.status().to_string();
    EXPECT_EQ(read_file(path), bad) << "a refused open changed the file";
  }
}

INSTANTIATE_TEST_SUITE_P(AllKinds, RootStamp, ::testing::ValuesIn(IndexRegistry::names()),
                         [](const auto& p) { return p.param; });

}  // namespace
}  // namespace pmindex

// PM work per operation of uTree in the counting flavour (deterministic counts, not timings),
// against the design: an insert persists its new node (one line: 24 B in one block) and the
// predecessor's link (one line) - two lines, two flushes, two fences, whatever the tree's size,
// because splits touch DRAM only; an 8-byte update is one line and one persist; a remove
// persists the mark and the unlink (two lines). The original flushes the same two lines per
// insert, each with mfence + clflush + mfence. A regression (an extra persist, a split that
// writes PM) fails here.
#include <gtest/gtest.h>

#include <iostream>
#include <random>

#include "index/common/op_cost.h"
#include "pmindex/index.h"

namespace pmindex {
namespace {

TEST(UTreeLines, PersistsPerOperation) {
  Options o;
  o.kind = "utree";
  o.node_size = 64;  // a split every other insert: DRAM only, so still two lines
  o.pool_size = std::size_t{64} << 20;
  auto r = Index::open(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::unique_ptr<Index> idx = std::move(r).value();
  std::mt19937_64 rng(5);
  std::vector<std::uint64_t> keys;
  pm::Counters ins{}, upd{}, rem{};
  const std::size_t n = 20000;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t k = rng();
    keys.push_back(k);
    ins += test::op_cost([&] { ASSERT_EQ(idx->insert(encode_u64(k), encode_u64(i)), Code::ok); });
  }
  for (std::size_t i = 0; i < n; ++i)
    upd += test::op_cost([&] { ASSERT_EQ(idx->update(encode_u64(keys[i]), encode_u64(i)), Code::ok); });
  for (std::size_t i = 0; i < n; ++i)
    rem += test::op_cost([&] { ASSERT_EQ(idx->remove(encode_u64(keys[i])), Code::ok); });
  auto per = [n](std::uint64_t v) { return static_cast<double>(v) / static_cast<double>(n); };
  std::cout << "per insert: " << per(ins.lines_written) << " lines, " << per(ins.flushes)
            << " flushes, " << per(ins.fences) << " fences\n"
            << "per update: " << per(upd.lines_written) << " lines, " << per(upd.flushes)
            << " flushes, " << per(upd.fences) << " fences\n"
            << "per remove: " << per(rem.lines_written) << " lines, " << per(rem.flushes)
            << " flushes, " << per(rem.fences) << " fences\n";
  // Lines: at most two (two small nodes may share a line once 32 B allocation classes exist).
  EXPECT_LE(ins.lines_written, 2 * n);
  EXPECT_EQ(ins.flushes, 2 * n);
  EXPECT_EQ(ins.fences, 2 * n);
  EXPECT_LE(upd.lines_written, n);
  EXPECT_EQ(upd.flushes, n);
  EXPECT_LE(rem.lines_written, 2 * n);
  EXPECT_EQ(rem.flushes, 2 * n);
  ASSERT_TRUE(idx->verify().ok());
}

}  // namespace
}  // namespace pmindex

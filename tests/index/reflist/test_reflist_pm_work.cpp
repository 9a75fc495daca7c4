// PM work per operation of reflist in the counting flavour (deterministic counts, not timings),
// against PROTOCOL.md: an insert persists its new record (R5) and the one link word that
// publishes it (R7); an update the same (out of place); a remove persists the one unlinking
// word (R8). Tagged links (W1t) put the tag into those same words, so they add no store, line,
// flush or fence: these counts are the ones the untagged format had (measured on both). A
// regression (an extra persist, a second store per link) fails here.
#include <gtest/gtest.h>

#include <iostream>
#include <random>
#include <vector>

#include "index/common/op_cost.h"
#include "pmindex/index.h"

namespace pmindex {
namespace {

TEST(RefListLines, PersistsPerOperation) {
  Options o;
  o.kind = "reflist";
  o.pool_size = std::size_t{8} << 20;
  auto r = Index::open(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::unique_ptr<Index> idx = std::move(r).value();
  std::mt19937_64 rng(5);
  std::vector<std::uint64_t> keys;
  pm::Counters ins{}, upd{}, rem{};
  const std::size_t n = 2000;
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
  std::cout << "per insert: " << per(ins.lines_written) << " lines, " << per(ins.bytes_stored)
            << " bytes, " << per(ins.flushes) << " flushes, " << per(ins.fences) << " fences\n"
            << "per update: " << per(upd.lines_written) << " lines, " << per(upd.bytes_stored)
            << " bytes, " << per(upd.flushes) << " flushes, " << per(upd.fences) << " fences\n"
            << "per remove: " << per(rem.lines_written) << " lines, " << per(rem.bytes_stored)
            << " bytes, " << per(rem.flushes) << " flushes, " << per(rem.fences) << " fences\n";
  // Measured identical before tagged links (2026-11-28): 2 / 2 / 1 flushes and fences, 40 / 40 /
  // 8 bytes (16 B header, 8 B key, 8 B value, one 8-byte link word), at most 2 / 2 / 1 lines.
  EXPECT_EQ(ins.flushes, 2 * n);
  EXPECT_EQ(ins.fences, 2 * n);
  EXPECT_EQ(ins.bytes_stored, 40 * n);
  EXPECT_LE(ins.lines_written, 2 * n);
  EXPECT_EQ(upd.flushes, 2 * n);
  EXPECT_EQ(upd.fences, 2 * n);
  EXPECT_EQ(upd.bytes_stored, 40 * n);
  EXPECT_LE(upd.lines_written, 2 * n);
  EXPECT_EQ(rem.flushes, n);
  EXPECT_EQ(rem.fences, n);
  EXPECT_EQ(rem.bytes_stored, 8 * n);
  EXPECT_EQ(rem.lines_written, n);
}

}  // namespace
}  // namespace pmindex

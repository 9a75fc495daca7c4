// part's PM work per operation, measured with the counting flavour (the design's claim,
// PROTOCOL.md): an insert into a free slot persists the record (P1: one line for a 24 B
// record) and the child word (P3): 2 flushes, 2 fences; an in-place update persists the value
// word (P8): 1 flush, 1 fence; an in-place remove persists the cleared slot (P9a): 1 flush,
// 1 fence; a lookup writes nothing durable and persists nothing. Lock words are PM stores too
// (never flushed), so lines written are counted, not asserted, for writers.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "index/common/op_cost.h"
#include "pmindex/index.h"

namespace pmindex {
namespace {

using test::op_cost;

TEST(PartCounting, FlushesAndFencesPerOperation) {
  Options o;
  o.kind = "part";
  o.pool_size = 16 << 20;
  auto r = Index::open(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  auto idx = std::move(r).value();
  // Keys 0x100..0x1ff under one N256 at the last byte; key 0x100 + b is free until inserted.
  for (std::uint64_t k = 0x100; k < 0x1f0; ++k) ASSERT_EQ(idx->insert(encode_u64(k), encode_u64(k)), Code::ok);
  const pm::Counters ins = op_cost([&] { ASSERT_EQ(idx->insert(encode_u64(0x1f5), encode_u64(1)), Code::ok); });
  const pm::Counters upd = op_cost([&] { ASSERT_EQ(idx->update(encode_u64(0x1f5), encode_u64(2)), Code::ok); });
  const pm::Counters rem = op_cost([&] { ASSERT_EQ(idx->remove(encode_u64(0x150)), Code::ok); });
  std::string v;
  const pm::Counters find = op_cost([&] { ASSERT_EQ(idx->find(encode_u64(0x1f5), &v), Code::ok); });
  const auto triple = [](const pm::Counters& c) {
    return std::to_string(c.flushes) + "/" + std::to_string(c.fences) + "/" +
           std::to_string(c.lines_written);
  };
  std::printf("[part cost] flushes/fences/lines: insert %s; update %s; remove %s; find %s\n",
              triple(ins).c_str(), triple(upd).c_str(), triple(rem).c_str(), triple(find).c_str());
  EXPECT_EQ(ins.flushes, 2u);
  EXPECT_EQ(ins.fences, 2u);
  EXPECT_EQ(upd.flushes, 1u);
  EXPECT_EQ(upd.fences, 1u);
  EXPECT_EQ(rem.flushes, 1u);
  EXPECT_EQ(rem.fences, 1u);
  EXPECT_EQ(find.flushes, 0u);
  EXPECT_EQ(find.fences, 0u);
  EXPECT_EQ(find.lines_written, 0u);  // readers write nothing to PM (the node was touched already)
  EXPECT_LE(ins.lines_written, 4u);   // record line, child word line, lock word line, N256 accel none
}

}  // namespace
}  // namespace pmindex

// roart's PM work per operation, measured with the counting flavour (PROTOCOL.md): an insert
// into a free slot persists the record (A1: one line for a 24 B record in its 32 B class) and
// the slot word (A2a): 2 flushes, 2 fences; an update persists the new record (A1) and swaps
// the slot word (A2b): 2 flushes, 2 fences; a remove persists the cleared slot (A2c): 1 flush,
// 1 fence; a lookup writes nothing to PM and persists nothing. Prefix words, bitmaps and lock
// words are PM stores too (never flushed): lines written are bounded for writers.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "index/common/op_cost.h"
#include "pmindex/index.h"

namespace pmindex {
namespace {

using test::op_cost;

TEST(RoartCounting, FlushesAndFencesPerOperation) {
  Options o;
  o.kind = "roart";
  o.pool_size = 16 << 20;
  auto r = Index::open(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  auto idx = std::move(r).value();
  // Ten keys: the first array grew to 16 slots, so the eleventh insert takes a free slot.
  for (std::uint64_t k = 1; k <= 10; ++k) ASSERT_EQ(idx->insert(encode_u64(k), encode_u64(k)), Code::ok);
  const pm::Counters ins = op_cost([&] { ASSERT_EQ(idx->insert(encode_u64(11), encode_u64(1)), Code::ok); });
  const pm::Counters upd = op_cost([&] { ASSERT_EQ(idx->update(encode_u64(11), encode_u64(2)), Code::ok); });
  const pm::Counters rem = op_cost([&] { ASSERT_EQ(idx->remove(encode_u64(5)), Code::ok); });
  std::string v;
  const pm::Counters find = op_cost([&] { ASSERT_EQ(idx->find(encode_u64(11), &v), Code::ok); });
  const auto triple = [](const pm::Counters& c) {
    return std::to_string(c.flushes) + "/" + std::to_string(c.fences) + "/" +
           std::to_string(c.lines_written);
  };
  std::printf("[roart cost] flushes/fences/lines: insert %s; update %s; remove %s; find %s\n",
              triple(ins).c_str(), triple(upd).c_str(), triple(rem).c_str(), triple(find).c_str());
  EXPECT_EQ(ins.flushes, 2u);
  EXPECT_EQ(ins.fences, 2u);
  EXPECT_EQ(upd.flushes, 2u);
  EXPECT_EQ(upd.fences, 2u);
  EXPECT_EQ(rem.flushes, 1u);
  EXPECT_EQ(rem.fences, 1u);
  EXPECT_EQ(find.flushes, 0u);
  EXPECT_EQ(find.fences, 0u);
  EXPECT_EQ(find.lines_written, 0u);  // readers write nothing to PM (the array was touched already)
  EXPECT_LE(ins.lines_written, 5u);   // record, slot, prefix word, bitmap+lock line, trie root lock
}

}  // namespace
}  // namespace pmindex

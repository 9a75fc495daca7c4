// PACTree's PM work per operation, measured with the counting flavour (PROTOCOL.md): an insert
// into a free slot writes the record and its fingerprint and persists them together (I1-I2:
// 2 flushes, 1 fence), then the bitmap (I3: 1 flush, 1 fence) - the original's 3 line
// write-backs and 2 fences; an update persists the value word (U1: 1/1); a remove the bitmap
// (D1: 1/1); a lookup and a scan write nothing to PM.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "index/common/op_cost.h"
#include "pmindex/index.h"

namespace pmindex {
namespace {

using test::op_cost;

TEST(PacTreeCounting, FlushesAndFencesPerOperation) {
  Options o;
  o.kind = "pactree";
  o.pool_size = 16 << 20;
  auto r = Index::open(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  auto idx = std::move(r).value();
  for (std::uint64_t k = 0; k < 20; ++k) ASSERT_EQ(idx->insert(encode_u64(k * 2), encode_u64(k)), Code::ok);
  const pm::Counters ins = op_cost([&] { ASSERT_EQ(idx->insert(encode_u64(7), encode_u64(1)), Code::ok); });
  const pm::Counters upd = op_cost([&] { ASSERT_EQ(idx->update(encode_u64(7), encode_u64(2)), Code::ok); });
  const pm::Counters rem = op_cost([&] { ASSERT_EQ(idx->remove(encode_u64(8)), Code::ok); });
  std::string v;
  const pm::Counters find = op_cost([&] { ASSERT_EQ(idx->find(encode_u64(7), &v), Code::ok); });
  ScanBuffer out;
  const pm::Counters scan = op_cost([&] { ASSERT_EQ(idx->scan(encode_u64(0), 10, out), 10u); });
  const auto triple = [](const pm::Counters& c) {
    return std::to_string(c.flushes) + "/" + std::to_string(c.fences) + "/" +
           std::to_string(c.lines_written);
  };
  std::printf("[pactree cost] flushes/fences/lines: insert %s; update %s; remove %s\n",
              triple(ins).c_str(), triple(upd).c_str(), triple(rem).c_str());
  EXPECT_EQ(ins.flushes, 3u);
  EXPECT_EQ(ins.fences, 2u);
  EXPECT_LE(ins.lines_written, 3u);  // slot line, fingerprint line, header line
  EXPECT_EQ(upd.flushes, 1u);
  EXPECT_EQ(upd.fences, 1u);
  EXPECT_EQ(rem.flushes, 1u);
  EXPECT_EQ(rem.fences, 1u);
  for (const pm::Counters& c : {find, scan}) {
    EXPECT_EQ(c.flushes, 0u);
    EXPECT_EQ(c.fences, 0u);
    EXPECT_EQ(c.lines_written, 0u);  // readers write nothing to PM
  }
}

}  // namespace
}  // namespace pmindex

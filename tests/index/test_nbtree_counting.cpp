// NBTree's row of the paper's Table 1, measured with the counting flavour: PM line writes and
// flushes per insert / delete / update on the common path (key != 0, value < 2^61, no SMO).
// Paper: 1/1/1 flushes and 1/1/1 line writes (ADR). eADR: no flushes, still one line.
#include <gtest/gtest.h>

#include <cstdio>

#include "pmindex/index.h"

namespace pmindex {
namespace {

struct Row {
  std::uint64_t flushes = 0, lines = 0;
};

template <class F>
Row measure(F&& op) {
  pm::Runtime::end_operation();
  const pm::Counters before = pm::Runtime::counters();
  op();
  pm::Runtime::end_operation();
  const pm::Counters d = pm::Runtime::counters() - before;
  return {d.flushes, d.lines_written};
}

void run(pm::Mode mode, std::uint64_t expect_flushes) {
  Options o;
  o.kind = "nbtree";
  o.pool_size = 64 << 20;
  o.persistence = mode;  // default 1 KiB leaves
  auto r = Index::open(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  auto idx = std::move(r).value();
  constexpr int kOps = 20;  // fewer than a leaf holds: no SMO
  Row ins, upd, del;
  for (int i = 1; i <= kOps; ++i) {
    const Row a = measure([&] { ASSERT_EQ(idx->insert(encode_u64(i * 100), encode_u64(i)), Code::ok); });
    const Row b = measure([&] { ASSERT_EQ(idx->update(encode_u64(i * 100), encode_u64(i + 1)), Code::ok); });
    EXPECT_EQ(a.flushes, expect_flushes);
    EXPECT_EQ(a.lines, 1u);
    EXPECT_EQ(b.flushes, expect_flushes);
    EXPECT_EQ(b.lines, 1u);
    ins.flushes += a.flushes, ins.lines += a.lines;
    upd.flushes += b.flushes, upd.lines += b.lines;
  }
  for (int i = 1; i <= kOps; ++i) {
    const Row c = measure([&] { ASSERT_EQ(idx->remove(encode_u64(i * 100)), Code::ok); });
    EXPECT_EQ(c.flushes, expect_flushes);
    EXPECT_EQ(c.lines, 1u);
    del.flushes += c.flushes, del.lines += c.lines;
  }
  std::printf("nbtree %s, per op (insert/delete/update): flushes %.0f/%.0f/%.0f, "
              "PM line writes %.0f/%.0f/%.0f\n",
              std::string(pm::to_string(mode)).c_str(), 1.0 * ins.flushes / kOps,
              1.0 * del.flushes / kOps, 1.0 * upd.flushes / kOps, 1.0 * ins.lines / kOps,
              1.0 * del.lines / kOps, 1.0 * upd.lines / kOps);
}

TEST(NBTreeTable1, Adr) { run(pm::Mode::adr, 1); }
TEST(NBTreeTable1, Eadr) { run(pm::Mode::eadr, 0); }

}  // namespace
}  // namespace pmindex

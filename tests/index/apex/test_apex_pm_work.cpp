// APEX's PM-write claim (paper §4.2-4.3), measured with the counting flavour: one PM line
// written and one flush per insert, update and delete in the common case (no SMO, no new
// extended stash block). Bulk-loaded at fill 0.6, then 10% more keys: the density stays between
// the bounds, so no SMO runs. Every node is touched once first: the first access to a node in a
// session stores its DRAM-state address and L into the node header (R4; never flushed), which
// the counters see as one more line written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>

#include "index/common/op_cost.h"
#include "pmindex/index.h"

namespace pmindex {
namespace {

using test::op_cost;

void run(pm::Mode mode, std::uint64_t expect_flushes) {
  Options o;
  o.kind = "apex";
  o.pool_size = 64 << 20;
  o.node_size = 16384;
  o.persistence = mode;
  auto r = Index::open(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  auto idx = std::move(r).value();
  std::mt19937_64 rng(5);
  std::vector<std::uint64_t> all;
  for (int i = 0; i < 22000; ++i) all.push_back(rng() >> 1);
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<std::uint64_t> loaded(all.begin(), all.begin() + 20000), fresh(all.begin() + 20000, all.end());
  std::sort(loaded.begin(), loaded.end());
  std::vector<std::string> keys;
  std::vector<KeyValue> kv;
  for (std::uint64_t k : loaded) keys.push_back(encode_u64(k));
  const std::string v8 = encode_u64(7);
  for (const auto& k : keys) kv.push_back({k, v8});
  ASSERT_TRUE(idx->bulk_load(kv, 0.6).ok());
  for (const auto& k : keys) ASSERT_EQ(idx->find(k, nullptr), Code::ok);  // builds DRAM state
  std::map<std::uint64_t, std::uint64_t> ins_lines, upd_lines, del_lines;
  std::uint64_t bad_flushes = 0;
  for (std::uint64_t k : fresh) {
    const pm::Counters a = op_cost([&] { ASSERT_EQ(idx->insert(encode_u64(k), v8), Code::ok); });
    ++ins_lines[a.lines_written];
    if (a.lines_written == 1 && a.flushes != expect_flushes) ++bad_flushes;
  }
  for (std::uint64_t k : fresh) {
    const pm::Counters b = op_cost([&] { ASSERT_EQ(idx->update(encode_u64(k), encode_u64(k)), Code::ok); });
    ++upd_lines[b.lines_written];
    if (b.flushes != expect_flushes) ++bad_flushes;
  }
  for (std::uint64_t k : fresh) {
    const pm::Counters c = op_cost([&] { ASSERT_EQ(idx->remove(encode_u64(k)), Code::ok); });
    ++del_lines[c.lines_written];
    if (c.flushes != expect_flushes) ++bad_flushes;
  }
  auto show = [](const std::map<std::uint64_t, std::uint64_t>& m) {
    std::string s;
    for (const auto& [lines, n] : m) s += std::to_string(n) + "x" + std::to_string(lines) + " ";
    return s;
  };
  std::printf("apex %s, %zu ops each; PM lines per op: insert %s| update %s| delete %s\n",
              std::string(pm::to_string(mode)).c_str(), fresh.size(), show(ins_lines).c_str(),
              show(upd_lines).c_str(), show(del_lines).c_str());
  // Updates and deletes: always exactly one line. Inserts: one line except the rare insert
  // that links a new extended stash block (A4-A7).
  EXPECT_EQ(upd_lines[1], fresh.size());
  EXPECT_EQ(del_lines[1], fresh.size());
  EXPECT_GE(ins_lines[1] * 100, fresh.size() * 99);
  EXPECT_EQ(ins_lines[0], 0u);
  EXPECT_EQ(bad_flushes, 0u);
  // A check that can fail: the counters do see a multi-line write (a bulk load's nodes).
  const pm::Counters big = op_cost([&] {
    auto fresh_idx = Index::open(o);
    ASSERT_TRUE(fresh_idx.ok());
    ASSERT_EQ(fresh_idx.value()->bulk_load(kv, 0.6).code(), Code::ok);
  });
  EXPECT_GT(big.lines_written, 1u);
}

TEST(ApexPmWrites, Adr) { run(pm::Mode::adr, 1); }
TEST(ApexPmWrites, Eadr) { run(pm::Mode::eadr, 0); }

}  // namespace
}  // namespace pmindex

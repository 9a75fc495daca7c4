// FPTree: out-of-line values (max_value_size > 8), its own bulk load, and parallel recovery.
//  * values: randomized against std::map with value lengths 0..max (verify() after every op,
//    PM returns to the empty footprint when everything is removed: no leaked record); every
//    documented limit (inline 8-byte values, value_too_large, refused max_value_size).
//  * bulk load: against std::map for several fills and leaf sizes, then random operations;
//    the refusals (non-empty index, unsorted input, bad fill, bad value); reopen.
//  * parallel recovery: the same crashed pool recovered with 1 and with 4 threads gives the
//    same inner tree (describe_inner), the same contents, and the N-thread run used N threads.
#include <gtest/gtest.h>

#include <bit>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "index/fptree/fptree.h"
#include "index/common/map_checker.h"
#include "pmindex/index.h"
#include "support/temp_dir.h"

namespace pmindex {
namespace {

using namespace pmindex::testing;

constexpr std::uint32_t kSmall = sizeof(fptree::Leaf<8>);   // 192
constexpr std::uint32_t kPaper = sizeof(fptree::Leaf<64>);  // 1152

Options options(std::uint32_t node_size, KeyType kt, std::uint32_t max_value) {
  Options o;
  o.kind = "fptree";
  o.pool_size = 32 << 20;
  o.node_size = node_size;
  o.key_type = kt;
  o.max_key_size = kt == KeyType::bytes ? 24 : 8;
  o.max_value_size = max_value;
  return o;
}

std::string key_of(KeyType kt, std::uint64_t r) {
  if (kt == KeyType::bytes) return "k" + std::to_string(r * 7919 % 100003);
  return encode_u64(r * 0x9E3779B97F4A7C15ull);
}

std::string value_of(std::mt19937_64& rng, std::uint32_t max_value) {
  std::string v(rng() % (max_value + 1), '\0');
  for (char& c : v) c = static_cast<char>(rng());
  return v;
}

void expect_matches(const Index& idx, const std::map<std::string, std::string>& oracle) {
  ScanBuffer out;
  ASSERT_EQ(idx.scan({}, oracle.size() + 3, out), oracle.size());
  std::size_t i = 0;
  for (const auto& [k, v] : oracle) {
    ASSERT_EQ(out.key(i), k) << i;
    ASSERT_EQ(out.value(i), v) << i;
    std::string got;
    ASSERT_EQ(idx.find(k, &got), Code::ok) << i;
    ASSERT_EQ(got, v) << i;
    ++i;
  }
}

// --- values -------------------------------------------------------------------------------

class FPTreeValues : public ::testing::TestWithParam<KeyType> {};

TEST_P(FPTreeValues, OutOfLineValuesMatchStdMapWithVerifyAfterEveryOp) {
  const KeyType kt = GetParam();
  constexpr std::uint32_t kMax = 100;
  MapChecker c(options(kSmall, kt, kMax));
  ASSERT_TRUE(c.ok()) << c.open_status().to_string();
  const std::uint64_t empty_bytes = c.index().footprint().pm_bytes;
  c.run({.phases = {mixed_phase(2500)}, .seed = 7 + static_cast<unsigned>(kt)},
        [kt](std::mt19937_64& rng) { return key_of(kt, rng() % 300); },
        [](std::mt19937_64& rng) { return value_of(rng, kMax); });
  const Model all = c.model();
  for (const auto& [k, v] : all) ASSERT_TRUE(c.remove(k));
  ASSERT_TRUE(c.verify());
  // Every value record was freed (a leaf may stay: removal is best effort, not the head).
  EXPECT_LE(c.index().footprint().pm_bytes, empty_bytes + 4 * 256);
}

INSTANTIATE_TEST_SUITE_P(KeyTypes, FPTreeValues, ::testing::Values(KeyType::u64, KeyType::bytes));

TEST(FPTreeValueLimits, EveryValueSizeWorksOrGetsADocumentedError) {
  {  // inline: exactly 8 bytes
    auto idx = open_or_die(options(kSmall, KeyType::u64, 8));
    ASSERT_NE(idx, nullptr);
    EXPECT_EQ(idx->insert(encode_u64(1), std::string(7, 'a')), Code::invalid_argument);
    EXPECT_EQ(idx->insert(encode_u64(1), std::string(9, 'a')), Code::value_too_large);
    EXPECT_EQ(idx->insert(encode_u64(1), std::string(8, '\xff')), Code::ok);
    EXPECT_EQ(idx->update(encode_u64(1), std::string()), Code::invalid_argument);
  }
  {  // out of line: 0..max bytes
    auto idx = open_or_die(options(kSmall, KeyType::u64, 64));
    ASSERT_NE(idx, nullptr);
    for (std::size_t n : {0, 1, 8, 9, 63, 64}) {
      const std::string k = encode_u64(n), v(n, static_cast<char>('a' + n % 26));
      ASSERT_EQ(idx->insert(k, v), Code::ok) << n;
      std::string got;
      ASSERT_EQ(idx->find(k, &got), Code::ok);
      EXPECT_EQ(got, v);
    }
    EXPECT_EQ(idx->insert(encode_u64(100), std::string(65, 'x')), Code::value_too_large);
    EXPECT_EQ(idx->update(encode_u64(1), std::string(65, 'x')), Code::value_too_large);
    EXPECT_TRUE(idx->verify().ok());
  }
  {  // the largest limit and a value of that size
    auto idx = open_or_die(options(kSmall, KeyType::u64, fptree::kMaxValueBytes));
    ASSERT_NE(idx, nullptr);
    const std::string big(fptree::kMaxValueBytes, 'z');
    ASSERT_EQ(idx->insert(encode_u64(5), big), Code::ok);
    ASSERT_EQ(idx->update(encode_u64(5), big + ""), Code::ok);
    std::string got;
    ASSERT_EQ(idx->find(encode_u64(5), &got), Code::ok);
    EXPECT_EQ(got, big);
    EXPECT_TRUE(idx->verify().ok());
  }
  for (std::uint32_t bad : {0u, 7u, fptree::kMaxValueBytes + 1}) {
    auto r = Index::open(options(kSmall, KeyType::u64, bad));
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), Code::invalid_argument) << bad;
  }
}

TEST(FPTreeValueLimits, UpdateGoesOutOfPlaceAndFreesTheOldRecord) {
  auto idx = open_or_die(options(kSmall, KeyType::u64, 200));
  ASSERT_NE(idx, nullptr);
  ASSERT_EQ(idx->insert(encode_u64(1), std::string(150, 'a')), Code::ok);
  const std::uint64_t before = idx->footprint().pm_bytes;
  for (int i = 0; i < 50; ++i)
    ASSERT_EQ(idx->update(encode_u64(1), std::string(150, static_cast<char>('b' + i % 20))), Code::ok);
  ASSERT_TRUE(idx->verify().ok());  // also frees what the updates retired
  EXPECT_EQ(idx->footprint().pm_bytes, before);  // each update freed the record it replaced
}

TEST(FPTreeValueLimits, ValuesSurviveCloseAndCrash) {
  TempDir dir;
  Options o = options(kSmall, KeyType::bytes, 300);
  o.path = dir.file("v.pool");
  o.pool_size = 8 << 20;
  std::map<std::string, std::string> oracle;
  std::mt19937_64 rng(3);
  {
    auto idx = open_or_die(o);
    ASSERT_NE(idx, nullptr);
    for (int i = 0; i < 400; ++i) {
      const std::string k = key_of(KeyType::bytes, i), v = value_of(rng, 300);
      ASSERT_EQ(idx->insert(k, v), Code::ok);
      oracle[k] = v;
    }
    ASSERT_TRUE(idx->close().ok());
  }
  {
    auto idx = open_or_die(o);
    ASSERT_NE(idx, nullptr);
    ASSERT_TRUE(idx->verify().ok());
    expect_matches(*idx, oracle);
    for (int i = 0; i < 400; i += 3) {
      const std::string k = key_of(KeyType::bytes, i), v = value_of(rng, 300);
      ASSERT_EQ(idx->update(k, v), Code::ok);
      oracle[k] = v;
    }
    // no close(): the next open recovers as after a crash
  }
  auto idx = open_or_die(o);
  ASSERT_NE(idx, nullptr);
  EXPECT_FALSE(idx->recovery_stats().clean_shutdown);
  ASSERT_TRUE(idx->verify().ok());
  expect_matches(*idx, oracle);
}

// --- bulk load ----------------------------------------------------------------------------

using BulkParam = std::tuple<std::uint32_t, double, std::uint32_t>;
class FPTreeBulk : public ::testing::TestWithParam<BulkParam> {};

// Bulk load through the kit, then random inserts / updates / removes (verify() every 50 ops
// and after every SMO), then recovery after a "crash" (no close).
TEST_P(FPTreeBulk, LoadsSortedInputThenBehavesLikeStdMap) {
  const auto [node_size, fill, max_value] = GetParam();
  TempDir dir;
  Options o = options(node_size, KeyType::u64, max_value);
  o.path = dir.file("b.pool");
  Model sorted;
  std::mt19937_64 rng(node_size + static_cast<unsigned>(fill * 100));
  auto value = [mv = max_value](std::mt19937_64& r) {
    return mv == 8 ? encode_u64(r()) : value_of(r, mv);
  };
  for (std::uint64_t i = 0; i < 3000; ++i) sorted[encode_u64(i * 10 + (i == 0 ? 0 : 5))] = value(rng);
  MapChecker c(o);
  ASSERT_TRUE(c.ok()) << c.open_status().to_string();
  ASSERT_TRUE(c.bulk_load(sorted, fill));
  ASSERT_TRUE(c.verify());
  // The leaves hold `fill` of their slots: ceil(n / floor(N * fill)) of them + the empty head.
  const unsigned n_slots = node_size == kSmall ? 8 : 64;
  const std::size_t per = std::max<std::size_t>(1, static_cast<std::size_t>(n_slots * fill));
  const std::size_t want = (sorted.size() + per - 1) / per + 1;
  if (node_size == kSmall) {
    EXPECT_EQ(dynamic_cast<const fptree::FPTree<8>&>(c.index()).leaf_count(), want);
  } else {
    EXPECT_EQ(dynamic_cast<const fptree::FPTree<64>&>(c.index()).leaf_count(), want);
  }
  std::vector<KeyValue> kvs;
  for (const auto& [k, v] : sorted) kvs.push_back({k, v});
  EXPECT_FALSE(c.index().bulk_load(kvs, fill).ok()) << "bulk load needs an empty index";
  c.run({.phases = {Phase{1500, {2, 0, 2, 1, 0, 0}, 40, 0}}, .seed = 5, .verify_every = 50},
        [](std::mt19937_64& r) { return encode_u64(r() % 31000); }, value);
  ASSERT_TRUE(c.reopen(/*clean=*/false));
}

INSTANTIATE_TEST_SUITE_P(Fills, FPTreeBulk,
                         ::testing::Values(BulkParam{kSmall, 0.3, 8}, BulkParam{kSmall, 0.7, 8},
                                           BulkParam{kSmall, 1.0, 8}, BulkParam{kPaper, 0.7, 8},
                                           BulkParam{kPaper, 1.0, 8}, BulkParam{kSmall, 0.7, 40}));

TEST(FPTreeBulkRefusals, BadInputLeavesTheIndexEmptyAndUsable) {
  auto idx = open_or_die(options(kSmall, KeyType::u64, 8));
  ASSERT_NE(idx, nullptr);
  const std::uint64_t empty_bytes = idx->footprint().pm_bytes;
  const std::string a = encode_u64(1), b = encode_u64(2), v = encode_u64(9);
  std::vector<KeyValue> unsorted{{b, v}, {a, v}}, dup{{a, v}, {a, v}}, ok{{a, v}, {b, v}};
  std::vector<KeyValue> short_value{{a, v}, {b, "x"}};
  EXPECT_EQ(idx->bulk_load(unsorted, 0.5).code(), Code::invalid_argument);
  EXPECT_EQ(idx->bulk_load(dup, 0.5).code(), Code::invalid_argument);
  EXPECT_EQ(idx->bulk_load(short_value, 0.5).code(), Code::invalid_argument);
  EXPECT_EQ(idx->bulk_load(ok, 0.0).code(), Code::invalid_argument);
  EXPECT_EQ(idx->bulk_load(ok, 1.5).code(), Code::invalid_argument);
  EXPECT_EQ(idx->footprint().pm_bytes, empty_bytes);
  ASSERT_TRUE(idx->bulk_load(ok, 0.5).ok());
  ASSERT_TRUE(idx->verify().ok());
  std::string got;
  EXPECT_EQ(idx->find(b, &got), Code::ok);
  EXPECT_EQ(got, v);
}

TEST(FPTreeBulkRefusals, PoolFullUndoesEverything) {
  Options o = options(kSmall, KeyType::u64, 8);
  o.pool_size = 1 << 20;
  auto idx = open_or_die(o);
  ASSERT_NE(idx, nullptr);
  const std::uint64_t empty_bytes = idx->footprint().pm_bytes;
  std::vector<std::string> keys;
  for (std::uint64_t i = 0; i < 20000; ++i) keys.push_back(encode_u64(i));
  std::vector<KeyValue> kvs;
  for (const auto& k : keys) kvs.push_back({k, k});
  EXPECT_EQ(idx->bulk_load(kvs, 0.5).code(), Code::pool_full);
  EXPECT_EQ(idx->footprint().pm_bytes, empty_bytes);
  ASSERT_TRUE(idx->verify().ok());
  ASSERT_EQ(idx->insert(keys[3], keys[3]), Code::ok);
}

// --- parallel recovery ----------------------------------------------------------------------

TEST(FPTreeParallelRecovery, OneAndFourThreadsBuildTheSameTree) {
  for (const KeyType kt : {KeyType::u64, KeyType::bytes}) {
    TempDir dir;
    Options o = options(kSmall, kt, kt == KeyType::bytes ? 40 : 8);
    o.path = dir.file("p.pool");
    o.pool_size = 64 << 20;
    std::map<std::string, std::string> oracle;
    std::mt19937_64 rng(11);
    {
      auto idx = open_or_die(o);
      ASSERT_NE(idx, nullptr);
      for (std::uint64_t i = 0; i < 24000; ++i) {
        const std::string k = key_of(kt, i);
        const std::string v = kt == KeyType::bytes ? value_of(rng, 40) : encode_u64(rng());
        ASSERT_EQ(idx->insert(k, v), Code::ok);
        oracle[k] = v;
      }
      for (std::uint64_t i = 0; i < 24000; i += 5) {
        ASSERT_EQ(idx->remove(key_of(kt, i)), Code::ok);
        oracle.erase(key_of(kt, i));
      }
      // no close(): both opens below recover a crashed pool
    }
    const std::string copy = dir.file("p1.pool");
    std::filesystem::copy_file(o.path, copy);
    std::string trees[2];
    unsigned used[2] = {0, 0};
    for (int run = 0; run < 2; ++run) {
      Options r = o;
      r.path = run == 0 ? copy : o.path;
      r.recovery_threads = run == 0 ? 1 : 4;
      auto idx = open_or_die(r);
      ASSERT_NE(idx, nullptr);
      ASSERT_TRUE(idx->verify().ok());
      expect_matches(*idx, oracle);
      const auto* fp = dynamic_cast<const fptree::FPTree<8>*>(idx.get());
      ASSERT_NE(fp, nullptr);
      trees[run] = fp->describe_inner();
      used[run] = idx->recovery_stats().threads;
      std::printf("%s keys, %u recovery thread(s): rebuild %.4f s, open %.4f s\n",
                  kt == KeyType::bytes ? "bytes" : "u64", idx->recovery_stats().threads,
                  fp->rebuild_seconds(), idx->recovery_stats().seconds);
      EXPECT_GT(fp->rebuild_seconds(), 0.0);
      EXPECT_LE(fp->rebuild_seconds(), idx->recovery_stats().seconds);
      EXPECT_EQ(idx->recovery_stats().records, oracle.size());
    }
    EXPECT_EQ(used[0], 1u);
    EXPECT_EQ(used[1], 4u);
    EXPECT_GT(trees[0].size(), 1000u);
    EXPECT_EQ(trees[0], trees[1]);
  }
}

// The per-leaf pass's checks still refuse a bad pool when they run on several threads.
TEST(FPTreeParallelRecovery, RefusesOutOfOrderLeavesWithFourThreads) {
  TempDir dir;
  Options o = options(kSmall, KeyType::u64, 8);
  o.path = dir.file("bad.pool");
  o.pool_size = 16 << 20;
  std::uint64_t last_leaf_key_off = 0;
  {
    auto idx = open_or_die(o);
    ASSERT_NE(idx, nullptr);
    for (std::uint64_t i = 1; i <= 12000; ++i) ASSERT_EQ(idx->insert(encode_u64(i), encode_u64(i)), Code::ok);
    // Find the slot holding the largest key and make it the smallest: keys out of order.
    ASSERT_TRUE(idx->close().ok());
  }
  {
    auto r = Index::open(o);
    ASSERT_TRUE(r.ok());
    auto& idx = *r;
    const auto* fp = dynamic_cast<const fptree::FPTree<8>*>(idx.get());
    ASSERT_NE(fp, nullptr);
    const std::string tree = fp->describe_inner();
    // The last leaf's offset is the first number on the last line.
    const std::size_t start = tree.rfind('\n', tree.size() - 2) + 1;
    const std::uint64_t last_leaf = std::stoull(tree.substr(start));
    auto* l = const_cast<fptree::Leaf<8>*>(idx->pool().at<fptree::Leaf<8>>(last_leaf));
    const unsigned s = static_cast<unsigned>(std::countr_zero(l->bitmap));
    last_leaf_key_off = last_leaf + offsetof(fptree::Leaf<8>, kv) + s * 16;
    l->kv[s][0] = 0;  // key 0 in the last leaf: below every key before it
  }
  ASSERT_NE(last_leaf_key_off, 0u);
  Options r = o;
  r.recovery_threads = 4;
  auto bad = Index::open(r);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::corrupted);
  EXPECT_NE(bad.status().message().find("out of key order"), std::string::npos)
      << bad.status().to_string();
}

}  // namespace
}  // namespace pmindex

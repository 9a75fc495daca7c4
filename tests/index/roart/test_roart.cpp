// The registered index `roart` through the native API: key modes and edge keys, the test kit's
// random driver against std::map (map_checker.h) with verify() after every op on key sets that
// split, grow and shrink leaf arrays, scans from many start keys stopping early, reopen after
// close and after a crash, and verify() fed known-bad cases (it must fail on each).
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <tuple>

#include "index/common/map_checker.h"
#include "index/roart/roart.h"
#include "support/temp_dir.h"

namespace pmindex {
namespace {

Options roart_options(const std::string& path, KeyType kt = KeyType::bytes,
                      std::uint32_t max_value = 8) {
  Options o;
  o.kind = "roart";
  o.path = path;
  o.pool_size = 32 << 20;
  o.key_type = kt;
  o.max_key_size = kt == KeyType::bytes ? 512 : 8;
  o.max_value_size = max_value;
  return o;
}

std::unique_ptr<Index> open_ok(const Options& o) {
  auto r = Index::open(o);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? std::move(r).value() : nullptr;
}

roart::Roart& as_roart(Index& idx) { return static_cast<roart::Roart&>(idx); }

TEST(Roart, EdgeKeysInU64Mode) {
  auto idx = open_ok(roart_options("", KeyType::u64));
  ASSERT_NE(idx, nullptr);
  const std::uint64_t keys[] = {0, 1, ~std::uint64_t{0}, std::uint64_t{1} << 63, 0xff00ff00ff00ff00ull, 256};
  for (std::uint64_t k : keys) ASSERT_EQ(idx->insert(encode_u64(k), encode_u64(k ^ 5)), Code::ok);
  for (std::uint64_t k : keys) {
    std::string v;
    ASSERT_EQ(idx->find(encode_u64(k), &v), Code::ok);
    EXPECT_EQ(decode_u64(v), k ^ 5);
  }
  EXPECT_EQ(idx->insert(encode_u64(0), encode_u64(1)), Code::already_present);
  EXPECT_EQ(idx->insert("short", encode_u64(1)), Code::invalid_argument);
  ScanBuffer out;
  ASSERT_EQ(idx->scan(encode_u64(1), 10, out), 5u);  // all but key 0
  EXPECT_EQ(decode_u64(out.key(0)), 1u);
  EXPECT_EQ(decode_u64(out.key(1)), 256u);
  EXPECT_EQ(decode_u64(out.key(4)), ~std::uint64_t{0});
  EXPECT_TRUE(idx->verify().ok());
}

TEST(Roart, EmptyNulAndPrefixKeys) {
  auto idx = open_ok(roart_options(""));
  ASSERT_NE(idx, nullptr);
  const std::string keys[] = {"", std::string(1, '\0'), std::string(2, '\0'), "a", std::string("a\0", 2),
                              "ab", "abc", std::string("a\0b", 3), "\xff", "\xff\xff"};
  for (const auto& k : keys) ASSERT_EQ(idx->insert(k, encode_u64(k.size())), Code::ok);
  std::map<std::string, int> m;
  for (const auto& k : keys) m[k] = 1;
  ScanBuffer out;
  ASSERT_EQ(idx->scan("", 100, out), m.size());
  std::size_t i = 0;
  for (const auto& [k, v] : m) EXPECT_EQ(out.key(i++), k);
  EXPECT_EQ(idx->find("", nullptr), Code::ok);
  EXPECT_EQ(idx->remove(""), Code::ok);
  EXPECT_EQ(idx->find("", nullptr), Code::not_found);
  EXPECT_TRUE(idx->verify().ok());
}

// Keys drawn for the hard cases: u64 keys sharing long prefixes (a few high bytes vary), byte
// keys of 0-11 bytes over {0x00, 0x01, a, b, z, 0xff} (NUL bytes, prefix keys, the empty key),
// values of 0-100 bytes in the out-of-line mode.
std::string draw_key(KeyType kt, std::mt19937_64& rng) {
  if (kt == KeyType::u64) return encode_u64((rng() % 64) << 56 | (rng() % 64) << 8 | rng() % 4);
  std::string k(rng() % 12, '\0');
  for (char& c : k) c = "\0\1abz\xff"[rng() % 6];
  return k;
}

using RandomParam = std::tuple<KeyType, std::uint32_t>;
class RoartRandom : public ::testing::TestWithParam<RandomParam> {};

// The kit's random driver with verify() after every op: arrays grow (8 -> 16 -> 32 -> 64
// slots) and split in the grow phase, shrink in the shrink phase; then a clean reopen and a
// recovery after a crash, each compared with the model in full.
TEST_P(RoartRandom, AgainstStdMapWithVerifyAfterEveryOp) {
  const auto [kt, max_value] = GetParam();
  pmindex::testing::TempDir dir;
  pmindex::testing::MapChecker c(roart_options(dir.file("r.pool"), kt, max_value));
  ASSERT_TRUE(c.ok()) << c.open_status().to_string();
  const pmindex::testing::Gen keys = [kt](std::mt19937_64& rng) { return draw_key(kt, rng); };
  const pmindex::testing::Gen values = [mv = max_value](std::mt19937_64& rng) {
    std::string v = encode_u64(rng());
    if (mv > 8) v.assign(rng() % (mv + 1), static_cast<char>('a' + rng() % 26));
    return v;
  };
  using pmindex::testing::grow_phase;
  using pmindex::testing::shrink_phase;
  const pmindex::testing::RandomStats st =
      c.run({.phases = {grow_phase(2000), shrink_phase(1500)}, .seed = 11}, keys, values);
  EXPECT_GT(st.grew, 0u);
  EXPECT_GT(st.shrank, 0u);
  ASSERT_TRUE(c.reopen(/*clean=*/true));
  c.run({.phases = {pmindex::testing::mixed_phase(300)}, .seed = 12}, keys, values);
  ASSERT_TRUE(c.reopen(/*clean=*/false));
  c.run({.phases = {pmindex::testing::mixed_phase(300)}, .seed = 13}, keys, values);
}

INSTANTIATE_TEST_SUITE_P(KeysAndValues, RoartRandom,
                         ::testing::Values(RandomParam{KeyType::u64, 8},
                                           RandomParam{KeyType::bytes, 8},
                                           RandomParam{KeyType::bytes, 100}));

// Enough records for many splits, every size class, and shrinks after removes; scans from
// random start keys with small limits agree with std::map.
TEST(Roart, SplitsGrowsShrinksAndScans) {
  auto idx = open_ok(roart_options("", KeyType::u64));
  ASSERT_NE(idx, nullptr);
  roart::Roart& r = as_roart(*idx);
  std::mt19937_64 rng(5);
  std::map<std::string, std::string> m;
  for (int i = 0; i < 6000; ++i) {
    const std::string k = encode_u64(i % 2 == 0 ? rng() : std::uint64_t(i) * 7);
    const std::string v = encode_u64(i);
    const Code c = idx->insert(k, v);
    ASSERT_EQ(c, m.count(k) ? Code::already_present : Code::ok);
    m.emplace(k, v);
  }
  ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
  EXPECT_GT(r.splits(), 50u);
  EXPECT_GT(r.grows(), 50u);
  EXPECT_EQ(idx->size(), m.size());
  for (int t = 0; t < 300; ++t) {
    const std::string start = encode_u64(rng());
    const std::size_t max = rng() % 150;
    ScanBuffer out;
    idx->scan(start, max, out);
    auto it = m.lower_bound(start);
    std::size_t i = 0;
    for (; it != m.end() && i < max; ++it, ++i) {
      ASSERT_LT(i, out.size());
      ASSERT_EQ(out.key(i), it->first);
      ASSERT_EQ(out.value(i), it->second);
    }
    ASSERT_EQ(out.size(), i);
  }
  // Updates out of place, then removes of most keys: arrays shrink.
  int n = 0;
  for (auto it = m.begin(); it != m.end(); ++n) {
    if (n % 3 == 0) {
      ASSERT_EQ(idx->update(it->first, "updated!"), Code::ok);
      it->second = "updated!";
      ++it;
    } else {
      ASSERT_EQ(idx->remove(it->first), Code::ok);
      it = m.erase(it);
    }
  }
  ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
  EXPECT_GT(r.shrinks(), 10u);
  ScanBuffer out;
  ASSERT_EQ(idx->scan("", m.size() + 5, out), m.size());
  std::size_t i = 0;
  for (const auto& [k, v] : m) {
    ASSERT_EQ(out.key(i), k);
    ASSERT_EQ(out.value(i++), v);
  }
}

// Both scan paths (the prefix-word sort, the default, and copy-first, PMINDEX_ROART_SCAN)
// return std::map's records from random starts, on keys whose first 8 bytes often tie (a
// 10-byte shared prefix): the test checks that many adjacent answers tie on their prefix
// words, so an order by prefix word alone (no tie-break by full key) could not pass it.
TEST(Roart, BothScanPathsAgreeWithStdMap) {
  for (const bool copy_first : {false, true}) {
    if (copy_first) ::setenv("PMINDEX_ROART_SCAN", "copy_first", 1);
    auto idx = open_ok(roart_options(""));
    ::unsetenv("PMINDEX_ROART_SCAN");
    ASSERT_NE(idx, nullptr);
    std::mt19937_64 rng(11);
    std::map<std::string, std::string> m;
    for (int i = 0; i < 4000; ++i) {
      const std::string k = i % 2 == 0 ? "shared/pre" + std::to_string(rng() % 100000)
                                       : encode_u64(rng());
      if (idx->insert(k, encode_u64(i)) == Code::ok) m.emplace(k, encode_u64(i));
    }
    ASSERT_GT(as_roart(*idx).splits(), 20u);
    std::size_t tie_broken = 0;  // scans whose answer depends on keys past the 8-byte prefix
    for (int t = 0; t < 400; ++t) {
      const std::string start =
          t % 2 == 0 ? "shared/pre" + std::to_string(rng() % 100000) : encode_u64(rng());
      const std::size_t max = 1 + rng() % 120;
      ScanBuffer out;
      idx->scan(start, max, out);
      auto it = m.lower_bound(start);
      std::size_t i = 0;
      for (; it != m.end() && i < max; ++it, ++i) {
        ASSERT_LT(i, out.size()) << "copy_first " << copy_first;
        ASSERT_EQ(out.key(i), it->first) << "copy_first " << copy_first;
        ASSERT_EQ(out.value(i), it->second);
        if (i > 0 && out.key(i).substr(0, 8) == out.key(i - 1).substr(0, 8)) ++tie_broken;
      }
      ASSERT_EQ(out.size(), i);
    }
    EXPECT_GT(tie_broken, 100u) << "the keys must tie on their prefix words";
  }
}

// An array left empty leaves the trie (A3e): after removing every key only the tail is left,
// and the index takes as many records again.
TEST(Roart, EmptiedArraysLeaveTheTrie) {
  auto idx = open_ok(roart_options("", KeyType::u64));
  ASSERT_NE(idx, nullptr);
  roart::Roart& r = as_roart(*idx);
  for (std::uint64_t k = 0; k < 3000; ++k) ASSERT_EQ(idx->insert(encode_u64(k * 5), encode_u64(k)), Code::ok);
  const std::uint64_t arrays = r.array_count_for_testing();
  EXPECT_GT(arrays, 40u);
  for (std::uint64_t k = 0; k < 3000; k += 2) ASSERT_EQ(idx->remove(encode_u64(k * 5)), Code::ok);
  ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
  for (std::uint64_t k = 1; k < 3000; k += 2) ASSERT_EQ(idx->remove(encode_u64(k * 5)), Code::ok);
  ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
  EXPECT_EQ(r.array_count_for_testing(), 1u);
  for (std::uint64_t k = 0; k < 3000; ++k) ASSERT_EQ(idx->insert(encode_u64(k * 7), encode_u64(k)), Code::ok);
  ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
  ScanBuffer out;
  ASSERT_EQ(idx->scan(encode_u64(7 * 100), 10, out), 10u);
  EXPECT_EQ(decode_u64(out.key(0)), 700u);
}

// M0-M5: removing every other key of ascending runs leaves half-full arrays; an array whose
// last remove leaves it at 16 records merges with a neighbour holding 16 (leftward: its right
// neighbour is still full then). Arrays roughly halve; every kept key and scans stay right,
// and the merged arrays fill and split again. Bytes keys with a 20-byte shared prefix too
// (the left neighbour is found among the entries after the 8-byte hint).
TEST(Roart, UnderfullArraysMerge) {
  for (const KeyType kt : {KeyType::u64, KeyType::bytes}) {
    SCOPED_TRACE(kt == KeyType::u64 ? "u64" : "bytes");
    auto idx = open_ok(roart_options("", kt));
    ASSERT_NE(idx, nullptr);
    roart::Roart& r = as_roart(*idx);
    auto key = [&](std::uint64_t k) {
      return kt == KeyType::u64 ? encode_u64(k) : "shared/prefix/twenty" + encode_u64(k);
    };
    constexpr std::uint64_t kN = 4000;
    for (std::uint64_t k = 0; k < kN; ++k) ASSERT_EQ(idx->insert(key(k), encode_u64(k)), Code::ok);
    const std::uint64_t arrays = r.array_count_for_testing();
    for (std::uint64_t k = 0; k < kN; k += 2) ASSERT_EQ(idx->remove(key(k)), Code::ok);
    ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
    EXPECT_GT(r.merges(), arrays / 3);
    EXPECT_LT(r.array_count_for_testing(), arrays * 2 / 3);
    for (std::uint64_t k = 0; k < kN; ++k)
      ASSERT_EQ(idx->find(key(k), nullptr), k % 2 == 1 ? Code::ok : Code::not_found) << k;
    ScanBuffer out;
    ASSERT_EQ(idx->scan(key(1001), 100, out), 100u);
    for (std::size_t j = 0; j < out.size(); ++j) ASSERT_EQ(out.key(j), key(1001 + 2 * j));
    for (std::uint64_t k = 0; k < kN; k += 2) ASSERT_EQ(idx->insert(key(k), encode_u64(k)), Code::ok);
    ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
    EXPECT_EQ(idx->size(), kN);
  }
}

TEST(Roart, ReopenAfterCloseAndAfterCrash) {
  pmindex::testing::TempDir dir;
  const Options o = roart_options(dir.file("r.pool"), KeyType::bytes, 64);
  std::map<std::string, std::string> m;
  {
    auto idx = open_ok(o);
    ASSERT_NE(idx, nullptr);
    for (int i = 0; i < 3000; ++i) {
      const std::string k = "key" + std::to_string(i * 7919 % 10007);
      const std::string v(i % 60, static_cast<char>('a' + i % 26));
      if (idx->insert(k, v) == Code::ok) m[k] = v;
    }
    ASSERT_TRUE(idx->close().ok());
  }
  for (bool clean : {false, true}) {
    auto idx = open_ok(o);
    ASSERT_NE(idx, nullptr);
    ASSERT_TRUE(as_roart(*idx).wait_recovery_walk().ok());
    EXPECT_EQ(idx->recovery_stats().records, m.size());
    EXPECT_EQ(idx->size(), m.size());
    for (const auto& [k, v] : m) {
      std::string got;
      ASSERT_EQ(idx->find(k, &got), Code::ok);
      ASSERT_EQ(got, v);
    }
    ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
    for (int i = 0; i < 500; ++i) {
      const std::string k = "new" + std::to_string(i) + (clean ? "c" : "d");
      ASSERT_EQ(idx->insert(k, "x"), Code::ok);
      m[k] = "x";
    }
    if (clean) {
      ASSERT_TRUE(idx->close().ok());
    }
    // !clean: destroyed without close, as a crash leaves it
  }
}

// verify() must fail on each kind of damage it claims to check.
TEST(Roart, VerifyCatchesKnownBadCases) {
  for (int what = 0; what < 4; ++what) {
    auto idx = open_ok(roart_options("", KeyType::u64));
    ASSERT_NE(idx, nullptr);
    for (std::uint64_t k = 0; k < 500; ++k) ASSERT_EQ(idx->insert(encode_u64(k * 3), encode_u64(k)), Code::ok);
    ASSERT_TRUE(idx->verify().ok());
    ASSERT_GT(as_roart(*idx).splits(), 0u);
    as_roart(*idx).corrupt_for_testing(what);
    const Status s = idx->verify();
    EXPECT_FALSE(s.ok()) << "damage " << what << " not caught";
  }
}

TEST(Roart, RefusesNodeSizeAndHugeKeys) {
  Options o = roart_options("");
  o.node_size = 256;
  EXPECT_FALSE(Index::open(o).ok());
  o = roart_options("");
  o.max_key_size = art::kMaxKeyBytes + 1;
  EXPECT_FALSE(Index::open(o).ok());
}

}  // namespace
}  // namespace pmindex

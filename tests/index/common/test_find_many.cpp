// Index::find_many for every registered index kind (issue 17): batched answers against find and
// against a std::map oracle, over random batches of present and absent keys, duplicates
// within a batch, malformed keys, and batch sizes 0, 1, 7, 32 (one group) and 100 (groups of
// kFindBatch plus a remainder). The comparison must be able to fail: a wrapper whose batched
// lookup drops one answer per group is caught by it.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "index/common/find_many_faults.h"
#include "pmindex/index.h"
#include "support/temp_dir.h"

namespace pmindex {
namespace {

using Oracle = std::map<std::uint64_t, std::uint64_t>;

// The first disagreement of find_many over `keys` with find and with the oracle (a key absent
// from the oracle must be not_found; a malformed key must get find's code); empty if none.
std::string check_batch(const Index& idx, const std::vector<std::string>& keys,
                        const Oracle& oracle, bool with_values) {
  std::vector<std::string_view> views(keys.begin(), keys.end());
  std::vector<std::string> values(with_values ? keys.size() : 0);
  std::vector<Code> codes(keys.size(), Code::io_error);
  if (Code c = idx.find_many(views, values, codes); c != Code::ok)
    return "find_many answered " + std::string(to_string(c));
  for (std::size_t i = 0; i < keys.size(); ++i) {
    std::ostringstream where;
    where << "batch of " << keys.size() << ", position " << i << ": ";
    std::string one;
    const Code single = idx.find(keys[i], &one);
    if (codes[i] != single)
      return where.str() + "find_many " + std::string(to_string(codes[i])) + ", find " +
             std::string(to_string(single));
    if (keys[i].size() != 8) continue;  // malformed: find's code is the answer
    const auto it = oracle.find(decode_u64(keys[i]));
    const Code want = it == oracle.end() ? Code::not_found : Code::ok;
    if (codes[i] != want) return where.str() + "find_many " + std::string(to_string(codes[i])) +
                                 ", oracle " + std::string(to_string(want));
    if (with_values && want == Code::ok && values[i] != encode_u64(it->second))
      return where.str() + "wrong value";
  }
  return {};
}

// Every key of the oracle, in key order (neighbouring keys share leaves), in batches of 32;
// the first failure, or "".
std::string check_present_in_batches(const Index& idx, const Oracle& oracle) {
  std::vector<std::string> all;
  for (const auto& [k, v] : oracle) all.push_back(encode_u64(k));
  for (std::size_t i = 0; i < all.size(); i += 32) {
    const auto from = all.begin() + static_cast<std::ptrdiff_t>(i);
    const std::vector<std::string> keys(from, from + static_cast<std::ptrdiff_t>(
                                                         std::min<std::size_t>(32, all.size() - i)));
    if (std::string err = check_batch(idx, keys, oracle, true); !err.empty()) return err;
  }
  return "";
}

// Random batches over [0, key_space): about half the keys present, some repeated, one
// malformed key now and then.
std::vector<std::string> random_batch(std::mt19937_64& rng, std::size_t n,
                                      std::uint64_t key_space) {
  std::vector<std::string> keys;
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned r = static_cast<unsigned>(rng() % 16);
    if (r == 0 && !keys.empty()) keys.push_back(keys[rng() % keys.size()]);  // duplicate
    else if (r == 1) keys.push_back("short");
    else keys.push_back(encode_u64(rng() % key_space));
  }
  return keys;
}

class FindMany : public ::testing::TestWithParam<std::string> {};

TEST_P(FindMany, MatchesFindAndOracle) {
  Options o;
  o.kind = GetParam();
  o.persistence = pm::Mode::dram;
  o.expected_records = 20000;
  auto r = Index::open(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  Index& idx = **r;
  std::mt19937_64 rng(17);
  Oracle oracle;
  constexpr std::uint64_t kSpace = 40000;  // several inner levels for every tree
  for (int i = 0; i < 20000; ++i) {
    const std::uint64_t k = rng() % kSpace;
    const std::uint64_t v = rng();
    if (idx.insert(encode_u64(k), encode_u64(v)) == Code::ok) oracle.emplace(k, v);
  }
  for (int i = 0; i < 3000; ++i) {  // removals too: some leaves shrink or go
    const std::uint64_t k = rng() % kSpace;
    if (idx.remove(encode_u64(k)) == Code::ok) oracle.erase(k);
  }
  ASSERT_TRUE(idx.verify().ok());
  for (const std::size_t n : {0, 1, 7, 32, 100}) {
    for (int round = 0; round < 40; ++round) {
      const auto keys = random_batch(rng, n, kSpace);
      const bool with_values = round % 4 != 3;  // presence-only batches too
      const std::string err = check_batch(idx, keys, oracle, with_values);
      ASSERT_TRUE(err.empty()) << err;
    }
  }
  EXPECT_EQ(check_present_in_batches(idx, oracle), "");
}

// Byte-string keys (kinds that take them): batched answers against find and a std::map, with
// keys of 1..24 bytes sharing prefixes (tries branch deep, separator copies compare bytes).
TEST_P(FindMany, BytesKeysMatchFindAndOracle) {
  Options o;
  o.kind = GetParam();
  o.persistence = pm::Mode::dram;
  o.expected_records = 5000;
  o.key_type = KeyType::bytes;
  o.max_key_size = 24;
  auto r = Index::open(o);
  if (!r.ok()) GTEST_SKIP() << o.kind << " takes no byte-string keys: " << r.status().to_string();
  Index& idx = **r;
  std::mt19937_64 rng(29);
  auto random_key = [&] {
    std::string k = "key/" + std::to_string(rng() % 3000);
    k.resize(std::min<std::size_t>(24, k.size() + rng() % 12), static_cast<char>('a' + rng() % 3));
    return k;
  };
  std::map<std::string, std::string> oracle;
  for (int i = 0; i < 5000; ++i) {
    const std::string k = random_key();
    const std::string v = encode_u64(rng());
    if (idx.insert(k, v) == Code::ok) oracle.emplace(k, v);
  }
  for (const std::size_t n : {1, 7, 32, 100}) {
    for (int round = 0; round < 20; ++round) {
      std::vector<std::string> keys;
      for (std::size_t i = 0; i < n; ++i) keys.push_back(random_key());
      std::vector<std::string_view> views(keys.begin(), keys.end());
      std::vector<std::string> values(n);
      std::vector<Code> codes(n);
      ASSERT_EQ(idx.find_many(views, values, codes), Code::ok);
      for (std::size_t i = 0; i < n; ++i) {
        const auto it = oracle.find(keys[i]);
        ASSERT_EQ(codes[i], it == oracle.end() ? Code::not_found : Code::ok) << keys[i];
        if (it != oracle.end()) {
          ASSERT_EQ(values[i], it->second) << keys[i];
        }
      }
    }
  }
}

// After a reopen without close (recovery as after a crash), the batch is the first reader of
// every node it meets: kinds that rebuild volatile state at first touch (roart's leaf arrays,
// A9) do it inside the batched probes, and a kind's batch must still agree with find.
TEST_P(FindMany, FirstLookupsAfterACrashReopen) {
  pmindex::testing::TempDir dir;
  Options o;
  o.kind = GetParam();
  o.path = dir.file("find_many.pool");
  o.pool_size = 64 << 20;
  o.expected_records = 20000;
  Oracle oracle;
  std::mt19937_64 rng(23);
  constexpr std::uint64_t kSpace = 30000;
  {
    auto r = Index::open(o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    for (int i = 0; i < 10000; ++i) {
      const std::uint64_t k = rng() % kSpace, v = rng();
      if ((*r)->insert(encode_u64(k), encode_u64(v)) == Code::ok) oracle.emplace(k, v);
    }
  }  // no close: the next open recovers
  auto r = Index::open(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(check_present_in_batches(**r, oracle), "");
  for (int round = 0; round < 20; ++round) {
    const std::string err = check_batch(**r, random_batch(rng, 32, kSpace), oracle, true);
    ASSERT_TRUE(err.empty()) << err;
  }
}

TEST_P(FindMany, RefusesMismatchedSpans) {
  Options o;
  o.kind = GetParam();
  o.persistence = pm::Mode::dram;
  o.expected_records = 1000;
  auto r = Index::open(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const std::string k = encode_u64(1);
  const std::string_view keys[2] = {k, k};
  std::string values[1];
  Code codes[2] = {Code::io_error, Code::io_error};
  EXPECT_EQ((*r)->find_many(keys, values, codes), Code::invalid_argument);
  EXPECT_EQ((*r)->find_many(keys, {}, std::span<Code>(codes, 1)), Code::invalid_argument);
  EXPECT_EQ(codes[0], Code::io_error) << "a refused call must look nothing up";
  EXPECT_EQ((*r)->find_many(keys, {}, codes), Code::ok);
  EXPECT_EQ(codes[1], Code::not_found);
}

INSTANTIATE_TEST_SUITE_P(AllKinds, FindMany, ::testing::ValuesIn(IndexRegistry::names()),
                         [](const auto& p) { return p.param; });

TEST(FindManyChecker, CatchesALostAnswer) {
  Options o;
  o.kind = "reflist";
  o.persistence = pm::Mode::dram;
  auto r = Index::open(o);
  ASSERT_TRUE(r.ok());
  index_test::DropsLast idx(std::move(*r));
  Oracle oracle;
  for (std::uint64_t k = 0; k < 64; ++k) {
    ASSERT_EQ(idx.insert(encode_u64(k), encode_u64(k)), Code::ok);
    oracle.emplace(k, k);
  }
  std::vector<std::string> keys;
  for (std::uint64_t k = 0; k < 7; ++k) keys.push_back(encode_u64(k));
  EXPECT_FALSE(check_batch(idx, keys, oracle, true).empty());
  keys.pop_back();
  keys.push_back(encode_u64(1000));  // absent: dropping its answer changes nothing
  EXPECT_TRUE(check_batch(idx, keys, oracle, true).empty());
}

}  // namespace
}  // namespace pmindex

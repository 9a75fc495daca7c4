// The reference index against std::map, with verify() after every operation, plus reopen,
// key types and bad input.
#include <gtest/gtest.h>

#include <cstring>
#include <iostream>
#include <map>
#include <random>

#include "index/common/map_checker.h"
#include "index/reflist/layout.h"
#include "pmindex/index.h"
#include "support/temp_dir.h"

namespace pmindex {
namespace {

using namespace pmindex::testing;

// The kit's random driver (index/common/map_checker.h) over byte keys with NUL bytes and the
// empty key, verify() after every op, then recovery after a crash and after a clean close.
TEST(RefList, RandomizedAgainstStdMap) {
  TempDir dir;
  Options o;
  o.kind = "reflist";
  o.path = dir.file("r.pool");
  o.pool_size = 4 << 20;
  o.key_type = KeyType::bytes;
  o.max_key_size = 16;
  o.max_value_size = 16;
  MapChecker c(o);
  ASSERT_TRUE(c.ok()) << c.open_status().to_string();
  auto rand_str = [](std::size_t maxlen) {
    return [maxlen](std::mt19937_64& rng) {
      std::string s(std::uniform_int_distribution<std::size_t>(0, maxlen)(rng), '\0');
      for (char& ch : s) ch = static_cast<char>(std::uniform_int_distribution<int>(0, 3)(rng));
      return s;
    };
  };
  const RandomStats st = c.run({.phases = {grow_phase(1500), shrink_phase(1500)}, .seed = 7},
                               rand_str(4), rand_str(16));
  EXPECT_GT(st.grew, 0u);
  EXPECT_GT(st.shrank, 0u);
  ASSERT_TRUE(c.reopen(/*clean=*/false));
  ASSERT_TRUE(c.reopen(/*clean=*/true));
}

// verify() must be able to fail. Layout (src/index/reflist/layout.h): the root's head word
// at byte 8, a record's next word at byte 0, both link words (offset and tag). Each damage is
// planted behind the index's back.
TEST(RefList, VerifyCatchesCorruption) {
  for (int what = 0; what < 3; ++what) {
    Options o;
    o.pool_size = 1 << 20;
    auto idx = open_or_die(o);
    ASSERT_NE(idx, nullptr);
    for (std::uint64_t k = 1; k <= 5; ++k)
      ASSERT_EQ(idx->insert(encode_u64(k), encode_u64(k)), Code::ok);
    ASSERT_TRUE(idx->verify().ok());
    char* base = idx->pool().base();
    std::uint64_t head = 0;
    std::memcpy(&head, base + idx->pool().root() + 8, 8);
    ASSERT_NE(reflist::link_off(head), 0u);
    std::uint64_t word = 0;
    if (what == 0) word = head;                      // the first record points at itself
    if (what == 1) word = 0;                         // the chain ends after one record
    if (what == 2) word = idx->pool().size() + 64;   // the next record is out of bounds
    std::memcpy(base + reflist::link_off(head), &word, 8);
    const Status s = idx->verify();
    EXPECT_FALSE(s.ok()) << "damage " << what << " not detected";
    std::cout << "damage " << what << ": " << s.to_string() << "\n";
  }
}

TEST(RefList, ReopenRecoversEverythingAndFreesGarbage) {
  TempDir dir;
  Options o;
  o.path = dir.file("r.pool");
  o.pool_size = 1 << 20;
  std::uint64_t in_use = 0;
  {
    auto idx = open_or_die(o);
    for (std::uint64_t k = 0; k < 500; ++k) ASSERT_EQ(idx->insert(encode_u64(k * 7), encode_u64(~k)), Code::ok);
    for (std::uint64_t k = 0; k < 500; k += 2) ASSERT_EQ(idx->remove(encode_u64(k * 7)), Code::ok);
    in_use = idx->footprint().pm_bytes;
    // No close(): the next open recovers as after a crash.
  }
  auto idx = open_or_die(o);
  EXPECT_FALSE(idx->recovery_stats().clean_shutdown);
  EXPECT_EQ(idx->recovery_stats().records, 250u);
  EXPECT_EQ(idx->footprint().pm_bytes, in_use);
  ASSERT_TRUE(idx->verify().ok());
  std::string v;
  for (std::uint64_t k = 0; k < 500; ++k) {
    const Code c = idx->find(encode_u64(k * 7), &v);
    if (k % 2) {
      ASSERT_EQ(c, Code::ok);
      EXPECT_EQ(decode_u64(v), ~k);
    } else {
      EXPECT_EQ(c, Code::not_found);
    }
  }
  ASSERT_TRUE(idx->close().ok());
  idx.reset();
  auto again = open_or_die(o);
  EXPECT_TRUE(again->recovery_stats().clean_shutdown);
}

// A record of 16 B header + 8 B key + 8 B value is one 32 B block (the allocator's 32 B class),
// so half the records start mid-line: recovery must accept 16 B-aligned records (it used to
// require 64 B) and count 32 B per record.
TEST(RefList, SmallRecordsCost32BytesAndSurviveRecovery) {
  TempDir dir;
  Options o;
  o.path = dir.file("small.pool");
  o.pool_size = 1 << 20;
  std::uint64_t empty = 0;
  {
    auto idx = open_or_die(o);
    empty = idx->footprint().pm_bytes;
    for (std::uint64_t k = 0; k < 100; ++k)
      ASSERT_EQ(idx->insert(encode_u64(k), encode_u64(k + 1)), Code::ok);
    EXPECT_EQ(idx->footprint().pm_bytes, empty + 100 * 32);
    // No close(): the next open recovers as after a crash.
  }
  auto idx = open_or_die(o);
  ASSERT_NE(idx, nullptr);
  EXPECT_EQ(idx->recovery_stats().records, 100u);
  EXPECT_EQ(idx->footprint().pm_bytes, empty + 100 * 32);
  ASSERT_TRUE(idx->verify().ok());
  std::string v;
  for (std::uint64_t k = 0; k < 100; ++k) {
    ASSERT_EQ(idx->find(encode_u64(k), &v), Code::ok);
    EXPECT_EQ(decode_u64(v), k + 1);
  }
}

TEST(RefList, DeletingEverythingReturnsTheSpace) {
  Options o;
  o.pool_size = 1 << 20;
  auto idx = open_or_die(o);
  const std::uint64_t empty = idx->footprint().pm_bytes;
  for (std::uint64_t k = 0; k < 1000; ++k) ASSERT_EQ(idx->insert(encode_u64(k), encode_u64(k)), Code::ok);
  EXPECT_GT(idx->footprint().pm_bytes, empty);
  for (std::uint64_t k = 0; k < 1000; ++k) ASSERT_EQ(idx->remove(encode_u64(k)), Code::ok);
  EXPECT_EQ(idx->footprint().pm_bytes, empty);
}

TEST(RefList, AllU64KeysAndValuesIncludingZeroAndTopBits) {
  Options o;
  o.pool_size = 1 << 20;
  auto idx = open_or_die(o);
  const std::uint64_t keys[] = {0, 1, ~std::uint64_t{0}, std::uint64_t{1} << 63, 0x8000000000000001};
  for (auto k : keys) ASSERT_EQ(idx->insert(encode_u64(k), encode_u64(~k)), Code::ok);
  std::string v;
  for (auto k : keys) {
    ASSERT_EQ(idx->find(encode_u64(k), &v), Code::ok);
    EXPECT_EQ(decode_u64(v), ~k);
  }
  ScanBuffer buf;
  ASSERT_EQ(idx->scan(encode_u64(0), 10, buf), 5u);
  EXPECT_EQ(decode_u64(buf.key(0)), 0u);
  EXPECT_EQ(decode_u64(buf.key(4)), ~std::uint64_t{0});
}

TEST(RefList, KeySizeAndValueSizeErrors) {
  Options o;
  o.pool_size = 1 << 20;
  auto idx = open_or_die(o);
  EXPECT_EQ(idx->insert("short", encode_u64(1)), Code::invalid_argument);
  EXPECT_EQ(idx->insert(encode_u64(1), std::string(9, 'v')), Code::value_too_large);
  Options b = o;
  b.key_type = KeyType::bytes;
  b.max_key_size = 4;
  auto bidx = open_or_die(b);
  EXPECT_EQ(bidx->insert("12345", "v"), Code::key_too_large);
  EXPECT_EQ(bidx->insert("", "v"), Code::ok);
  EXPECT_EQ(bidx->insert(std::string("\0\0", 2), "w"), Code::ok);
}

TEST(RefList, DoubleKeysOrderAndNaN) {
  Options o;
  o.pool_size = 1 << 20;
  o.key_type = KeyType::f64;
  auto idx = open_or_die(o);
  for (double d : {-2.5, -0.0, 1e-300, 3.0, -1e300, 7.0}) {
    ASSERT_EQ(idx->insert(encode_f64(d), encode_u64(1)), Code::ok);
  }
  EXPECT_EQ(idx->insert(encode_f64(std::nan("")), encode_u64(1)), Code::invalid_argument);
  ScanBuffer buf;
  ASSERT_EQ(idx->scan(encode_f64(-1e308), 10, buf), 6u);
  double prev = -INFINITY;
  for (std::size_t i = 0; i < buf.size(); ++i) {
    const double d = decode_f64(buf.key(i));
    EXPECT_LE(prev, d);
    prev = d;
  }
}

TEST(RefList, PoolFullIsATypedErrorAndLosesNothing) {
  Options o;
  o.pool_size = 64 << 10;
  auto idx = open_or_die(o);
  std::uint64_t k = 0;
  Code c = Code::ok;
  for (; c == Code::ok; ++k) c = idx->insert(encode_u64(k), encode_u64(k));
  EXPECT_EQ(c, Code::pool_full);
  ASSERT_TRUE(idx->verify().ok());
  std::string v;
  for (std::uint64_t j = 0; j + 1 < k; ++j) ASSERT_EQ(idx->find(encode_u64(j), &v), Code::ok);
}

TEST(RefList, UnknownKindIsAClearError) {
  Options o;
  o.kind = "no-such-index";
  auto r = Index::open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("unknown index kind 'no-such-index'"), std::string::npos);
}

}  // namespace
}  // namespace pmindex

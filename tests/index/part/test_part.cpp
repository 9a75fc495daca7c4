// The registered index `part` through the native API: key modes and edge keys, the test kit's
// random driver against std::map (map_checker.h) with out-of-line values, reopen after close and after a crash, a stale prefix met by recovery (a crash
// between P5 and P6) and repaired by a writer (P7), damage found by the first touch and the
// recovery walk, and the time to the first answered lookup.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "index/common/map_checker.h"
#include "index/part/part.h"
#include "support/temp_dir.h"

namespace pmindex {
namespace {

Options part_options(const std::string& path, KeyType kt = KeyType::bytes, std::uint32_t max_value = 8) {
  Options o;
  o.kind = "part";
  o.path = path;
  o.pool_size = 16 << 20;
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

part::Part& as_part(Index& idx) { return static_cast<part::Part&>(idx); }

TEST(Part, EdgeKeysInU64Mode) {
  auto idx = open_ok(part_options("", KeyType::u64));
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
  EXPECT_EQ(idx->insert(encode_u64(9), "seven77"), Code::invalid_argument);
  ScanBuffer out;
  ASSERT_EQ(idx->scan(encode_u64(1), 10, out), 5u);  // all but key 0
  EXPECT_EQ(decode_u64(out.key(0)), 1u);
  EXPECT_EQ(decode_u64(out.key(1)), 256u);
  EXPECT_EQ(decode_u64(out.key(4)), ~std::uint64_t{0});
  EXPECT_TRUE(idx->verify().ok());
}

// Keys drawn for the trie's hard cases: u64 keys sharing long prefixes (a few high bytes vary),
// byte keys of 0-11 bytes over {0x00, 0x01, a, b, z, 0xff} (NUL bytes, prefix keys, the empty
// key), values of 0-100 bytes in the out-of-line mode.
std::string draw_key(KeyType kt, std::mt19937_64& rng) {
  if (kt == KeyType::u64) return encode_u64((rng() % 64) << 56 | (rng() % 64) << 8 | rng() % 4);
  std::string k(rng() % 12, '\0');
  for (char& c : k) c = "\0\1abz\xff"[rng() % 6];
  return k;
}

using RandomParam = std::tuple<KeyType, std::uint32_t>;
class PartRandom : public ::testing::TestWithParam<RandomParam> {};

// The kit's random driver (map_checker.h) with verify() after every op: nodes grow (N4 -> N16
// -> N48 -> N256) in the grow phase and shrink or collapse in the shrink phase; then a clean
// reopen and a recovery after a crash, each compared with the model in full.
TEST_P(PartRandom, AgainstStdMapWithVerifyAfterEveryOp) {
  const auto [kt, max_value] = GetParam();
  pmindex::testing::TempDir dir;
  pmindex::testing::MapChecker c(part_options(dir.file("p.pool"), kt, max_value));
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
  EXPECT_GT(st.grew, 0u) << "no node allocated";
  EXPECT_GT(st.shrank, 0u) << "no node freed";
  ASSERT_TRUE(c.reopen(/*clean=*/true));
  c.run({.phases = {pmindex::testing::mixed_phase(300)}, .seed = 12}, keys, values);
  ASSERT_TRUE(c.reopen(/*clean=*/false));
  EXPECT_EQ(c.index().insert(std::string(513, 'k'), encode_u64(1)),
            kt == KeyType::bytes ? Code::key_too_large : Code::invalid_argument);
  if (max_value > 8) {
    EXPECT_EQ(c.index().insert("k", std::string(max_value + 1, 'v')), Code::value_too_large);
  }
}

INSTANTIATE_TEST_SUITE_P(KeysAndValues, PartRandom,
                         ::testing::Values(RandomParam{KeyType::u64, 8},
                                           RandomParam{KeyType::bytes, 8},
                                           RandomParam{KeyType::bytes, 100}));

// Bulk load (B1-B2): key sets that make every node type and the trie's hard cases, loaded
// bottom-up, must read back as std::map holds them (every key, one full scan), pass verify()
// with each node type present, and then take random operations, a clean reopen and a crash
// recovery like any other tree.
std::map<std::string, std::string> bulk_model(KeyType kt, std::uint32_t max_value) {
  std::map<std::string, std::string> m;
  std::mt19937_64 rng(21);
  const auto value = [&] {
    std::string v = encode_u64(rng());
    if (max_value > 8) v.assign(rng() % (max_value + 1), static_cast<char>('a' + rng() % 26));
    return v;
  };
  // Under one 6-byte prefix per group, n children at the next byte: N4, N16, N48 and N256.
  const unsigned fanouts[] = {3, 12, 40, 200};
  for (unsigned g = 0; g < 4; ++g)
    for (unsigned c = 0; c < fanouts[g]; ++c) {
      const std::uint64_t k = std::uint64_t{g + 1} << 56 | std::uint64_t{0x4242} << 16 |
                              std::uint64_t{c * 255 / fanouts[g]} << 8 | (rng() % 2);
      m[encode_u64(k)] = value();
    }
  for (int i = 0; i < 1000; ++i) m[encode_u64(rng())] = value();  // sparse
  if (kt == KeyType::bytes) {
    m[""] = value();  // the empty key: the root node's end slot
    std::string chain;
    for (int i = 0; i < 20; ++i) m[chain += 'a'] = value();  // each key a prefix of the next
    const std::string long_prefix(300, 'p');
    for (int b = 0; b < 256; ++b) m[long_prefix + static_cast<char>(b)] = value();  // every byte
    m[long_prefix] = value();
    for (int i = 0; i < 300; ++i) m[draw_key(kt, rng)] = value();
  }
  return m;
}

class PartBulk : public ::testing::TestWithParam<RandomParam> {};

TEST_P(PartBulk, LoadsSortedInputAsTheMapHoldsIt) {
  const auto [kt, max_value] = GetParam();
  pmindex::testing::TempDir dir;
  pmindex::testing::MapChecker c(part_options(dir.file("p.pool"), kt, max_value));
  ASSERT_TRUE(c.ok()) << c.open_status().to_string();
  ASSERT_TRUE(c.bulk_load(bulk_model(kt, max_value), 1.0));
  EXPECT_EQ(c.index().size(), c.model().size());
  art::TreeStats st;
  const Status v = as_part(c.index()).verify_with(&st);
  ASSERT_TRUE(v.ok()) << v.to_string();
  EXPECT_EQ(st.records, c.model().size());
  for (int t = 1; t <= 4; ++t) EXPECT_GT(st.nodes[t], 0u) << "no node of type " << t;
  const pmindex::testing::Gen keys = [kt](std::mt19937_64& rng) { return draw_key(kt, rng); };
  const pmindex::testing::Gen values = [](std::mt19937_64& rng) { return encode_u64(rng()); };
  c.run({.phases = {pmindex::testing::mixed_phase(500)}, .seed = 22}, keys, values);
  ASSERT_TRUE(c.reopen(/*clean=*/true));
  ASSERT_TRUE(c.reopen(/*clean=*/false));
}

INSTANTIATE_TEST_SUITE_P(KeysAndValues, PartBulk,
                         ::testing::Values(RandomParam{KeyType::u64, 8},
                                           RandomParam{KeyType::bytes, 8},
                                           RandomParam{KeyType::bytes, 100}));

// Refused bulk loads change nothing: input out of order or with a duplicate, a key or value the
// tree refuses, a bad fill, a non-empty index, and a pool too small for the input (pool_full,
// every block it took freed, so a smaller load then fits in the same pool).
TEST(Part, RefusedBulkLoadsLeaveTheIndexAsItWas) {
  pmindex::testing::TempDir dir;
  Options o = part_options(dir.file("p.pool"), KeyType::bytes, 100);
  o.pool_size = 4 << 20;
  auto idx = open_ok(o);
  ASSERT_NE(idx, nullptr);
  const std::uint64_t empty_pm = idx->footprint().pm_bytes;
  const auto load = [&](std::vector<std::pair<std::string, std::string>> recs, double fill = 1.0) {
    std::vector<KeyValue> kvs;
    for (const auto& [k, v] : recs) kvs.push_back({k, v});
    return idx->bulk_load(kvs, fill).code();
  };
  EXPECT_EQ(load({{"b", "1"}, {"a", "2"}}), Code::invalid_argument);
  EXPECT_EQ(load({{"a", "1"}, {"a", "2"}}), Code::invalid_argument);
  EXPECT_EQ(load({{"a", "1"}, {std::string(513, 'k'), "2"}}), Code::key_too_large);
  EXPECT_EQ(load({{"a", "1"}, {"b", std::string(101, 'v')}}), Code::value_too_large);
  EXPECT_EQ(load({{"a", "1"}}, 0.0), Code::invalid_argument);
  EXPECT_EQ(idx->size(), 0u);
  EXPECT_EQ(idx->footprint().pm_bytes, empty_pm);

  // Inline values (a fresh index): the tree's records (32 B each) and nodes run out of room
  // in the build itself, not in the values.
  idx.reset();
  o = part_options(dir.file("q.pool"), KeyType::u64, 8);
  o.pool_size = 4 << 20;
  idx = open_ok(o);
  ASSERT_NE(idx, nullptr);
  const std::uint64_t empty_pm2 = idx->footprint().pm_bytes;
  std::vector<std::pair<std::string, std::string>> big;
  for (std::uint64_t k = 0; k < 150000; ++k) big.emplace_back(encode_u64(k * 7919), encode_u64(k));
  EXPECT_EQ(load(big), Code::pool_full);
  EXPECT_EQ(idx->size(), 0u);
  EXPECT_EQ(idx->footprint().pm_bytes, empty_pm2) << "a failed bulk load left blocks allocated";
  ASSERT_TRUE(idx->verify().ok());

  big.resize(5000);
  ASSERT_EQ(load(big), Code::ok);
  EXPECT_EQ(idx->size(), 5000u);
  const std::string extra = encode_u64(~std::uint64_t{0});
  EXPECT_EQ(load({{extra, encode_u64(1)}}), Code::invalid_argument);  // not empty any more
  EXPECT_EQ(idx->size(), 5000u);
  ASSERT_TRUE(idx->verify().ok());
  std::string v;
  EXPECT_EQ(idx->find(big[4999].first, &v), Code::ok);
  EXPECT_EQ(decode_u64(v), 4999u);
  EXPECT_EQ(idx->find(extra, &v), Code::not_found);
}

// P11: relocation moves records and nothing else changes: every record once (out-of-line
// values and bytes keys included), then only the sparse units of an ascending fill with
// every other key removed, whose records leave them (each unit the allocator reports after
// is denser); verify() and every value after each, and the tree still takes writes.
TEST(Part, RelocationMovesRecordsAndKeepsEveryValue) {
  for (const auto& [kt, max_value] : {std::pair{KeyType::u64, 8u}, std::pair{KeyType::bytes, 64u}}) {
    auto idx = open_ok(part_options("", kt, max_value));
    ASSERT_NE(idx, nullptr);
    auto key = [&](std::uint64_t i) {
      return kt == KeyType::u64 ? encode_u64(i) : encode_u64(i) + "-" + std::to_string(i % 7);
    };
    auto value = [&](std::uint64_t i) {
      return max_value == 8 ? encode_u64(i * 3) : "v" + std::to_string(i) + std::string(i % 40, 'x');
    };
    std::map<std::string, std::string> model;
    for (std::uint64_t i = 1; i <= 3000; ++i) {
      ASSERT_EQ(idx->insert(key(i), value(i)), Code::ok);
      model[key(i)] = value(i);
    }
    auto& p = as_part(*idx);
    EXPECT_EQ(p.relocate_records(part::Part::Relocate::every_record), 3000u);
    for (std::uint64_t i = 1; i <= 3000; i += 2) {
      ASSERT_EQ(idx->remove(key(i)), Code::ok);
      model.erase(key(i));
    }
    const std::size_t moved = p.relocate_records(part::Part::Relocate::sparse_units);
    EXPECT_GT(moved, 300u) << "the sparse units' records stay";
    EXPECT_LT(moved, 1500u) << "more moved than the sparse half";
    std::printf("[relocation] %s: %zu of 1500 records moved out of sparse units\n",
                kt == KeyType::u64 ? "u64, inline values" : "bytes, out-of-line values", moved);
    EXPECT_TRUE(idx->verify().ok());
    std::string got;
    for (const auto& [k, v] : model) {
      ASSERT_EQ(idx->find(k, &got), Code::ok);
      ASSERT_EQ(got, v);
    }
    for (std::uint64_t i = 1; i <= 3000; i += 2) ASSERT_EQ(idx->insert(key(i), value(i + 1)), Code::ok);
    for (std::uint64_t i = 2; i <= 3000; i += 2) ASSERT_EQ(idx->update(key(i), value(i + 5)), Code::ok);
    EXPECT_TRUE(idx->verify().ok());
    EXPECT_EQ(idx->size(), 3000u);
  }
}

TEST(Part, RefusesNodeSizeAndHugeKeys) {
  Options o = part_options("");
  o.node_size = 256;
  EXPECT_FALSE(Index::open(o).ok());
  o = part_options("");
  o.max_key_size = art::kMaxKeyBytes + 1;
  EXPECT_FALSE(Index::open(o).ok());
}

TEST(Part, ReopenAfterCloseAndAfterCrash) {
  pmindex::testing::TempDir dir;
  const Options o = part_options(dir.file("p.pool"), KeyType::bytes, 64);
  std::map<std::string, std::string> m;
  {
    auto idx = open_ok(o);
    for (int i = 0; i < 3000; ++i) {
      const std::string k = "key/" + std::to_string(i * 7919 % 3001) + std::string(i % 5, '/');
      const std::string v = std::string(i % 40, 'v') + std::to_string(i);
      if (idx->insert(k, v) == Code::ok) m[k] = v;
    }
    ASSERT_TRUE(idx->close().ok());
  }
  for (int round = 0; round < 2; ++round) {  // after a clean close, then after a "crash"
    auto idx = open_ok(o);
    ASSERT_NE(idx, nullptr);
    EXPECT_EQ(idx->recovery_stats().clean_shutdown, round == 0);
    std::string got;
    const auto& first = *m.begin();
    ASSERT_EQ(idx->find(first.first, &got), Code::ok);
    EXPECT_GT(as_part(*idx).first_answer_seconds(), 0.0);
    ASSERT_TRUE(as_part(*idx).wait_recovery_walk().ok());
    EXPECT_EQ(idx->recovery_stats().records, m.size());
    ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
    for (const auto& [k, v] : m) {
      ASSERT_EQ(idx->find(k, &got), Code::ok) << k;
      ASSERT_EQ(got, v);
    }
    // Writes after recovery; the index is destroyed without close (a crash) in round 0.
    for (int i = 0; i < 200; ++i) {
      const std::string k = "new/" + std::to_string(round) + "/" + std::to_string(i);
      ASSERT_EQ(idx->insert(k, "x"), Code::ok);
      m[k] = "x";
    }
    const std::string victim = m.begin()->first;
    ASSERT_EQ(idx->remove(victim), Code::ok);
    m.erase(victim);
    ASSERT_TRUE(idx->verify().ok());
  }
}

// Finds the child word for byte b in a node (tests only; quiescent).
std::uint64_t child_for(const pm::Pool& pool, std::uint64_t w, std::uint8_t b) {
  const auto* n = pool.at<art::NodeHeader>(art::target_of(w));
  const std::uint64_t* ch = art::children_of(n);
  for (unsigned j = 0; j < art::capacity_of(static_cast<art::NodeType>(n->type)); ++j)
    if (ch[j] != 0 && art::byte_of(ch[j]) == b) return ch[j];
  return 0;
}

// Damage: the first live child word of node `w` points outside the pool (its byte kept).
void point_first_child_outside(const pm::Pool& pool, std::uint64_t w) {
  auto* n = pool.at<art::NodeHeader>(art::target_of(w));
  std::uint64_t* ch = art::children_of(n);
  for (unsigned j = 0; j < art::capacity_of(static_cast<art::NodeType>(n->type)); ++j)
    if (ch[j] != 0) { ch[j] = art::rebyte(std::uint64_t{1} << 50, art::byte_of(ch[j])); break; }
}

// A crash between P5 (the new node published) and P6 (the old node's prefix cut) leaves the
// old node's level and prefix stale. Recovery must read it right, and a writer repairs it.
TEST(Part, RecoveryMeetsAStalePrefixAndAWriterRepairsIt) {
  pmindex::testing::TempDir dir;
  const Options o = part_options(dir.file("p.pool"));
  const std::vector<std::string> keys = {"abcdefghijk1", "abcdefghijk2", "abcdefghijk3", "abcX"};
  std::uint64_t old_shape = 0, old_prefix = 0;
  {
    auto idx = open_ok(o);
    for (std::size_t i = 0; i < 3; ++i) ASSERT_EQ(idx->insert(keys[i], encode_u64(i)), Code::ok);
    const pm::Pool& pool = idx->pool();
    const auto* root = pool.at<part::Root>(pool.root());
    auto* n = pool.at<art::NodeHeader>(art::target_of(root->top));
    old_shape = n->shape;
    old_prefix = n->prefix;
    ASSERT_EQ(art::prefix_len_of(old_shape), 11u);
    ASSERT_EQ(idx->insert(keys[3], encode_u64(3)), Code::ok);  // prefix split at "abc"
    const std::uint64_t moved = child_for(pool, root->top, 'd');
    ASSERT_TRUE(moved != 0 && !art::is_record(moved));
    auto* m = pool.at<art::NodeHeader>(art::target_of(moved));
    ASSERT_EQ(m, n);
    EXPECT_EQ(art::level_of(n->shape), 4u);
    // Undo P6 in the pool as a crash before it would have left it, then "crash".
    n->prefix = old_prefix;
    n->shape = old_shape;
  }
  auto idx = open_ok(o);
  ASSERT_NE(idx, nullptr);
  art::TreeStats st;
  ASSERT_TRUE(as_part(*idx).verify_with(&st).ok()) << as_part(*idx).verify_with(&st).to_string();
  EXPECT_EQ(st.stale_prefixes, 1u);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    std::string v;
    ASSERT_EQ(idx->find(keys[i], &v), Code::ok) << keys[i];
    EXPECT_EQ(decode_u64(v), i);
  }
  EXPECT_EQ(idx->find("abcdXfghijk1", nullptr), Code::not_found);
  ScanBuffer out;
  EXPECT_EQ(idx->scan("abcd", 10, out), 3u);
  // A writer that changes the stale node repairs it (P7).
  ASSERT_EQ(idx->insert("abcdefghijk4", encode_u64(4)), Code::ok);
  ASSERT_TRUE(as_part(*idx).verify_with(&st).ok());
  EXPECT_EQ(st.stale_prefixes, 0u);
  // A key that leaves the stale prefix in its untrusted part splits it correctly.
  ASSERT_EQ(idx->insert("abcdefgZ", encode_u64(5)), Code::ok);
  ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
  EXPECT_EQ(idx->scan("", 10, out), 6u);
}

// Damage below the root: the first touch refuses the node (corrupted), the walk reports it,
// and nothing crashes or hangs.
TEST(Part, DamagedNodeIsReportedNotFollowed) {
  pmindex::testing::TempDir dir;
  const Options o = part_options(dir.file("p.pool"));
  {
    auto idx = open_ok(o);
    for (int i = 0; i < 100; ++i) ASSERT_EQ(idx->insert("k" + std::to_string(i), encode_u64(i)), Code::ok);
    const pm::Pool& pool = idx->pool();
    const auto* root = pool.at<part::Root>(pool.root());
    const std::uint64_t child = child_for(pool, root->top, '5');
    ASSERT_NE(child, 0u);
    ASSERT_FALSE(art::is_record(child));
    point_first_child_outside(pool, child);
  }
  auto idx = open_ok(o);
  ASSERT_NE(idx, nullptr);
  EXPECT_EQ(idx->find("k55", nullptr), Code::corrupted);
  EXPECT_EQ(idx->find("k1", nullptr), Code::ok);
  EXPECT_FALSE(as_part(*idx).wait_recovery_walk().ok());
  EXPECT_FALSE(idx->verify().ok());
  EXPECT_EQ(idx->insert("k7777", encode_u64(1)), Code::corrupted);
}

// The same damage in u64 mode, met by find's flat way (Part::find -> Tree::find_word, open
// after the first answer): the damaged node, still tagged by the earlier run, is left to the
// general way, which refuses it (corrupted), before and after its first touch; other keys
// are answered. Keys the flat way must not answer itself: NaN in f64 mode, an 8-byte key
// over a bytes pool's limit.
TEST(Part, FlatFindLeavesDamageAndBadKeysToTheGeneralWay) {
  pmindex::testing::TempDir dir;
  const Options o = part_options(dir.file("p.pool"), KeyType::u64);
  std::mt19937_64 rng(17);
  std::vector<std::uint64_t> keys(2000);
  std::uint8_t top_byte = 0;
  {
    auto idx = open_ok(o);
    for (std::uint64_t& k : keys) {
      k = rng();
      ASSERT_EQ(idx->insert(encode_u64(k), encode_u64(~k)), Code::ok);
    }
    const pm::Pool& pool = idx->pool();
    const auto* root = pool.at<part::Root>(pool.root());
    top_byte = static_cast<std::uint8_t>(keys[0] >> 56);
    const std::uint64_t child = child_for(pool, root->top, top_byte);
    ASSERT_NE(child, 0u);
    ASSERT_FALSE(art::is_record(child));
    point_first_child_outside(pool, child);
  }
  auto idx = open_ok(o);
  ASSERT_NE(idx, nullptr);
  std::size_t healthy = 0;
  for (int round = 0; round < 2; ++round) {
    for (const std::uint64_t k : keys) {
      std::string v;
      const Code c = idx->find(encode_u64(k), &v);
      if (static_cast<std::uint8_t>(k >> 56) == top_byte) {
        EXPECT_EQ(c, Code::corrupted);
      } else {
        ASSERT_EQ(c, Code::ok);
        EXPECT_EQ(decode_u64(v), ~k);
        ++healthy;
      }
    }
  }
  EXPECT_GT(healthy, keys.size());
  EXPECT_GT(as_part(*idx).first_answer_seconds(), 0.0);

  auto f = open_ok(part_options("", KeyType::f64));
  ASSERT_EQ(f->insert(encode_f64(1.5), encode_u64(1)), Code::ok);
  for (int i = 0; i < 2; ++i) {  // the first answer opens the flat way, the second would use it
    EXPECT_EQ(f->find(encode_f64(1.5), nullptr), Code::ok);
    EXPECT_EQ(f->find(encode_f64(std::nan("")), nullptr), Code::invalid_argument);
  }
  Options small = part_options("");
  small.max_key_size = 4;
  auto b = open_ok(small);
  ASSERT_EQ(b->insert("abc", encode_u64(1)), Code::ok);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(b->find("abc", nullptr), Code::ok);
    EXPECT_EQ(b->find("abcdefgh", nullptr), Code::key_too_large);
  }
  auto wide = open_ok(part_options(""));  // bytes keys up to 512: 8-byte keys go the flat way
  ASSERT_EQ(wide->insert("abcdefgh", encode_u64(3)), Code::ok);
  ASSERT_EQ(wide->insert("abcdefghi", encode_u64(4)), Code::ok);  // a node at depth 8
  ASSERT_EQ(wide->insert("abcd", encode_u64(5)), Code::ok);
  for (int i = 0; i < 2; ++i) {
    std::string v;
    ASSERT_EQ(wide->find("abcdefgh", &v), Code::ok);
    EXPECT_EQ(decode_u64(v), 3u);
    EXPECT_EQ(wide->find("abcdefgX", nullptr), Code::not_found);
    EXPECT_EQ(wide->find(std::string("abcd\0fgh", 8), nullptr), Code::not_found);
  }
}

// Corrupted pools: random byte flips in the heap, a zeroed 4 KiB page, a bad root word. Each
// damaged copy opens with a clean error or answers (any code) without crashing or hanging:
// lookups, a scan, verify, writes (which wait for the recovery walk) and close.
TEST(Part, CorruptedPoolsFailCleanly) {
  pmindex::testing::TempDir dir;
  const std::string good = dir.file("good.pool");
  Options o = part_options(good, KeyType::bytes, 32);
  o.pool_size = 1 << 20;
  std::size_t heap_begin = 0, used = 0;
  {
    auto idx = open_ok(o);
    ASSERT_NE(idx, nullptr);
    for (int i = 0; i < 600; ++i)
      ASSERT_EQ(idx->insert("key" + std::to_string(i * 37 % 1000), std::string(i % 30, 'v')), Code::ok);
    heap_begin = idx->pool().heap_begin();
    used = idx->footprint().pm_reserved;
    ASSERT_TRUE(idx->close().ok());
  }
  std::ifstream in(good, std::ios::binary);
  const std::string image((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::mt19937_64 rng(99);
  const int kMutants = 40;
  int opened = 0;
  for (int m = 0; m < kMutants; ++m) {
    std::string bad = image;
    if (m % 4 == 0) {  // a zeroed page of the used heap
      const std::size_t page = heap_begin + (rng() % std::max<std::size_t>(1, used / 4096)) * 4096;
      std::memset(bad.data() + page, 0, 4096);
    } else if (m == 5) {  // a root word naming the pool header
      const std::uint64_t root_off = pm::image_root(bad.data());
      std::memset(bad.data() + root_off + 8, 0x41, 8);
    } else {
      for (int f = 0; f < 1 + m % 8; ++f) bad[heap_begin + rng() % used] ^= static_cast<char>(1 << (rng() % 8));
    }
    const std::string path = dir.file("bad" + std::to_string(m) + ".pool");
    std::ofstream(path, std::ios::binary).write(bad.data(), static_cast<std::streamsize>(bad.size()));
    Options bo = o;
    bo.path = path;
    bo.open_mode = OpenMode::open;
    auto r = Index::open(bo);
    if (!r.ok()) continue;
    ++opened;
    auto idx = std::move(r).value();
    std::string v;
    for (int i = 0; i < 1000; i += 7) (void)idx->find("key" + std::to_string(i), &v);
    ScanBuffer out;
    (void)idx->scan("", 2000, out);
    (void)idx->verify();
    (void)idx->insert("fresh", "x");
    (void)idx->remove("key37");
    (void)idx->close();
  }
  std::printf("[part corrupt] %d of %d damaged pools opened (the rest refused at open)\n", opened, kMutants);
}

}  // namespace
}  // namespace pmindex

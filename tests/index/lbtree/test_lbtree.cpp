// LB+-Tree against std::map with small leaves (256 B = 14 slots: a split every few inserts),
// verify() after every operation, all three key types and node sizes 256/512/1024 B; edge
// keys and values; reopen after close and after a "crash"; space returned after deleting
// everything; verify() catching corruption; bulk load.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <tuple>

#include "index/common/damage_checks.h"
#include "index/common/map_checker.h"
#include "index/lbtree/layout.h"
#include "pmindex/index.h"
#include "support/temp_dir.h"

namespace pmindex {
namespace {

using namespace pmindex::testing;

Options lbtree_options(std::uint32_t node_size, KeyType kt, std::uint32_t max_value = 8) {
  Options o;
  o.kind = "lbtree";
  o.pool_size = 32 << 20;
  o.node_size = node_size;
  o.key_type = kt;
  o.max_key_size = kt == KeyType::bytes ? 64 : 8;
  o.max_value_size = max_value;
  return o;
}

// Keys drawn from a small domain so inserts, updates and removes hit existing keys.
class KeyGen {
 public:
  KeyGen(KeyType kt, std::uint64_t seed) : kt_(kt), rng_(seed) {}
  std::string next() {
    const std::uint64_t r = std::uniform_int_distribution<std::uint64_t>(0, 2000)(rng_);
    switch (kt_) {
      case KeyType::u64:
        if (r == 0) return encode_u64(0);
        if (r == 1) return encode_u64(~std::uint64_t{0});
        return encode_u64(r * 0x9E3779B97F4A7C15ull);
      case KeyType::f64:
        return encode_f64((static_cast<double>(r) - 1000.0) * 1.5e-3);
      case KeyType::bytes: {
        std::mt19937_64 k(r);  // the key is a function of r: a bounded domain
        std::string s(std::uniform_int_distribution<std::size_t>(0, 12)(k), '\0');
        for (char& c : s) c = static_cast<char>(std::uniform_int_distribution<int>(0, 3)(k));
        return s;
      }
    }
    return {};
  }
  std::string value(std::uint32_t max_value) {
    const std::uint64_t v = rng_() | (std::uint64_t{1} << 63);  // top bit set
    std::string s(reinterpret_cast<const char*>(&v), 8);
    if (max_value > 8) s.resize(std::uniform_int_distribution<std::size_t>(0, max_value)(rng_), 'v');
    return s;
  }

 private:
  KeyType kt_;
  std::mt19937_64 rng_;
};

void expect_same(Index& idx, const std::map<std::string, std::string>& oracle) {
  ScanBuffer buf;
  ASSERT_EQ(idx.scan(std::string(), oracle.size() + 10, buf), oracle.size());
  std::size_t i = 0;
  for (const auto& [k, v] : oracle) {
    ASSERT_EQ(buf.key(i), k) << "at " << i;
    ASSERT_EQ(buf.value(i), v) << "at " << i;
    ++i;
  }
  std::string got;
  for (const auto& [k, v] : oracle) {
    ASSERT_EQ(idx.find(k, &got), Code::ok);
    ASSERT_EQ(got, v);
  }
}

using Param = std::tuple<std::uint32_t, KeyType, std::uint32_t>;

class LBTreeRandom : public ::testing::TestWithParam<Param> {};

// The kit's random driver: a grow phase (splits) then a shrink phase whose removes mostly hit
// live keys, so leaves drain and are unlinked; both must happen. Then reopen after a clean
// close, delete everything (the space comes back: only the root and the head leaf remain),
// and recover after a crash (no close): still empty.
TEST_P(LBTreeRandom, AgainstStdMapWithVerifyAfterEveryOp) {
  const auto [node_size, kt, max_value] = GetParam();
  TempDir dir;
  Options o = lbtree_options(node_size, kt, max_value);
  o.path = dir.file("t.pool");
  MapChecker c(o);
  ASSERT_TRUE(c.ok()) << c.open_status().to_string();
  const std::uint64_t empty_pm = c.index().footprint().pm_bytes;
  auto gen = std::make_shared<KeyGen>(kt, 11 + node_size);
  const RandomStats st =
      c.run({.phases = {grow_phase(1500), shrink_phase(1500)}, .seed = 5},
            [gen](std::mt19937_64&) { return gen->next(); },
            [gen, mv = max_value](std::mt19937_64&) { return gen->value(mv); });
  EXPECT_GT(st.grew, 0u) << "no leaf split";
  EXPECT_GT(st.shrank, 0u) << "no leaf drained";
  ASSERT_TRUE(c.reopen(/*clean=*/true));
  const Model all = c.model();
  for (const auto& [k, v] : all) ASSERT_TRUE(c.remove(k));
  ASSERT_TRUE(c.verify());
  EXPECT_EQ(c.index().footprint().pm_bytes, empty_pm);
  ASSERT_TRUE(c.reopen(/*clean=*/false));
  EXPECT_EQ(c.index().footprint().pm_bytes, empty_pm);
}

INSTANTIATE_TEST_SUITE_P(
    NodesAndKeys, LBTreeRandom,
    ::testing::Values(Param{256, KeyType::u64, 8}, Param{512, KeyType::u64, 8},
                      Param{1024, KeyType::u64, 8}, Param{256, KeyType::f64, 8},
                      Param{512, KeyType::f64, 8}, Param{256, KeyType::bytes, 8},
                      Param{512, KeyType::bytes, 8}, Param{1024, KeyType::bytes, 8},
                      Param{256, KeyType::bytes, 24}, Param{1024, KeyType::u64, 24}));

TEST(LBTree, EdgeKeysAndValues) {
  for (std::uint32_t ns : {256u, 512u, 1024u}) {
    auto idx = open_or_die(lbtree_options(ns, KeyType::u64));
    ASSERT_NE(idx, nullptr);
    std::map<std::string, std::string> oracle;
    const std::uint64_t keys[] = {0, 1, ~std::uint64_t{0}, std::uint64_t{1} << 63, 42};
    const std::uint64_t vals[] = {~std::uint64_t{0}, 0, std::uint64_t{1} << 63, 7, 0x8000000000000001ull};
    for (int i = 0; i < 5; ++i) {
      const std::string v(reinterpret_cast<const char*>(&vals[i]), 8);
      ASSERT_EQ(idx->insert(encode_u64(keys[i]), v), Code::ok);
      oracle[encode_u64(keys[i])] = v;
    }
    // Fill so the edge keys live through splits.
    for (std::uint64_t k = 100; k < 400; ++k) {
      ASSERT_EQ(idx->insert(encode_u64(k * 3), encode_u64(k)), Code::ok);
      oracle[encode_u64(k * 3)] = encode_u64(k);
    }
    ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
    expect_same(*idx, oracle);
    ASSERT_EQ(idx->insert(encode_u64(0), encode_u64(1)), Code::already_present);
    EXPECT_EQ(idx->insert("short", encode_u64(1)), Code::invalid_argument);
    EXPECT_EQ(idx->insert(encode_u64(5), "short"), Code::invalid_argument);
    ASSERT_EQ(idx->remove(encode_u64(0)), Code::ok);
    std::string got;
    EXPECT_EQ(idx->find(encode_u64(0), &got), Code::not_found);
  }
}

TEST(LBTree, VariableLengthKeys) {
  Options o = lbtree_options(256, KeyType::bytes);
  o.max_key_size = 8192;
  auto idx = open_or_die(o);
  ASSERT_NE(idx, nullptr);
  const std::string empty;
  const std::string nul("a\0b\0", 4);
  const std::string big(6000, 'x');
  std::string big2 = big;
  big2.back() = 'y';
  ASSERT_EQ(idx->insert(empty, encode_u64(1)), Code::ok);
  ASSERT_EQ(idx->insert(nul, encode_u64(2)), Code::ok);
  ASSERT_EQ(idx->insert(std::string("a", 1), encode_u64(3)), Code::ok);
  ASSERT_EQ(idx->insert(big, encode_u64(4)), Code::ok);
  ASSERT_EQ(idx->insert(big2, encode_u64(5)), Code::ok);
  EXPECT_EQ(idx->insert(std::string(8193, 'z'), encode_u64(6)), Code::key_too_large);
  std::string got;
  ASSERT_EQ(idx->find(empty, &got), Code::ok);
  EXPECT_EQ(got, encode_u64(1));
  ASSERT_EQ(idx->find(nul, &got), Code::ok);
  EXPECT_EQ(got, encode_u64(2));
  ASSERT_EQ(idx->find(big2, &got), Code::ok);
  EXPECT_EQ(got, encode_u64(5));
  EXPECT_EQ(idx->find(std::string("a\0b", 3), &got), Code::not_found);
  ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
  ScanBuffer buf;
  ASSERT_EQ(idx->scan(empty, 10, buf), 5u);
  EXPECT_EQ(buf.key(0), empty);
  EXPECT_EQ(buf.key(1), "a");
  EXPECT_EQ(buf.key(2), nul);
  // Over the creation limit.
  Options too_big = lbtree_options(256, KeyType::bytes);
  too_big.max_key_size = 8193;
  EXPECT_FALSE(Index::open(too_big).ok());
}

// Separator copies of unlinked leaves are freed while the index is open (epoch-based
// reclamation), not only at close: deleting everything brings the DRAM footprint back near
// the empty tree's, and the separators of live leaves stay readable meanwhile.
TEST(LBTree, SeparatorCopiesOfUnlinkedLeavesAreFreed) {
  Options o = lbtree_options(256, KeyType::bytes);
  o.max_key_size = 1024;
  auto idx = open_or_die(o);
  ASSERT_NE(idx, nullptr);
  auto scope = idx->attach_thread();
  const std::uint64_t empty_dram = idx->footprint().dram_bytes;
  auto key = [](int i) { return std::string(900, 'k') + std::to_string(100000 + i); };
  const int n = 3000;
  for (int i = 0; i < n; ++i) ASSERT_EQ(idx->insert(key(i), encode_u64(i)), Code::ok);
  const std::uint64_t full_dram = idx->footprint().dram_bytes;
  // Hundreds of leaves, each with a ~900 B separator copy.
  ASSERT_GT(full_dram, empty_dram + 100 * 900);
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(idx->remove(key(i)), Code::ok);
    if (i % 97 == 0) {
      std::string got;
      ASSERT_EQ(idx->find(key(n - 1), &got), Code::ok);  // a live leaf's fences still work
    }
  }
  for (int i = 0; i < 300; ++i) (void)idx->find(key(i), nullptr);  // unpins: collections
  ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
  const std::uint64_t after = idx->footprint().dram_bytes;
  EXPECT_LT(after, empty_dram + (full_dram - empty_dram) / 4)
      << "empty " << empty_dram << " full " << full_dram << " after deleting all " << after;
}

TEST(LBTree, ReopenAfterCrashKeepsEverything) {
  for (std::uint32_t ns : {256u, 1024u}) {
    TempDir dir;
    Options o = lbtree_options(ns, KeyType::u64);
    o.path = dir.file("c.pool");
    o.recovery_threads = 2;
    std::map<std::string, std::string> oracle;
    {
      auto idx = open_or_die(o);
      ASSERT_NE(idx, nullptr);
      std::mt19937_64 rng(3);
      // 30,000 keys: about 3,000 leaves of 256 B, enough for the parallel rebuild paths.
      for (int i = 0; i < 30000; ++i) {
        const std::string k = encode_u64(rng() % 100000);
        if (oracle.emplace(k, encode_u64(i)).second) { ASSERT_EQ(idx->insert(k, encode_u64(i)), Code::ok); }
      }
      for (int i = 0; i < 8000; ++i) {
        const std::string k = encode_u64(rng() % 100000);
        ASSERT_EQ(idx->remove(k), oracle.erase(k) ? Code::ok : Code::not_found);
      }
      // no close(): a crash
    }
    auto idx = open_or_die(o);
    ASSERT_NE(idx, nullptr);
    EXPECT_FALSE(idx->recovery_stats().clean_shutdown);
    EXPECT_EQ(idx->recovery_stats().records, oracle.size());
    EXPECT_EQ(idx->recovery_stats().threads, 2u);
    EXPECT_GT(idx->recovery_stats().nodes, 1000u / (ns / 256));
    ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
    expect_same(*idx, oracle);
  }
}

TEST(LBTree, BulkLoad) {
  for (std::uint32_t ns : {256u, 512u, 1024u}) {
    for (double fill : {0.7, 1.0}) {
      TempDir dir;
      Options o = lbtree_options(ns, KeyType::bytes);
      o.path = dir.file("b.pool");
      std::map<std::string, std::string> oracle;
      for (int i = 0; i < 3000; ++i) oracle["k" + std::to_string(100000 + i * 7)] = encode_u64(i);
      std::vector<KeyValue> kvs;
      for (const auto& [k, v] : oracle) kvs.push_back({k, v});
      {
        auto idx = open_or_die(o);
        ASSERT_NE(idx, nullptr);
        ASSERT_TRUE(idx->bulk_load(kvs, fill).ok());
        ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
        expect_same(*idx, oracle);
        EXPECT_FALSE(idx->bulk_load(kvs, fill).ok()) << "bulk load needs an empty index";
        for (int i = 0; i < 500; ++i) {
          const std::string k = "k" + std::to_string(100000 + i * 7 + 3);
          ASSERT_EQ(idx->insert(k, encode_u64(i)), Code::ok);
          oracle[k] = encode_u64(i);
        }
        ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
      }
      auto idx = open_or_die(o);
      ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
      expect_same(*idx, oracle);
    }
  }
}

// verify() must be able to fail: corrupt a fingerprint, a bitmap and the key order through
// raw pool memory and expect a report each time.
TEST(LBTree, VerifyCatchesCorruption) {
  auto idx = open_or_die(lbtree_options(256, KeyType::u64));
  ASSERT_NE(idx, nullptr);
  for (std::uint64_t k = 1; k <= 5; ++k) ASSERT_EQ(idx->insert(encode_u64(k), encode_u64(k)), Code::ok);
  ASSERT_TRUE(idx->verify().ok());
  const pm::Pool& pool = idx->pool();
  const std::uint64_t root = pool.root();
  const std::uint64_t head = *pool.at<std::uint64_t>(root + 8);
  char* leaf = pool.base() + head;
  // Header bytes 2..15 are the fingerprints of slots 0..13; slot s's entry is at 16 + 16 s.
  std::uint64_t w0;
  std::memcpy(&w0, leaf, 8);
  const int a = __builtin_ctzll(w0 & 0x3FFF);
  const int b = __builtin_ctzll(w0 & 0x3FFF & ~(1ull << a));
  leaf[2 + a] = static_cast<char>(leaf[2 + a] ^ 0x5a);
  Status s = idx->verify();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("fingerprint"), std::string::npos) << s.to_string();
  leaf[2 + a] = static_cast<char>(leaf[2 + a] ^ 0x5a);
  ASSERT_TRUE(idx->verify().ok());
  // Duplicate a key: copy slot a's key and fingerprint into slot b.
  std::memcpy(leaf + 16 + 16 * b, leaf + 16 + 16 * a, 8);
  leaf[2 + b] = leaf[2 + a];
  s = idx->verify();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("duplicate"), std::string::npos) << s.to_string();
}

TEST(LBTree, RecoveryRefusesACycle) {
  TempDir dir;
  Options o = lbtree_options(256, KeyType::u64);
  o.path = dir.file("cyc.pool");
  std::uint64_t head = 0;
  {
    auto idx = open_or_die(o);
    for (std::uint64_t k = 0; k < 100; ++k) ASSERT_EQ(idx->insert(encode_u64(k), encode_u64(k)), Code::ok);
    const pm::Pool& pool = idx->pool();
    head = *pool.at<std::uint64_t>(pool.root() + 8);
    char* leaf = pool.base() + head;
    std::uint64_t w0;
    std::memcpy(&w0, leaf, 8);
    const int alt = (w0 >> 15) & 1;
    std::uint64_t sib;
    std::memcpy(&sib, leaf + 240 + 8 * alt, 8);
    // The head points at itself, with the right tags (so the cycle check is what refuses it).
    const std::uint64_t self =
        lbtree::make_sibling(head, lbtree::sib_own_tag(sib), lbtree::sib_own_tag(sib));
    std::memcpy(leaf + 240 + 8 * alt, &self, 8);
    ASSERT_FALSE(idx->verify().ok());
  }
  auto r = Index::open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::corrupted);
}

// R2's cross-leaf check (index_common::check_leaf_summaries): a head-leaf key raised above
// every key of the next leaf must refuse the pool.
TEST(LBTree, RecoveryRefusesLeavesOutOfKeyOrder) {
  TempDir dir;
  Options o = lbtree_options(256, KeyType::u64);
  o.path = dir.file("order.pool");
  {
    auto idx = open_or_die(o);
    for (std::uint64_t k = 0; k < 100; ++k) ASSERT_EQ(idx->insert(encode_u64(k), encode_u64(k)), Code::ok);
    const pm::Pool& pool = idx->pool();
    char* leaf = pool.base() + *pool.at<std::uint64_t>(pool.root() + 8);
    std::uint64_t w0;
    std::memcpy(&w0, leaf, 8);
    const int a = __builtin_ctzll(w0 & 0x3FFF);
    const std::uint64_t top = ~std::uint64_t{0};
    std::memcpy(leaf + 16 + 16 * a, &top, 8);  // slot a's key word: the largest key
  }
  auto r = Index::open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::corrupted);
  EXPECT_NE(r.status().message().find("out of key order"), std::string::npos)
      << r.status().to_string();
}

// Issue 18, unclean shutdown: every sibling word names its successor's own tag (leaf.h), so a
// sibling word zeroed, or redirected past a leaf, is refused after an end that left no close
// counts to compare; without the tags the redirected chain is in key order and would open,
// silently missing a leaf's records.
TEST(LBTree, RecoveryAfterAnUncleanEndRefusesADamagedLink) {
  for (const bool zero : {true, false}) {
    TempDir dir;
    Options o = lbtree_options(256, KeyType::u64);
    o.path = dir.file("link.pool");
    {
      auto idx = open_or_die(o);
      for (std::uint64_t k = 0; k < 100; ++k)
        ASSERT_EQ(idx->insert(encode_u64(k), encode_u64(k)), Code::ok);
      const pm::Pool& pool = idx->pool();
      auto active = [&](std::uint64_t off) -> std::uint64_t& {
        auto* l = pool.at<lbtree::Leaf<1>>(off);
        return l->block[0].tail[(l->block[0].front[0] & lbtree::kAltBit) != 0 ? 1 : 0];
      };
      const std::uint64_t head = *pool.at<std::uint64_t>(pool.root() + 8);
      const std::uint64_t second = lbtree::sib_off(active(head));
      const std::uint64_t third = lbtree::sib_off(active(second));
      ASSERT_NE(third, 0u) << "the test needs three leaves";
      // Redirected: the offset names the third leaf, the tags are still the second's.
      std::uint64_t& w = active(head);
      w = zero ? 0 : (w & ~lbtree::kOffMask) | third;
    }  // no close(): an unclean end, so no counts are stored
    expect_refused_after_unclean_end(o, zero ? "zeroed sibling word" : "redirected sibling word",
                                     zero ? "end mark" : "tag of the leaf");
  }
}

}  // namespace
}  // namespace pmindex

// FPTree against std::map with small leaves (8 entries = 192 B: a split every few inserts,
// inner fanout 4), verify() after every operation, all three key types and every leaf size;
// edge keys and values; out-of-place updates; empty-leaf removal returning space; reopen after
// close and after a "crash"; verify() and recovery catching corruption; sparse leaves merging
// into their left neighbours (J1-J7) and recovery of each state a merge log can leave.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <map>
#include <random>
#include <tuple>

#include "index/fptree/fptree.h"
#include "index/common/damage_checks.h"
#include "index/common/map_checker.h"
#include "pmindex/index.h"
#include "support/temp_dir.h"

namespace pmindex {
namespace {

using namespace pmindex::testing;

constexpr std::uint32_t kSmall = sizeof(fptree::Leaf<8>);   // 192
constexpr std::uint32_t kPaper = sizeof(fptree::Leaf<64>);  // 1152

Options fp_options(std::uint32_t node_size, KeyType kt) {
  Options o;
  o.kind = "fptree";
  o.pool_size = 32 << 20;
  o.node_size = node_size;
  o.key_type = kt;
  o.max_key_size = kt == KeyType::bytes ? 48 : 8;
  return o;
}

std::string random_key(KeyType kt, std::uint64_t r) {
  if (kt == KeyType::u64) {
    if (r == 0) return encode_u64(0);
    if (r == 1) return encode_u64(~std::uint64_t{0});
    return encode_u64(r * 0xD1B54A32D192ED03ull);
  }
  if (kt == KeyType::f64) return encode_f64((static_cast<double>(r) - 700.0) * 0.25);
  std::mt19937_64 g(r);
  std::string s(std::uniform_int_distribution<std::size_t>(0, 10)(g), '\0');
  for (char& c : s) c = static_cast<char>(std::uniform_int_distribution<int>(0, 2)(g));
  return s;
}

std::string random_value(std::mt19937_64& rng) {
  const std::uint64_t v = rng() | (std::uint64_t{1} << 63);  // top bit set
  return std::string(reinterpret_cast<const char*>(&v), 8);
}

void check_against(const Index& idx, const std::map<std::string, std::string>& oracle) {
  ScanBuffer out;
  ASSERT_EQ(idx.scan({}, oracle.size() + 5, out), oracle.size());
  std::size_t i = 0;
  for (const auto& [k, v] : oracle) {
    ASSERT_EQ(out.key(i), k) << i;
    ASSERT_EQ(out.value(i), v) << i;
    ++i;
  }
}

using RandomParam = std::tuple<std::uint32_t, KeyType>;
class FPTreeRandom : public ::testing::TestWithParam<RandomParam> {};

// The kit's random driver over a 400-key domain: a grow phase, a mixed phase and a shrink
// phase. Every leaf size, the paper's 64 slots included, must split (the footprint grew) and
// drain leaves (it shrank), so the closing check, deleting everything unlinks every non-head
// leaf and PM use returns to the empty tree's, is not trivially true.
TEST_P(FPTreeRandom, MatchesStdMapWithVerifyAfterEveryOp) {
  const auto [node_size, kt] = GetParam();
  MapChecker c(fp_options(node_size, kt));
  ASSERT_TRUE(c.ok()) << c.open_status().to_string();
  const std::uint64_t empty_bytes = c.index().footprint().pm_bytes;
  const int ops = node_size == kSmall ? 1000 : 500;
  const RandomStats st = c.run(
      {.phases = {grow_phase(ops), mixed_phase(ops), shrink_phase(ops)},
       .seed = node_size * 31 + static_cast<unsigned>(kt)},
      [kt = kt](std::mt19937_64& rng) { return random_key(kt, rng() % 400); }, random_value);
  EXPECT_GT(st.grew, 0u) << "no leaf split";
  EXPECT_GT(st.shrank, 0u) << "no leaf removed";
  const Model all = c.model();
  for (const auto& [k, v] : all) ASSERT_TRUE(c.remove(k));
  ASSERT_TRUE(c.verify());
  EXPECT_EQ(c.index().footprint().pm_bytes, empty_bytes);
}

INSTANTIATE_TEST_SUITE_P(
    LeavesAndKeys, FPTreeRandom,
    ::testing::Combine(::testing::Values(kSmall, std::uint32_t{320}, std::uint32_t{576}, kPaper),
                       ::testing::Values(KeyType::u64, KeyType::f64, KeyType::bytes)));

TEST(FPTree, EdgeKeysAndValues) {
  auto idx = open_or_die(fp_options(kSmall, KeyType::u64));
  ASSERT_NE(idx, nullptr);
  const std::string zero = encode_u64(0), ones = encode_u64(~std::uint64_t{0});
  const std::string top(8, '\xff'), nul(8, '\0');
  EXPECT_EQ(idx->insert(zero, top), Code::ok);
  EXPECT_EQ(idx->insert(ones, nul), Code::ok);
  std::string v;
  EXPECT_EQ(idx->find(zero, &v), Code::ok);
  EXPECT_EQ(v, top);
  EXPECT_EQ(idx->find(ones, &v), Code::ok);
  EXPECT_EQ(v, nul);
  EXPECT_EQ(idx->insert("short", top), Code::invalid_argument);
  EXPECT_EQ(idx->insert(encode_u64(5), "seven77"), Code::invalid_argument);
  EXPECT_EQ(idx->update(zero, nul), Code::ok);
  EXPECT_EQ(idx->find(zero, &v), Code::ok);
  EXPECT_EQ(v, nul);
  EXPECT_TRUE(idx->verify().ok());
  Options o = fp_options(kSmall, KeyType::u64);
  o.max_value_size = 7;
  EXPECT_FALSE(Index::open(o).ok()) << "values are 8 bytes inline or 9..65536 out of line";
  o = fp_options(1000, KeyType::u64);
  EXPECT_FALSE(Index::open(o).ok()) << "no such leaf size";
}

// Updates in a full leaf split it first (the new version needs a free slot).
TEST(FPTree, UpdateInFullLeafSplits) {
  auto idx = open_or_die(fp_options(kSmall, KeyType::u64));
  ASSERT_NE(idx, nullptr);
  for (std::uint64_t k = 0; k < 8; ++k) ASSERT_EQ(idx->insert(encode_u64(k), encode_u64(k)), Code::ok);
  const std::uint64_t before = idx->footprint().pm_bytes;
  for (std::uint64_t k = 0; k < 8; ++k) {
    ASSERT_EQ(idx->update(encode_u64(k), encode_u64(k + 100)), Code::ok);
    ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
  }
  EXPECT_GT(idx->footprint().pm_bytes, before);
  for (std::uint64_t k = 0; k < 8; ++k) {
    std::string v;
    ASSERT_EQ(idx->find(encode_u64(k), &v), Code::ok);
    EXPECT_EQ(v, encode_u64(k + 100));
  }
}

TEST(FPTree, ReopenAfterCloseAndAfterCrash) {
  for (const bool clean : {true, false}) {
    for (const KeyType kt : {KeyType::u64, KeyType::bytes}) {
      TempDir dir;
      Options o = fp_options(kSmall, kt);
      o.path = dir.file("f.pool");
      std::map<std::string, std::string> oracle;
      {
        auto idx = open_or_die(o);
        ASSERT_NE(idx, nullptr);
        std::mt19937_64 rng(7);
        for (int i = 0; i < 4000; ++i) {
          const std::string k = random_key(kt, rng() % 3000);
          if (oracle.emplace(k, encode_u64(i)).second) {
            ASSERT_EQ(idx->insert(k, encode_u64(i)), Code::ok);
          }
        }
        for (int i = 0; i < 2500; ++i) {
          const std::string k = random_key(kt, rng() % 3000);
          ASSERT_EQ(idx->remove(k), oracle.erase(k) ? Code::ok : Code::not_found);
        }
        if (clean) {
          ASSERT_TRUE(idx->close().ok());
        }
      }
      auto idx = open_or_die(o);
      ASSERT_NE(idx, nullptr);
      EXPECT_EQ(idx->recovery_stats().clean_shutdown, clean);
      EXPECT_EQ(idx->recovery_stats().records, oracle.size());
      ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
      check_against(*idx, oracle);
      ASSERT_EQ(idx->insert(random_key(kt, 999999), encode_u64(1)), Code::ok);
      ASSERT_TRUE(idx->verify().ok());
    }
  }
}

// Layout id: a pool made with one leaf size refuses another.
TEST(FPTree, LayoutRecordsLeafSize) {
  TempDir dir;
  Options o = fp_options(kSmall, KeyType::u64);
  o.path = dir.file("l.pool");
  { ASSERT_NE(open_or_die(o), nullptr); }
  Options other = o;
  other.node_size = kPaper;
  EXPECT_FALSE(Index::open(other).ok());
  Options from_pool = other;
  from_pool.layout_from_pool = true;
  EXPECT_TRUE(Index::open(from_pool).ok());
}

std::uint64_t head_of(const pm::Pool& pool) {
  return pool.at<fptree::Root>(pool.root())->head;
}

// verify() must be able to fail: a fingerprint, a duplicated key, a bitmap bit beyond the slots,
// a leftover lock word and a non-empty micro-log are each reported.
TEST(FPTree, VerifyCatchesCorruption) {
  auto idx = open_or_die(fp_options(kSmall, KeyType::u64));
  ASSERT_NE(idx, nullptr);
  for (std::uint64_t k = 1; k <= 5; ++k) ASSERT_EQ(idx->insert(encode_u64(k), encode_u64(k)), Code::ok);
  ASSERT_TRUE(idx->verify().ok());
  const pm::Pool& pool = idx->pool();
  auto* leaf = pool.at<fptree::Leaf<8>>(head_of(pool));
  auto expect_bad = [&](const char* what) {
    const Status s = idx->verify();
    EXPECT_FALSE(s.ok()) << what;
    EXPECT_NE(s.message().find(what), std::string::npos) << s.to_string();
  };
  leaf->fps[0] ^= 0x5a;  // slot 0's fingerprint
  expect_bad("fingerprint");
  leaf->fps[0] ^= 0x5a;
  ASSERT_TRUE(idx->verify().ok());
  const std::uint64_t saved = leaf->kv[1][0];
  leaf->kv[1][0] = leaf->kv[0][0];
  leaf->fps[0] = fptree::with_fp(leaf->fps[0], 1, fptree::fp_of(leaf->fps[0], 0));
  expect_bad("duplicate");
  leaf->kv[1][0] = saved;
  leaf->fps[0] = fptree::with_fp(leaf->fps[0], 1, index_common::fingerprint_word(saved));
  ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
  leaf->bitmap |= std::uint64_t{1} << 9;
  expect_bad("beyond");
  leaf->bitmap &= ~(std::uint64_t{1} << 9);
  leaf->lock = 1;
  expect_bad("locked");
  leaf->lock = 0;
  auto* log = pool.at<fptree::MicroLog>(pool.at<fptree::Root>(pool.root())->logs);
  log[3].split_leaf = head_of(pool);
  expect_bad("micro-log");
  log[3].split_leaf = 0;
  EXPECT_TRUE(idx->verify().ok());
}

TEST(FPTree, RecoveryRefusesACycle) {
  TempDir dir;
  Options o = fp_options(kSmall, KeyType::u64);
  o.path = dir.file("cyc.pool");
  {
    auto idx = open_or_die(o);
    for (std::uint64_t k = 0; k < 100; ++k) ASSERT_EQ(idx->insert(encode_u64(k), encode_u64(k)), Code::ok);
    const pm::Pool& pool = idx->pool();
    auto* head = pool.at<fptree::Leaf<8>>(head_of(pool));
    head->next = head_of(pool);
    ASSERT_FALSE(idx->verify().ok());
  }
  auto r = Index::open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::corrupted);
}

// Issue 18, unclean shutdown: every link carries the tag of the leaf it names (layout.h), so a
// next pointer zeroed, or redirected past a leaf, is refused after an end that left no close
// counts to compare.
TEST(FPTree, RecoveryAfterAnUncleanEndRefusesADamagedLink) {
  for (const bool zero : {true, false}) {
    TempDir dir;
    Options o = fp_options(kSmall, KeyType::u64);
    o.path = dir.file("link.pool");
    {
      auto idx = open_or_die(o);
      for (std::uint64_t k = 0; k < 400; ++k)
        ASSERT_EQ(idx->insert(encode_u64(k), encode_u64(k)), Code::ok);
      const pm::Pool& pool = idx->pool();
      auto* head = pool.at<fptree::Leaf<8>>(head_of(pool));
      const auto* second = pool.at<fptree::Leaf<8>>(fptree::link_off(head->next));
      const std::uint64_t third = fptree::link_off(second->next);
      ASSERT_NE(third, 0u);
      // Redirected: the offset part names the third leaf, the tag is still the second's (what
      // a damaged offset looks like). Without the tag the chain would just skip a leaf.
      head->next = zero ? 0 : (head->next & ~fptree::link_off(~std::uint64_t{0})) | third;
    }  // no close(): an unclean end, so no counts are stored
    expect_refused_after_unclean_end(o, zero ? "zeroed link" : "redirected link",
                                     zero ? "end mark" : "tag of the leaf");
  }
}

template <unsigned N>
const fptree::FPTree<N>& as_fptree(const Index& idx) {
  return dynamic_cast<const fptree::FPTree<N>&>(idx);
}

// Issue 19, sparse case: ascending keys leave half-full leaves; removing every other key
// thins them to the trigger and they merge into their left neighbours (J1-J7), giving back
// blocks. Every leaf size's thresholds, u64 and bytes keys (key records move with their
// slots), inline and out-of-line values (value records too): the kept keys read back, verify()
// passes (invariant 5: PM bytes in use = reachable, so no record was freed or leaked), a
// "crash" reopen recovers the same records, and removing the rest returns PM to the empty
// tree's use.
template <unsigned N>
void sparse_merge(KeyType kt, std::uint32_t max_value) {
  TempDir dir;
  Options o = fp_options(sizeof(fptree::Leaf<N>), kt);
  o.path = dir.file("merge.pool");
  o.max_value_size = max_value;
  const std::uint64_t n = 40 * N;
  auto value_of = [&](std::uint64_t k) {
    return max_value == 8 ? encode_u64(k * 5) : std::string(10 + k % 40, static_cast<char>('a' + k % 26));
  };
  std::uint64_t empty_bytes = 0;
  {
    auto idx = open_or_die(o);
    ASSERT_NE(idx, nullptr);
    empty_bytes = idx->footprint().pm_bytes;
    for (std::uint64_t k = 0; k < n; ++k) ASSERT_EQ(idx->insert(encode_u64(k), value_of(k)), Code::ok);
    const std::uint64_t leaves_full = as_fptree<N>(*idx).leaf_count();
    for (std::uint64_t k = 0; k < n; k += 2) ASSERT_EQ(idx->remove(encode_u64(k)), Code::ok);
    const std::uint64_t leaves_sparse = as_fptree<N>(*idx).leaf_count();
    EXPECT_GT(as_fptree<N>(*idx).merges(), 0u);
    // Pairs and threes of quarter-full leaves merge: well under two thirds stay.
    EXPECT_LT(leaves_sparse * 3, leaves_full * 2) << leaves_full << " -> " << leaves_sparse;
    ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
    std::string got;
    for (std::uint64_t k = 0; k < n; ++k) {
      ASSERT_EQ(idx->find(encode_u64(k), &got), k % 2 == 1 ? Code::ok : Code::not_found) << k;
      if (k % 2 == 1) { ASSERT_EQ(got, value_of(k)) << k; }
    }
  }  // no close(): recovery from an unclean end
  auto idx = open_or_die(o);
  ASSERT_NE(idx, nullptr);
  EXPECT_EQ(idx->recovery_stats().records, n / 2);
  ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
  std::string got;
  for (std::uint64_t k = 1; k < n; k += 2) {
    ASSERT_EQ(idx->find(encode_u64(k), &got), Code::ok) << k;
    ASSERT_EQ(got, value_of(k));
  }
  for (std::uint64_t k = 1; k < n; k += 2) ASSERT_EQ(idx->remove(encode_u64(k)), Code::ok);
  ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
  EXPECT_EQ(idx->footprint().pm_bytes, empty_bytes);
}

TEST(FPTree, SparseLeavesMergeIntoTheirLeftNeighbour) {
  for (const KeyType kt : {KeyType::u64, KeyType::bytes}) {
    for (const std::uint32_t mv : {8u, 64u}) {
      SCOPED_TRACE(std::to_string(static_cast<int>(kt)) + " / " + std::to_string(mv));
      sparse_merge<8>(kt, mv);
      sparse_merge<16>(kt, mv);
      sparse_merge<32>(kt, mv);
      sparse_merge<64>(kt, mv);
    }
  }
}

// Hysteresis: a leaf just split does not merge back when one key leaves it, and a merged leaf
// does not split at the next insert (PROTOCOL.md J1-J7, "When").
TEST(FPTree, NoSplitMergePingPong) {
  auto idx = open_or_die(fp_options(kSmall, KeyType::u64));
  ASSERT_NE(idx, nullptr);
  const auto& t = as_fptree<8>(*idx);
  for (std::uint64_t k = 1; k <= 9; ++k) ASSERT_EQ(idx->insert(encode_u64(k), encode_u64(k)), Code::ok);
  ASSERT_EQ(t.leaf_count(), 2u);  // 1..4 | 5..9
  ASSERT_EQ(idx->remove(encode_u64(9)), Code::ok);
  ASSERT_EQ(idx->remove(encode_u64(8)), Code::ok);
  EXPECT_EQ(t.merges(), 0u);  // 3 left in the right leaf: above the trigger (2)
  ASSERT_EQ(idx->remove(encode_u64(7)), Code::ok);
  EXPECT_EQ(t.merges(), 1u);  // 4 + 2 <= 6: merged
  EXPECT_EQ(t.leaf_count(), 1u);
  ASSERT_EQ(idx->insert(encode_u64(7), encode_u64(7)), Code::ok);
  ASSERT_EQ(idx->insert(encode_u64(8), encode_u64(8)), Code::ok);
  EXPECT_EQ(t.leaf_count(), 1u);  // 8 of 8: full, not split until the next insert
  ASSERT_TRUE(idx->verify().ok());
}

// R1 on a merge log, each state a crash can leave (built by hand in a live pool, then an
// unclean end): the moved entries valid in A (J4 durable, J5 not) -> finished, L dropped;
// copied but not valid (J4 not durable) -> rolled back, both leaves kept; and a state the
// protocol never produces, only some of L's keys valid in A -> the pool is refused.
TEST(FPTree, RecoveryOfAMergeLog) {
  enum class Case { finished, rolled_back, damaged };
  for (const Case c : {Case::finished, Case::rolled_back, Case::damaged}) {
    SCOPED_TRACE(static_cast<int>(c));
    TempDir dir;
    Options o = fp_options(kSmall, KeyType::u64);
    o.path = dir.file("mlog.pool");
    {
      auto idx = open_or_die(o);
      ASSERT_NE(idx, nullptr);
      for (std::uint64_t k = 1; k <= 12; ++k)
        ASSERT_EQ(idx->insert(encode_u64(k), encode_u64(k * 3)), Code::ok);  // 1..4 | 5..12
      for (std::uint64_t k = 1; k <= 3; ++k) ASSERT_EQ(idx->remove(encode_u64(k)), Code::ok);
      for (std::uint64_t k = 5; k <= 8; ++k) ASSERT_EQ(idx->remove(encode_u64(k)), Code::ok);
      ASSERT_EQ(as_fptree<8>(*idx).merges(), 0u);  // the head holds 1 entry, the right leaf 4
      const pm::Pool& pool = idx->pool();
      const std::uint64_t a_off = head_of(pool);
      auto* a = pool.at<fptree::Leaf<8>>(a_off);
      const std::uint64_t l_off = fptree::link_off(a->next);
      const auto* l = pool.at<fptree::Leaf<8>>(l_off);
      ASSERT_EQ(std::popcount(a->bitmap), 1);
      ASSERT_EQ(std::popcount(l->bitmap), 4);
      std::uint64_t moved = 0, free = ~a->bitmap & 0xff;
      unsigned i = 0;
      for (std::uint64_t m = l->bitmap; m != 0; m &= m - 1, ++i) {  // J2
        const auto s = static_cast<unsigned>(std::countr_zero(m));
        const auto t = static_cast<unsigned>(std::countr_zero(free));
        free &= free - 1;
        a->kv[t][0] = l->kv[s][0];
        a->kv[t][1] = l->kv[s][1];
        a->fps[0] = fptree::with_fp(a->fps[0], t, fptree::fp_of(l->fps[0], s));
        if (c == Case::finished || (c == Case::damaged && i < 2)) moved |= std::uint64_t{1} << t;
      }
      a->bitmap |= moved;  // J4 (all, none, or half)
      auto* log = pool.at<fptree::MicroLog>(pool.at<fptree::Root>(pool.root())->logs);
      log[5].delete_leaf = l_off;  // J1 (any thread's entry)
      log[5].delete_prev = a_off;
    }  // no close()
    auto r = Index::open(o);
    if (c == Case::damaged) {
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.status().code(), Code::corrupted);
      EXPECT_NE(r.status().message().find("share some keys"), std::string::npos)
          << r.status().to_string();
      continue;
    }
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    auto& idx = *r;
    EXPECT_EQ(as_fptree<8>(*idx).leaf_count(), c == Case::finished ? 1u : 2u);
    EXPECT_EQ(idx->recovery_stats().records, 5u);
    ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
    std::map<std::string, std::string> oracle;
    for (std::uint64_t k : {4, 9, 10, 11, 12}) oracle[encode_u64(k)] = encode_u64(k * 3);
    check_against(*idx, oracle);
  }
}

}  // namespace
}  // namespace pmindex

// NBTree, single thread: randomized against std::map with tiny leaves and verify() after every
// operation; every 8-byte key and value (key 0, reserved value bits, out-of-line values);
// reopen after close and after a destroy without close; verify() catching corruption; the
// flush count per operation in ADR mode; pool bytes after deleting every key.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <cstdlib>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "index/nbtree/nbtree.h"
#include "index/common/node_search.h"
#include "index/common/damage_checks.h"
#include "index/common/map_checker.h"
#include "pmindex/index.h"
#include "support/temp_dir.h"

namespace pmindex {
namespace {

using pmindex::testing::TempDir;
using pmindex::testing::expect_refused_after_unclean_end;
using pmindex::testing::grow_phase;
using pmindex::testing::MapChecker;
using pmindex::testing::open_or_die;
using pmindex::testing::mixed_phase;
using pmindex::testing::RandomStats;
using pmindex::testing::shrink_phase;

Options nb_options(std::uint32_t node_size, pm::Mode mode, std::string path = "") {
  Options o;
  o.kind = "nbtree";
  o.path = std::move(path);
  o.pool_size = 64 << 20;
  o.node_size = node_size;
  o.persistence = mode;
  o.max_value_size = 24;
  return o;
}

nbtree::NBTree* as_nb(Index* idx) { return dynamic_cast<nbtree::NBTree*>(idx); }

// Keys and values drawn so that key 0, the largest key, values with the reserved top bits and
// values of other lengths all occur often.
struct Gen {
  std::mt19937_64 rng;
  explicit Gen(std::uint64_t seed) : rng(seed) {}
  std::uint64_t u(std::uint64_t n) { return std::uniform_int_distribution<std::uint64_t>(0, n)(rng); }
  std::string key() {
    switch (u(9)) {
      case 0: return encode_u64(0);
      case 1: return encode_u64(~std::uint64_t{0} - u(2));
      default: return encode_u64(u(300));
    }
  }
  std::string value() {
    switch (u(7)) {
      case 0: return encode_u64(~std::uint64_t{0} - u(3));          // copy/sync bits set
      case 1: return encode_u64((std::uint64_t{1} << 61) + u(5));   // the out-of-line bit
      case 2: return std::string(u(24), static_cast<char>('a' + u(25)));  // other lengths
      case 3: return encode_u64(0);
      default: return encode_u64(u(1'000'000));
    }
  }
};

void check_against(Index& idx, const std::map<std::string, std::string>& oracle) {
  std::string got;
  for (const auto& [k, v] : oracle) {
    ASSERT_EQ(idx.find(k, &got), Code::ok) << ::testing::PrintToString(k);
    ASSERT_EQ(got, v) << ::testing::PrintToString(k);
  }
  ScanBuffer buf;
  const std::size_t n = idx.scan("", oracle.size() + 5, buf);  // "": the smallest key
  ASSERT_EQ(n, oracle.size());
  auto it = oracle.begin();
  for (std::size_t i = 0; i < n; ++i, ++it) {
    ASSERT_EQ(buf.key(i), it->first);
    ASSERT_EQ(buf.value(i), it->second);
  }
}

// After a reopen: the recorded shutdown state, a valid structure holding exactly the oracle
// (and, after a clean close, as many records as recovery counted).
void expect_recovered(Index& idx, const std::map<std::string, std::string>& oracle, bool clean) {
  EXPECT_EQ(idx.recovery_stats().clean_shutdown, clean);
  if (clean) {
    EXPECT_EQ(idx.recovery_stats().records, oracle.size());
  }
  ASSERT_TRUE(idx.verify().ok()) << idx.verify().to_string();
  check_against(idx, oracle);
}

class NBTreeRandom : public ::testing::TestWithParam<std::tuple<std::uint32_t, pm::Mode>> {};

// The kit's random driver (grow, mixed, shrink), verify() after every op; leaves must split.
TEST_P(NBTreeRandom, AgainstStdMapWithVerifyAfterEveryOp) {
  const auto [node_size, mode] = GetParam();
  MapChecker c(nb_options(node_size, mode));
  ASSERT_TRUE(c.ok()) << c.open_status().to_string();
  auto g = std::make_shared<Gen>(node_size * 31 + static_cast<int>(mode));
  c.run({.phases = {grow_phase(2000)}, .seed = 3},
        [g](std::mt19937_64&) { return g->key(); }, [g](std::mt19937_64&) { return g->value(); });
  EXPECT_GT(as_nb(&c.index())->leaf_count(), 4u) << "the test should split leaves";
  c.run({.phases = {mixed_phase(2000), shrink_phase(2000)}, .seed = 4},
        [g](std::mt19937_64&) { return g->key(); }, [g](std::mt19937_64&) { return g->value(); });
  EXPECT_GT(as_nb(&c.index())->merges_linked(), 0u) << "the test should merge leaves";
}

INSTANTIATE_TEST_SUITE_P(SmallLeaves, NBTreeRandom,
                         ::testing::Combine(::testing::Values(64u, 128u, 256u),
                                            ::testing::Values(pm::Mode::adr, pm::Mode::eadr)));

TEST(NBTree, EveryKeyAndValueShape) {
  auto idx = open_or_die(nb_options(128, pm::Mode::adr));
  ASSERT_NE(idx, nullptr);
  const std::uint64_t keys[] = {0, 1, 2, (std::uint64_t{1} << 63), ~std::uint64_t{0},
                                ~std::uint64_t{0} - 1, 12345};
  const std::string values[] = {encode_u64(0),
                                encode_u64((std::uint64_t{1} << 61) - 1),
                                encode_u64(std::uint64_t{1} << 61),
                                encode_u64(std::uint64_t{1} << 62),
                                encode_u64(std::uint64_t{1} << 63),
                                encode_u64(~std::uint64_t{0}),
                                std::string(),
                                std::string("\0\0\0", 3),
                                std::string(24, 'z')};
  std::map<std::string, std::string> oracle;
  std::string got;
  for (std::uint64_t k : keys) {
    for (const std::string& v : values) {
      const std::string ks = encode_u64(k);
      if (oracle.count(ks) == 0) {
        ASSERT_EQ(idx->insert(ks, v), Code::ok);
      } else {
        ASSERT_EQ(idx->update(ks, v), Code::ok);
      }
      oracle[ks] = v;
      ASSERT_EQ(idx->find(ks, &got), Code::ok);
      ASSERT_EQ(got, v);
      ASSERT_TRUE(idx->verify().ok());
    }
  }
  check_against(*idx, oracle);
  EXPECT_EQ(idx->insert(encode_u64(5), std::string(25, 'x')), Code::value_too_large);
  EXPECT_EQ(idx->insert("short", "v"), Code::invalid_argument);
  for (std::uint64_t k : keys) ASSERT_EQ(idx->remove(encode_u64(k)), Code::ok);
  for (std::uint64_t k : keys) ASSERT_EQ(idx->find(encode_u64(k), &got), Code::not_found);
  ASSERT_TRUE(idx->verify().ok());
}

TEST(NBTree, DoubleKeysScanInNumericOrder) {
  Options o = nb_options(64, pm::Mode::eadr);
  o.key_type = KeyType::f64;
  auto idx = open_or_die(o);
  ASSERT_NE(idx, nullptr);
  const double ds[] = {-1e300, -2.5, -0.0, 0.0, 1e-300, 3.25, 7.0, 1e300,
                       -std::numeric_limits<double>::infinity(),
                       std::numeric_limits<double>::infinity()};
  for (double d : ds) ASSERT_EQ(idx->insert(encode_f64(d), encode_u64(1)), Code::ok) << d;
  EXPECT_EQ(idx->insert(encode_f64(std::nan("")), encode_u64(1)), Code::invalid_argument);
  ScanBuffer buf;
  ASSERT_EQ(idx->scan(encode_f64(-std::numeric_limits<double>::infinity()), 100, buf),
            std::size(ds));
  for (std::size_t i = 1; i < buf.size(); ++i) {
    EXPECT_LE(decode_f64(buf.key(i - 1)), decode_f64(buf.key(i)));
  }
  ASSERT_TRUE(idx->verify().ok());
}

TEST(NBTree, ReopenAfterCloseAndAfterCrash) {
  TempDir dir;
  const std::string path = dir.file("nb.pool");
  std::map<std::string, std::string> oracle;
  Gen g(99);
  {
    auto idx = open_or_die(nb_options(128, pm::Mode::adr, path));
    ASSERT_NE(idx, nullptr);
    for (int i = 0; i < 2000; ++i) {
      const std::string k = g.key(), v = g.value();
      if (g.u(3) == 0) {
        ASSERT_EQ(idx->remove(k), oracle.erase(k) ? Code::ok : Code::not_found);
      } else {
        ASSERT_EQ(idx->upsert(k, v), Code::ok);
        oracle[k] = v;
      }
    }
    ASSERT_TRUE(idx->close().ok());
  }
  {
    auto idx = open_or_die(nb_options(128, pm::Mode::adr, path));
    ASSERT_NE(idx, nullptr);
    expect_recovered(*idx, oracle, /*clean=*/true);
    for (int i = 0; i < 2000; ++i) {
      const std::string k = g.key(), v = g.value();
      if (g.u(3) == 0) {
        ASSERT_EQ(idx->remove(k), oracle.erase(k) ? Code::ok : Code::not_found);
      } else {
        ASSERT_EQ(idx->upsert(k, v), Code::ok);
        oracle[k] = v;
      }
    }
    // destroyed without close(): what a process crash leaves (the file is in /dev/shm)
  }
  {
    auto idx = open_or_die(nb_options(128, pm::Mode::adr, path));
    ASSERT_NE(idx, nullptr);
    expect_recovered(*idx, oracle, /*clean=*/false);
    std::printf("recovery: %llu records, %llu blocks, %.6f s, %llu repaired\n",
                static_cast<unsigned long long>(idx->recovery_stats().records),
                static_cast<unsigned long long>(idx->recovery_stats().nodes),
                idx->recovery_stats().seconds,
                static_cast<unsigned long long>(idx->recovery_stats().repaired));
    ASSERT_TRUE(idx->close().ok());
  }
  // A pool made with another node size is refused.
  auto other = Index::open(nb_options(256, pm::Mode::adr, path));
  EXPECT_FALSE(other.ok());
}

// Recovery never trusts PM: a cycle or an out-of-bounds offset in the block chain is refused
// (Code::corrupted, no hang), and a key written twice into one block is repaired (X2, X3).
TEST(NBTree, RecoveryRefusesDamagedChains) {
  TempDir dir;
  const std::string path = dir.file("bad.pool");
  Options o = nb_options(128, pm::Mode::adr, path);
  o.pool_size = 1 << 20;
  // kind 0: next of a block points at itself; 1: next is out of bounds; 2: duplicate key
  for (int kind = 0; kind < 3; ++kind) {
    std::remove(path.c_str());
    {
      auto idx = open_or_die(o);
      ASSERT_NE(idx, nullptr);
      for (std::uint64_t k = 1; k <= 30; ++k) ASSERT_EQ(idx->insert(encode_u64(k), encode_u64(k)), Code::ok);
      auto* nb = as_nb(idx.get());
      const nbtree::Leaf* leaf = nb->leaf_for_testing(5);
      char* base = idx->pool().base();
      const std::uint64_t off = leaf->data_off;
      auto* hdr = reinterpret_cast<nbtree::BlockHeader*>(base + off);
      if (kind == 0) {
        hdr->next = index_common::make_link(off, hdr->tag);  // the right tag: the cycle check
      } else if (kind == 1) {
        hdr->next = index_common::make_link(idx->pool().size() + 4096,
                                            index_common::link_tag(hdr->next));
      } else {
        auto* e = reinterpret_cast<nbtree::Entry*>(base + off + sizeof(nbtree::BlockHeader));
        int live = -1, empty = -1;
        for (int i = 0; i < nb->leaf_capacity(); ++i) {
          if (e[i].key == 5) live = i;
          if (e[i].key == 0 && empty < 0 && i > live && live >= 0) empty = i;
        }
        ASSERT_GE(live, 0);
        ASSERT_GE(empty, 0) << "the test needs a free slot after key 5";
        e[empty] = nbtree::Entry{5, 999};
      }
      // destroyed without close: recovery runs at the next open
    }
    auto slurp = [&] {
      std::ifstream in(path, std::ios::binary);
      std::ostringstream out;
      out << in.rdbuf();
      return out.str();
    };
    const std::string before = slurp();
    auto r = Index::open(o);
    if (kind < 2) {
      ASSERT_FALSE(r.ok()) << "damage " << kind << " accepted";
      EXPECT_EQ(r.status().code(), Code::corrupted) << r.status().to_string();
      EXPECT_TRUE(slurp() == before) << "a pool refused at recovery must stay unchanged";
    } else {
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      auto idx = std::move(r).value();
      EXPECT_GE(idx->recovery_stats().repaired, 1u);
      std::string got;
      ASSERT_EQ(idx->find(encode_u64(5), &got), Code::ok);
      EXPECT_EQ(got, encode_u64(5)) << "the lower slot is kept";
      EXPECT_TRUE(idx->verify().ok()) << idx->verify().to_string();
    }
  }
}

// Issue 18, unclean shutdown: every link (root.head and each block's next) carries the tag of
// the block it names (common/chain_tag.h), so a link zeroed, or redirected past a block, is
// refused after an end that left no close counts to compare; without the tags the redirected
// chain is in key order and would open, silently missing a block's records.
TEST(NBTree, RecoveryAfterAnUncleanEndRefusesADamagedLink) {
  for (const bool zero : {true, false}) {
    TempDir dir;
    const std::string path = dir.file("link.pool");
    Options o = nb_options(128, pm::Mode::adr, path);
    o.pool_size = 1 << 20;
    {
      auto idx = open_or_die(o);
      ASSERT_NE(idx, nullptr);
      for (std::uint64_t k = 1; k <= 60; ++k)
        ASSERT_EQ(idx->insert(encode_u64(k), encode_u64(k)), Code::ok);
      char* base = idx->pool().base();
      auto* root = reinterpret_cast<nbtree::Root*>(base + idx->pool().root());
      auto* head =
          reinterpret_cast<nbtree::BlockHeader*>(base + index_common::link_off(root->head));
      const auto* second =
          reinterpret_cast<const nbtree::BlockHeader*>(base + index_common::link_off(head->next));
      const std::uint64_t third = index_common::link_off(second->next);
      ASSERT_NE(third, 0u) << "the test needs three blocks";
      // Redirected: the offset names the third block, the tag is still the second's.
      head->next = zero ? 0 : index_common::make_link(third, index_common::link_tag(head->next));
    }  // no close(): an unclean end, so no counts are stored
    expect_refused_after_unclean_end(o, zero ? "zeroed link" : "redirected link",
                                     zero ? "end mark" : "tag of the block");
  }
}

TEST(NBTree, VerifyCatchesCorruption) {
  for (int what = 0; what < 3; ++what) {
    auto idx = open_or_die(nb_options(128, pm::Mode::eadr));
    ASSERT_NE(idx, nullptr);
    for (std::uint64_t k = 1; k <= 40; ++k) ASSERT_EQ(idx->insert(encode_u64(k), encode_u64(k)), Code::ok);
    ASSERT_TRUE(idx->verify().ok());
    as_nb(idx.get())->corrupt_for_testing(what);
    EXPECT_FALSE(idx->verify().ok()) << "corruption " << what << " not detected";
  }
}

// The crash tests' known-bad variants exist only in the tracing flavour: this (production)
// build refuses to switch one on instead of running a write path without its persist.
TEST(NBTreeDeathTest, FaultsAreTracingFlavourOnly) {
  auto idx = open_or_die(nb_options(128, pm::Mode::adr));
  ASSERT_NE(idx, nullptr);
  as_nb(idx.get())->set_fault_for_testing(nbtree::NBTree::Fault::none);  // allowed
  EXPECT_DEATH(as_nb(idx.get())->set_fault_for_testing(nbtree::NBTree::Fault::skip_insert_persist),
               "");
}

// Issue 16: no test-hook pointer on the production write paths. The hook points are compiled
// out of this (production) build, so it refuses a Hooks object rather than ignore it.
static_assert(!nbtree::NBTree::kHooks, "hooks compiled into the production flavour");
TEST(NBTreeDeathTest, HooksAreTracingFlavourOnly) {
  struct Noop final : nbtree::Hooks {
    void at(nbtree::HookPoint, const nbtree::Leaf*) override {}
  } noop;
  auto idx = open_or_die(nb_options(128, pm::Mode::adr));
  ASSERT_NE(idx, nullptr);
  as_nb(idx.get())->set_hooks(nullptr);  // allowed
  EXPECT_DEATH(as_nb(idx.get())->set_hooks(&noop), "");
}

TEST(NBTree, OneFlushPerWriteInAdrOnTheCommonPath) {
  auto idx = open_or_die(nb_options(1024, pm::Mode::adr));
  ASSERT_NE(idx, nullptr);
  auto& c = pm::Runtime::counters();
  const std::string k = encode_u64(777), v = encode_u64(5), v2 = encode_u64(6);
  std::uint64_t f0 = c.flushes, n0 = c.fences;
  ASSERT_EQ(idx->insert(k, v), Code::ok);
  EXPECT_EQ(c.flushes - f0, 1u);
  EXPECT_EQ(c.fences - n0, 1u);
  f0 = c.flushes;
  ASSERT_EQ(idx->update(k, v2), Code::ok);
  EXPECT_EQ(c.flushes - f0, 1u);
  f0 = c.flushes;
  std::string got;
  ASSERT_EQ(idx->find(k, &got), Code::ok);
  EXPECT_EQ(c.flushes - f0, 0u) << "a read of a durable value flushes nothing";
  f0 = c.flushes;
  ASSERT_EQ(idx->remove(k), Code::ok);
  EXPECT_EQ(c.flushes - f0, 1u);
}

TEST(NBTree, BulkLoadThenOperate) {
  auto idx = open_or_die(nb_options(128, pm::Mode::adr));
  ASSERT_NE(idx, nullptr);
  std::vector<std::string> ks, vs;
  std::map<std::string, std::string> oracle;
  for (std::uint64_t k = 0; k < 500; k += 2) {
    ks.push_back(encode_u64(k));
    vs.push_back(k % 10 == 0 ? std::string(12, 'q') : encode_u64(k * 3));
  }
  std::vector<KeyValue> kv;
  for (std::size_t i = 0; i < ks.size(); ++i) {
    kv.push_back({ks[i], vs[i]});
    oracle[ks[i]] = vs[i];
  }
  ASSERT_TRUE(idx->bulk_load(kv, 0.7).ok());
  ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
  check_against(*idx, oracle);
  EXPECT_FALSE(idx->bulk_load(kv, 0.7).ok()) << "bulk_load into a non-empty index";
  for (std::uint64_t k = 1; k < 500; k += 2) {
    ASSERT_EQ(idx->insert(encode_u64(k), encode_u64(k)), Code::ok);
    oracle[encode_u64(k)] = encode_u64(k);
    ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
  }
  check_against(*idx, oracle);
}

TEST(NBTree, PoolBytesAfterDeletingEveryKey) {
  auto idx = open_or_die(nb_options(256, pm::Mode::adr));
  ASSERT_NE(idx, nullptr);
  auto* nb = as_nb(idx.get());
  const auto empty = idx->footprint().pm_bytes;
  for (std::uint64_t k = 1; k <= 5000; ++k) {
    const std::string v = k % 3 == 0 ? std::string(20, 'v') : encode_u64(k);
    ASSERT_EQ(idx->insert(encode_u64(k * 7919 % 100003), v), Code::ok);
  }
  nb->collect_garbage();
  const auto full = idx->footprint().pm_bytes;
  const std::size_t full_leaves = nb->leaf_count();
  for (std::uint64_t k = 1; k <= 5000; ++k) ASSERT_EQ(idx->remove(encode_u64(k * 7919 % 100003)), Code::ok);
  nb->collect_garbage();
  const auto after = idx->footprint().pm_bytes;
  const std::size_t leaves = nb->leaf_count();
  std::printf("pool bytes in use: empty %llu, 5000 keys %llu (%zu leaves), after deleting all "
              "%llu (%zu leaves x 256 B, %llu merges)\n",
              static_cast<unsigned long long>(empty), static_cast<unsigned long long>(full),
              full_leaves, static_cast<unsigned long long>(after), leaves,
              static_cast<unsigned long long>(nb->merges_linked()));
  // Every out-of-line record and every replaced leaf is back: only live blocks and the root.
  EXPECT_EQ(after, empty + (leaves - 1) * 256);
  // Emptied leaves merged away (M): before merges every one of the 5000 keys' leaves stayed.
  EXPECT_LE(leaves * 20, full_leaves);
  ASSERT_TRUE(idx->verify().ok());
}

// --- variable-length keys (KeyType::bytes) -------------------------------------------------------

Options nb_bytes_options(std::uint32_t node_size, pm::Mode mode, std::string path = "") {
  Options o = nb_options(node_size, mode, std::move(path));
  o.key_type = KeyType::bytes;
  o.max_key_size = 4096;
  return o;
}

// Keys in memcmp order's corners: the empty key, NUL bytes inside and at the end, prefix pairs
// ("a" < "a\0" < "a\0\0" < "a\1"), multi-KiB keys differing only in the last byte.
struct BytesGen : Gen {
  using Gen::Gen;
  std::string key() {
    switch (u(11)) {
      case 0: return "";
      case 1: return "a";
      case 2: return std::string("a\0", 2);
      case 3: return std::string("a\0\0", 3);
      case 4: return std::string("a\1", 2);
      case 5: return std::string(1000 + 1000 * u(3), 'k') + static_cast<char>(u(3));
      case 6: {
        std::string s(u(3), '\0');
        s += static_cast<char>(u(2));
        return s;
      }
      default: return "key" + std::to_string(u(300));
    }
  }
};

RandomStats random_ops_bytes(MapChecker& c, std::shared_ptr<BytesGen> g, int ops,
                             int verify_every) {
  return c.run({.phases = {mixed_phase(ops)}, .seed = 9, .verify_every = verify_every},
               [g](std::mt19937_64&) { return g->key(); },
               [g](std::mt19937_64&) { return g->value(); });
}

class NBTreeBytesRandom
    : public ::testing::TestWithParam<std::tuple<std::uint32_t, pm::Mode>> {};

TEST_P(NBTreeBytesRandom, AgainstStdMapWithVerifyAfterEveryOp) {
  const auto [node_size, mode] = GetParam();
  MapChecker c(nb_bytes_options(node_size, mode));
  ASSERT_TRUE(c.ok()) << c.open_status().to_string();
  random_ops_bytes(c, std::make_shared<BytesGen>(node_size * 37 + static_cast<int>(mode)), 5000,
                   1);
  EXPECT_GT(as_nb(&c.index())->leaf_count(), 4u) << "the test should split leaves";
}

INSTANTIATE_TEST_SUITE_P(SmallLeaves, NBTreeBytesRandom,
                         ::testing::Combine(::testing::Values(128u, 256u),
                                            ::testing::Values(pm::Mode::adr, pm::Mode::eadr)));

// Reopen after close and after a destroy without close keeps every key; deleting every key and
// reopening gives the pool back down to a fresh index's bytes (no key record leaks: records of
// deleted keys are freed at run time or, if an SMO raced, by recovery's reachability walk).
TEST(NBTreeBytes, ReopenKeepsEverythingAndDeletingAllLeaksNothing) {
  TempDir dir;
  const std::string path = dir.file("nbb.pool");
  const std::string fresh_path = dir.file("fresh.pool");
  std::uint64_t baseline = 0;
  {
    auto idx = open_or_die(nb_bytes_options(128, pm::Mode::adr, fresh_path));
    ASSERT_NE(idx, nullptr);
    ASSERT_TRUE(idx->close().ok());
  }
  {
    auto idx = open_or_die(nb_bytes_options(128, pm::Mode::adr, fresh_path));
    ASSERT_NE(idx, nullptr);
    baseline = idx->footprint().pm_bytes;
  }
  auto g = std::make_shared<BytesGen>(4242);
  // verify() only after SMOs and at the end; reopen after a clean close, more ops, then
  // recovery after a destroy without close (what a process crash leaves).
  MapChecker c(nb_bytes_options(128, pm::Mode::adr, path));
  ASSERT_TRUE(c.ok()) << c.open_status().to_string();
  random_ops_bytes(c, g, 3000, 0);
  ASSERT_TRUE(c.reopen(/*clean=*/true));
  random_ops_bytes(c, g, 3000, 0);
  ASSERT_TRUE(c.reopen(/*clean=*/false));
  const auto all = c.model();
  for (const auto& [k, v] : all) ASSERT_TRUE(c.remove(k));
  ASSERT_TRUE(c.verify());
  // At run time already: every key and value record is freed (K3 through the epochs); what
  // is left is one block per leaf (leaves are not merged) above the fresh index's bytes.
  auto* nb = as_nb(&c.index());
  nb->collect_garbage();
  EXPECT_EQ(c.index().footprint().pm_bytes, baseline + (nb->leaf_count() - 1) * 128)
      << "records not freed at run time";
  ASSERT_TRUE(c.reopen(/*clean=*/true));
  EXPECT_EQ(c.index().footprint().pm_bytes, baseline) << "key or value records leaked";
}

// Recovery never trusts a key word or a key record (K5): an out-of-bounds record offset, an
// impossible record length and blocks out of memcmp order are refused (Code::corrupted, pool
// unchanged); the same key twice in one block is repaired.
TEST(NBTreeBytes, RecoveryRefusesDamagedKeyRecords) {
  TempDir dir;
  const std::string path = dir.file("badb.pool");
  Options o = nb_bytes_options(128, pm::Mode::adr, path);
  o.pool_size = 1 << 20;
  o.max_key_size = 16;
  for (int kind = 0; kind < 4; ++kind) {
    std::remove(path.c_str());
    {
      auto idx = open_or_die(o);
      ASSERT_NE(idx, nullptr);
      for (int k = 10; k < 40; ++k) ASSERT_EQ(idx->insert("key" + std::to_string(k), encode_u64(k)), Code::ok);
      ASSERT_GT(as_nb(idx.get())->leaf_count(), 2u);
      char* base = idx->pool().base();
      const auto* root = reinterpret_cast<const nbtree::Root*>(base + idx->pool().root());
      const std::uint64_t head = index_common::link_off(root->head);
      const std::uint64_t second = index_common::link_off(
          reinterpret_cast<const nbtree::BlockHeader*>(base + head)->next);
      auto entries_of = [&](std::uint64_t block) {
        return reinterpret_cast<nbtree::Entry*>(base + block + sizeof(nbtree::BlockHeader));
      };
      auto first_live = [&](nbtree::Entry* e) {
        int i = 0;
        while (e[i].key == 0) ++i;
        return i;
      };
      nbtree::Entry* e = entries_of(kind == 3 ? second : head);
      const int live = first_live(e);
      if (kind == 0) {
        e[live].key = idx->pool().size() + 4096;
      } else if (kind == 1) {
        const std::uint64_t huge = std::uint64_t{1} << 40;
        std::memcpy(base + e[live].key, &huge, 8);  // the record's length word
      } else if (kind == 2) {
        int empty = -1;
        for (int i = live + 1; i < as_nb(idx.get())->leaf_capacity(); ++i) {
          if (e[i].key == 0) {
            empty = i;
            break;
          }
        }
        ASSERT_GE(empty, 0) << "the test needs a free slot after the first live one";
        e[empty] = nbtree::Entry{e[live].key, 999};
      } else {
        base[e[live].key + 8] = '\0';  // "key.." -> "\0ey..": below every key of the head block
      }
      // destroyed without close: recovery runs at the next open
    }
    auto slurp = [&] {
      std::ifstream in(path, std::ios::binary);
      std::ostringstream out;
      out << in.rdbuf();
      return out.str();
    };
    const std::string before = slurp();
    auto r = Index::open(o);
    if (kind != 2) {
      ASSERT_FALSE(r.ok()) << "damage " << kind << " accepted";
      EXPECT_EQ(r.status().code(), Code::corrupted) << r.status().to_string();
      std::printf("damage %d: %s\n", kind, r.status().to_string().c_str());
      EXPECT_TRUE(slurp() == before) << "a pool refused at recovery must stay unchanged";
    } else {
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      auto idx = std::move(r).value();
      EXPECT_GE(idx->recovery_stats().repaired, 1u);
      EXPECT_EQ(idx->recovery_stats().records, 30u);
      EXPECT_TRUE(idx->verify().ok()) << idx->verify().to_string();
    }
  }
}

TEST(NBTreeBytes, KeyLimits) {
  Options o = nb_bytes_options(256, pm::Mode::eadr);
  o.max_key_size = 100;
  auto idx = open_or_die(o);
  ASSERT_NE(idx, nullptr);
  const std::string ok_key(100, 'x'), long_key(101, 'x');
  std::string got;
  EXPECT_EQ(idx->insert(ok_key, encode_u64(1)), Code::ok);
  EXPECT_EQ(idx->insert(long_key, encode_u64(1)), Code::key_too_large);
  EXPECT_EQ(idx->update(long_key, encode_u64(1)), Code::key_too_large);
  EXPECT_EQ(idx->upsert(long_key, encode_u64(1)), Code::key_too_large);
  EXPECT_EQ(idx->find(long_key, &got), Code::key_too_large);
  EXPECT_EQ(idx->remove(long_key), Code::key_too_large);
  EXPECT_EQ(idx->find(ok_key, &got), Code::ok);
  ASSERT_TRUE(idx->verify().ok());
  // The limit itself is bounded (kMaxKeyBytes).
  o.max_key_size = nbtree::kMaxKeyBytes + 1;
  EXPECT_FALSE(Index::open(o).ok());
  // u64 mode: a key of another size stays invalid_argument.
  auto u = open_or_die(nb_options(256, pm::Mode::eadr));
  ASSERT_NE(u, nullptr);
  EXPECT_EQ(u->insert("abc", encode_u64(1)), Code::invalid_argument);
  EXPECT_EQ(u->find(std::string(9, 'k'), &got), Code::invalid_argument);
}

// Known-bad: a leaf bound (DRAM separator) that no longer orders the keys by memcmp must fail
// verify() (the bytes-mode range check).
TEST(NBTreeBytes, VerifyCatchesABadSeparator) {
  auto idx = open_or_die(nb_bytes_options(128, pm::Mode::eadr));
  ASSERT_NE(idx, nullptr);
  for (int k = 0; k < 60; ++k) ASSERT_EQ(idx->insert("key" + std::to_string(k), encode_u64(k)), Code::ok);
  ASSERT_GT(as_nb(idx.get())->leaf_count(), 2u);
  ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
  as_nb(idx.get())->corrupt_for_testing(3);
  const Status s = idx->verify();
  EXPECT_FALSE(s.ok()) << "a separator above its leaf's keys was not detected";
}

TEST(NBTreeBytes, BulkLoadThenOperate) {
  auto idx = open_or_die(nb_bytes_options(128, pm::Mode::adr));
  ASSERT_NE(idx, nullptr);
  std::map<std::string, std::string> oracle;
  for (int k = 0; k < 300; ++k) oracle["k" + std::to_string(k * 2)] = encode_u64(k);
  oracle[""] = encode_u64(7);
  oracle[std::string("k\0", 2)] = std::string(12, 'q');
  std::vector<KeyValue> kv;
  for (const auto& [k, v] : oracle) kv.push_back({k, v});
  std::vector<KeyValue> unsorted(kv.rbegin(), kv.rend());
  EXPECT_FALSE(idx->bulk_load(unsorted, 0.7).ok()) << "unsorted input must be refused";
  ASSERT_TRUE(idx->bulk_load(kv, 0.7).ok());
  ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
  check_against(*idx, oracle);
  for (int k = 0; k < 300; ++k) {
    const std::string key = "k" + std::to_string(k * 2 + 1);
    ASSERT_EQ(idx->insert(key, encode_u64(k)), Code::ok);
    oracle[key] = encode_u64(k);
    ASSERT_TRUE(idx->verify().ok()) << idx->verify().to_string();
  }
  check_against(*idx, oracle);
}

// Recovery time after a crash-like close (PMINDEX_NBTREE_RECOVERY_RECORDS, default 100,000;
// the paper reports 0.32 s for 16M). A report, not a timed assertion.
TEST(NBTree, RecoveryTimeReport) {
  const char* env = std::getenv("PMINDEX_NBTREE_RECOVERY_RECORDS");
  const std::uint64_t n = env != nullptr ? std::strtoull(env, nullptr, 10) : 100'000;
  TempDir dir;
  Options o = nb_options(0, pm::Mode::eadr, dir.file("rec.pool"));
  o.pool_size = std::max<std::size_t>(64 << 20, n * 96);
  {
    auto idx = open_or_die(o);
    ASSERT_NE(idx, nullptr);
    for (std::uint64_t i = 1; i <= n; ++i) {
      ASSERT_EQ(idx->insert(encode_u64(i * 0x9E3779B97F4A7C15ull), encode_u64(i)), Code::ok);
    }
  }
  auto idx = open_or_die(o);
  ASSERT_NE(idx, nullptr);
  const RecoveryStats st = idx->recovery_stats();
  EXPECT_EQ(st.records, n);
  std::printf("recovery of %llu records in %llu blocks: %.3f s (one thread)\n",
              static_cast<unsigned long long>(st.records),
              static_cast<unsigned long long>(st.nodes), st.seconds);
  std::string got;
  ASSERT_EQ(idx->find(encode_u64(n * 0x9E3779B97F4A7C15ull), &got), Code::ok);
  EXPECT_EQ(got, encode_u64(n));
}

// The inner-node search of the u64 descent (snapshot): count_u64_not_above over the 63
// separators by fixed binary steps, against a linear count, for every count 0..63, probes
// below, between, on and above the keys; and a torn count (any 32-bit value, as a reader
// racing a writer may read) answers at most 63, so children[lo] stays inside the node.
TEST(NBTreeSearch, FixedStepCountMatchesLinearCount) {
  constexpr unsigned kCap = nbtree::Inner::kMaxFanout - 1;
  std::mt19937_64 rng(16);
  alignas(32) std::uint64_t k[kCap + 1 + 4];  // + the word after the keys (children[0])
  for (int round = 0; round < 20000; ++round) {
    for (auto& w : k) w = rng();  // slots past the count hold garbage
    const unsigned cnt = static_cast<unsigned>(round % (kCap + 1));
    std::vector<std::uint64_t> v(cnt);
    for (auto& w : v) w = rng() % 4096 + (round % 3 == 0 ? ~std::uint64_t{0} - 8192 : 0);
    std::sort(v.begin(), v.end());
    std::copy(v.begin(), v.end(), k);
    // Half the probes on a key or just above one, the others anywhere near the keys (wrapping).
    std::uint64_t probe = cnt == 0 ? rng() : v[0] - 64 + rng() % 8192;
    if (cnt != 0 && round % 2 == 0) probe = v[rng() % cnt] + rng() % 2;
    const auto want = static_cast<unsigned>(std::count_if(
        v.begin(), v.end(), [probe](std::uint64_t w) { return w <= probe; }));
    ASSERT_EQ((index_common::count_u64_not_above<kCap>(k, cnt, probe)), want)
        << "count " << cnt << ", probe " << probe;
    const auto torn = static_cast<unsigned>(rng());
    EXPECT_LE((index_common::count_u64_not_above<kCap>(k, torn, probe)), kCap);
    EXPECT_LE((index_common::count_u64_not_above<kCap>(k, ~0u, probe)), kCap);
  }
}

}  // namespace
}  // namespace pmindex

// DPTree's tagged links (issue 18; PROTOCOL.md "Tagged links", R1t, R2t): after an unclean end
// (no close(), so no close counts to compare) a damaged link of the current version's leaf
// chain or of the log's page chain is refused at open with Code::corrupted and a message naming
// the leaf or page: a link zeroed, a link redirected to another valid leaf or page with its tag
// bits left as they were, a linked leaf's or page's first line(s) zeroed, the root's head and
// log_head zeroed or redirected. The known-bad instantiation without the checks
// (Protocol::kUncheckedLinks: links read as offsets) opens the same pools; where nothing else
// sees the damage it answers a silently shorter chain or log, which is what the tags exist to
// refuse. Also: a DPTREE01 pool (untagged) is refused with a message, and verify() names a
// damaged link it finds in a running index.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "index/common/damage_checks.h"
#include "index/dptree/dptree_recovery.h"  // the templates: the known-bad policy below
#include "pmindex/index.h"
#include "support/temp_dir.h"

namespace pmindex::dptree {

struct UncheckedLinks : Protocol {
  static constexpr bool kUncheckedLinks = true;
};
template class DPTree<UncheckedLinks>;

namespace {

using index_common::link_off;
using index_common::link_tag;
using index_common::make_link;
using pmindex::testing::expect_refused_after_unclean_end;
using pmindex::testing::TempDir;

constexpr std::uint32_t kSlots = 8;        // small leaves: a chain of ~150 leaves
constexpr std::uint64_t kBaseKeys = 800;   // merged into the base tree
constexpr std::uint64_t kLogKeys = 300;    // then buffered: 5 log pages (63 records each)

Options damage_options(const std::string& path) {
  Options o;
  o.kind = "dptree";
  o.path = path;
  o.pool_size = 4 << 20;
  o.node_size = static_cast<std::uint32_t>(leaf_bytes(kSlots));
  return o;
}

// The chain of the current version and the log as they are in PM (quiescent).
struct PoolView {
  char* base = nullptr;
  Root* root = nullptr;
  unsigned gv = 0;
  std::vector<std::uint64_t> leaves;  // offsets, in chain order
  std::vector<std::uint64_t> pages;   // offsets, in log order
  Meta& meta(std::size_t i) const { return *reinterpret_cast<Meta*>(base + leaves[i] + 64 * gv); }
  LogPageHeader& page(std::size_t i) const {
    return *reinterpret_cast<LogPageHeader*>(base + pages[i]);
  }
  std::string leaf(std::size_t i) const {
    return "dptree leaf at offset " + std::to_string(leaves[i]) + ": ";
  }
  std::string log_page(std::size_t i) const {
    return "dptree log page at offset " + std::to_string(pages[i]) + ": ";
  }
};

PoolView view_of(Index& idx) {
  PoolView v;
  v.base = idx.pool().base();
  v.root = reinterpret_cast<Root*>(v.base + idx.pool().root());
  v.gv = state_gv(v.root->state);
  for (std::uint64_t l = v.root->head[v.gv]; link_off(l) != 0;
       l = reinterpret_cast<Meta*>(v.base + link_off(l) + 64 * v.gv)->next)
    v.leaves.push_back(link_off(l));
  for (std::uint64_t l = v.root->log_head; link_off(l) != 0;
       l = reinterpret_cast<LogPageHeader*>(v.base + link_off(l))->next)
    v.pages.push_back(link_off(l));
  return v;
}

constexpr const char* kZeroed = "offset 0 without the end mark";
constexpr const char* kOtherTag = "the link to it (the ";

// One kind of damage: applied to the pool, it returns what the refusal must say.
struct Damage {
  const char* what;
  // The known-bad (no tag checks) opens it and loses records silently; else another check
  // (bounds, sequence numbers) refuses it anyway.
  bool silent_without_tags;
  std::function<std::string(PoolView&)> apply;
};

std::vector<Damage> damages() {
  return {
      // The base chain (version gv).
      {"zeroed leaf link", false,  // leaf 40's bound is not ~0: the last-bound check sees it too
       [](PoolView& v) {
         v.meta(40).next = 0;
         return "dptree next link of the leaf at offset " + std::to_string(v.leaves[40]) +
                " is 0: " + kZeroed;
       }},
      {"redirected leaf link", true,  // past leaf 41 to leaf 42, the tag still leaf 41's
       [](PoolView& v) {
         v.meta(40).next = make_link(v.leaves[42], link_tag(v.meta(40).next));
         return v.leaf(42) + kOtherTag + "next link of the leaf at offset " +
                std::to_string(v.leaves[40]) + ")";
       }},
      {"zeroed leaf lines", false,  // bound 0: the bound order sees it too
       [](PoolView& v) {
         std::memset(v.base + v.leaves[41], 0, 128);  // both metadata versions
         return v.leaf(41) + kOtherTag + "next link of the leaf at offset " +
                std::to_string(v.leaves[40]) + ")";
       }},
      {"zeroed root head", false,  // an empty chain is refused anyway
       [](PoolView& v) {
         v.root->head[v.gv] = 0;
         return "dptree root head[" + std::to_string(v.gv) + "] is 0: " + kZeroed;
       }},
      {"redirected root head", true,  // to leaf 1: leaf 0's keys are lost
       [](PoolView& v) {
         v.root->head[v.gv] = make_link(v.leaves[1], link_tag(v.root->head[v.gv]));
         return v.leaf(1) + kOtherTag + "root head[" + std::to_string(v.gv) + "])";
       }},
      // The log's page chain.
      {"zeroed page link", true,  // pages 2-4 would be read as past the end of the log
       [](PoolView& v) {
         v.page(1).next = 0;
         return "dptree next link of the log page at offset " + std::to_string(v.pages[1]) +
                " is 0: " + kZeroed;
       }},
      {"redirected page link", false,  // past page 2 to page 3: first_lsn does not continue
       [](PoolView& v) {
         v.page(1).next = make_link(v.pages[3], link_tag(v.page(1).next));
         return v.log_page(3) + kOtherTag + "next link of the log page at offset " +
                std::to_string(v.pages[1]) + ")";
       }},
      {"zeroed page header", false,  // first_lsn 0 does not continue the log either
       [](PoolView& v) {
         std::memset(v.base + v.pages[2], 0, 64);
         return v.log_page(2) + kOtherTag + "next link of the log page at offset " +
                std::to_string(v.pages[1]) + ")";
       }},
      {"zeroed root log_head", true,  // read as an empty log: every buffered write lost
       [](PoolView& v) {
         v.root->log_head = 0;
         return std::string("dptree root log_head is 0: ") + kZeroed;
       }},
  };
}

// kBaseKeys keys merged into a chain of small leaves, kLogKeys more left in the log (a buffer
// too large to merge), the damage applied, then an end without close(). Returns what the
// refusal must say.
std::string make_damaged_pool(const Options& o, const Damage& d) {
  pm::PoolOptions po;
  po.path = o.path;
  po.size = o.pool_size;
  po.layout = layout_for(o);
  auto pool = pm::Pool::create(po);
  EXPECT_TRUE(pool.ok()) << pool.status().to_string();
  if (!pool.ok()) return {};
  Config config;
  config.background = false;
  config.min_buffer = 1000;
  auto r = DPTree<>::create(std::move(pool).value(), o, config);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (!r.ok()) return {};
  std::unique_ptr<Index> idx = std::move(r).value();
  auto* t = dynamic_cast<DPTree<>*>(idx.get());
  for (std::uint64_t i = 1; i <= kBaseKeys; ++i)
    EXPECT_EQ(idx->insert(encode_u64(i * 16), encode_u64(i)), Code::ok);
  EXPECT_EQ(t->merge_for_testing(), Code::ok);
  for (std::uint64_t i = 1; i <= kLogKeys; ++i)  // between the base keys: new keys
    EXPECT_EQ(idx->insert(encode_u64(i * 16 + 7), encode_u64(i)), Code::ok);
  EXPECT_TRUE(idx->verify().ok()) << idx->verify().to_string();
  PoolView v = view_of(*idx);
  EXPECT_GE(v.leaves.size(), 50u);
  const std::uint32_t per_page = records_per_page(v.root->log_page_bytes);  // 63: small leaves
  EXPECT_EQ(v.pages.size(), (kLogKeys + per_page - 1) / per_page);
  if (v.leaves.size() < 50 || v.pages.size() < 5) return {};
  return d.apply(v);
}  // no close(): an unclean end, so no counts are stored

TEST(DPTreeDamage, RecoveryAfterAnUncleanEndRefusesADamagedLink) {
  for (const Damage& d : damages()) {
    SCOPED_TRACE(d.what);
    TempDir dir;
    const Options o = damage_options(dir.file("d.pool"));
    const std::string says = make_damaged_pool(o, d);
    ASSERT_FALSE(says.empty());
    expect_refused_after_unclean_end(o, d.what, says);
  }
}

// The known-bad: the same damage through DPTree<UncheckedLinks> (R1t, R2t and verify()'s tag
// checks off). Damage that nothing else sees opens and verifies as a shorter chain or log;
// the rest is refused by the bound order or the log's sequence numbers, tags or not.
TEST(DPTreeDamage, WithoutTheTagChecksTheDamageIsASilentlyShorterChainOrLog) {
  int silent = 0;
  for (const Damage& d : damages()) {
    SCOPED_TRACE(d.what);
    TempDir dir;
    const Options o = damage_options(dir.file("d.pool"));
    ASSERT_FALSE(make_damaged_pool(o, d).empty());
    auto pool = pm::Pool::open({.path = o.path, .mode = pm::Mode::adr, .layout = layout_for(o)});
    ASSERT_TRUE(pool.ok()) << pool.status().to_string();
    Config config;
    config.background = false;
    auto r = DPTree<UncheckedLinks>::recover(std::move(pool).value(), o, config);
    if (!d.silent_without_tags) {
      EXPECT_FALSE(r.ok()) << "expected the bound or sequence number checks to refuse it";
      if (!r.ok()) {
        EXPECT_EQ(r.status().code(), Code::corrupted) << r.status().to_string();
      }
      continue;
    }
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ++silent;
    std::unique_ptr<Index> idx = std::move(r).value();
    EXPECT_LT(idx->recovery_stats().records, kBaseKeys + kLogKeys)
        << "records lost, and nothing said so";
    EXPECT_TRUE(idx->verify().ok()) << idx->verify().to_string();
  }
  EXPECT_EQ(silent, 4);
}

// A pool written before tagged links (root magic DPTREE01) is refused with a message saying
// what to do, never read as a chain whose links lack tags.
TEST(DPTreeDamage, UntaggedFormatIsRefused) {
  TempDir dir;
  Options o = damage_options(dir.file("u.pool"));
  {
    auto r = Index::open(o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_EQ((*r)->insert(encode_u64(1), encode_u64(1)), Code::ok);
    view_of(**r).root->magic = kRootMagicUntagged;
    ASSERT_TRUE((*r)->close().ok());
  }
  auto r = Index::open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::corrupted);
  EXPECT_NE(r.status().message().find("DPTREE01"), std::string::npos) << r.status().to_string();
  EXPECT_NE(r.status().message().find("new pool"), std::string::npos) << r.status().to_string();
}

// verify() (and so pmpool check) checks every link of a running index against its DRAM chain
// and log: a link whose tag was damaged (offset kept) is named; fixed again, verify passes.
TEST(DPTreeDamage, VerifyNamesADamagedLink) {
  TempDir dir;
  const Options o = damage_options(dir.file("v.pool"));
  const Damage none{"none", false, [](PoolView&) { return std::string("-"); }};
  ASSERT_FALSE(make_damaged_pool(o, none).empty());
  auto r = Index::open(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  Index& idx = **r;
  ASSERT_TRUE(idx.verify().ok()) << idx.verify().to_string();
  PoolView v = view_of(idx);
  ASSERT_GE(v.leaves.size(), 50u);
  ASSERT_GE(v.pages.size(), 2u);
  const std::uint64_t flip = std::uint64_t{1} << 48;  // the tag's low bit
  struct Word {
    std::uint64_t* at;
    const char* says;
  };
  for (const Word& w : {Word{&v.root->head[v.gv], "root head"},
                        Word{&v.meta(20).next, "next link"},
                        Word{&v.meta(v.leaves.size() - 1).next, "the end mark"},
                        Word{&v.root->log_head, "root log_head"},
                        Word{&v.page(0).next, "next link"}}) {
    SCOPED_TRACE(w.says);
    *w.at ^= flip;
    const Status s = idx.verify();
    EXPECT_EQ(s.code(), Code::corrupted);
    EXPECT_NE(s.message().find(w.says), std::string::npos) << s.to_string();
    *w.at ^= flip;
    EXPECT_TRUE(idx.verify().ok()) << idx.verify().to_string();
  }
  ASSERT_TRUE(idx.close().ok());
}

}  // namespace
}  // namespace pmindex::dptree

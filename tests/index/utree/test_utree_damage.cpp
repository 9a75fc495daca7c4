// uTree's tagged links (PROTOCOL.md R1t, issue 18): after an unclean end (no close, so no
// close counts to compare) a link zeroed, a link redirected to another valid node with its tag
// bits left, a zeroed list node or page, and a zeroed root.head are each refused at open with
// Code::corrupted and a message naming the node. The known-bad instantiation without R1t's
// checks (Protocol::kUncheckedLinks) opens the same damaged pools; where the damage keeps the
// keys in order it answers a silently shorter list, which is what R1t exists to refuse.
// Also: a pool of the untagged format (UTREE001) is refused with a message, and verify()'s own
// R1t check names the link it finds damaged.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "index/common/damage_checks.h"
#include "index/common/map_checker.h"
#include "index/utree/utree_recovery.h"
#include "pmindex/index.h"
#include "support/temp_dir.h"

namespace pmindex::utree {

struct UncheckedLinks : Protocol {
  static constexpr bool kUncheckedLinks = true;
};
template class UTree<UncheckedLinks>;

namespace {

using pmindex::testing::expect_refused_after_unclean_end;
using pmindex::testing::open_or_die;
using pmindex::testing::TempDir;

constexpr std::uint64_t kKeys = 300;  // ascending: ~5 pages of 64 B node blocks

Options damage_options(KeyType kt, const std::string& path) {
  Options o;
  o.kind = "utree";
  o.path = path;
  o.pool_size = 1 << 20;
  o.node_size = 512;
  o.key_type = kt;
  o.max_key_size = kt == KeyType::bytes ? 32 : 8;
  return o;
}

// Bytes keys share their 8-byte prefix ("user0000"): a tag of the prefix alone would be the same
// for every node, so these keys show that the key record's offset is part of the tag.
std::string key_of(KeyType kt, std::uint64_t i) {
  if (kt == KeyType::u64) return encode_u64(i);
  std::string digits = std::to_string(i);
  return "user" + std::string(10 - digits.size(), '0') + digits;
}

// The list as it is in PM: the root and each node in list order (quiescent).
struct ListView {
  char* base = nullptr;
  Root* root = nullptr;
  std::size_t node_bytes = 0;
  std::vector<ListNode*> nodes;
  std::uint64_t off(const void* at) const { return static_cast<const char*>(at) - base; }
  std::string node(std::size_t i) const {
    return "utree list node at offset " + std::to_string(off(nodes[i])) + ": ";
  }
};

ListView view_of(Index& idx, KeyType kt) {
  ListView v;
  v.base = idx.pool().base();
  v.root = reinterpret_cast<Root*>(v.base + idx.pool().root());
  v.node_bytes = kt == KeyType::bytes ? kNodeBytesBytes : kNodeBytesWord;
  for (std::uint64_t off = link_target(v.root->head); off != 0;
       off = link_target(v.nodes.back()->next))
    v.nodes.push_back(reinterpret_cast<ListNode*>(v.base + off));
  return v;
}

constexpr const char* kZeroed = "its link names offset 0 without the end mark";
constexpr const char* kOtherTag = "the link to it (from ";

// One kind of damage: applied to the list, it returns what the refusal must say (the node or
// root head it names, and what is wrong there).
struct Damage {
  const char* what;
  bool silent_without_tags;  // the known-bad opens it (keys still in order; u64 keys)
  std::uint64_t records_without_tags;
  std::function<std::string(ListView&)> apply;
};

std::vector<Damage> damages() {
  return {
      {"zeroed link", true, 100,
       [](ListView& v) {
         v.nodes[99]->next = 0;
         return v.node(99) + kZeroed;
       }},
      {"redirected link", true, kKeys - 1,
       [](ListView& v) {  // past node 101 to node 102, the tag still node 101's
         v.nodes[100]->next = make_link(v.off(v.nodes[102]), link_tag(v.nodes[100]->next));
         return v.node(102) + kOtherTag + "offset " + std::to_string(v.off(v.nodes[100]));
       }},
      {"zeroed root head", true, 0,
       [](ListView& v) {
         v.root->head = 0;
         return std::string("utree root head: ") + kZeroed;
       }},
      {"zeroed first node", true, 1,  // read as key 0 alone (bytes keys: no key record)
       [](ListView& v) {
         std::memset(v.nodes[0], 0, v.node_bytes);
         return v.node(0) + kOtherTag + "root head";
       }},
      {"zeroed page", false, 0,
       [](ListView& v) {  // the page holding node 151 (not the root's: nodes follow it)
         const std::uint64_t page = v.off(v.nodes[150]) & ~std::uint64_t{4095};
         std::size_t first = 0;  // the first node in list order inside the page
         while (v.off(v.nodes[first]) < page) ++first;
         EXPECT_GT(first, 0u);
         EXPECT_GT(page, v.off(v.root));
         std::memset(v.base + page, 0, 4096);
         return v.node(first) + kOtherTag;
       }},
  };
}

// A pool of kKeys ascending keys, damaged, ended without close(). Returns what the refusal
// must say.
std::string make_damaged_pool(const Options& o, const Damage& d) {
  auto idx = open_or_die(o);
  EXPECT_NE(idx, nullptr);
  if (idx == nullptr) return {};
  for (std::uint64_t i = 1; i <= kKeys; ++i)
    EXPECT_EQ(idx->insert(key_of(o.key_type, i), encode_u64(i)), Code::ok);
  ListView v = view_of(*idx, o.key_type);
  EXPECT_EQ(v.nodes.size(), kKeys);
  if (v.nodes.size() != kKeys) return {};
  return d.apply(v);
}  // no close(): an unclean end, so no counts are stored

TEST(UtreeDamage, RecoveryAfterAnUncleanEndRefusesADamagedLink) {
  for (KeyType kt : {KeyType::u64, KeyType::bytes}) {
    for (const Damage& d : damages()) {
      SCOPED_TRACE(std::string(d.what) + (kt == KeyType::bytes ? " (bytes keys)" : ""));
      TempDir dir;
      const Options o = damage_options(kt, dir.file("u.pool"));
      const std::string says = make_damaged_pool(o, d);
      ASSERT_FALSE(says.empty());
      expect_refused_after_unclean_end(o, d.what, says);
    }
  }
}

// The known-bad: the same damage through UTree<UncheckedLinks> (no R1t). Damage that keeps the
// keys in order opens and verifies as a shorter list. A zeroed page mid-list is refused by the
// key order check, tags or not, and so is any zeroed node of bytes keys (no key record).
TEST(UtreeDamage, WithoutTheTagChecksTheDamageIsASilentlyShorterList) {
  for (KeyType kt : {KeyType::u64, KeyType::bytes}) {
    for (const Damage& d : damages()) {
      SCOPED_TRACE(std::string(d.what) + (kt == KeyType::bytes ? " (bytes keys)" : ""));
      const bool silent = d.silent_without_tags &&
                          !(kt == KeyType::bytes && std::string(d.what) == "zeroed first node");
      TempDir dir;
      const Options o = damage_options(kt, dir.file("u.pool"));
      ASSERT_FALSE(make_damaged_pool(o, d).empty());
      auto pool = pm::Pool::open({.path = o.path, .mode = pm::Mode::adr, .layout = layout_for(o)});
      ASSERT_TRUE(pool.ok()) << pool.status().to_string();
      auto r = UTree<UncheckedLinks>::recover(std::move(pool).value(), o);
      if (!silent) {
        EXPECT_FALSE(r.ok()) << "expected the key order or key record check to refuse it";
        continue;
      }
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      std::unique_ptr<Index> idx = std::move(r).value();
      EXPECT_EQ(idx->recovery_stats().records, d.records_without_tags);
      EXPECT_LT(idx->recovery_stats().records, kKeys) << "records lost, and nothing said so";
      EXPECT_TRUE(idx->verify().ok()) << idx->verify().to_string();
    }
  }
}

// A pool written before tagged links (root magic UTREE001) is refused with a message saying
// what to do, never read as a list whose links lack tags.
TEST(UtreeDamage, UntaggedFormatIsRefused) {
  TempDir dir;
  const Options o = damage_options(KeyType::u64, dir.file("u.pool"));
  {
    auto idx = open_or_die(o);
    ASSERT_NE(idx, nullptr);
    ASSERT_EQ(idx->insert(encode_u64(1), encode_u64(1)), Code::ok);
    view_of(*idx, KeyType::u64).root->magic = kRootMagicUntagged;
    ASSERT_TRUE(idx->close().ok());
  }
  auto r = Index::open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::corrupted);
  EXPECT_NE(r.status().message().find("UTREE001"), std::string::npos) << r.status().to_string();
  EXPECT_NE(r.status().message().find("new pool"), std::string::npos) << r.status().to_string();
}

// verify()'s R1t check (so `pmpool check` on an open index): a zeroed link and root.head
// redirected past the first node with its tag left are named as such.
TEST(UtreeDamage, VerifyNamesADamagedLink) {
  for (const auto& [what, needle] : {std::pair{4, "without the end mark"},
                                     std::pair{5, "another node's tag"}}) {
    auto idx = open_or_die(damage_options(KeyType::u64, ""));
    ASSERT_NE(idx, nullptr);
    for (std::uint64_t k = 1; k <= 10; ++k)
      ASSERT_EQ(idx->insert(encode_u64(k), encode_u64(k)), Code::ok);
    auto& t = dynamic_cast<UTree<>&>(*idx);
    ASSERT_TRUE(t.verify().ok());
    t.corrupt_for_testing(what);
    const Status s = t.verify();
    EXPECT_FALSE(s.ok()) << "damage " << what;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.to_string();
  }
}

// The tag's inputs: equal key words with distinct key records (bytes keys sharing a prefix)
// get distinct tags, and no tag is 0 or the end mark's.
TEST(UtreeDamage, TagsMixTheKeyRecord) {
  const std::uint64_t prefix = 0x7573657230303030ull;  // "user0000"
  EXPECT_NE(node_tag(prefix, 0x1000), node_tag(prefix, 0x1040));
  for (std::uint64_t k = 0; k < 100000; ++k) {
    const std::uint64_t t = node_tag(k, k % 3 == 0 ? 0 : k * 64);
    ASSERT_TRUE(t >= 1 && t < kEndTag) << k;
  }
}

}  // namespace
}  // namespace pmindex::utree

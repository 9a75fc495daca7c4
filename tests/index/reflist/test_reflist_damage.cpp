// reflist's tagged links (PROTOCOL.md W1t, issue 18): after an unclean end (no close, so no
// close counts to compare) a link zeroed, a link redirected to another valid record with its
// tag bits kept, a zeroed linked record, a flipped value byte of a linked record and a zeroed
// root.head of an empty list are each refused at open with Code::corrupted and a message naming
// the record. The known-bad run (RefList::set_ignore_link_tags_for_testing: links read as
// offsets only) opens the same damaged pools as a silently shorter list or a wrong value.
// Also the REFLIST1 (untagged) format: the golden image and pools with some links untagged open
// with all their data and are upgraded in place (R10, R11); a tagged link in them is checked.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "index/common/damage_checks.h"
#include "index/common/map_checker.h"
#include "index/reflist/layout.h"
#include "index/reflist/reflist.h"
#include "pmindex/index.h"
#include "support/temp_dir.h"

namespace pmindex::reflist {
namespace {

using pmindex::testing::expect_refused_after_unclean_end;
using pmindex::testing::open_or_die;
using pmindex::testing::TempDir;

constexpr std::uint64_t kKeys = 200;

Options damage_options(const std::string& path) {
  Options o;
  o.kind = "reflist";
  o.path = path;
  o.pool_size = 1 << 20;
  o.max_value_size = 16;
  return o;
}

std::string value_of(std::uint64_t k) { return "value-" + std::to_string(k * 7 + 3); }

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
void spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}
std::uint64_t word_at(const std::string& bytes, std::uint64_t off) {
  std::uint64_t w = 0;
  std::memcpy(&w, bytes.data() + off, 8);
  return w;
}
void put_word(std::string& bytes, std::uint64_t off, std::uint64_t w) {
  std::memcpy(bytes.data() + off, &w, 8);
}

// The chain as it is in a pool file: the root's offset and the records' offsets in order.
struct ChainView {
  std::uint64_t root = 0;
  std::vector<std::uint64_t> records;
};

ChainView view_of(const Index& idx) {
  ChainView v;
  const pm::Pool& p = idx.pool();
  v.root = p.root();
  for (std::uint64_t off = link_off(p.at<Root>(v.root)->head); off != 0;
       off = link_off(p.at<Record>(off)->next))
    v.records.push_back(off);
  return v;
}

// Keys 0..n-1, then an end without close(): recovery has no close counts to compare.
ChainView make_unclean_pool(const Options& o, std::uint64_t n) {
  auto idx = open_or_die(o);
  if (idx == nullptr) return {};
  for (std::uint64_t k = 0; k < n; ++k)
    EXPECT_EQ(idx->insert(encode_u64(k), value_of(k)), Code::ok);
  return view_of(*idx);  // idx goes out of scope without close(): an unclean end
}

std::string record(std::uint64_t off) { return "reflist record at offset " + std::to_string(off); }
std::string tag_mismatch(std::uint64_t off) { return record(off) + ": its content's tag is "; }

struct Damage {
  const char* what;
  std::uint64_t records_without_tags;  // what the known-bad opens (silently)
  bool wrong_value_without_tags;       // and key 120 answers another value
  // Damages the file's bytes; returns what the refusal must say.
  std::function<std::string(std::string&, const ChainView&)> apply;
};

std::vector<Damage> damages() {
  return {
      {"zeroed link", 100, false,
       [](std::string& b, const ChainView& v) {
         put_word(b, v.records[99], 0);
         return record(v.records[99]) + ": its next names offset 0 without the end mark";
       }},
      {"redirected link", kKeys - 1, false,
       [](std::string& b, const ChainView& v) {  // past record 101 to 102, record 101's tag kept
         const std::uint64_t w = word_at(b, v.records[100]);
         put_word(b, v.records[100], make_link(v.records[102], link_tag(w)));
         return tag_mismatch(v.records[102]);
       }},
      {"zeroed first record", 1, false,  // its key reads as "" and its next as the end
       [](std::string& b, const ChainView& v) {
         std::memset(b.data() + v.records[0], 0, sizeof(Record) + 8 + value_of(0).size());
         return tag_mismatch(v.records[0]);
       }},
      {"flipped value byte", kKeys, true,
       [](std::string& b, const ChainView& v) {
         b[v.records[120] + sizeof(Record) + 8 + 2] ^= 0x20;
         return tag_mismatch(v.records[120]);
       }},
  };
}

TEST(RefListLinkTags, DamageAfterAnUncleanEndIsRefused) {
  for (const Damage& d : damages()) {
    SCOPED_TRACE(d.what);
    TempDir dir;
    const Options o = damage_options(dir.file("d.pool"));
    const ChainView v = make_unclean_pool(o, kKeys);
    ASSERT_EQ(v.records.size(), kKeys);
    std::string bytes = slurp(o.path);
    const std::string needle = d.apply(bytes, v);
    spit(o.path, bytes);
    expect_refused_after_unclean_end(o, d.what, needle);
    EXPECT_EQ(slurp(o.path), bytes) << "a refused pool was changed";
  }
}

// Known-bad: with the link checks off the same damage opens, silently wrong.
TEST(RefListLinkTags, CheckOffOpensAShorterListOrAWrongValue) {
  RefList::set_ignore_link_tags_for_testing(true);
  for (const Damage& d : damages()) {
    SCOPED_TRACE(d.what);
    TempDir dir;
    const Options o = damage_options(dir.file("d.pool"));
    const ChainView v = make_unclean_pool(o, kKeys);
    std::string bytes = slurp(o.path);
    d.apply(bytes, v);
    spit(o.path, bytes);
    auto r = Index::open(o);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_FALSE((*r)->recovery_stats().clean_shutdown);
    EXPECT_EQ((*r)->recovery_stats().records, d.records_without_tags);
    EXPECT_TRUE((*r)->verify().ok());
    if (d.wrong_value_without_tags) {
      std::string got;
      ASSERT_EQ((*r)->find(encode_u64(120), &got), Code::ok);
      EXPECT_NE(got, value_of(120));
    }
  }
  RefList::set_ignore_link_tags_for_testing(false);
}

// An empty list's root.head is the end mark: a head of 0 is damage, not an empty list.
TEST(RefListLinkTags, ZeroedHeadOfAnEmptyListIsRefused) {
  TempDir dir;
  const Options o = damage_options(dir.file("e.pool"));
  const ChainView v = make_unclean_pool(o, 0);
  std::string bytes = slurp(o.path);
  ASSERT_EQ(word_at(bytes, v.root + offsetof(Root, head)), kListEnd);
  put_word(bytes, v.root + offsetof(Root, head), 0);
  spit(o.path, bytes);
  expect_refused_after_unclean_end(o, "zeroed head", "reflist root head names offset 0");
}

// verify() (so `pmpool check`) checks the same: a value byte flipped behind a live index.
TEST(RefListLinkTags, VerifyNamesTheDamagedRecord) {
  TempDir dir;
  const Options o = damage_options(dir.file("v.pool"));
  auto idx = open_or_die(o);
  ASSERT_NE(idx, nullptr);
  for (std::uint64_t k = 0; k < 10; ++k)
    ASSERT_EQ(idx->insert(encode_u64(k), value_of(k)), Code::ok);
  ASSERT_TRUE(idx->verify().ok());
  const ChainView v = view_of(*idx);
  idx->pool().base()[v.records[4] + sizeof(Record) + 8] ^= 1;
  const Status s = idx->verify();
  EXPECT_EQ(s.code(), Code::corrupted);
  EXPECT_NE(s.message().find(tag_mismatch(v.records[4])), std::string::npos) << s.to_string();
  idx->pool().base()[v.records[4] + sizeof(Record) + 8] ^= 1;
  EXPECT_TRUE(idx->verify().ok());
}

// A link word holds a 40-bit offset: a pool of 1 TiB or more is refused before any file exists.
TEST(RefListLinkTags, PoolsAboveOneTebibyteAreRefused) {
  TempDir dir;
  Options o = damage_options(dir.file("big.pool"));
  o.pool_size = (std::size_t{1} << 40) + 4096;
  auto r = Index::open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::invalid_argument) << r.status().to_string();
  EXPECT_FALSE(std::filesystem::exists(o.path));
  o.pool_size = 0;
  o.expected_records = std::size_t{1} << 34;  // the default size would be above 1 TiB
  r = Index::open(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::invalid_argument) << r.status().to_string();
}

// --- The REFLIST1 format (untagged links) -----------------------------------------------------

// Rewrites the links from link `from` on (0: root.head, i: record i-1's next) as REFLIST1 wrote
// them (plain offsets, 0 at the end) and sets the REFLIST1 magic: what an upgrade that a crash
// cut short after tagging links 0..from-1 leaves (from = 0: a pool as REFLIST1 wrote it).
void untag(std::string& b, const ChainView& v, std::size_t from) {
  put_word(b, v.root, kRootMagicUntagged);
  for (std::size_t i = from; i <= v.records.size(); ++i) {
    const std::uint64_t at = i == 0 ? v.root + offsetof(Root, head) : v.records[i - 1];
    put_word(b, at, i < v.records.size() ? v.records[i] : 0);
  }
}

// After the open every link is tagged and the magic says REFLIST2 (checked on the file).
void expect_upgraded(const std::string& path) {
  const std::string b = slurp(path);
  std::uint64_t header_root = 0;
  {
    auto idx = Index::open([&] {
      Options o = damage_options(path);
      o.open_mode = OpenMode::open;
      return o;
    }());
    ASSERT_TRUE(idx.ok()) << idx.status().to_string();
    header_root = (*idx)->pool().root();
    ASSERT_TRUE((*idx)->close().ok());
  }
  EXPECT_EQ(word_at(b, header_root), kRootMagic);
  std::uint64_t link = word_at(b, header_root + offsetof(Root, head));
  std::size_t n = 0;
  while (link != kListEnd && n < 100000) {
    ASSERT_NE(link_tag(link), 0u) << "link " << n << " is untagged";
    link = word_at(b, link_off(link));
    ++n;
  }
}

TEST(RefListUntagged, GoldenReflist1PoolOpensAndIsUpgradedInPlace) {
  TempDir dir;
  const std::string copy = dir.file("golden.pool");
  std::filesystem::copy_file(std::string(PMINDEX_GOLDEN_DIR) + "/v2-reflist.pool", copy);
  Options o = damage_options(copy);
  o.open_mode = OpenMode::open;
  {
    auto idx = Index::open(o);
    ASSERT_TRUE(idx.ok()) << idx.status().to_string();
    EXPECT_TRUE((*idx)->recovery_stats().clean_shutdown);
    EXPECT_TRUE((*idx)->recovery_stats().warning.empty()) << (*idx)->recovery_stats().warning;
    EXPECT_EQ((*idx)->recovery_stats().records, 100u);
    ASSERT_TRUE((*idx)->verify().ok());
    std::string v;
    ASSERT_EQ((*idx)->find(encode_u64(99), &v), Code::ok);
    EXPECT_EQ(decode_u64(v), 99u * 99u);
    ASSERT_TRUE((*idx)->close().ok());
  }
  expect_upgraded(copy);
}

// An upgrade cut short (some links tagged, the magic still REFLIST1) after a clean close and
// after an unclean end: the open accepts both forms and finishes it; the unclean one says in
// the warning that its untagged links could not be checked.
TEST(RefListUntagged, PartlyTaggedPoolsOpenAndFinishTheUpgrade) {
  for (bool clean : {true, false}) {
    for (std::size_t from : {std::size_t{0}, std::size_t{57}, std::size_t{kKeys}}) {
      SCOPED_TRACE(std::string(clean ? "clean" : "unclean") + ", untagged from link " +
                   std::to_string(from));
      TempDir dir;
      const Options o = damage_options(dir.file("u.pool"));
      ChainView v;
      {
        auto idx = open_or_die(o);
        ASSERT_NE(idx, nullptr);
        for (std::uint64_t k = 0; k < kKeys; ++k)
          ASSERT_EQ(idx->insert(encode_u64(k), value_of(k)), Code::ok);
        v = view_of(*idx);
        if (clean) {
          ASSERT_TRUE(idx->close().ok());
        }
      }
      std::string bytes = slurp(o.path);
      untag(bytes, v, from);
      spit(o.path, bytes);
      {
        auto idx = Index::open(o);
        ASSERT_TRUE(idx.ok()) << idx.status().to_string();
        const RecoveryStats st = (*idx)->recovery_stats();
        EXPECT_EQ(st.records, kKeys);
        EXPECT_EQ(st.warning.find("REFLIST1") != std::string::npos, !clean) << st.warning;
        ASSERT_TRUE((*idx)->verify().ok());
        std::string got;
        for (std::uint64_t k = 0; k < kKeys; ++k) {
          ASSERT_EQ((*idx)->find(encode_u64(k), &got), Code::ok);
          EXPECT_EQ(got, value_of(k));
        }
        ASSERT_EQ((*idx)->insert(encode_u64(kKeys), "more"), Code::ok);
        ASSERT_TRUE((*idx)->close().ok());
      }
      expect_upgraded(o.path);
    }
  }
}

// In a REFLIST1 pool a tagged link is checked: a redirect with its tag kept is still refused.
TEST(RefListUntagged, TaggedLinksOfAReflist1PoolAreChecked) {
  TempDir dir;
  const Options o = damage_options(dir.file("m.pool"));
  const ChainView v = make_unclean_pool(o, kKeys);
  std::string bytes = slurp(o.path);
  untag(bytes, v, 150);  // links 0..149 tagged
  const std::uint64_t w = word_at(bytes, v.records[100]);
  put_word(bytes, v.records[100], make_link(v.records[102], link_tag(w)));
  spit(o.path, bytes);
  expect_refused_after_unclean_end(o, "redirected tagged link", tag_mismatch(v.records[102]));
}

}  // namespace
}  // namespace pmindex::reflist

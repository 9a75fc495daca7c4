// After pool_full an index must stay usable (issue 19 item 2): verify() passes live, every
// acknowledged record reads back, and once records are removed their space serves new inserts
// without a reopen, whether or not the caller holds a ThreadScope. Every index kind, u64 keys
// with inline values, random and ascending; the indexes with PM records also with out-of-line
// values and bytes keys. Label: unit (a 1 MiB anonymous pool per case, well under a second each).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "pmindex/index.h"

namespace pmindex {
namespace {

struct Case {
  std::string kind;
  KeyType key_type = KeyType::u64;
  std::uint32_t max_value_size = 8;
  bool scope = false;  // hold attach_thread() for the whole test
  bool ascending = false;  // keys 1, 2, 3, ...: the re-inserts all land right of the old keys
};

std::string name(const Case& c) {
  std::string s = c.kind;
  s += c.key_type == KeyType::bytes ? "_bytes" : "_u64";
  s += c.max_value_size > 8 ? "_vrec" : "_v8";
  s += c.ascending ? "_asc" : "";
  s += c.scope ? "_scope" : "_noscope";
  return s;
}

// Small nodes, so the fill runs through many SMOs (as test_shared_keys.cpp).
std::uint32_t small_node(const std::string& kind) {
  if (kind == "nbtree") return 128;
  if (kind == "lbtree") return 256;
  if (kind == "fptree") return 192;
  if (kind == "apex") return 1024;
  if (kind == "utree") return 64;  // DRAM leaves of 2 entries: the list layer has no SMO
  if (kind == "pactree") return 192;  // data nodes of 4 slots
  if (kind == "dptree") return 320;  // 8-slot base leaves: a merge every 8 writes
  return 0;
}

std::uint64_t mix(std::uint64_t x) {  // splitmix64: distinct inputs give distinct outputs
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Key i, spread over the key space so every leaf fills (and fails) in turn (or ascending).
std::string key_of(const Case& c, std::uint64_t i) {
  std::string k = encode_u64(c.ascending ? i + 1 : mix(i));
  if (c.key_type == KeyType::bytes) k += "-k" + std::to_string(i % 97);  // 10..12 bytes
  return k;
}

std::string value_of(const Case& c, std::uint64_t i) {
  if (c.max_value_size == 8) return encode_u64(i * 3 + 1);
  return "value-" + std::to_string(i) + std::string(24 + i % 17, 'v');  // 31..50 bytes
}

class PoolFull : public ::testing::TestWithParam<Case> {};

// The bound on re-inserts: after every record is removed, inserting as many new distinct keys
// as were removed needs about the space the first fill used (same sizes, same key
// distribution), and that fill succeeded. 90%, not 100%: splits happen at other points for
// other keys, so leaf occupancy (and so the node count) differs by a few percent between runs.
// NBTree, random keys: 75%. It merges a leaf only into its left neighbour under the same
// inner node, and only when a delete brings it to a third or empties it (PROTOCOL.md M0;
// measured 41,414 of 41,777 with merges), so the new keys
// land in the ranges the first fill's keys cut, unevenly (about Poisson), and more leaves hold
// few keys; measured 83-100% before merges. Ascending keys: 90% like the others (the emptied
// leaves left of the new keys merge away; 7 of 49,051 before merges).
// DPTree: 80%. The space comes back (bytes in use fall to 5-12 KiB of about 970 KiB after the
// removes and rise to 934-990 KiB with the re-inserts), but how many records that space holds
// depends on where the merges' splits fell when the pool filled, and on whether 4 KiB log
// pages can still be carved between the 512 B leaf blocks: background merges (the default)
// gave 9,652-11,699 acknowledged, 9,574-10,818 re-inserted in 13 ASan runs, down to 89.0% of
// the fill; a CI run (28 Nov) filled 11,785, above that range, and re-inserted 9,946, inside
// it: 84.4%, so the ratio's spread comes from the first fill as much as from the re-fill. PMINDEX_DPTREE_MERGE=sync is deterministic: 11,919 of 12,055 (98.9%) before sparse
// leaves folded (PROTOCOL.md M1b), 10,437 of 12,055 (86.6%) since: the folds during the
// removes change the order in which leaf and log blocks are freed, and the re-fill ends with
// the same leaf count at 6.1 instead of 6.9 records per leaf and 66 free 512 B blocks (33 KiB)
// that no 4 KiB log page can use (measured with Allocator::stats(); a fold threshold of 4, 5
// or 6 of 8 slots gives the same figure).
double reinsert_bound(const Case& c) {
  if (c.kind == "nbtree" && !c.ascending) return 0.75;
  if (c.kind == "dptree") return 0.80;
  return 0.90;
}

// Measured failures not fixed yet (issue 19 item 2), skipped by name with the measurement;
// PMINDEX_POOL_FULL_KNOWN=1 runs them.
// (nbtree ascending: 7 of 49,051 before its leaf merges, PROTOCOL.md M0-M7.)
const char* known_failure(const Case&) { return nullptr; }

// A 1 MiB pool with small nodes, so it fills within a few thousand records.
Options options_for(const Case& c) {
  Options o;
  o.kind = c.kind;
  o.pool_size = 1 << 20;
  o.node_size = small_node(c.kind);
  o.key_type = c.key_type;
  o.max_key_size = c.key_type == KeyType::bytes ? 16 : 8;
  o.max_value_size = c.max_value_size;
  return o;
}

TEST_P(PoolFull, StaysUsableAndReusesSpace) {
  const Case& c = GetParam();
  const char* why = known_failure(c);
  if (why != nullptr && std::getenv("PMINDEX_POOL_FULL_KNOWN") == nullptr) GTEST_SKIP() << why;
  auto opened = Index::open(options_for(c));
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  auto& idx = *opened;
  Index::ThreadScope scope;
  if (c.scope) scope = idx->attach_thread();

  // Fill: insert until pool_full, then 512 more keys so that many leaves meet the full pool.
  std::vector<std::uint64_t> acked;
  std::uint64_t next = 0;
  std::uint64_t full_answers = 0;
  for (; next < 4'000'000 && full_answers < 512; ++next) {
    const Code code = idx->insert(key_of(c, next), value_of(c, next));
    if (code == Code::ok) {
      acked.push_back(next);
    } else {
      ASSERT_EQ(code, Code::pool_full) << "insert " << next;
      ++full_answers;
    }
  }
  ASSERT_EQ(full_answers, 512u) << "the pool never filled";
  ASSERT_GT(acked.size(), 1000u);

  Status v = idx->verify();
  ASSERT_TRUE(v.ok()) << "after pool_full: " << v.to_string();
  std::string got;
  for (std::uint64_t i : acked) {
    ASSERT_EQ(idx->find(key_of(c, i), &got), Code::ok) << "acknowledged key " << i;
    ASSERT_EQ(got, value_of(c, i)) << "acknowledged key " << i;
  }

  // Remove everything, then insert as many new keys (no verify() in between: it drains the
  // epoch manager, which would hide frees left deferred).
  for (std::uint64_t i : acked) ASSERT_EQ(idx->remove(key_of(c, i)), Code::ok) << i;
  std::size_t ok = 0;
  std::vector<std::uint64_t> fresh;
  for (std::size_t n = 0; n < acked.size(); ++n, ++next) {
    const Code code = idx->insert(key_of(c, next), value_of(c, next));
    if (code == Code::ok) {
      ++ok;
      fresh.push_back(next);
    } else {
      ASSERT_EQ(code, Code::pool_full) << "re-insert " << next;
    }
  }
  std::printf("[pool-full] %s: %zu acknowledged, %zu of %zu re-inserts succeeded\n",
              name(c).c_str(), acked.size(), ok, acked.size());
  EXPECT_GE(static_cast<double>(ok), reinsert_bound(c) * static_cast<double>(acked.size()))
      << ok << " of " << acked.size() << " re-inserts succeeded";
  v = idx->verify();
  ASSERT_TRUE(v.ok()) << "after re-inserts: " << v.to_string();
  for (std::uint64_t i : fresh) {
    ASSERT_EQ(idx->find(key_of(c, i), &got), Code::ok) << "re-inserted key " << i;
    ASSERT_EQ(got, value_of(c, i)) << "re-inserted key " << i;
  }
  scope = Index::ThreadScope();  // detach before the index goes
}

// Issue 19 item 2, the sparse case: fill with ascending keys to pool_full, remove every other
// key, then insert as many new keys as were removed. The new keys all land right of the old
// ones, so they need new leaves: the half-empty leaves must give their space back (merged or
// compacted) without a restart. Most kinds merge only emptier leaves (or none), so this is a
// measurement first: every kind runs the whole test (full pool, removes, re-inserts, verify()
// live, every kept key present), but the kinds measured short of the space bound are excused
// from that bound by name with their number (ASan build, 1 MiB pool; each number as of the
// commit that last changed its line: `git blame`); PMINDEX_POOL_FULL_KNOWN=1 holds them to it
// too.
const char* known_sparse_failure(const Case&) {
  // part: see the measured line at the end (record relocation, PROTOCOL.md P11; was 520 of
  // 12,312); reflist and utree: 16,319 of 16,319; lbtree: 14,280 of 14,280 (leaf merges, PROTOCOL.md
  // J1-J6; was 7 before them); fptree: 8,032 of 8,032 (leaf merges, PROTOCOL.md
  // J1-J7; was 4 of 8,032); roart: 8,512 of 9,008 (array merges, PROTOCOL.md M0-M5; was 32);
  // apex: 5,206 of 8,409 (merges up to the largest node at density 0.6, contractions that
  // free a quarter; was 2,190); pactree: 4,054 of 4,060 (merges up to 3/4 of a node; was 2);
  // dptree: 4,505 of 4,968 synchronous, 4,589-4,898 of about 4,870 background (sparse
  // leaves fold in merges that removed records and in the full pool's partial merges,
  // PROTOCOL.md M1b; was 0 and 0-943); nbtree: 12,239 of 12,239 (leaf merges, PROTOCOL.md
  // M0-M7; was 0).
  return nullptr;
}

class PoolFullSparse : public ::testing::TestWithParam<Case> {};

TEST_P(PoolFullSparse, EveryOtherRemovedMakesRoom) {
  const Case& c = GetParam();
  const char* why = known_sparse_failure(c);
  const bool excused = why != nullptr && std::getenv("PMINDEX_POOL_FULL_KNOWN") == nullptr;
  auto opened = Index::open(options_for(c));
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  auto& idx = *opened;
  std::vector<std::uint64_t> acked;
  std::uint64_t next = 0;
  for (; next < 4'000'000; ++next) {
    const Code code = idx->insert(key_of(c, next), value_of(c, next));
    if (code != Code::ok) {
      ASSERT_EQ(code, Code::pool_full) << "insert " << next;
      break;
    }
    acked.push_back(next);
  }
  ASSERT_GT(acked.size(), 1000u) << "the pool never filled";
  ++next;
  std::size_t removed = 0;  // every remove succeeds in a full pool, for every kind
  for (std::size_t j = 0; j < acked.size(); j += 2) {
    ASSERT_EQ(idx->remove(key_of(c, acked[j])), Code::ok) << acked[j];
    ++removed;
  }
  std::size_t ok = 0;
  for (std::size_t n = 0; n < removed; ++n, ++next) {
    const Code code = idx->insert(key_of(c, next), value_of(c, next));
    if (code == Code::ok) {
      ++ok;
    } else {
      ASSERT_EQ(code, Code::pool_full) << "re-insert " << next;
    }
  }
  std::printf("[pool-full-sparse] %s: %zu acknowledged, %zu of %zu re-inserts succeeded\n",
              name(c).c_str(), acked.size(), ok, removed);
  const Status v = idx->verify();
  ASSERT_TRUE(v.ok()) << "after re-inserts: " << v.to_string();
  std::string got;
  for (std::size_t j = 1; j < acked.size(); j += 2)
    ASSERT_EQ(idx->find(key_of(c, acked[j]), &got), Code::ok) << "kept key " << acked[j];
  // Half of the removed space: merging two half-full leaves frees one leaf per two.
  if (excused) {
    std::printf("[pool-full-sparse] %s: bound not held (known: %s)\n", name(c).c_str(), why);
    return;
  }
  EXPECT_GE(static_cast<double>(ok), 0.5 * static_cast<double>(removed))
      << ok << " of " << removed << " re-inserts succeeded";
}

// Two threads fill one pool at once (each with a ThreadScope), so SMOs meet pool_full while
// another thread helps or commits into the same leaf (NBTree: S2g/S2x under contention);
// then verify() live and every acknowledged record reads back.
class PoolFullConcurrent : public ::testing::TestWithParam<Case> {};

TEST_P(PoolFullConcurrent, FillStaysConsistent) {
  const Case& c = GetParam();
  auto opened = Index::open(options_for(c));
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  auto& idx = *opened;
  std::vector<std::uint64_t> acked[2];
  std::atomic<bool> bad{false};
  auto worker = [&](unsigned t) {
    auto scope = idx->attach_thread();
    unsigned full = 0;
    for (std::uint64_t i = t; i < 4'000'000 && full < 256; i += 2) {
      const Code code = idx->insert(key_of(c, i), value_of(c, i));
      if (code == Code::ok) {
        acked[t].push_back(i);
      } else if (code == Code::pool_full) {
        ++full;
      } else {
        bad = true;
        return;
      }
    }
  };
  std::thread a(worker, 0), b(worker, 1);
  a.join();
  b.join();
  ASSERT_FALSE(bad.load()) << "an insert answered neither ok nor pool_full";
  const Status v = idx->verify();
  ASSERT_TRUE(v.ok()) << v.to_string();
  std::string got;
  for (const auto& list : acked) {
    for (std::uint64_t i : list) {
      ASSERT_EQ(idx->find(key_of(c, i), &got), Code::ok) << "acknowledged key " << i;
      ASSERT_EQ(got, value_of(c, i)) << "acknowledged key " << i;
    }
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (bool scope : {false, true}) {
    for (const char* kind :
         {"reflist", "lbtree", "fptree", "nbtree", "apex", "utree", "part", "dptree"}) {
      out.push_back({kind, KeyType::u64, 8, scope});
      out.push_back({kind, KeyType::u64, 8, scope, /*ascending=*/true});
    }
    for (const char* kind : {"lbtree", "fptree", "nbtree", "utree", "part"}) {
      out.push_back({kind, KeyType::u64, 64, scope});
      out.push_back({kind, KeyType::bytes, 64, scope});
    }
    out.push_back({"pactree", KeyType::u64, 8, scope});
    out.push_back({"pactree", KeyType::u64, 8, scope, /*ascending=*/true});
    out.push_back({"pactree", KeyType::u64, 64, scope});
    out.push_back({"pactree", KeyType::bytes, 64, scope});
    out.push_back({"roart", KeyType::u64, 8, scope});
    out.push_back({"roart", KeyType::u64, 8, scope, /*ascending=*/true});
    out.push_back({"roart", KeyType::u64, 64, scope});
    out.push_back({"roart", KeyType::bytes, 64, scope});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Kinds, PoolFull, ::testing::ValuesIn(cases()),
                         [](const auto& p) { return name(p.param); });

std::vector<Case> concurrent_cases() {  // one run per kind, key type and value mode
  std::vector<Case> out;
  for (const Case& c : cases())
    if (!c.scope && !c.ascending) out.push_back(c);
  return out;
}

std::vector<Case> sparse_cases() {  // ascending u64, inline values: one run per kind
  std::vector<Case> out;
  for (const Case& c : cases())
    if (!c.scope && c.ascending) out.push_back(c);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Kinds, PoolFullSparse, ::testing::ValuesIn(sparse_cases()),
                         [](const auto& p) { return name(p.param); });

INSTANTIATE_TEST_SUITE_P(Kinds, PoolFullConcurrent, ::testing::ValuesIn(concurrent_cases()),
                         [](const auto& p) { return name(p.param); });

}  // namespace
}  // namespace pmindex

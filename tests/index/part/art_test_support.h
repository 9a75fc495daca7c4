// The trie core (src/index/common/art/) under test, with nodes in a pool (PM placement, adr
// mode on anonymous memory) or in a DRAM arena: one fixture type per placement, so the same
// randomized oracle runs on both.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <string>

#include "index/common/art/art_tree.h"
#include "pmindex/pm/pool.h"

namespace pmindex::art::testing {

inline constexpr std::uint32_t kTestMaxKey = 1024;

struct PmFixture {
  using Placement = PmPlacement;
  std::unique_ptr<pm::Pool> pool;
  std::uint64_t* words = nullptr;  // [0] root word, [1] root lock
  std::unique_ptr<Tree<PmPlacement>> tree;
  PmFixture() {
    pm::PoolOptions o;
    o.size = 64 << 20;
    o.layout = pm::Layout{"artcore", 0, pm::KeyMode::bytes, 0};
    auto p = pm::Pool::create(o);
    EXPECT_TRUE(p.ok()) << p.status().to_string();
    pool = std::move(p).value();
    Code code = Code::ok;
    const std::uint64_t off = pool->allocator().allocate(64, &code);
    words = pool->at<std::uint64_t>(off);
    words[0] = words[1] = 0;
    tree = std::make_unique<Tree<PmPlacement>>(PmPlacement{pool.get()}, &words[0], &words[1], 7,
                                               kTestMaxKey);
  }
  ~PmFixture() { tree.reset(); }
};

struct DramFixture {
  using Placement = DramPlacement;
  std::unique_ptr<pm::DramArena> arena = std::make_unique<pm::DramArena>();
  std::uint64_t words[2] = {0, 0};
  std::unique_ptr<Tree<DramPlacement>> tree;
  DramFixture() {
    tree = std::make_unique<Tree<DramPlacement>>(DramPlacement{arena.get()}, &words[0],
                                                 &words[1], 1, kTestMaxKey);
  }
  ~DramFixture() { tree.reset(); }
};

// Checks the tree against the oracle: verify(), every key found with its value, a full scan
// equal to the map.
template <class TreeT>
::testing::AssertionResult agrees(const TreeT& tree, const std::map<std::string, std::uint64_t>& m,
                                  TreeStats* stats = nullptr) {
  TreeStats local;
  const std::string e = tree.verify(stats != nullptr ? stats : &local, false, nullptr, nullptr);
  if (!e.empty()) return ::testing::AssertionFailure() << "verify: " << e;
  const TreeStats& st = stats != nullptr ? *stats : local;
  if (st.records != m.size())
    return ::testing::AssertionFailure() << "verify counted " << st.records << " records, map has " << m.size();
  std::vector<std::pair<std::string, std::uint64_t>> got;
  tree.scan("", m.size() + 1, [&](std::string_view k, std::uint64_t v) { got.emplace_back(k, v); });
  if (got.size() != m.size()) return ::testing::AssertionFailure() << "scan returned " << got.size();
  auto it = m.begin();
  for (const auto& [k, v] : got) {
    if (k != it->first || v != it->second) return ::testing::AssertionFailure() << "scan differs at a key of " << k.size() << " bytes";
    ++it;
  }
  return ::testing::AssertionSuccess();
}

}  // namespace pmindex::art::testing

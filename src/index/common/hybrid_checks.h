// verify() pieces every DRAM-inner / PM-leaf index needs once it has walked its leaf chain and
// collected each leaf's keys: key order within and across leaves, the inner tree against the
// chain (same leaves, same order, keys inside the fences), PM reachability against the
// allocator; plus the footprint and the fatal-invariant exit they share. Nothing here knows a
// leaf layout. Written for FPTree (issue 6); LB+-Tree's verify() does the same steps inline
// and can call these instead.
//
// Thread safety: quiescent use only (verify), except fatal().
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "index/common/inner_tree.h"
#include "index/common/leaf_versions.h"
#include "index/common/separator_store.h"
#include "pmindex/index.h"
#include "pmindex/pm/pool.h"

namespace pmindex::index_common {

// An index's internal invariant is broken (never a PM corruption: those are Status errors).
[[noreturn]] inline void fatal(const char* index, const char* what) {
  std::fprintf(stderr, "pmindex %s: internal invariant broken: %s\n", index, what);
  std::abort();
}

// What verify() gathered: the chain's leaves and, per leaf, its keys (memcmp order bytes).
struct ChainKeys {
  std::vector<std::uint64_t> leaves;
  std::vector<std::vector<std::string>> keys;
};

inline Status leaf_error(const pm::Pool& pool, std::uint64_t leaf, const std::string& what) {
  return pool.error(Code::corrupted,
                    "verify: leaf at offset " + std::to_string(leaf) + ": " + what);
}

// The allocator's size for a block of `bytes` (what reachability accounting adds up).
inline std::uint64_t block_bytes(std::size_t bytes) {
  return pm::Allocator::class_size(pm::Allocator::class_of(bytes));
}

// Sorts each leaf's keys, then: no key twice in a leaf, and every leaf's keys above the
// previous non-empty leaf's.
inline Status check_key_order(const pm::Pool& pool, ChainKeys& chain) {
  const std::string* below = nullptr;
  for (std::size_t i = 0; i < chain.leaves.size(); ++i) {
    std::vector<std::string>& ks = chain.keys[i];
    std::sort(ks.begin(), ks.end());
    if (std::adjacent_find(ks.begin(), ks.end()) != ks.end())
      return leaf_error(pool, chain.leaves[i], "duplicate key");
    if (ks.empty()) continue;
    if (below != nullptr && !(*below < ks.front()))
      return leaf_error(pool, chain.leaves[i], "keys not above the previous leaf's keys");
    below = &ks.back();
  }
  return Status::Ok();
}

inline Status check_reachable(const pm::Pool& pool, std::uint64_t reachable) {
  const std::uint64_t in_use = pool.allocator().stats().bytes_in_use;
  if (in_use == reachable) return Status::Ok();
  return pool.error(Code::corrupted, "verify: allocator has " + std::to_string(in_use) +
                                         " bytes in use but " + std::to_string(reachable) +
                                         " are reachable");
}

// The inner tree's leaves are the chain's, in order, and each leaf's (sorted) keys lie in
// [lo, hi) of its fences. sep_bytes turns a separator word into key bytes.
inline Status check_inner_against_chain(
    const pm::Pool& pool, const InnerTree& inner, const ChainKeys& chain,
    const std::function<bool(std::uint64_t, std::uint64_t)>& word_less,
    const std::function<std::string(std::uint64_t)>& sep_bytes) {
  std::size_t at = 0;
  Status s = inner.verify(
      word_less, [&](std::uint64_t leaf, const std::uint64_t* lo, const std::uint64_t* hi) {
        if (at == chain.leaves.size() || chain.leaves[at] != leaf)
          return pool.error(Code::corrupted, "verify: inner tree leaf order differs from the chain");
        const std::vector<std::string>& ks = chain.keys[at++];
        if (!ks.empty() && lo != nullptr && ks.front() < sep_bytes(*lo))
          return leaf_error(pool, leaf, "key below the inner-node fence");
        if (!ks.empty() && hi != nullptr && !(ks.back() < sep_bytes(*hi)))
          return leaf_error(pool, leaf, "key not below the inner-node fence");
        return Status::Ok();
      });
  if (s.ok() && at != chain.leaves.size())
    return pool.error(Code::corrupted, "verify: chain has leaves the inner tree lacks");
  return s;
}

inline Footprint hybrid_footprint(const pm::Pool& pool, const InnerTree& inner,
                                  const LeafVersions& versions, const SeparatorStore& seps) {
  const auto st = pool.allocator().stats();
  Footprint f;
  f.pm_bytes = st.bytes_in_use;
  f.pm_reserved = st.bytes_reserved;
  f.dram_bytes = inner.dram_bytes() + versions.dram_bytes() + seps.dram_bytes();
  return f;
}

}  // namespace pmindex::index_common

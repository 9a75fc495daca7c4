// Parallel per-leaf recovery pass of the hybrid indexes (FPTree and LB+-Tree; each supplies
// its own per-leaf function, the policy part). The chain walk (leaf_chain.h) records every
// leaf position serially - it is a pointer chase - and then the expensive part runs on
// `threads` threads over contiguous ranges of those positions: each leaf is checked, marked
// reachable together with its records, and summarised (smallest and largest key). The
// summaries are then checked for key order across leaves in one serial pass.
//
//   std::vector<LeafSummary> sums(leaves.size());
//   for_each_leaf_parallel(leaves.size(), threads, [&](std::size_t i) { ...fill sums[i]... });
//   if (Status s = check_leaf_summaries(pool, "fptree", keys, leaves, sums, &records); !s.ok()) ...
//
// Thread safety: the per-leaf function runs concurrently for different indexes i; it may call
// Allocator::mark_reachable (thread-safe during recovery) and must write only its own
// summary. SeparatorStore::make is thread-safe too, but its words are made after the pass so
// that a 1-thread and an N-thread recovery build the same inner tree.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "index/common/key_codec.h"
#include "pmindex/pm/pool.h"
#include "pmindex/status.h"

namespace pmindex::index_common {

// What the per-leaf pass learns about one leaf. `error` non-empty refuses the pool. The
// smallest and largest keys are kept as key words and compared through the codec, so an
// integer-mode pass copies no key bytes (10M keys: no per-key string).
struct LeafSummary {
  bool empty = true;
  bool locked = false;          // a writer's lock word survived the crash
  std::uint64_t min_word = 0;   // key word of the smallest key (separator source), when !empty
  std::uint64_t max_word = 0;   // key word of the largest key, when !empty
  std::uint64_t records = 0;
  std::string error;

  // Adds one key word (in bytes mode its record must already be checked by mark_record).
  void add(std::uint64_t kw, const KeyCodec& keys) {
    if (empty) {
      min_word = max_word = kw;
      empty = false;
    } else if (keys.key_word_less(kw, min_word)) {
      min_word = kw;
    } else if (keys.key_word_less(max_word, kw)) {
      max_word = kw;
    }
    ++records;
  }
};

// Leaves per thread below which extra threads cost more than they save.
inline constexpr std::size_t kMinLeavesPerThread = 512;

// Runs fn(i) for i in [0, n) on up to `threads` threads (contiguous ranges). Returns the number
// of threads actually used.
template <class Fn>
unsigned for_each_leaf_parallel(std::size_t n, unsigned threads, Fn fn) {
  const auto t = static_cast<unsigned>(
      std::clamp<std::size_t>(n / kMinLeavesPerThread, 1, std::max(1u, threads)));
  if (t <= 1) {
    for (std::size_t i = 0; i < n; ++i) fn(i);
    return 1;
  }
  std::vector<std::thread> ws;
  const std::size_t chunk = (n + t - 1) / t;
  for (unsigned w = 0; w < t; ++w) {
    const std::size_t from = w * chunk, to = std::min(n, from + chunk);
    if (from < to) ws.emplace_back([&fn, from, to] { for (std::size_t i = from; i < to; ++i) fn(i); });
  }
  for (auto& w : ws) w.join();
  return t;
}

// The serial check after the pass: the first leaf error, then key order across non-empty
// leaves (every key of a leaf above every key of the leaves before it). Adds the record count.
inline Status check_leaf_summaries(const pm::Pool& pool, const char* index, const KeyCodec& keys,
                                   const std::vector<std::uint64_t>& leaves,
                                   const std::vector<LeafSummary>& sums, std::uint64_t* records) {
  auto where = [&](std::size_t i) {  // built only for the error message
    return std::string(index) + " leaf at offset " + std::to_string(leaves[i]);
  };
  const LeafSummary* prev = nullptr;  // the last non-empty leaf
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    if (!sums[i].error.empty()) return pool.error(Code::corrupted, where(i) + ": " + sums[i].error);
    if (sums[i].empty) continue;
    if (prev != nullptr && !keys.key_word_less(prev->max_word, sums[i].min_word))
      return pool.error(Code::corrupted, where(i) + ": leaves out of key order");
    prev = &sums[i];
    *records += sums[i].records;
  }
  return Status::Ok();
}

}  // namespace pmindex::index_common

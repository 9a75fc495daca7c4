// Parallel per-leaf recovery pass of the hybrid indexes (FPTree and LB+-Tree; each supplies
// its own per-leaf function, the policy part), and the whole recovery pass they share
// (recover_leaf_chain, at the end). The chain walk (leaf_chain.h) records every
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

#include "index/common/close_counts.h"
#include "index/common/key_codec.h"
#include "index/common/leaf_chain.h"
#include "pmindex/index.h"
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

// The hybrid indexes' recovery pass after their own first steps (FPTree's micro-log decisions):
// the chain walk from `head`, bounds- and cycle-checked (leaf_chain.h); the link checks; the
// per-leaf pass above on `threads` threads; key order across leaves and the close counts.
// Until then nothing in PM changed, so a refusal leaves the pool as it was. Then the open is
// committed and the repairs run: the index's own first (before_repairs), a stale lock cleared
// in every leaf the pass found locked, every empty leaf but the head unlinked from the last
// kept one and freed, and the DRAM inner layer built from the kept leaves' smallest keys.
// `stats` gets the records, the repairs and the kept leaves. The policy supplies the parts
// that differ, each cited with its PROTOCOL.md step where it is written:
//
//   struct Policy {
//     const char* name;                                  // "lbtree": error messages
//     std::size_t leaf_bytes;                            // a leaf, for the walk's bounds check
//     std::size_t block_bytes;                           // its block, freed by an unlink
//     std::uint64_t next(std::uint64_t off);             // the offset a leaf's link names
//     Status check_links(const std::vector<std::uint64_t>& leaves);  // their tags
//     void summarise(std::uint64_t off, LeafSummary* s);  // concurrent, per leaf
//     const KeyCodec& keys();
//     void before_repairs();                             // after commit_open
//     void clear_lock(std::uint64_t off);                // persisted
//     void unlink(std::uint64_t kept, std::uint64_t off);  // persisted; the pass frees off
//     std::uint64_t separator(std::uint64_t min_word);   // the inner layer's word
//     void build_inner(const std::vector<std::pair<std::uint64_t, std::uint64_t>>& items,
//                      unsigned threads);
//   };
//
// *threads_used: the threads the per-leaf pass ran on (the inner build gets as many).
template <class Policy>
Status recover_leaf_chain(pm::Pool& pool, std::uint64_t head, unsigned threads, Policy& pol,
                          RecoveryStats* stats, unsigned* threads_used) {
  auto refuse = [&](Status s) {
    (void)pool.allocator().finish_recovery();
    return s;
  };
  std::vector<std::uint64_t> leaves;
  Status walk = walk_leaf_chain(pool, head, pol.leaf_bytes, 256,
                                [&](std::uint64_t off) { return pol.next(off); }, &leaves);
  if (walk.ok()) walk = pol.check_links(leaves);
  if (!walk.ok()) return refuse(walk);
  std::vector<LeafSummary> sums(leaves.size());
  *threads_used = for_each_leaf_parallel(
      leaves.size(), threads, [&](std::size_t i) { pol.summarise(leaves[i], &sums[i]); });
  if (Status s = check_leaf_summaries(pool, pol.name, pol.keys(), leaves, sums, &stats->records);
      !s.ok())
    return refuse(s);
  if (Status s = check_close_counts(pool, pol.name, stats->records, leaves.size()); !s.ok())
    return refuse(s);
  if (Status s = pool.allocator().finish_recovery(); !s.ok()) return s;
  pool.commit_open();
  pol.before_repairs();
  std::vector<std::pair<std::uint64_t, std::uint64_t>> items;  // separator, leaf
  std::uint64_t kept = 0;
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    if (sums[i].locked) {
      pol.clear_lock(leaves[i]);
      ++stats->repaired;
    }
    if (i > 0 && sums[i].empty) {  // the head (i == 0) stays, empty or not
      pol.unlink(kept, leaves[i]);
      pool.allocator().deallocate(leaves[i], pol.block_bytes);
      ++stats->repaired;
      continue;
    }
    kept = leaves[i];
    items.emplace_back(i == 0 ? 0 : pol.separator(sums[i].min_word), kept);
  }
  pol.build_inner(items, *threads_used);
  stats->nodes = items.size();
  return Status::Ok();
}

}  // namespace pmindex::index_common

// FPTree structural changes with the per-thread micro-logs: leaf split (S1..S8) and removal
// of an empty leaf (D3..D6). Included only by fptree.cpp. Steps: PROTOCOL.md.
#pragma once

#include <algorithm>
#include <vector>

#include "index/common/hybrid_checks.h"
#include "index/fptree/fptree_ops.h"

namespace pmindex::fptree {

// Splits the locked, full leaf `off`. The new leaf is returned locked; the caller unlocks it.
// Both leaves stay locked until the inner tree holds the separator, so a reader never misses
// a key that moved.
template <unsigned N>
std::uint64_t FPTree<N>::split(std::uint64_t off, std::uint64_t* sep_word) {
  LeafT* l = leaf_at(off);
  // The split key: the median of the leaf's keys; slots with keys >= it move.
  std::vector<std::pair<std::string, unsigned>> order;
  order.reserve(N);
  for (unsigned s = 0; s < N; ++s) order.emplace_back(keys_.key_bytes(optimistic_read(l->kv[s][0])), s);
  std::sort(order.begin(), order.end());
  std::uint64_t upper = 0;
  for (unsigned i = N / 2; i < N; ++i) upper |= detail::bit(order[i].second);
  const unsigned median_slot = order[N / 2].second;

  MicroLog* log = my_log();
  detail::put(&log->split_leaf, off);  // S1: record the leaf in the split log
  pm::persist(&log->split_leaf, 8);
  Code code = Code::ok;
  const std::uint64_t new_off = pool_->allocator().allocate(kBlock, &code);
  if (new_off == 0) {
    detail::put(&log->split_leaf, 0);
    pm::persist(&log->split_leaf, 8);
    return 0;
  }
  detail::put(&log->split_new, new_off);  // S2: the new leaf is owned through the log
  pm::persist(&log->split_new, 8);
  index_common::recycle_locked(versions_->at(new_off));
  LeafT* nl = leaf_at(new_off);
  // S3: copy the whole leaf (unreachable space), lock word clear.
  const auto* src = reinterpret_cast<const std::uint64_t*>(l);
  auto* dst = reinterpret_cast<std::uint64_t*>(nl);
  for (std::size_t w = 0; w < sizeof(LeafT) / 8; ++w)
    detail::put(dst + w, w == offsetof(LeafT, lock) / 8 ? 0 : optimistic_read(src[w]));
  pm::persist(nl, sizeof(LeafT));  // S4
  detail::put(&nl->bitmap, upper);  // S5: the new leaf keeps the upper half
  pm::persist(&nl->bitmap, 8);
  detail::put(&l->bitmap, LeafT::kFullMask & ~upper);  // S6: NAW - the old leaf the lower half
  pm::persist(&l->bitmap, 8);
  detail::put(&l->next, new_off);  // S7: NAW - link the new leaf
  pm::persist(&l->next, 8);
  detail::put(&log->split_new, 0);  // S8: clear the log
  detail::put(&log->split_leaf, 0);
  pm::persist(log, 16);

  // DRAM: the separator joins the inner tree while both leaves are locked.
  const std::string sep_bytes = std::move(order[N / 2].first);
  *sep_word = keys_.separator_for(sep_bytes, optimistic_read(nl->kv[median_slot][0]), seps_);
  const Probe sp = keys_.probe(sep_bytes);
  auto smo = inner_.smo_lock();
  index_common::InnerTree::Path path;
  inner_.path_to([&](std::uint64_t sep) { return keys_.below(sp, sep); }, &path);
  if (!inner_.insert_separator(path, off, *sep_word, new_off))
    index_common::fatal("fptree", "split: the separator's path does not end at the split leaf");
  return new_off;
}

template <unsigned N>
Code FPTree<N>::make_room(std::uint64_t* off, const Probe& p) {
  if ((optimistic_read(leaf_at(*off)->bitmap) & LeafT::kFullMask) != LeafT::kFullMask)
    return Code::ok;
  std::uint64_t sep = 0;
  const std::uint64_t new_off = split(*off, &sep);
  if (new_off == 0) return Code::pool_full;
  if (keys_.below(p, sep)) {
    unlock_leaf(new_off);
  } else {
    unlock_leaf(*off);
    *off = new_off;
  }
  return Code::ok;
}

// The locked, non-head leaf `off` is empty: unlink it with the delete micro-log, drop it from
// the inner tree and free it. Best effort: if the left neighbour is locked, the empty leaf
// stays (a valid leaf; recovery removes it, R4).
template <unsigned N>
void FPTree<N>::try_remove_leaf(std::uint64_t off, const Probe& p) {
  auto smo = inner_.smo_lock();
  index_common::InnerTree::Path path;
  inner_.path_to([&](std::uint64_t sep) { return keys_.below(p, sep); }, &path);
  const std::uint64_t prev = inner_.left_neighbour(path);
  const std::uint64_t pv = versions_->at(prev).peek();  // a try-lock: never wait (olc.h (2))
  if (prev == 0 || index_common::OptimisticLock::isLocked(pv) ||
      index_common::OptimisticLock::isObsolete(pv) || !try_lock_leaf(prev, pv)) {
    smo.unlock();
    unlock_leaf(off);
    return;
  }
  LeafT* a = leaf_at(prev);
  LeafT* l = leaf_at(off);
  if (optimistic_read(a->next) != off)
    index_common::fatal("fptree", "remove: the inner tree's left neighbour is not the chain predecessor");
  MicroLog* log = my_log();
  detail::put(&log->delete_leaf, off);  // D3: record leaf and predecessor in the delete log
  detail::put(&log->delete_prev, prev);
  pm::persist(&log->delete_leaf, 16);
  detail::put(&a->next, optimistic_read(l->next));  // D4: NAW - unlink
  pm::persist(&a->next, 8);
  detail::put(&log->delete_prev, 0);  // D5: clear the log before the block can be reused
  detail::put(&log->delete_leaf, 0);
  pm::persist(&log->delete_leaf, 16);
  if (!inner_.remove_leaf(path, off)) index_common::fatal("fptree", "remove: leaf not in the inner tree");
  smo.unlock();
  unlock_leaf(prev);
  unlock_leaf(off, /*obsolete=*/true);
  pool_->allocator().deallocate(off, kBlock);  // D6: unreachable in PM and DRAM
}

}  // namespace pmindex::fptree

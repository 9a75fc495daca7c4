// FPTree structural changes with the per-thread micro-logs: leaf split (S1..S8), removal of
// an empty leaf (D3..D6) and merge of a sparse leaf into its left neighbour (J1..J7).
// Included only by fptree.cpp. Steps: PROTOCOL.md.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
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
  // The split key: the median of the leaf's keys; slots with keys >= it move. Integer key
  // words sort as integers (no allocation: a split happens every N/2 inserts or so).
  std::uint64_t upper = 0;
  unsigned median_slot = 0;
  std::string sep_bytes;
  if (!keys_.bytes_mode()) {
    std::array<std::pair<std::uint64_t, unsigned>, N> order;
    for (unsigned s = 0; s < N; ++s) order[s] = {optimistic_read(l->kv[s][0]), s};
    std::nth_element(order.begin(), order.begin() + N / 2, order.end());
    for (unsigned i = N / 2; i < N; ++i) upper |= detail::bit(order[i].second);
    median_slot = order[N / 2].second;
    sep_bytes = keys_.key_bytes(order[N / 2].first);
  } else {
    std::vector<std::pair<std::string, unsigned>> order;
    order.reserve(N);
    for (unsigned s = 0; s < N; ++s) order.emplace_back(keys_.key_bytes(optimistic_read(l->kv[s][0])), s);
    std::nth_element(order.begin(), order.begin() + N / 2, order.end());
    for (unsigned i = N / 2; i < N; ++i) upper |= detail::bit(order[i].second);
    median_slot = order[N / 2].second;
    sep_bytes = std::move(order[N / 2].first);
  }

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
    detail::put(dst + w, w == offsetof(LeafT, lock) / 8  ? 0
                         : w == offsetof(LeafT, tag) / 8 ? new_tag()  // its own tag
                                                         : optimistic_read(src[w]));
  pm::persist(nl, sizeof(LeafT));  // S4
  detail::put(&nl->bitmap, upper);  // S5: the new leaf keeps the upper half
  pm::persist(&nl->bitmap, 8);
  detail::put(&l->bitmap, LeafT::kFullMask & ~upper);  // S6: NAW - the old leaf the lower half
  pm::persist(&l->bitmap, 8);
  detail::put(&l->next, make_link(new_off, nl->tag));  // S7: NAW - link the new leaf
  pm::persist(&l->next, 8);
  detail::put(&log->split_new, 0);  // S8: clear the log
  detail::put(&log->split_leaf, 0);
  pm::persist(log, 16);

  // DRAM: the separator joins the inner tree while both leaves are locked.
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

// J2..J5 on the locked leaves `a` (the chain predecessor) and `l`, with the delete micro-log
// naming both (J1): `l`'s valid entries go into `a`'s free slots, one bitmap NAW validates
// them in `a`, one link NAW unlinks `l`. The caller checked that they fit (at most kMergeMax).
template <unsigned N>
void FPTree<N>::merge_into(LeafT* a, const LeafT* l) {
  const std::uint64_t a_bm = optimistic_read(a->bitmap) & LeafT::kFullMask;
  std::uint64_t free = ~a_bm & LeafT::kFullMask;
  std::uint64_t moved = 0;
  for (std::uint64_t m = optimistic_read(l->bitmap) & LeafT::kFullMask; m != 0; m &= m - 1) {
    const auto s = static_cast<unsigned>(std::countr_zero(m));
    const auto t = static_cast<unsigned>(std::countr_zero(free));  // in range: the caller counted
    free &= free - 1;
    // J2: the entry into a free slot of `a` (unused space) with its fingerprint (a free slot's
    // byte of the fingerprint word: unused). Key and value records move with the slot.
    detail::put(&a->kv[t][0], optimistic_read(l->kv[s][0]));
    detail::put(&a->kv[t][1], optimistic_read(l->kv[s][1]));
    set_fp(a, t, get_fp(l, s));
    moved |= detail::bit(t);
  }
  pm::flush(a, sizeof(LeafT));  // J3: all of `a` that J2 wrote is durable before J4
  pm::fence();
  const std::uint64_t next = optimistic_read(l->next);
  if (fault_ == Fault::merge_unlink_first) [[unlikely]] {
    // Known-bad (tests only): the unlink commits before the moved entries are valid in `a`.
    detail::put(&a->next, next);
    pm::persist(&a->next, 8);
  }
  detail::put(&a->bitmap, a_bm | moved);  // J4: NAW - the moved entries valid in `a` (they
  pm::persist(&a->bitmap, 8);             //     are in `l` too until J5: the log tells)
  detail::put(&a->next, next);            // J5: NAW - unlink `l`
  pm::persist(&a->next, 8);
}

// The locked non-head leaf `off` holds at most kMergeTrigger entries after a remove: unlink it
// if it is empty (D3..D6), fold it into its left neighbour if both fit into kMergeMax entries
// (J1..J7), else leave it. Best effort: if another writer holds the left neighbour, the leaf
// stays (a valid, reachable leaf; an empty one is removed by recovery, R4). Unlocks `off`.
template <unsigned N>
void FPTree<N>::try_merge(std::uint64_t off, const Probe& p) {
  auto smo = inner_.smo_lock();
  index_common::InnerTree::Path path;
  inner_.path_to([&](std::uint64_t sep) { return keys_.below(p, sep); }, &path);
  const std::uint64_t prev = inner_.left_neighbour(path);
  const std::uint64_t pv = prev == 0 ? 0 : versions_->at(prev).peek();  // a try-lock: never wait (olc.h (2))
  LeafT* l = leaf_at(off);
  const auto n = static_cast<unsigned>(std::popcount(optimistic_read(l->bitmap) & LeafT::kFullMask));
  // Too full together, judged before locking (an unvalidated read of the neighbour's bitmap,
  // rechecked under its lock below): a delete that cannot merge then leaves the neighbour
  // alone, its lock word included, so it writes one line as D1-D2 do.
  auto too_full = [&] {
    return n != 0 &&
           std::popcount(optimistic_read(leaf_at(prev)->bitmap) & LeafT::kFullMask) + n > kMergeMax;
  };
  if (prev == 0 || index_common::OptimisticLock::isLocked(pv) ||
      index_common::OptimisticLock::isObsolete(pv) || too_full() || !try_lock_leaf(prev, pv)) {
    smo.unlock();
    unlock_leaf(off);
    return;
  }
  LeafT* a = leaf_at(prev);
  if (link_off(optimistic_read(a->next)) != off)
    index_common::fatal("fptree", "remove: the inner tree's left neighbour is not the chain predecessor");
  if (too_full()) {  // changed since the unlocked look: both stay
    smo.unlock();
    unlock_leaf(prev);
    unlock_leaf(off);
    return;
  }
  MicroLog* log = my_log();
  detail::put(&log->delete_leaf, off);  // D3 / J1: record leaf and predecessor in the delete log
  detail::put(&log->delete_prev, prev);
  pm::persist(&log->delete_leaf, 16);
  if (n == 0) {
    detail::put(&a->next, optimistic_read(l->next));  // D4: NAW - unlink
    pm::persist(&a->next, 8);
  } else {
    merge_into(a, l);  // J2..J5
    merges_.fetch_add(1, std::memory_order_relaxed);
  }
  detail::put(&log->delete_prev, 0);  // D5 / J6: clear the log before the block can be reused
  detail::put(&log->delete_leaf, 0);
  pm::persist(&log->delete_leaf, 16);
  // D6 / J7: the inner tree forgets `off`. A merged leaf's range must join `a` (its keys are
  // there now); an empty one's may join either neighbour.
  // (A bytes-mode separator copy that leaves the tree stays in seps_ until close, as before:
  // writers descend without a pin, so it cannot be retired through the epochs.)
  if (!inner_.remove_leaf(path, off, nullptr, /*join_left=*/n != 0))
    index_common::fatal("fptree", "remove: leaf not in the inner tree");
  smo.unlock();
  unlock_leaf(prev);
  unlock_leaf(off, /*obsolete=*/true);
  // D6 / J7: unreachable in PM and DRAM; freed after an epoch, since a pinned reader (bytes
  // keys, out-of-line values) may still be reading L's key words before it validates L's
  // version. A merged leaf's key and value records now belong to `a`: not freed.
  epochs_.retire(
      this, [](void* self, std::uint64_t block) {
        static_cast<FPTree*>(self)->pool_->allocator().deallocate(block, kBlock);
      },
      off);
}

// Bulk load into an empty tree (B1..B4). Every record goes into NEW leaves, written and
// chained as unused space; the (empty) head leaf stays first and one NAW of its `next` word
// publishes the whole chain. A crash before B4 leaves the empty tree (the new leaves and
// records are unreachable and recovery's reachability pass frees them); after it, the whole
// load. The head stays empty until keys below the first loaded key arrive (one leaf of waste).
template <unsigned N>
Status FPTree<N>::bulk_load(std::span<const KeyValue> sorted, double fill) {
  if (!(fill > 0.0 && fill <= 1.0))
    return Status(Code::invalid_argument, "bulk_load: fill factor must be in (0, 1]");
  if (sorted.empty()) return Status::Ok();
  LeafT* head = leaf_at(head_);
  if ((optimistic_read(head->bitmap) & LeafT::kFullMask) != 0 ||
      optimistic_read(head->next) != kChainEnd)
    return Status(Code::invalid_argument, "bulk_load needs an empty index");
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    if (Code c = keys_.check(sorted[i].key); c != Code::ok)
      return Status(c, "bulk_load: bad key at record " + std::to_string(i));
    if (Code c = values_.check(sorted[i].value); c != Code::ok)
      return Status(c, "bulk_load: bad value at record " + std::to_string(i));
    if (i > 0 && !(sorted[i - 1].key < sorted[i].key))
      return Status(Code::invalid_argument, "bulk_load: keys not sorted and distinct");
  }
  const std::size_t per = std::clamp<std::size_t>(
      static_cast<std::size_t>(static_cast<double>(N) * fill), 1, N);
  const std::size_t n_leaves = (sorted.size() + per - 1) / per;
  std::vector<std::uint64_t> leaves(n_leaves, 0);
  std::vector<std::uint64_t> key_words(sorted.size()), value_words(sorted.size());
  std::size_t made_records = 0, made_leaves = 0;
  auto undo = [&](Code c) {  // nothing is reachable yet: give every block back
    for (std::size_t j = 0; j < made_leaves; ++j) pool_->allocator().deallocate(leaves[j], kBlock);
    for (std::size_t i = 0; i < made_records; ++i) release_records(key_words[i], value_words[i]);
    return Status(c, "bulk_load: pool full");
  };
  for (std::size_t i = 0; i < sorted.size(); ++i) {  // B1: key and value records (K1)
    Code c = Code::ok;
    key_words[i] = keys_.make_key_word(*pool_, keys_.probe(sorted[i].key), &c);
    if (c != Code::ok) return undo(c);
    value_words[i] = values_.make_word(sorted[i].value, &c);
    if (c != Code::ok) {
      if (keys_.bytes_mode()) index_common::free_record(*pool_, key_words[i]);
      return undo(c);
    }
    ++made_records;
  }
  for (; made_leaves < n_leaves; ++made_leaves) {
    Code c = Code::ok;
    if ((leaves[made_leaves] = pool_->allocator().allocate(kBlock, &c)) == 0) return undo(c);
  }
  for (std::size_t j = n_leaves; j-- > 0;) {  // B2: the new leaves, chained (unused space),
    // back to front: each link carries the tag of the leaf after it
    LeafT* l = leaf_at(leaves[j]);
    index_common::recycle_unlocked(versions_->at(leaves[j]));
    const std::size_t first = j * per, cnt = std::min(sorted.size(), first + per) - first;
    std::uint64_t fps[LeafT::kFpWords] = {};
    for (std::size_t i = 0; i < cnt; ++i) {
      detail::put(&l->kv[i][0], key_words[first + i]);
      detail::put(&l->kv[i][1], value_words[first + i]);
      const auto s = static_cast<unsigned>(i);
      fps[s / 8] = with_fp(fps[s / 8], s, keys_.probe(sorted[first + i].key).fp);
    }
    for (std::size_t w = 0; w < LeafT::kFpWords; ++w) detail::put(&l->fps[w], fps[w]);
    detail::put(&l->next, j + 1 < n_leaves
                              ? make_link(leaves[j + 1], leaf_at(leaves[j + 1])->tag)
                              : kChainEnd);
    detail::put(&l->bitmap, cnt == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << cnt) - 1);
    detail::put(&l->lock, 0);
    detail::put(&l->tag, new_tag());
    pm::flush(l, offsetof(LeafT, kv) + cnt * 16);  // B3: header, fingerprints, used slots
  }
  pm::fence();                                      //     durable before the commit
  // B4: NAW - the head's next publishes the whole load
  detail::put(&head->next, make_link(leaves[0], leaf_at(leaves[0])->tag));
  pm::persist(&head->next, 8);
  // DRAM: the inner tree over head + the loaded leaves.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> items;
  items.reserve(n_leaves + 1);
  items.emplace_back(0, head_);
  for (std::size_t j = 0; j < n_leaves; ++j)
    items.emplace_back(keys_.separator_for(sorted[j * per].key, key_words[j * per], seps_), leaves[j]);
  inner_.bulk_build(items, fill, 1);
  count_loaded(sorted.size());
  return Status::Ok();
}

}  // namespace pmindex::fptree

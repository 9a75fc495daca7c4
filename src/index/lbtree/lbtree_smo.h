// LB+-Tree structural changes: logless split (Alg. 3, §3.4), crash-safe removal of an empty
// leaf, bulk load. Included only by lbtree.cpp. Steps S*, U*, B*: PROTOCOL.md.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <vector>

#include "index/common/hybrid_checks.h"
#include "index/common/prefetch.h"
#include "index/lbtree/lbtree_ops.h"

namespace pmindex::lbtree {


// Splits the locked, full leaf `off` and inserts the new entry. The new leaf is locked (DRAM
// version) before the inner tree holds its separator and stays locked until the split is
// complete, so no reader can miss a moved key. On success the old leaf's PM lock bit is clear
// (S6); its DRAM version is still locked.
template <unsigned M>
Code LBTree<M>::split_insert(std::uint64_t off, std::uint64_t key_word,
                             std::uint64_t value_word, std::uint8_t fp,
                             const index_common::InnerTree::ParentHint& hint) {
  Code code = Code::ok;
  const std::uint64_t new_off = pool_->allocator().allocate(LeafT::kBytes, &code);
  if (new_off == 0) return code;
  // Fetched while the entries are sorted: the new leaf's DRAM version, which the split locks
  // first (a cache miss the paper's design does not have), and the lines it then writes.
  index_common::prefetch_lines_for_write(&versions_.at(new_off), 64);
  index_common::prefetch_lines_for_write(leaf_at(new_off), LeafT::kBytes);
  LeafT* l = leaf_at(off);
  const DWord d0 = load_header(l->block[0].front);
  const bool alt = d0.alt();
  DWord od[M];
  SplitItems items;
  const unsigned n = gather_sorted(l, d0, od, items);
  const std::uint64_t sep_key = items[n - n / 2].key;
  index_common::recycle_locked(versions_.at(new_off));
  link_separator(off, sep_key, new_off, hint);

  // S1: the upper half into the new leaf, and the new entry with it if it belongs there
  // (Alg. 3 lines 13-14: it joins the new leaf before the leaf is persisted).
  LeafT* nl = leaf_at(new_off);
  DWord nd[M];
  build_upper_half(l, od, items, n, nl, nd);
  const bool go_right = keys_.key_word_less(sep_key, key_word);
  if (go_right) {
    unsigned b = 0;
    while (nd[b].full()) ++b;
    const std::uint64_t free = ~nd[b].bitmap() & kBitmapMask;
    const auto s = static_cast<unsigned>(std::countr_zero(free));
    detail::put(&nl->block[b].entry[s][0], key_word);
    detail::put(&nl->block[b].entry[s][1], value_word);
    nd[b].set_fp(s, fp);
    nd[b].set_valid(s);
  }
  for (unsigned b = 0; b < M; ++b) {
    detail::put(&nl->block[b].front[0], nd[b].w[0]);
    detail::put(&nl->block[b].front[1], nd[b].w[1]);
    detail::put(&nl->block[b].tail[0], 0);
    detail::put(&nl->block[b].tail[1], 0);
  }
  // The new leaf continues where `l` did, under its own new tag (layout.h sibling words).
  const std::uint64_t l_sib = optimistic_read(l->block[0].tail[alt ? 1 : 0]);
  const std::uint64_t new_tag = tags_.next();
  detail::put(&nl->block[0].tail[0], reowned(l_sib, new_tag));
  detail::put(&nl->block[0].tail[1], make_sibling(0, 0, new_tag));
  // S2: write the new leaf back. Its fence is S5's: S3 and S4 write unused space too, so one
  // fence makes S1-S4 durable before S6 links the new leaf (a split waits for one write-back
  // round trip fewer).
  pm::flush(nl, LeafT::kBytes);

  // S3: the old leaf's headers of blocks 1..M-1 after the split go into their inactive
  // (alternative) places, and S4: the unused sibling pointer gets the new leaf. Unused space.
  for (unsigned b = 1; b < M; ++b) {
    std::uint64_t* h = inactive_header(l, b, alt);
    detail::put(h, od[b].w[0]);
    detail::put(h + 1, od[b].w[1]);
    pm::flush(h, 16);
  }
  detail::put(&l->block[0].tail[alt ? 0 : 1], make_sibling(new_off, new_tag, sib_own_tag(l_sib)));
  pm::flush(&l->block[0].tail[0], 16);
  pm::fence();  // S5: S1-S4 are durable before the commit
  // S6: NAW - block 0's word0 with the moved bits cleared and alt flipped switches the sibling
  // pointer and every block's header at once: the split is committed. It clears the PM lock
  // bit too (the caller's unlock then leaves the line alone; the DRAM version stays locked).
  od[0].w[0] = (od[0].w[0] ^ kAltBit) & ~kLockBit;
  detail::put(&l->block[0].front[0], od[0].w[0]);
  pm::persist(l->block[0].front, 16);  // S7
  if (!go_right) {
    // S8: the new entry goes into the (now half-empty) old leaf as a second NAW section
    // (P1..P6). The paper does this before S6; that would overwrite a slot that is still
    // valid until S6 commits (PROTOCOL.md, "Deviation").
    leaf_insert(l, od[0], key_word, value_word, fp);
  }

  versions_.at(new_off).writeUnlock();
  return Code::ok;
}

// split_insert: the full leaf's active headers into od (block 0's is d0) and its entries into
// items, sorted by key; returns their number. The entries sit on the stack (a full leaf holds
// kSlots): a split allocates no DRAM, which was a third of its instructions (issue 16).
template <unsigned M>
unsigned LBTree<M>::gather_sorted(LeafT* l, DWord d0, DWord (&od)[M], SplitItems& items) const {
  unsigned n = 0;
  for (unsigned b = 0; b < M; ++b) {
    od[b] = b == 0 ? d0 : load_header(active_header(l, b, d0.alt()));
    for (std::uint64_t m = od[b].bitmap(); m != 0; m &= m - 1) {
      const auto s = static_cast<unsigned>(std::countr_zero(m));
      items[n++] = {b, s, optimistic_read(l->block[b].entry[s][0])};
    }
  }
  if (keys_.bytes_mode()) {
    std::vector<std::pair<std::string, unsigned>> keyed;
    for (unsigned i = 0; i < n; ++i) keyed.emplace_back(keys_.key_bytes(items[i].key), i);
    std::sort(keyed.begin(), keyed.end());
    const SplitItems unsorted = items;
    for (unsigned i = 0; i < n; ++i) items[i] = unsorted[keyed[i].second];
  } else {
    std::sort(items.begin(), items.begin() + n,
              [](const SplitItem& a, const SplitItem& b) { return a.key < b.key; });
  }
  return n;
}

// split_insert, DRAM first: the separator goes into the inner tree while both leaves are
// locked, so a reader routed to either leaf waits until the split is complete. It comes before
// the PM steps because its lock and CASes are locked instructions, which wait for every earlier
// write-back to finish: after S7 they would wait out S7's (and S8's) write-backs, which
// otherwise overlap the next operation's descent. The insert's own descent named the level-1
// node: if no SMO changed it since and it has room, the separator goes there without a second
// descent (path_to was ~180 instructions of a split).
template <unsigned M>
void LBTree<M>::link_separator(std::uint64_t off, std::uint64_t sep_key, std::uint64_t new_off,
                               const index_common::InnerTree::ParentHint& hint) {
  const std::uint64_t sep = make_separator(sep_key);
  auto smo = inner_.smo_lock();
  if (inner_.insert_separator_hinted(hint, off, sep, new_off)) return;
  index_common::InnerTree::Path& path = smo_path_;
  if (keys_.bytes_mode()) {
    const std::string sep_bytes = keys_.key_bytes(sep_key);
    const Probe sp = keys_.probe(sep_bytes);
    inner_.path_to([&](std::uint64_t s) { return keys_.below(sp, s); }, &path);
  } else {
    inner_.path_to<kInnerKeys>(index_common::WordProbe{sep_key}, &path);  // no key bytes, no mode test
  }
  if (!inner_.insert_separator(path, off, sep, new_off))
    index_common::fatal("lbtree", "split: the separator's path does not end at the split leaf");
}

// split_insert's S1 (unused space): the upper half of the sorted entries goes into the new
// leaf's LAST slots, so that later inserts find free slots in block 0, line 0 (all headers
// front, alt = 0); their bits are cleared in the old leaf's headers od, which S3 and S6 write.
template <unsigned M>
void LBTree<M>::build_upper_half(LeafT* l, DWord (&od)[M], const SplitItems& items, unsigned n,
                                 LeafT* nl, DWord (&nd)[M]) const {
  // The block of an item or of a slot number g: a constant 0 for one-block (256 B) leaves, so
  // their header words stay in registers instead of runtime-indexed arrays (issue 16).
  auto block_of = [](const SplitItem& it) { return M == 1 ? 0u : it.b; };
  auto split_slot = [](unsigned g) {
    return std::pair<unsigned, unsigned>{M == 1 ? 0u : g / kSlotsPerBlock,
                                         M == 1 ? g : g % kSlotsPerBlock};
  };
  const unsigned move = n / 2;
  for (auto& d : nd) d = DWord{{0, 0}};
  for (unsigned i = 0; i < move; ++i) {
    const SplitItem& it = items[n - move + i];
    const auto [b, s] = split_slot(traditional_ ? i : LeafT::kSlots - move + i);
    const unsigned ob = block_of(it);
    detail::put(&nl->block[b].entry[s][0], it.key);
    detail::put(&nl->block[b].entry[s][1], optimistic_read(l->block[ob].entry[it.s][1]));
    nd[b].set_fp(s, od[ob].fp(it.s));
    nd[b].set_valid(s);
    od[ob].clear_valid(it.s);
  }
}

// U1..U3 on leaf `a` (locked, or recovery): make what `next` names (another leaf's sibling
// word: the successor's offset and tag) its successor with one NAW.
template <unsigned M>
void LBTree<M>::switch_sibling(LeafT* a, std::uint64_t next) {
  const DWord a0 = load_header(a->block[0].front);
  const bool alt = a0.alt();
  // U1: copy blocks 1..M-1's active headers into their alternative places (unused space) so
  // the alt flip leaves them unchanged, and write the successor into the unused sibling.
  for (unsigned b = 1; b < M; ++b) {
    const DWord d = load_header(active_header(a, b, alt));
    std::uint64_t* h = inactive_header(a, b, alt);
    detail::put(h, d.w[0]);
    detail::put(h + 1, d.w[1]);
    pm::flush(h, 16);
  }
  detail::put(&a->block[0].tail[alt ? 0 : 1], reowned(next, sib_own_tag(active_sibling(a))));
  pm::flush(&a->block[0].tail[0], 16);
  pm::fence();  // U2
  // U3: NAW - flip alt: the removed leaf is no longer reachable.
  detail::put(&a->block[0].front[0], a0.w[0] ^ kAltBit);
  pm::persist(a->block[0].front, 16);
}

template <unsigned M>
unsigned LBTree<M>::entry_count(LeafT* l) const {
  const bool alt = (optimistic_read(l->block[0].front[0]) & kAltBit) != 0;
  unsigned n = 0;
  for (unsigned b = 0; b < M; ++b)
    n += static_cast<unsigned>(std::popcount(load_header(active_header(l, b, alt)).bitmap()));
  return n;
}

// J1..J5 on the locked leaves `a` (the chain predecessor) and `l`: `l`'s entries go into
// `a`'s free slots and `a`'s successor becomes `next` (`l`'s successor), committed by one NAW
// of `a`'s block-0 word0. The caller checked that they fit (at most kMergeMax < kSlots).
template <unsigned M>
void LBTree<M>::merge_into(LeafT* a, LeafT* l, std::uint64_t next) {
  const DWord a0 = load_header(a->block[0].front);
  const bool alt = a0.alt();
  DWord ad[M];
  for (unsigned b = 0; b < M; ++b) ad[b] = b == 0 ? a0 : load_header(active_header(a, b, alt));
  const bool l_alt = (optimistic_read(l->block[0].front[0]) & kAltBit) != 0;
  unsigned tb = 0;
  for (unsigned b = 0; b < M; ++b) {
    const DWord ld = load_header(active_header(l, b, l_alt));
    for (std::uint64_t m = ld.bitmap(); m != 0; m &= m - 1) {
      const auto s = static_cast<unsigned>(std::countr_zero(m));
      while (ad[tb].full()) ++tb;  // in bounds: the caller checked the combined count
      const auto t = static_cast<unsigned>(std::countr_zero(~ad[tb].bitmap() & kBitmapMask));
      // J1: the entry into a free slot of `a` (unused space), with its fingerprint.
      detail::put(&a->block[tb].entry[t][0], optimistic_read(l->block[b].entry[s][0]));
      detail::put(&a->block[tb].entry[t][1], optimistic_read(l->block[b].entry[s][1]));
      ad[tb].set_fp(t, ld.fp(s));
      ad[tb].set_valid(t);
    }
  }
  // J2: blocks 1..M-1's merged headers into their inactive places, block 0's word1 in place
  // (it changes only fingerprints of slots the old bitmap marks unused, as P4), and `l`'s
  // successor into the unused sibling. All unused space.
  for (unsigned b = 1; b < M; ++b) {
    std::uint64_t* h = inactive_header(a, b, alt);
    detail::put(h, ad[b].w[0]);
    detail::put(h + 1, ad[b].w[1]);
  }
  detail::put(&a->block[0].front[1], ad[0].w[1]);
  detail::put(&a->block[0].tail[alt ? 0 : 1], reowned(next, sib_own_tag(active_sibling(a))));
  // J3: write back everything J1/J2 touched (the whole leaf: up to M x 4 lines), one fence.
  pm::flush(a, LeafT::kBytes);
  pm::fence();
  const std::uint64_t commit = (ad[0].w[0] ^ kAltBit) & ~kLockBit;
  if (fault_ == Fault::merge_unlink_first) [[unlikely]] {
    // Known-bad (tests only): the unlink commits first, the moved bits in a second NAW.
    detail::put(&a->block[0].front[0], (a0.w[0] ^ kAltBit) & ~kLockBit);
    pm::persist(a->block[0].front, 16);
  }
  // J4: NAW - block 0's word0 with the moved entries' bits (and fingerprints 0..5) set and alt
  // flipped: in one store the entries become valid in `a`, blocks 1..M-1 switch to the J2
  // headers and `a`'s successor becomes `next`, so `l` (and its copies) is unreachable.
  detail::put(&a->block[0].front[0], commit);
  pm::persist(a->block[0].front, 16);  // J5
}

// The locked non-head leaf `off` holds at most kMergeTrigger entries after a remove: fold it
// into its left neighbour (J1-J6) if both fit into kMergeMax entries, unlinking it outright if
// it is empty (U1-U4). Best effort: if the left neighbour is locked by another writer or too
// full, the leaf stays (it is a valid, reachable leaf). Unlocks `off`, and frees it if merged.
template <unsigned M>
void LBTree<M>::try_merge(std::uint64_t off, const Probe& p) {
  auto smo = inner_.smo_lock();
  index_common::InnerTree::Path& path = smo_path_;
  inner_.path_to([&](std::uint64_t s) { return keys_.below(p, s); }, &path);
  const std::uint64_t a_off = inner_.left_neighbour(path);
  if (a_off == 0 || !index_common::try_write_lock(versions_.at(a_off))) {
    smo.unlock();
    unlock_leaf(off);
    return;
  }
  LeafT* a = leaf_at(a_off);
  LeafT* l = leaf_at(off);
  const bool a_alt = (optimistic_read(a->block[0].front[0]) & kAltBit) != 0;
  if (sib_off(optimistic_read(a->block[0].tail[a_alt ? 1 : 0])) != off)
    index_common::fatal("lbtree",
                        "merge: the inner tree's left neighbour is not the chain predecessor");
  const unsigned n = entry_count(l);
  if (n != 0 && entry_count(a) + n > kMergeMax) {
    smo.unlock();
    versions_.at(a_off).writeUnlock();
    unlock_leaf(off);
    return;
  }
  const bool l_alt = (optimistic_read(l->block[0].front[0]) & kAltBit) != 0;
  const std::uint64_t next = optimistic_read(l->block[0].tail[l_alt ? 1 : 0]);
  if (n == 0) {
    switch_sibling(a, next);  // U1..U3
  } else {
    merge_into(a, l, next);   // J1..J5
    merges_.fetch_add(1, std::memory_order_relaxed);
  }
  // U4 / J6: the inner tree forgets `off` (its range joins `a`'s), then the DRAM versions.
  std::uint64_t dropped = 0;
  // A merged leaf's range must join `a` (its keys are there now); an empty one's may join
  // either neighbour.
  if (!inner_.remove_leaf(path, off, &dropped, /*join_left=*/n != 0))
    index_common::fatal("lbtree", "merge: leaf not in the inner tree");
  smo.unlock();
  if (keys_.bytes_mode()) seps_.retire(dropped, epochs_);  // freed once no pinned reader holds it
  versions_.at(a_off).writeUnlock();
  versions_.at(off).writeUnlockObsolete();
  // U4 / J6: unreachable in PM and DRAM; its key/value records (if any) now belong to `a`,
  // not freed. A reader that pins (bytes keys, out-of-line values) may still be inside `off`
  // and follow a key or value word it read there to a record before it validates, so the
  // block must not be reused as anything else under it: freed through the epoch manager.
  // Integer keys with inline values follow no word (a reused block only fails validation).
  if (keys_.bytes_mode() || !inline_values_) {
    epochs_.retire(
        pool_.get(),
        [](void* pool, std::uint64_t leaf) {
          static_cast<pm::Pool*>(pool)->allocator().deallocate(leaf, LeafT::kBytes);
        },
        off);
  } else {
    pool_->allocator().deallocate(off, LeafT::kBytes);
  }
}

// Bulk load into an empty tree. The new leaves are written and chained as unused space
// (B1, B2); the head leaf receives its share into unused slots and the first new leaf in its
// unused sibling pointer (B3); one NAW of the head's word0 commits the whole load (B4).
template <unsigned M>
Status LBTree<M>::bulk_load(std::span<const KeyValue> sorted, double fill) {
  if (Status s = check_bulk(sorted, fill); !s.ok() || sorted.empty()) return s;
  BulkPlan plan;
  plan.per = std::max<std::size_t>(1, static_cast<std::size_t>(LeafT::kSlots * fill));
  plan.leaves.assign((sorted.size() + plan.per - 1) / plan.per, 0);
  plan.leaves[0] = head_;
  if (Status s = bulk_allocate(sorted, &plan); !s.ok()) return s;
  bulk_write_chain(sorted, plan);       // B2
  bulk_commit_head(sorted, plan);       // B3, B4
  // DRAM: rebuild the inner tree over the loaded leaves.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> seps(plan.leaves.size());
  for (std::size_t j = 0; j < plan.leaves.size(); ++j)
    seps[j] = {j == 0 ? 0 : make_separator(plan.key_words[j * plan.per]), plan.leaves[j]};
  inner_.bulk_build(seps, fill, 1);
  count_loaded(sorted.size());
  return Status::Ok();
}

// bulk_load's refusals: a fill outside (0, 1], a non-empty tree, a bad key or value, keys not
// sorted and distinct. Nothing is written before these pass.
template <unsigned M>
Status LBTree<M>::check_bulk(std::span<const KeyValue> sorted, double fill) const {
  if (!(fill > 0.0 && fill <= 1.0))
    return Status(Code::invalid_argument, "fill factor must be in (0, 1]");
  if (sorted.empty()) return Status::Ok();
  if (!leaf_empty(leaf_at(head_)) || leaf_count() != 1)
    return Status(Code::invalid_argument, "bulk_load needs an empty index");
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    if (Code c = keys_.check(sorted[i].key); c != Code::ok)
      return Status(c, "bulk_load: bad key at record " + std::to_string(i));
    if (Code c = check_value(sorted[i].value); c != Code::ok)
      return Status(c, "bulk_load: bad value at record " + std::to_string(i));
    if (i > 0 && !(sorted[i - 1].key < sorted[i].key))
      return Status(Code::invalid_argument, "bulk_load: keys not sorted and distinct");
  }
  return Status::Ok();
}

// B1 (K1 for byte keys and out-of-line values): the records, then the new leaves (plan.leaves
// from index 1). On pool_full everything allocated so far is freed: nothing is reachable yet.
template <unsigned M>
Status LBTree<M>::bulk_allocate(std::span<const KeyValue> sorted, BulkPlan* plan) {
  plan->key_words.assign(sorted.size(), 0);
  plan->value_words.assign(sorted.size(), 0);
  auto undo = [&](std::size_t upto_leaf, std::size_t upto_rec, Code c) {
    for (std::size_t i = 1; i < upto_leaf; ++i)
      pool_->allocator().deallocate(plan->leaves[i], LeafT::kBytes);
    for (std::size_t i = 0; i < upto_rec; ++i) {
      if (keys_.bytes_mode()) index_common::free_record(*pool_, plan->key_words[i]);
      if (!inline_values_) index_common::free_record(*pool_, plan->value_words[i]);
    }
    return Status(c, "bulk_load: pool full");
  };
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    Code c = Code::ok;
    std::uint64_t& kw = plan->key_words[i];
    std::uint64_t& vw = plan->value_words[i];
    kw = keys_.probe(sorted[i].key).word;
    if (keys_.bytes_mode() && (kw = index_common::write_record(*pool_, sorted[i].key, &c)) == 0)
      return undo(0, i, c);
    if (inline_values_) {
      std::memcpy(&vw, sorted[i].value.data(), 8);
    } else if ((vw = index_common::write_record(*pool_, sorted[i].value, &c)) == 0) {
      if (keys_.bytes_mode()) index_common::free_record(*pool_, kw);
      return undo(0, i, c);
    }
  }
  for (std::size_t j = 1; j < plan->leaves.size(); ++j) {
    Code c = Code::ok;
    if ((plan->leaves[j] = pool_->allocator().allocate(LeafT::kBytes, &c)) == 0)
      return undo(j, sorted.size(), c);
  }
  return Status::Ok();
}

// Fills leaf j's slots (the last ones, as a split does) into headers `hd`.
template <unsigned M>
void LBTree<M>::bulk_fill_leaf(std::span<const KeyValue> sorted, const BulkPlan& plan,
                               LeafT* l, std::size_t j, DWord (&hd)[M]) const {
  for (unsigned b = 0; b < M; ++b) hd[b] = DWord{{0, 0}};
  const std::size_t first = j * plan.per, last = std::min(sorted.size(), first + plan.per);
  const auto cnt = static_cast<unsigned>(last - first);
  for (unsigned i = 0; i < cnt; ++i) {
    const unsigned g = LeafT::kSlots - cnt + i;
    const unsigned b = g / kSlotsPerBlock, s = g % kSlotsPerBlock;
    detail::put(&l->block[b].entry[s][0], plan.key_words[first + i]);
    detail::put(&l->block[b].entry[s][1], plan.value_words[first + i]);
    hd[b].set_fp(s, keys_.probe(sorted[first + i].key).fp);
    hd[b].set_valid(s);
  }
}

// B2: the new leaves written and chained, all in unused space, then one fence.
template <unsigned M>
void LBTree<M>::bulk_write_chain(std::span<const KeyValue> sorted, const BulkPlan& plan) {
  const std::size_t n_leaves = plan.leaves.size();
  // Each new leaf's own tag, known before the leaf before it names it (layout.h).
  std::vector<std::uint64_t> tag(n_leaves + 1, kEndTag8);
  for (std::size_t j = 1; j < n_leaves; ++j) tag[j] = tags_.next();
  for (std::size_t j = 1; j < n_leaves; ++j) {
    LeafT* l = leaf_at(plan.leaves[j]);
    index_common::recycle_unlocked(versions_.at(plan.leaves[j]));
    DWord hd[M];
    bulk_fill_leaf(sorted, plan, l, j, hd);
    for (unsigned b = 0; b < M; ++b) {
      detail::put(&l->block[b].front[0], hd[b].w[0]);
      detail::put(&l->block[b].front[1], hd[b].w[1]);
      detail::put(&l->block[b].tail[0], 0);
      detail::put(&l->block[b].tail[1], 0);
    }
    detail::put(&l->block[0].tail[0],
                make_sibling(j + 1 < n_leaves ? plan.leaves[j + 1] : 0, tag[j + 1], tag[j]));
    detail::put(&l->block[0].tail[1], make_sibling(0, 0, tag[j]));
    pm::flush(l, LeafT::kBytes);
  }
  pm::fence();
}

// B3: the head's share into its unused slots and headers, the chain into its unused sibling;
// B4: the NAW of the head's word0 (its bitmap, fingerprints 0..5, alt flipped) commits the load.
template <unsigned M>
void LBTree<M>::bulk_commit_head(std::span<const KeyValue> sorted, const BulkPlan& plan) {
  LeafT* head = leaf_at(head_);
  const DWord h0 = load_header(head->block[0].front);
  const bool alt = h0.alt();
  DWord hd[M];
  bulk_fill_leaf(sorted, plan, head, 0, hd);
  for (unsigned b = 1; b < M; ++b) {
    std::uint64_t* h = inactive_header(head, b, alt);
    detail::put(h, hd[b].w[0]);
    detail::put(h + 1, hd[b].w[1]);
  }
  const std::uint64_t head_tag = sib_own_tag(active_sibling(head));
  const std::uint64_t next = plan.leaves.size() > 1 ? plan.leaves[1] : 0;
  const std::uint64_t next_tag =
      next != 0 ? sib_own_tag(leaf_at(next)->block[0].tail[0]) : kEndTag8;
  detail::put(&head->block[0].tail[alt ? 0 : 1], make_sibling(next, next_tag, head_tag));
  detail::put(&head->block[0].front[1], hd[0].w[1]);  // fingerprints of unused slots only
  pm::flush(head, LeafT::kBytes);
  pm::fence();
  detail::put(&head->block[0].front[0], (hd[0].w[0] & ~(kAltBit | kLockBit)) |
                                            (alt ? 0 : kAltBit));
  pm::persist(head->block[0].front, 16);
}

}  // namespace pmindex::lbtree

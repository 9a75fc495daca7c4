// LB+-Tree operations: search (Alg. 1), insert with entry moving (Alg. 2), update, delete,
// scan. Included only by lbtree.cpp (explicit instantiations). Steps P*, D*, W*, K*: PROTOCOL.md.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "index/common/key_group.h"
#include "index/common/pm_record.h"
#include "index/common/prefetch.h"
#include "index/common/reclaim.h"
#include "index/lbtree/lbtree.h"

namespace pmindex::lbtree {

using index_common::optimistic_read;

namespace detail {
// Every PM word of a leaf is written with one 8-byte atomic store (pm::publish), because
// optimistic readers read the same words with optimistic_read (no data race; olc.h (1)).
inline void put(std::uint64_t* p, std::uint64_t v) { pm::publish(p, v); }

// Candidate slots of a block: SIMD compare of the 16 header bytes against the fingerprint;
// bits 2..15 of the byte mask are slots 0..13, filtered by the bitmap.
inline std::uint32_t match_slots(const DWord& d, std::uint8_t fp) {
  const __m128i header = _mm_set_epi64x(static_cast<long long>(d.w[1]),
                                        static_cast<long long>(d.w[0]));
  const __m128i probe = _mm_set1_epi8(static_cast<char>(fp));
  const auto mask = static_cast<std::uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(header, probe)));
  return (mask >> 2) & static_cast<std::uint32_t>(d.bitmap());
}

inline const char* line_ptr(const Block& b, unsigned line) {
  return reinterpret_cast<const char*>(&b) + 64 * line;
}
}  // namespace detail

// --- keys and values -------------------------------------------------------------------------

template <unsigned M>
Code LBTree<M>::check_value(std::string_view value) const {
  // Over the limit is value_too_large in every mode; a short value in the fixed 8-byte mode
  // is invalid_argument (include/pmindex/index.h).
  if (value.size() > max_value_) return Code::value_too_large;
  return inline_values_ && value.size() != 8 ? Code::invalid_argument : Code::ok;
}

template <unsigned M>
std::uint64_t LBTree<M>::make_separator(std::uint64_t key_word) {
  return keys_.separator_of_word(key_word, seps_);
}

template <unsigned M>
bool LBTree<M>::read_value(std::uint64_t value_word, std::string* out) const {
  if (inline_values_) {
    out->assign(reinterpret_cast<const char*>(&value_word), 8);
    return true;
  }
  std::string_view stored;
  if (!index_common::read_record(*pool_, value_word, max_value_, &stored)) return false;
  out->assign(stored);
  return true;
}

// --- leaf reading ------------------------------------------------------------------------------

template <unsigned M>
inline DWord LBTree<M>::load_header(const std::uint64_t* h) {
  return DWord{{optimistic_read(h[0]), optimistic_read(h[1])}};
}

template <unsigned M>
std::uint64_t LBTree<M>::active_sibling(const LeafT* l) {
  const bool alt = (optimistic_read(l->block[0].front[0]) & kAltBit) != 0;
  return optimistic_read(l->block[0].tail[alt ? 1 : 0]);
}

// match(key_word): the slot's key is the probe's. Integer keys compare words (no key-mode
// test per candidate slot).
template <unsigned M>
template <class Match>
typename LBTree<M>::SlotRef LBTree<M>::find_slot_if(LeafT* l, std::uint8_t fp,
                                                    Match match) const {
  const bool alt = (optimistic_read(l->block[0].front[0]) & kAltBit) != 0;
  for (unsigned b = 0; b < M; ++b) {
    const DWord d = load_header(active_header(l, b, alt));
    for (std::uint32_t m = detail::match_slots(d, fp); m != 0; m &= m - 1) {
      const auto s = static_cast<unsigned>(std::countr_zero(m));
      if (match(optimistic_read(l->block[b].entry[s][0]))) return SlotRef{static_cast<int>(b), s, d};
    }
  }
  return SlotRef{};
}

template <unsigned M>
typename LBTree<M>::SlotRef LBTree<M>::find_slot(LeafT* l, const Probe& p) const {
  if (!keys_.bytes_mode())
    return find_slot_if(l, p.fp, [w = p.word](std::uint64_t k) { return k == w; });
  return find_slot_if(l, p.fp, [&](std::uint64_t k) { return keys_.matches(k, p); });
}

template <unsigned M>
bool LBTree<M>::leaf_empty(LeafT* l) const {
  const bool alt = (optimistic_read(l->block[0].front[0]) & kAltBit) != 0;
  for (unsigned b = 0; b < M; ++b)
    if (load_header(active_header(l, b, alt)).bitmap() != 0) return false;
  return true;
}

// Optimistic descent to the leaf covering p; returns (leaf, leaf version).
template <unsigned M>
std::pair<std::uint64_t, std::uint64_t> LBTree<M>::descend_read(const Probe& p) const {
  // Integer keys compare words directly (no key-mode test per separator).
  if (!keys_.bytes_mode()) return descend_word(p.word);
  return inner_.descend([&](std::uint64_t sep) { return keys_.below(p, sep); },
                        [&](std::uint64_t leaf) { return on_leaf(leaf); });
}

template <unsigned M>
template <index_common::SearchIsa I>
std::pair<std::uint64_t, std::uint64_t> LBTree<M>::descend_word(std::uint64_t word) const {
  return inner_.descend<kInnerKeys>(index_common::WordProbeIsa<I>{word},
                                    [&](std::uint64_t leaf) { return on_leaf(leaf); });
}

template <unsigned M>
std::optional<std::uint64_t> LBTree<M>::on_leaf(std::uint64_t leaf) const {
  // Alg. 1: prefetch the leaf's lines as soon as the parent names it, so the fetch overlaps
  // the version read and the parent's validation.
  index_common::prefetch_lines(leaf_at(leaf), LeafT::kBytes);
  return versions_.read(leaf);
}

// Writers: lock the leaf covering p (DRAM version by CAS from the version seen under the
// valid parent, then the PM lock bit by pm::cas).
template <unsigned M>
std::uint64_t LBTree<M>::lock_leaf_for(const Probe& p,
                                       index_common::InnerTree::ParentHint* hint) {
  index_common::InnerTree::ParentHint unused;
  if (hint == nullptr) hint = &unused;
  const auto leaf = [&](std::uint64_t l) { return on_leaf(l); };
  for (;;) {
    const auto [off, v] =
        !keys_.bytes_mode()
            ? inner_.descend<kInnerKeys>(index_common::WordProbe{p.word}, leaf, hint)
            : inner_.descend([&](std::uint64_t sep) { return keys_.below(p, sep); }, leaf, hint);
    if (versions_.upgrade(off, v)) {
      // The PM lock bit: a release store, not the paper's CAS. Only the holder of the DRAM
      // version lock writes word0 (as at unlock), and a second locked instruction per insert
      // would wait for the previous operation's write-backs (docs/persistence.md).
      std::uint64_t* w0 = &leaf_at(off)->block[0].front[0];
      pm::publish(w0, optimistic_read(*w0) | kLockBit);
      return off;
    }
    index_common::olc_pause();
  }
}

// The lock bit is set only by a writer that holds the leaf's DRAM version lock, so while we
// hold both no other thread writes word0 and a release store clears the bit. A CAS here would
// wait for the line: the NAW just before it wrote the line back (clwb), and writing a line
// after its write-back refetches it for ownership, which a locked instruction waits for and a
// store does not (inserts into a bulk-loaded 10M-key tree x1.51 for this step alone,
// docs/performance-history.md). pm_bit_clear: the operation's commit NAW already cleared the
// bit (as the paper's Alg. 2 does), so the line just written back is not written again.
template <unsigned M>
void LBTree<M>::unlock_leaf(std::uint64_t off, bool pm_bit_clear) {
  if (!pm_bit_clear) {
    std::uint64_t* w0 = &leaf_at(off)->block[0].front[0];
    pm::publish(w0, optimistic_read(*w0) & ~kLockBit);
  }
  versions_.at(off).writeUnlock();
}

// --- search (Alg. 1) ------------------------------------------------------------------------------

// Two out-of-line bodies behind one test, so that neither pays the other's set-up.
template <unsigned M>
Code LBTree<M>::find(std::string_view key, std::string* value) const {
  if (!keys_.bytes_mode() && inline_values_)
    return search_avx2_ ? find_word_avx2(key, value) : find_word(key, value);
  return find_general(key, value);
}

template <unsigned M>
Code LBTree<M>::find_general(std::string_view key, std::string* value) const {
  const auto guard = pin();
  if (Code c = keys_.check(key); c != Code::ok) return c;
  const Probe p = probe(key);
  std::string tmp;
  for (;;) {
    const auto [off, v] = descend_read(p);
    LeafT* l = leaf_at(off);  // its lines were prefetched by descend_read
    const SlotRef r = find_slot(l, p);
    bool ok = true;
    if (r.block >= 0 && value != nullptr)
      ok = read_value(optimistic_read(l->block[r.block].entry[r.slot][1]), &tmp);
    if (!versions_.unchanged(off, v) || !ok) continue;
    if (r.block < 0) return Code::not_found;
    if (value != nullptr) value->swap(tmp);
    return Code::ok;
  }
}

// Integer keys with inline values (issue 16's short hot path): no epoch pin (nothing read
// here is ever freed while the index lives, as pin() says), no key-mode test after check(),
// and the value word goes straight into the caller's string once the leaf validated.
template <unsigned M>
Code LBTree<M>::find_word(std::string_view key, std::string* value) const {
  return find_word_t<index_common::SearchIsa::baseline>(key, value);
}

// The only LB+-Tree code a baseline build compiles with AVX2 (docs/isa.md).
template <unsigned M>
PMINDEX_AVX2_ENTRY Code LBTree<M>::find_word_avx2(std::string_view key,
                                                  std::string* value) const {
  return find_word_t<index_common::SearchIsa::avx2>(key, value);
}

template <unsigned M>
template <index_common::SearchIsa I>
Code LBTree<M>::find_word_t(std::string_view key, std::string* value) const {
  if (Code c = keys_.check(key); c != Code::ok) return c;
  const Probe p = keys_.probe_word(key);
  for (;;) {
    const auto [off, v] = descend_word<I>(p.word);
    LeafT* l = leaf_at(off);  // its lines were prefetched by descend_word
    const SlotRef r =
        find_slot_if(l, p.fp, [w = p.word](std::uint64_t k) { return k == w; });
    const std::uint64_t word =
        r.block >= 0 ? optimistic_read(l->block[r.block].entry[r.slot][1]) : 0;
    if (!versions_.unchanged(off, v)) continue;
    if (r.block < 0) return Code::not_found;
    if (value != nullptr) {
      if (value->size() != 8) value->resize(8);  // no call once the caller's string holds 8 bytes
      std::memcpy(value->data(), &word, 8);
    }
    return Code::ok;
  }
}

// --- batched search (Index::find_many) -----------------------------------------------------

template <unsigned M>
void LBTree<M>::find_batch(const std::string_view* keys, std::string* values, Code* codes,
                           std::size_t n) const {
  if (!keys_.bytes_mode() && inline_values_) return find_batch_word(keys, values, codes, n);
  find_batch_general(keys, values, codes, n);
}

// find_general's protocol per key under one pin for the batch: the separators compare key
// bytes (kKeys = 0: the inner search by binary steps), the leaf pass compares PM key records
// and copies values (out of line or inline) through `tmp`, so a value reaches the caller only
// after its leaf validated (as find_general). A key that fails validation is retried alone.
template <unsigned M>
void LBTree<M>::find_batch_general(const std::string_view* keys, std::string* values,
                                   Code* codes, std::size_t n) const {
  static_assert(kFindBatch <= index_common::InnerTree::kMaxBatch);
  const auto guard = pin();
  Probe p[kFindBatch];
  std::uint8_t at[kFindBatch];  // batch position of the j-th well-formed key
  const std::size_t live = index_common::compact_checked(
      keys, codes, n, [&](std::string_view k) { return keys_.check(k); },
      [&](std::string_view k) { return keys_.probe(k); }, p, at);
  struct Below {  // the ProbeLess of probe j (one type for every probe of the batch)
    const index_common::KeyCodec* keys;
    const Probe* p;
    bool operator()(std::uint64_t sep) const { return keys->below(*p, sep); }
  };
  std::pair<std::uint64_t, std::uint64_t> leaf[kFindBatch];
  std::uint64_t alone = inner_.descend_batch(
      live, [&](std::size_t j) { return Below{&keys_, &p[j]}; },
      [&](std::uint64_t off) {
        index_common::prefetch_lines(leaf_at(off), LeafT::kBytes);
        index_common::prefetch_lines(&versions_.at(off), 64);
      },
      [&](std::uint64_t off) { return versions_.read(off); }, leaf);
  std::string tmp;
  for (std::size_t j = 0; j < live; ++j) {
    if ((alone >> j & 1) != 0) continue;
    const auto [off, v] = leaf[j];
    LeafT* l = leaf_at(off);
    const std::size_t i = at[j];
    const SlotRef r = find_slot(l, p[j]);
    bool ok = true;
    if (r.block >= 0 && values != nullptr)
      ok = read_value(optimistic_read(l->block[r.block].entry[r.slot][1]), &tmp);
    if (!versions_.unchanged(off, v) || !ok) {
      alone |= std::uint64_t{1} << j;
      continue;
    }
    codes[i] = r.block >= 0 ? Code::ok : Code::not_found;
    if (r.block >= 0 && values != nullptr) values[i].swap(tmp);
  }
  for (; alone != 0; alone &= alone - 1) {
    const std::size_t i = at[std::countr_zero(alone)];
    codes[i] = find_general(keys[i], values != nullptr ? values + i : nullptr);
  }
}

// The same protocol per key as find_word (no epoch pin: nothing it reads is ever freed); a key
// whose descent or leaf validation fails is looked up again alone by find_word.
template <unsigned M>
void LBTree<M>::find_batch_word(const std::string_view* keys, std::string* values, Code* codes,
                                std::size_t n) const {
  static_assert(kFindBatch <= index_common::InnerTree::kMaxBatch);
  const index_common::WordBatch<kFindBatch> b(keys_, keys, codes, n);
  const auto& word = b.word;
  const auto& fp = b.fp;
  const auto& at = b.at;
  const std::size_t live = b.live;
  std::pair<std::uint64_t, std::uint64_t> leaf[kFindBatch];
  std::uint64_t alone = inner_.descend_batch<kInnerKeys>(
      live, [&](std::size_t j) { return index_common::WordProbe{word[j]}; },
      [&](std::uint64_t off) {
        // The leaf's lines and its DRAM version: both read in the next round.
        index_common::prefetch_lines(leaf_at(off), LeafT::kBytes);
        index_common::prefetch_lines(&versions_.at(off), 64);
      },
      [&](std::uint64_t off) { return versions_.read(off); }, leaf);
  for (std::size_t j = 0; j < live; ++j) {
    if ((alone >> j & 1) != 0) continue;
    const auto [off, v] = leaf[j];
    LeafT* l = leaf_at(off);
    const SlotRef r = find_slot_if(l, fp[j], [w = word[j]](std::uint64_t k) { return k == w; });
    const std::uint64_t value =
        r.block >= 0 ? optimistic_read(l->block[r.block].entry[r.slot][1]) : 0;
    if (!versions_.unchanged(off, v)) {
      alone |= std::uint64_t{1} << j;
      continue;
    }
    const std::size_t i = at[j];
    codes[i] = r.block >= 0 ? Code::ok : Code::not_found;
    if (r.block >= 0 && values != nullptr) {
      if (values[i].size() != 8) values[i].resize(8);
      std::memcpy(values[i].data(), &value, 8);
    }
  }
  for (; alone != 0; alone &= alone - 1) {
    const std::size_t i = at[std::countr_zero(alone)];
    codes[i] = find_word(keys[i], values != nullptr ? values + i : nullptr);
  }
}

// --- insert (Alg. 2) -------------------------------------------------------------------------

// Inserts into a locked leaf with a free slot. d0 is block 0's header as it stands (or, after
// a split, as the split committed it). Each block insert is one NAW section: P1..P6. Returns
// true if the NAW was block 0's word0, which then also cleared the PM lock bit.
template <unsigned M>
bool LBTree<M>::leaf_insert(LeafT* l, DWord d0, std::uint64_t key_word,
                            std::uint64_t value_word, std::uint8_t fp) {
  const bool alt = d0.alt();
  unsigned b = 0;
  DWord d = d0;
  for (; b < M; ++b) {
    d = b == 0 ? d0 : load_header(active_header(l, b, alt));
    if (!d.full()) break;
  }
  Block& blk = l->block[b];
  std::uint64_t* hdr = active_header(l, b, alt);
  const std::uint64_t old_w1 = optimistic_read(hdr[1]);
  const unsigned hline = header_line(b, alt);
  const std::uint64_t free = ~d.bitmap() & kBitmapMask;
  const std::uint64_t free_in_hline = free & line_slots_mask(hline);
  const auto slot = static_cast<unsigned>(
      std::countr_zero(free_in_hline != 0 && !traditional_ ? free_in_hline : free));
  const unsigned line = line_of_slot(slot);
  // P1: the entry goes into an unused slot (unused space).
  detail::put(&blk.entry[slot][0], key_word);
  detail::put(&blk.entry[slot][1], value_word);
  d.set_fp(slot, fp);
  d.set_valid(slot);
  if (line != hline) {
    // P2: entry moving - copy the header line's entries into the other free slots of `line`
    // (unused space); the bitmap changes (clear `from`, set `to`) ride on the NAW of P5.
    std::uint64_t to_free = traditional_ ? 0 : ~d.bitmap() & line_slots_mask(line);
    std::uint64_t from = d.bitmap() & line_slots_mask(hline);
    while (to_free != 0 && from != 0) {
      const auto to = static_cast<unsigned>(std::countr_zero(to_free));
      const auto fr = static_cast<unsigned>(std::countr_zero(from));
      detail::put(&blk.entry[to][0], optimistic_read(blk.entry[fr][0]));
      detail::put(&blk.entry[to][1], optimistic_read(blk.entry[fr][1]));
      d.set_fp(to, d.fp(fr));
      d.set_valid(to);
      d.clear_valid(fr);
      to_free &= to_free - 1;
      from &= from - 1;
    }
    pm::persist(detail::line_ptr(blk, line), 64);  // P3: the entry line is durable first
  }
  // P4: header word1 (fingerprints of slots 6..13): only unused slots' fingerprints change.
  if (d.w[1] != old_w1) detail::put(hdr + 1, d.w[1]);
  // P5: the NAW - one 8-byte failure-atomic store of header word0 commits the insert. In
  // block 0 it clears the PM lock bit too (Alg. 2), so the unlock need not write the line again
  // after P6 wrote it back; the DRAM version stays locked until unlock_leaf.
  detail::put(hdr, b == 0 ? d.w[0] & ~kLockBit : d.w[0]);
  pm::persist(hdr, 16);  // P6
  return b == 0;
}

// pool_full: run the deferred frees and retry once (reclaim.h; a failed insert or update
// leaves nothing behind). Outside the pinned section: deleters never run inside one.
template <unsigned M>
Code LBTree<M>::insert(std::string_view key, std::string_view value) {
  return this->count_insert(
      index_common::retry_after_reclaim(epochs_, [&] { return insert_once(key, value); }));
}

template <unsigned M>
Code LBTree<M>::update(std::string_view key, std::string_view value) {
  return index_common::retry_after_reclaim(epochs_, [&] { return update_once(key, value); });
}

template <unsigned M>
Code LBTree<M>::insert_once(std::string_view key, std::string_view value) {
  const auto guard = pin();
  if (Code c = keys_.check(key); c != Code::ok) return c;
  if (Code c = check_value(value); c != Code::ok) return c;
  const Probe p = probe(key);
  index_common::InnerTree::ParentHint hint;
  const std::uint64_t off = lock_leaf_for(p, &hint);
  LeafT* l = leaf_at(off);
  if (find_slot(l, p).block >= 0) {
    unlock_leaf(off);
    return Code::already_present;
  }
  Code code = Code::ok;
  const std::uint64_t key_word = keys_.make_key_word(*pool_, p, &code);  // K1 (bytes keys)
  if (code != Code::ok) { unlock_leaf(off); return code; }
  std::uint64_t value_word = 0;
  if (inline_values_) {
    std::memcpy(&value_word, value.data(), 8);
  } else {
    value_word = index_common::write_record(*pool_, value, &code);  // K1
    if (value_word == 0) {
      if (keys_.bytes_mode()) index_common::free_record(*pool_, key_word);
      unlock_leaf(off);
      return code;
    }
  }
  const DWord d0 = load_header(l->block[0].front);
  bool full = true;
  for (unsigned b = 0; b < M && full; ++b)
    full = (b == 0 ? d0 : load_header(active_header(l, b, d0.alt()))).full();
  bool pm_bit_clear = false;  // the commit NAW cleared the PM lock bit
  if (!full) {
    pm_bit_clear = leaf_insert(l, d0, key_word, value_word, p.fp);
    code = Code::ok;
  } else {
    code = split_insert(off, key_word, value_word, p.fp, hint);
    pm_bit_clear = code == Code::ok;  // S6 clears it
    if (code != Code::ok) release(Pending{keys_.bytes_mode() ? key_word : 0,
                                          inline_values_ ? 0 : value_word});
  }
  unlock_leaf(off, pm_bit_clear);
  return code;
}

// --- update / delete --------------------------------------------------------------------------

template <unsigned M>
Code LBTree<M>::update_once(std::string_view key, std::string_view value) {
  const auto guard = pin();
  if (Code c = keys_.check(key); c != Code::ok) return c;
  if (Code c = check_value(value); c != Code::ok) return c;
  const Probe p = probe(key);
  const std::uint64_t off = lock_leaf_for(p);
  LeafT* l = leaf_at(off);
  const SlotRef r = find_slot(l, p);
  if (r.block < 0) {
    unlock_leaf(off);
    return Code::not_found;
  }
  std::uint64_t* vslot = &l->block[r.block].entry[r.slot][1];
  Pending old;
  std::uint64_t value_word = 0;
  if (inline_values_) {
    std::memcpy(&value_word, value.data(), 8);
  } else {
    Code code = Code::ok;
    value_word = index_common::write_record(*pool_, value, &code);  // K1
    if (value_word == 0) { unlock_leaf(off); return code; }
    old.value_record = optimistic_read(*vslot);
  }
  detail::put(vslot, value_word);  // W1: NAW - one 8-byte failure-atomic store of the value
  pm::persist(vslot, 8);           // W2
  unlock_leaf(off);
  release(old);                    // K3: the old value record is unreachable and persisted so
  return Code::ok;
}

template <unsigned M>
Code LBTree<M>::remove(std::string_view key) {
  const auto guard = pin();
  if (Code c = keys_.check(key); c != Code::ok) return c;
  const Probe p = probe(key);
  const std::uint64_t off = lock_leaf_for(p);
  LeafT* l = leaf_at(off);
  SlotRef r = find_slot(l, p);
  if (r.block < 0) {
    unlock_leaf(off);
    return Code::not_found;
  }
  const bool alt = (optimistic_read(l->block[0].front[0]) & kAltBit) != 0;
  std::uint64_t* hdr = active_header(l, static_cast<unsigned>(r.block), alt);
  Pending gone;
  if (keys_.bytes_mode()) gone.key_record = optimistic_read(l->block[r.block].entry[r.slot][0]);
  if (!inline_values_) gone.value_record = optimistic_read(l->block[r.block].entry[r.slot][1]);
  DWord d = load_header(hdr);
  d.clear_valid(r.slot);
  detail::put(hdr, d.w[0]);  // D1: NAW - clear the slot's bitmap bit
  pm::persist(hdr, 16);      // D2
  if (off != head_ && entry_count(l) <= kMergeTrigger) {
    try_merge(off, p);       // unlocks (and may merge and free) the leaf
  } else {
    unlock_leaf(off);
  }
  release(gone);             // K3
  return this->count_remove(Code::ok);
}

// K3 in concurrent code: a removed record may still be read by an optimistic reader that found
// its offset in a slot before the removal (it would fail validation, but it reads the bytes),
// so the block is freed through the epoch manager once no pinned reader can hold it. A crash
// before then only leaks it to the next recovery, whose reachability pass reclaims it.
template <unsigned M>
void LBTree<M>::release(const Pending& pending) {
  auto free_later = [&](std::uint64_t off) {
    if (off == 0) return;
    epochs_.retire(
        pool_.get(),
        [](void* pool, std::uint64_t rec) {
          index_common::free_record(*static_cast<pm::Pool*>(pool), rec);
        },
        off);
  };
  free_later(pending.key_record);
  free_later(pending.value_record);
}

// --- scan ---------------------------------------------------------------------------------------

// Leaf by leaf: gather the live entries under the leaf's version, read the next leaf's version
// before validating this one (hand-over-hand, so the successor was linked when its version
// was read), then sort and emit. A failed validation re-descends from the last emitted key.
template <unsigned M>
std::size_t LBTree<M>::scan(std::string_view start, std::size_t max, ScanBuffer& out) const {
  const auto guard = pin();
  out.clear();
  if (max == 0) return 0;
  index_common::LeafScan sc(start, max);
  std::string value;
  for (;;) {
    const std::string resume = sc.have_last() ? sc.last() : std::string(start);
    const Probe p = keys_.probe(resume);
    auto [off, v] = descend_read(p);
    bool restart = false;
    while (!restart) {
      LeafT* l = leaf_at(off);
      sc.begin_leaf();
      const std::uint64_t w0 = optimistic_read(l->block[0].front[0]);
      const bool alt = (w0 & kAltBit) != 0;
      for (unsigned b = 0; b < M; ++b) {
        const DWord d = load_header(active_header(l, b, alt));
        for (std::uint64_t m = d.bitmap(); m != 0; m &= m - 1) {
          const auto s = static_cast<unsigned>(std::countr_zero(m));
          const std::string k = keys_.key_bytes(optimistic_read(l->block[b].entry[s][0]));
          if (!read_value(optimistic_read(l->block[b].entry[s][1]), &value)) value.clear();
          sc.gather(k, value);
        }
      }
      const std::uint64_t next = sib_off(optimistic_read(l->block[0].tail[alt ? 1 : 0]));
      std::optional<std::uint64_t> nv = 0;
      if (next != 0 && !(nv = versions_.read(next))) restart = true;
      if (!versions_.unchanged(off, v)) restart = true;
      if (restart) break;
      sc.emit(out);
      if (sc.full(out) || next == 0) return out.size();
      off = next;
      v = *nv;
    }
    index_common::olc_pause();
  }
}

}  // namespace pmindex::lbtree

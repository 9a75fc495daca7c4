// FPTree operations: lookup, insert, in-leaf out-of-place update, delete, scan. Included only
// by fptree.cpp (explicit instantiations). Steps I*, U*, D*, K*: PROTOCOL.md.
#pragma once

#include <bit>
#include <cstring>

#include "index/common/key_group.h"
#include "index/common/node_search.h"
#include "index/common/pm_record.h"
#include "index/common/prefetch.h"
#include "index/common/reclaim.h"
#include "index/common/scan_assembly.h"
#include "index/fptree/fptree.h"
#include "pmindex/pm/thread_slot.h"

namespace pmindex::fptree {

using index_common::optimistic_read;

// A slot's key or value word as an optimistic reader loads it: acquire, pairing with the
// writer's release store (pm::publish, I1) so that a PM record the word names (written by K1
// before I1) is visible, even to a reader whose slot was just reused (the version check then
// discards what it read). A plain load on x86.
inline std::uint64_t slot_word(const std::uint64_t* w) { return pm::load_acquire(w); }

namespace detail {
// Every PM word that optimistic readers may read is written with one 8-byte atomic store.
inline void put(std::uint64_t* p, std::uint64_t v) { pm::publish(p, v); }
inline std::uint64_t bit(unsigned s) { return std::uint64_t{1} << s; }
}  // namespace detail

template <unsigned N>
void FPTree<N>::set_fp(LeafT* l, unsigned s, std::uint8_t fp) {
  std::uint64_t* w = &l->fps[s / 8];
  detail::put(w, with_fp(optimistic_read(*w), s, fp));
}

template <unsigned N>
std::uint8_t FPTree<N>::get_fp(const LeafT* l, unsigned s) {
  return fp_of(optimistic_read(l->fps[s / 8]), s);
}

template <unsigned N>
MicroLog* FPTree<N>::my_log() const {
  return &logs_[pm::this_thread_slot()];
}

// Fingerprints first (the paper's point: about one key comparison per successful probe). The
// fingerprint words are compared eight slots at a time (fp_matches, SWAR) and masked with the
// bitmap; only candidates' key words are read.
// With AVX2 and N a multiple of 32, 32 fingerprints per compare (the 64-entry leaf's SWAR
// took ~180 instructions a lookup, issue 16); the vector load of seqlock data is safe for
// the reasons node_search.h gives (the result is used only after the leaf's version
// validates). I: the AVX2 form is compiled only where I is avx2 (find_word_avx2 in a baseline
// build, docs/isa.md; every caller in a PMINDEX_ISA=avx2 build); the baseline form and a
// ThreadSanitizer build take the SWAR path.
template <unsigned N>
template <index_common::SearchIsa I>
std::uint64_t FPTree<N>::fp_candidates(const LeafT* l, std::uint8_t fp) {
  std::uint64_t cand = 0;
#if defined(PMINDEX_NODE_SEARCH_AVX2)
  if constexpr (I == index_common::SearchIsa::avx2 && N % 32 == 0) {
    for (unsigned g = 0; g < N / 32; ++g)
      cand |= std::uint64_t{index_common::avx2::match_bytes(l->fps + 4 * g, fp)} << (32 * g);
    return cand;
  }
#endif
  for (unsigned w = 0; w < N / 8; ++w)
    cand |= std::uint64_t{fp_matches(optimistic_read(l->fps[w]), fp)} << (8 * w);
  return cand;
}

template <unsigned N>
template <index_common::SearchIsa I, class Match>
int FPTree<N>::find_slot_if(const LeafT* l, std::uint8_t fp, Match match) const {
  std::uint64_t cand = fp_candidates<I>(l, fp);
  for (cand &= optimistic_read(l->bitmap) & LeafT::kFullMask; cand != 0; cand &= cand - 1) {
    const auto s = static_cast<unsigned>(std::countr_zero(cand));
    if (match(slot_word(&l->kv[s][0]))) return static_cast<int>(s);
  }
  return kNone;
}

template <unsigned N>
int FPTree<N>::find_slot(const LeafT* l, const Probe& p) const {
  if (!keys_.bytes_mode())
    return find_slot_if(l, p.fp, [w = p.word](std::uint64_t k) { return k == w; });
  return find_slot_if(l, p.fp, [&](std::uint64_t k) { return keys_.matches(k, p); });
}

// Integer keys compare as integers in a separately instantiated descent (no key-mode branch
// inside the inner nodes' binary search, the hottest loop of every operation).
template <unsigned N>
std::pair<std::uint64_t, std::uint64_t> FPTree<N>::descend_read(const Probe& p) const {
  if (!keys_.bytes_mode()) return descend_word(p.word);
  return inner_.descend([&](std::uint64_t sep) { return keys_.below(p, sep); },
                        [&](std::uint64_t leaf) { return on_leaf(leaf); });
}

// The inner capacity is a constant here (inner_keys_for(N)): unrolled node search.
template <unsigned N>
template <index_common::SearchIsa I>
std::pair<std::uint64_t, std::uint64_t> FPTree<N>::descend_word(std::uint64_t word) const {
  return inner_.descend<inner_keys_for(N)>(index_common::WordProbeIsa<I>{word},
                                           [&](std::uint64_t leaf) { return on_leaf(leaf); });
}

template <unsigned N>
std::optional<std::uint64_t> FPTree<N>::on_leaf(std::uint64_t leaf) const {
  // The leaf's bitmap and fingerprint lines are read next: start fetching them now (a hint
  // only, no effect on correctness), before the version's own miss.
  const char* lp = pool_->at<const char>(leaf);
  index_common::prefetch_lines(lp, offsetof(LeafT, kv) > 64 ? 128 : 64);
  return versions_->read(leaf);
}

// The DRAM version is the lock; the PM lock word mirrors it (volatile meaning, never flushed
// on purpose: recovery clears whatever a crash left, R4).
template <unsigned N>
bool FPTree<N>::try_lock_leaf(std::uint64_t off, std::uint64_t version) {
  if (!versions_->upgrade(off, version)) return false;
  detail::put(&leaf_at(off)->lock, 1);
  return true;
}

template <unsigned N>
std::uint64_t FPTree<N>::lock_leaf_for(const Probe& p) {
  for (;;) {
    const auto [off, v] = descend_read(p);
    if (try_lock_leaf(off, v)) return off;
    index_common::olc_pause();
  }
}

template <unsigned N>
void FPTree<N>::unlock_leaf(std::uint64_t off, bool obsolete) {
  detail::put(&leaf_at(off)->lock, 0);
  if (obsolete) {
    versions_->at(off).writeUnlockObsolete();
  } else {
    versions_->at(off).writeUnlock();
  }
}

// I1..I4 (insert) and U1..U4 (update) share this NAW section.
template <unsigned N>
void FPTree<N>::commit_slot(LeafT* l, unsigned s, std::uint64_t key_word,
                            std::uint64_t value_word, std::uint8_t fp, std::uint64_t bitmap) {
  detail::put(&l->kv[s][0], key_word);  // I1: the entry into a free slot (unused space)
  detail::put(&l->kv[s][1], value_word);
  set_fp(l, s, fp);                     // I2: its fingerprint (a free slot's byte: unused)
  pm::flush(&l->kv[s][0], 16);          // I3: entry and fingerprint durable before the commit;
  if (!fp_word_shares_bitmap_line(s))   //     a fingerprint word in the bitmap's line needs no
    pm::flush(&l->fps[s / 8], 8);       //     flush: x86 persists one line's stores in order, so
  pm::fence();                          //     the bitmap (I4) is never durable without it
  detail::put(&l->bitmap, bitmap);      // I4: NAW - one failure-atomic 8-byte bitmap store
  pm::persist(&l->bitmap, 8);           //     commits, then persisted
}

template <unsigned N>
void FPTree<N>::retire_record(std::uint64_t record) {
  epochs_.retire(
      this, [](void* self, std::uint64_t off) {
        index_common::free_record(*static_cast<FPTree*>(self)->pool_, off);
      },
      record);
}

template <unsigned N>
void FPTree<N>::release_records(std::uint64_t key_word, std::uint64_t value_word) {
  if (keys_.bytes_mode()) retire_record(key_word);          // K3
  if (!values_.inline_values()) retire_record(value_word);  // K3
}

template <unsigned N>
std::optional<sync::EpochManager::Guard> FPTree<N>::pin_for_records() const {
  std::optional<sync::EpochManager::Guard> g;
  if (has_records_) g.emplace(epochs_.pin());
  return g;
}

// An out-of-line value is copied before the leaf's version is validated: a validated read
// saw the slot while its record was live (records are freed only after the slot is gone).
// Two out-of-line bodies behind one test, so that neither pays the other's set-up.
template <unsigned N>
Code FPTree<N>::find(std::string_view key, std::string* value) const {
  if (!has_records_) return search_avx2_ ? find_word_avx2(key, value) : find_word(key, value);
  return find_general(key, value);
}

// Integer keys with inline values (issue 16's short hot path): no pin (no records), no
// key-mode test after check(), the value word straight into the caller's string once the
// leaf validated.
template <unsigned N>
Code FPTree<N>::find_word(std::string_view key, std::string* value) const {
  return find_word_t<index_common::SearchIsa::baseline>(key, value);
}

// The only FPTree code a baseline build compiles with AVX2 (docs/isa.md).
template <unsigned N>
PMINDEX_AVX2_ENTRY Code FPTree<N>::find_word_avx2(std::string_view key,
                                                  std::string* value) const {
  return find_word_t<index_common::SearchIsa::avx2>(key, value);
}

template <unsigned N>
template <index_common::SearchIsa I>
Code FPTree<N>::find_word_t(std::string_view key, std::string* value) const {
  if (Code c = keys_.check(key); c != Code::ok) return c;
  const Probe p = keys_.probe_word(key);
  for (;;) {
    const auto [off, v] = descend_word<I>(p.word);
    const LeafT* l = leaf_at(off);
    const int s = find_slot_if<I>(l, p.fp, [w = p.word](std::uint64_t k) { return k == w; });
    const std::uint64_t word = s != kNone ? slot_word(&l->kv[s][1]) : 0;
    if (!versions_->unchanged(off, v)) {
      index_common::olc_pause();
      continue;
    }
    if (s == kNone) return Code::not_found;
    if (value != nullptr) {
      if (value->size() != 8) value->resize(8);  // no call once the caller's string holds 8 bytes
      std::memcpy(value->data(), &word, 8);
    }
    return Code::ok;
  }
}

template <unsigned N>
Code FPTree<N>::find_general(std::string_view key, std::string* value) const {
  if (Code c = keys_.check(key); c != Code::ok) return c;
  const Probe p = keys_.probe(key);
  const auto pinned = pin_for_records();  // records read below stay allocated while pinned
  for (;;) {
    const auto [off, v] = descend_read(p);
    const LeafT* l = leaf_at(off);
    const int s = find_slot(l, p);
    bool readable = true;
    if (s != kNone && value != nullptr) readable = values_.read(slot_word(&l->kv[s][1]), value);
    if (!versions_->unchanged(off, v)) {
      index_common::olc_pause();
      continue;
    }
    if (s == kNone) return Code::not_found;
    if (!readable) return Code::corrupted;  // validated, so the record really is bad
    return Code::ok;
  }
}

// Batched lookups (Index::find_many).
template <unsigned N>
void FPTree<N>::find_batch(const std::string_view* keys, std::string* values, Code* codes,
                           std::size_t n) const {
  if (!has_records_) return find_batch_word(keys, values, codes, n);
  find_batch_general(keys, values, codes, n);
}

// Byte-string keys or out-of-line values: find_general's reads per key under one pin for the
// batch, separators compared by key bytes (binary steps), values copied through `tmp` and
// handed over only once their leaf validated. A key that fails validation is retried alone.
template <unsigned N>
void FPTree<N>::find_batch_general(const std::string_view* keys, std::string* values,
                                   Code* codes, std::size_t n) const {
  static_assert(kFindBatch <= index_common::InnerTree::kMaxBatch);
  const auto pinned = pin_for_records();  // records read below stay allocated while pinned
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
        const char* lp = pool_->at<const char>(off);
        index_common::prefetch_lines(lp, offsetof(LeafT, kv) > 64 ? 128 : 64);
        index_common::prefetch_lines(&versions_->at(off), 64);
      },
      [&](std::uint64_t off) { return versions_->read(off); }, leaf);
  std::string tmp;
  for (std::size_t j = 0; j < live; ++j) {
    if ((alone >> j & 1) != 0) continue;
    const auto [off, v] = leaf[j];
    const LeafT* l = leaf_at(off);
    const int s = find_slot(l, p[j]);
    bool readable = true;
    if (s != kNone && values != nullptr) readable = values_.read(slot_word(&l->kv[s][1]), &tmp);
    if (!versions_->unchanged(off, v) || !readable) {  // find_general tells corrupted apart
      alone |= std::uint64_t{1} << j;
      continue;
    }
    const std::size_t i = at[j];
    codes[i] = s != kNone ? Code::ok : Code::not_found;
    if (s != kNone && values != nullptr) values[i].swap(tmp);
  }
  for (; alone != 0; alone &= alone - 1) {
    const std::size_t i = at[std::countr_zero(alone)];
    codes[i] = find_general(keys[i], values != nullptr ? values + i : nullptr);
  }
}

// find_word's protocol per key; a key whose descent or leaf validation fails is looked up
// again alone by find_word.
template <unsigned N>
void FPTree<N>::find_batch_word(const std::string_view* keys, std::string* values, Code* codes,
                                std::size_t n) const {
  static_assert(kFindBatch <= index_common::InnerTree::kMaxBatch);
  const index_common::WordBatch<kFindBatch> b(keys_, keys, codes, n);
  const auto& word = b.word;
  const auto& fp = b.fp;
  const auto& at = b.at;
  const std::size_t live = b.live;
  std::pair<std::uint64_t, std::uint64_t> leaf[kFindBatch];
  std::uint64_t alone = inner_.descend_batch<inner_keys_for(N)>(
      live, [&](std::size_t j) { return index_common::WordProbe{word[j]}; },
      [&](std::uint64_t off) {
        // The bitmap and fingerprint lines and the DRAM version: read in the next round.
        const char* lp = pool_->at<const char>(off);
        index_common::prefetch_lines(lp, offsetof(LeafT, kv) > 64 ? 128 : 64);
        index_common::prefetch_lines(&versions_->at(off), 64);
      },
      [&](std::uint64_t off) { return versions_->read(off); }, leaf);
  for (std::size_t j = 0; j < live; ++j) {
    if ((alone >> j & 1) != 0) continue;
    const auto [off, v] = leaf[j];
    const LeafT* l = leaf_at(off);
    const int s = find_slot_if(l, fp[j], [w = word[j]](std::uint64_t k) { return k == w; });
    const std::uint64_t value = s != kNone ? slot_word(&l->kv[s][1]) : 0;
    if (!versions_->unchanged(off, v)) {
      alone |= std::uint64_t{1} << j;
      continue;
    }
    const std::size_t i = at[j];
    codes[i] = s != kNone ? Code::ok : Code::not_found;
    if (s != kNone && values != nullptr) {
      if (values[i].size() != 8) values[i].resize(8);
      std::memcpy(values[i].data(), &value, 8);
    }
  }
  for (; alone != 0; alone &= alone - 1) {
    const std::size_t i = at[std::countr_zero(alone)];
    codes[i] = find_word(keys[i], values != nullptr ? values + i : nullptr);
  }
}

// Insert and the paper's in-leaf out-of-place update are one protocol: lock the leaf, split
// it if full, write the new entry into a free slot, and commit with one bitmap NAW that sets
// the new slot and, for an update, clears the old one (I1..I4; U1..U4 are the same steps).
template <unsigned N>
Code FPTree<N>::write_entry(std::string_view key, std::string_view value, bool replace) {
  if (Code c = keys_.check(key); c != Code::ok) return c;
  if (Code c = values_.check(value); c != Code::ok) return c;
  const Probe p = keys_.probe(key);
  std::uint64_t off = lock_leaf_for(p);
  Code code = Code::ok;
  if ((find_slot(leaf_at(off), p) != kNone) != replace)
    code = replace ? Code::not_found : Code::already_present;
  if (code == Code::ok) code = make_room(&off, p);
  LeafT* l = leaf_at(off);
  const int old = code == Code::ok && replace ? find_slot(l, p) : kNone;  // a split keeps slots
  std::uint64_t key_word = 0;
  if (old != kNone) {
    key_word = optimistic_read(l->kv[old][0]);  // shared by both slots until the switch
  } else if (code == Code::ok) {
    key_word = keys_.make_key_word(*pool_, p, &code);  // K1
  }
  std::uint64_t value_word = 0;
  if (code == Code::ok) {
    value_word = values_.make_word(value, &code);  // K1 (out-of-line values)
    if (code != Code::ok && old == kNone && keys_.bytes_mode())
      index_common::free_record(*pool_, key_word);  // never published
  }
  if (code != Code::ok) {
    unlock_leaf(off);
    return code;
  }
  const std::uint64_t old_value_word = old != kNone ? optimistic_read(l->kv[old][1]) : 0;
  const std::uint64_t bm = optimistic_read(l->bitmap);
  const auto s = static_cast<unsigned>(std::countr_zero(~bm & LeafT::kFullMask));
  std::uint64_t bitmap = bm | detail::bit(s);
  if (old != kNone) bitmap &= ~detail::bit(static_cast<unsigned>(old));
  commit_slot(l, s, key_word, value_word, p.fp, bitmap);  // I1..I4 / U1..U4 (K2)
  unlock_leaf(off);
  // U5 (K3): the old slot's value record is unreachable now (the key record stays: the new
  // slot holds the same key word).
  if (old != kNone && !values_.inline_values()) retire_record(old_value_word);
  return Code::ok;
}

template <unsigned N>
Code FPTree<N>::insert(std::string_view key, std::string_view value) {
  // pool_full: run the deferred frees and retry once (reclaim.h; write_entry rolled back).
  return this->count_insert(index_common::retry_after_reclaim(
      epochs_, [&] { return write_entry(key, value, /*replace=*/false); }));
}

template <unsigned N>
Code FPTree<N>::update(std::string_view key, std::string_view value) {
  return index_common::retry_after_reclaim(
      epochs_, [&] { return write_entry(key, value, /*replace=*/true); });
}

template <unsigned N>
Code FPTree<N>::remove(std::string_view key) {
  if (Code c = keys_.check(key); c != Code::ok) return c;
  const Probe p = keys_.probe(key);
  const std::uint64_t off = lock_leaf_for(p);
  LeafT* l = leaf_at(off);
  const int s = find_slot(l, p);
  if (s == kNone) {
    unlock_leaf(off);
    return Code::not_found;
  }
  const std::uint64_t key_word = optimistic_read(l->kv[s][0]);
  const std::uint64_t value_word = optimistic_read(l->kv[s][1]);
  const std::uint64_t bm = optimistic_read(l->bitmap) & ~detail::bit(static_cast<unsigned>(s));
  detail::put(&l->bitmap, bm);  // D1: NAW - clear the slot's bitmap bit
  pm::persist(&l->bitmap, 8);   // D2
  if (off != head_ && static_cast<unsigned>(std::popcount(bm)) <= kMergeTrigger) {
    try_merge(off, p);          // D3..D6 or J1..J7 (or nothing); unlocks
  } else {
    unlock_leaf(off);
  }
  release_records(key_word, value_word);  // K3
  return this->count_remove(Code::ok);
}

// Leaf after leaf: gather the valid entries under the leaf's version, read the successor's
// version before validating (so the successor was linked when its version was read), sort
// and emit (LeafScan). A failed validation re-descends from the last key emitted.
template <unsigned N>
std::size_t FPTree<N>::scan(std::string_view start, std::size_t max, ScanBuffer& out) const {
  out.clear();
  index_common::LeafScan sc(start, max);
  std::string value_buf;
  const auto pinned = pin_for_records();
  while (max > 0) {
    const std::string from = sc.have_last() ? sc.last() : std::string(start);
    auto [off, v] = descend_read(keys_.probe(from));
    for (;;) {
      const LeafT* l = leaf_at(off);
      sc.begin_leaf();
      for (std::uint64_t m = optimistic_read(l->bitmap) & LeafT::kFullMask; m != 0; m &= m - 1) {
        const auto s = static_cast<unsigned>(std::countr_zero(m));
        if (!values_.read(slot_word(&l->kv[s][1]), &value_buf)) value_buf.clear();  // stale
        sc.gather(keys_.key_bytes(slot_word(&l->kv[s][0])), value_buf);
      }
      const std::uint64_t next = link_off(optimistic_read(l->next));
      std::optional<std::uint64_t> next_v = 0;
      const bool next_ok = next == 0 || (next_v = versions_->read(next));
      if (!next_ok || !versions_->unchanged(off, v)) break;
      sc.emit(out);
      if (sc.full(out) || next == 0) return out.size();
      off = next;
      v = *next_v;
    }
    index_common::olc_pause();
  }
  return 0;
}

}  // namespace pmindex::fptree

// PACTree: the native API over the data layer, split (S1-S8), merge (M1-M6) and the
// updater (background thread or synchronous).
// Creation, recovery and verify(): recovery.cpp. Steps: PROTOCOL.md.
#include "index/pactree/pactree.h"

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "index/common/key_group.h"
#include "index/common/olc.h"
#include "index/common/pm_record.h"
#include "index/common/prefetch.h"
#include "index/common/reclaim.h"

namespace pmindex::pactree {

namespace {

using sync::optimistic_read;

// Fingerprint match over the 64 fingerprint bytes: bit i of the result is set where byte i
// equals fp. SSE2 is the x86-64 baseline; the AVX2 path is chosen at run time (no ISA flag is
// imposed on users of the library).
std::uint64_t match_sse2(const std::uint8_t* fps, std::uint8_t fp) {
  const __m128i want = _mm_set1_epi8(static_cast<char>(fp));
  std::uint64_t m = 0;
  for (unsigned i = 0; i < 4; ++i) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(fps + 16 * i));
    m |= std::uint64_t{static_cast<std::uint16_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(v, want)))}
         << (16 * i);
  }
  return m;
}

__attribute__((target("avx2"))) std::uint64_t match_avx2(const std::uint8_t* fps,
                                                          std::uint8_t fp) {
  const __m256i want = _mm256_set1_epi8(static_cast<char>(fp));
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(fps));
  const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(fps + 32));
  const auto mlo = static_cast<std::uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(lo, want)));
  const auto mhi = static_cast<std::uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(hi, want)));
  return std::uint64_t{mlo} | (std::uint64_t{mhi} << 32);
}

const bool kHaveAvx2 = __builtin_cpu_supports("avx2");

}  // namespace

std::atomic<PacTree::WalkMode> PacTree::walk_mode_for_testing_{PacTree::WalkMode::automatic};
std::atomic<bool> PacTree::ignore_link_tags_for_testing_{false};

PacTree::PacTree(std::unique_ptr<pm::Pool> pool)
    : pool_(std::move(pool)), log_cursor_(new unsigned[pm::kMaxThreadSlots]()) {}

PacTree::~PacTree() {
  if (walker_.joinable()) walker_.join();  // a deferred walk nobody waited for never runs
  updater_.stop();  // no further application; what is queued stays logged (R1 frees it)
  if (!closed_) print_stats();
}

std::string PacTree::search_key(std::string_view key) const {
  std::string out;
  if (!bytes_) {  // fixed 8-byte keys: complementing every byte reverses the order
    out.resize(8);
    for (unsigned i = 0; i < 8; ++i) out[i] = static_cast<char>(~static_cast<std::uint8_t>(key[i]));
    return out;
  }
  // Any length: byte b becomes (0x00, 0xff - b) and the key ends with 0x01, so a key that is a
  // proper prefix of another encodes greater than it (0x01 > 0x00) and differing bytes reverse.
  out.reserve(2 * key.size() + 1);
  for (const char c : key) {
    out.push_back('\0');
    out.push_back(static_cast<char>(0xff - static_cast<std::uint8_t>(c)));
  }
  out.push_back('\1');
  return out;
}

bool PacTree::anchor_le(std::uint64_t off, const Probe& p) const {
  const DataNode* n = node(off);
  // Flags and anchor never change while a node is in the list (the node is freed through the
  // epoch manager, so the words stay readable while we are pinned).
  if ((optimistic_read(n->h.flags) & kFlagHead) != 0) return true;
  const std::uint64_t a = optimistic_read(n->h.anchor);
  if (!bytes_) return a <= p.word;
  std::string_view stored;
  if (!index_common::read_record(*pool_, a, keys_.max_key(), &stored)) return false;
  return stored <= p.bytes;
}

// The trie's answer for p: the node of the greatest anchor <= p it knows (*found 0 if none).
Code PacTree::seek_jump(const Probe& p, std::uint64_t* found) const {
  if (bytes_) {
    const std::string k = search_key(p.bytes);
    return search_.visit([&](auto& t) { return t.seek_ge(k, nullptr, found); });
  }
  // search_key of encode_u64(p.word), built on the stack: the complemented big-endian bytes
  // (two std::string per lookup cost about 100 instructions of it, callgrind).
  char k[8];
  for (unsigned i = 0; i < 8; ++i) k[i] = static_cast<char>(~(p.word >> (56 - 8 * i)));
  return search_.visit([&](auto& t) { return t.seek_ge(std::string_view(k, 8), nullptr, found); });
}

// The node of the greatest anchor <= p that the search layer knows, or the head. The search
// layer may lag behind splits (the last mile walks right from here).
std::uint64_t PacTree::jump_node(const Probe& p) const {
  std::uint64_t found = 0;
  (void)seek_jump(p, &found);
  return found != 0 ? found : root_->head;  // not found (past the last anchor): the head
}

// R8: jump_node while the start-now walk has not ended well. The trie is not trusted: a node
// whose trie removal was owed (merged before the crash) is replaced by the live node that
// took over its range (R7), and a node that fails its checks or lies right of p (a damaged
// trie) is replaced by the head, from which the last mile finds p's node.
std::uint64_t PacTree::checked_jump(const Probe& p) const {
  std::uint64_t found = 0;
  if (seek_jump(p, &found) != Code::ok || found == 0) return root_->head;
  bool redirect = true;
  if constexpr (pm::kTracing) redirect = !faults_.trust_owed_merged;  // Faults
  if (redirect) {
    const auto it = merged_at_open_.find(found);
    if (it != merged_at_open_.end()) found = it->second;
  }
  if (!node_sound(found) || !anchor_le(found, p)) return root_->head;
  return found;
}

// R8: a data node checked before it is read (the walk may not have reached it): in bounds
// and aligned, the head flag exactly on the head, a valid own tag, no bit beyond the node's
// slots, next the end mark or a valid tag and an offset in bounds (a next of 0 is a zeroed
// link, R2t), and (bytes keys) its anchor record readable. Reads only.
bool PacTree::node_sound(std::uint64_t off) const {
  pm::Pool& p = *pool_;
  const DataNode* n = p.checked<DataNode>(off, node_size_, 256);
  if (n == nullptr) return false;
  const std::uint64_t flags = optimistic_read(n->h.flags);
  if (flags != (off == root_->head ? kFlagHead : 0)) return false;
  if (!valid_tag(optimistic_read(n->h.tag))) return false;
  if ((optimistic_read(n->h.bitmap) & ~full_) != 0) return false;
  const std::uint64_t next = optimistic_read(n->h.next);
  if (next != kChainEnd && (!valid_tag(link_tag(next)) ||
                            p.checked<DataNode>(link_off(next), node_size_, 256) == nullptr))
    return false;
  std::string_view stored;
  return flags != 0 || !bytes_ ||
         index_common::read_record(p, optimistic_read(n->h.anchor), keys_.max_key(), &stored);
}

bool PacTree::link_names(std::uint64_t link) const {
  const std::uint64_t tag = link_tag(link);
  return valid_tag(tag) && optimistic_read(node(link_off(link))->h.tag) == tag;
}

bool PacTree::anchor_above(std::uint64_t next, std::uint64_t off) const {
  if (off == root_->head) return true;
  return key_of(optimistic_read(node(next)->h.anchor)) >
         key_of(optimistic_read(node(off)->h.anchor));
}

// find while readers check what they touch (R8): the checked jump, every node checked before
// it is read, the last mile only rightward in anchor order (a cycle of damaged links ends),
// each candidate key record checked; damage met answers corrupted. OLC as in find: a version
// that changed (a writer, once the walk ended) restarts the node's visit.
Code PacTree::find_checked(std::string_view key, std::string* value) const {
  const Probe p = keys_.probe(key);
  auto guard = epochs_.pin();
  std::uint64_t off = checked_jump(p);
  for (;;) {
    if (!node_sound(off)) return Code::corrupted;
    bool restart = false;
    const index_common::OptimisticLock& lock = versions_->at(off);
    const std::uint64_t v = lock.readLockOrRestart(restart);
    if (restart) {  // merged away in this run (after the walk): as find
      off = after_merged(off, p);
      continue;
    }
    const DataNode* n = node(off);
    const std::uint64_t link = optimistic_read(n->h.next);  // node_sound: the end mark or valid
    const std::uint64_t next = link_off(link);
    if (next != 0) {
      const bool sound = node_sound(next) && link_names(link) && anchor_above(next, off);
      const bool right = sound && anchor_le(next, p);
      lock.checkOrRestart(v, restart);
      if (restart) {
        index_common::olc_pause();
        continue;
      }
      if (!sound) return Code::corrupted;
      if (right) {
        hops_.fetch_add(1, std::memory_order_relaxed);  // relaxed: a statistic
        off = next;
        continue;
      }
    }
    int i = -1;
    bool damaged = false;
    for (std::uint64_t c = fp_candidates(n, p.fp, optimistic_read(n->h.bitmap)); c != 0;
         c &= c - 1) {
      const int j = std::countr_zero(c);
      const std::uint64_t kw = optimistic_read(n->slots[j].key);
      std::string_view stored;
      if (bytes_ && !index_common::read_record(*pool_, kw, keys_.max_key(), &stored)) {
        damaged = true;
        break;
      }
      if (keys_.matches(kw, p)) {
        i = j;
        break;
      }
    }
    const std::uint64_t word = i >= 0 ? optimistic_read(n->slots[i].value) : 0;
    lock.checkOrRestart(v, restart);
    if (restart) {
      index_common::olc_pause();
      continue;
    }
    if (damaged) return Code::corrupted;
    if (i < 0) return Code::not_found;
    if (value != nullptr && !values_.read(word, value)) return Code::corrupted;
    return Code::ok;
  }
}

std::uint64_t PacTree::fp_candidates(const DataNode* n, std::uint8_t fp,
                                     std::uint64_t bitmap) const {
  // Copied word by word with optimistic_read (a concurrent writer may change them; the
  // caller's validation discards what was read then), then compared as a vector.
  alignas(32) std::uint64_t words[kMaxSlots / 8];
  for (unsigned i = 0; i < kMaxSlots / 8; ++i) words[i] = optimistic_read(n->fp_words[i]);
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(words);
  return (kHaveAvx2 ? match_avx2(bytes, fp) : match_sse2(bytes, fp)) & bitmap;
}

int PacTree::find_slot(const DataNode* n, const Probe& p, std::uint64_t bitmap) const {
  for (std::uint64_t c = fp_candidates(n, p.fp, bitmap); c != 0; c &= c - 1) {
    const int i = std::countr_zero(c);
    if (keys_.matches(optimistic_read(n->slots[i].key), p)) return i;
  }
  return -1;
}

std::uint64_t PacTree::lock_node(const Probe& p) const {
  std::uint64_t off = jump_node(p);
  for (;;) {
    bool restart = false;
    index_common::OptimisticLock& lock = versions_->at(off);
    std::uint64_t v = lock.readLockOrRestart(restart);
    if (restart) {  // merged away: its left neighbour holds its range now
      off = after_merged(off, p);
      continue;
    }
    const std::uint64_t next = link_off(optimistic_read(node(off)->h.next));
    if (next != 0 && anchor_le(next, p)) {  // the last mile: p lies further right
      off = next;
      continue;
    }
    if (!restart) lock.upgradeToWriteLockOrRestart(v, restart);
    if (!restart) return off;  // unchanged since v: next, and so the range, still hold
    index_common::olc_pause();
  }
}

std::uint64_t PacTree::survivor_of(std::uint64_t off) const {
  // prev of a merged node is final: it was written under the survivor's lock, and nothing
  // names the node as next any more. The block stays readable while we are pinned.
  return optimistic_read(node(off)->h.prev);
}

std::uint64_t PacTree::after_merged(std::uint64_t off, const Probe& p) const {
  if constexpr (pm::kTracing) {
    if (faults_.restart_on_merged) {  // Faults: the original's restart from the jump node
      index_common::olc_pause();
      return jump_node(p);
    }
  }
  (void)p;
  return survivor_of(off);
}

void PacTree::unlock(std::uint64_t off) const { versions_->at(off).writeUnlock(); }

void PacTree::release_key(void* self, std::uint64_t word) {
  index_common::free_record(*static_cast<PacTree*>(self)->pool_, word);  // K3
}
void PacTree::release_value(void* self, std::uint64_t word) {
  static_cast<PacTree*>(self)->values_.release(word);  // K3
}
void PacTree::retire_key(std::uint64_t key_word) const {
  if (bytes_) epochs_.retire(const_cast<PacTree*>(this), &release_key, key_word);
}
void PacTree::retire_value(std::uint64_t value_word) const {
  if (!values_.inline_values())
    epochs_.retire(const_cast<PacTree*>(this), &release_value, value_word);
}

// --- the native API -------------------------------------------------------------------------

Code PacTree::find(std::string_view key, std::string* value) const {
  if (Code c = keys_.check(key); c != Code::ok) return c;
  // acquire: pairs with the walk's release, so R6's trie is seen once checks are off.
  if (checking_.load(std::memory_order_acquire)) [[unlikely]] return find_checked(key, value);
  const Probe p = keys_.probe(key);
  auto guard = epochs_.pin();  // key records and out-of-line values stay while we read them
  std::uint64_t off = jump_node(p);
  for (;;) {
    bool restart = false;
    const DataNode* n = node(off);
    index_common::prefetch_lines(n, 128);  // header and fingerprints, beside the version's miss
    const index_common::OptimisticLock& lock = versions_->at(off);
    const std::uint64_t v = lock.readLockOrRestart(restart);
    if (restart) {  // merged away: move on to the survivor instead of starting over
      off = after_merged(off, p);
      continue;
    }
    const std::uint64_t next = link_off(optimistic_read(n->h.next));
    // The next node's anchor decides whether p lies further right; its line is requested
    // before this node's slots are searched, so the two misses overlap (a hop drops the
    // search's answer).
    if (next != 0) index_common::prefetch_lines(node(next), 64);
    const int i = find_slot(n, p, optimistic_read(n->h.bitmap));
    if (next != 0 && anchor_le(next, p)) {
      hops_.fetch_add(1, std::memory_order_relaxed);  // relaxed: a statistic
      off = next;
      continue;
    }
    const std::uint64_t word = i >= 0 ? optimistic_read(n->slots[i].value) : 0;
    lock.checkOrRestart(v, restart);
    if (restart) {
      index_common::olc_pause();
      continue;
    }
    if (i < 0) return Code::not_found;
    if (value != nullptr && !values_.read(word, value)) return Code::corrupted;
    return Code::ok;
  }
}

// Batched lookups (Index::find_many): probe_batch runs find's steps pass by pass under one
// pin; find answers alone, after that pin, every key probe_batch could not (a merged jump
// node, a last-mile hop, a changed version). The search layer's seeks stay one after another:
// a warm-up pass of art::Tree::find_batch over the keys' encodings (roart's) made batches
// slower here (0.72x, 1M keys; README), the DRAM search layer being small and mostly cached.
void PacTree::find_batch(const std::string_view* keys, std::string* values, Code* codes,
                         std::size_t n) const {
  static_assert(kFindBatch <= 64);  // masks of one word
  if (checking_.load(std::memory_order_acquire)) [[unlikely]] {  // R8: each key alone
    for (std::size_t i = 0; i < n; ++i) {
      codes[i] = find(keys[i], values != nullptr ? &values[i] : nullptr);
    }
    return;
  }
  Probe p[kFindBatch];
  std::uint8_t at[kFindBatch];  // batch position of the j-th well-formed key
  const std::size_t live = index_common::compact_checked(
      keys, codes, n, [&](std::string_view k) { return keys_.check(k); },
      [&](std::string_view k) { return keys_.probe(k); }, p, at);
  if (live == 0) return;
  std::uint64_t alone = 0;
  {
    auto guard = epochs_.pin();  // key records and out-of-line values stay while we read them
    std::uint64_t words[kFindBatch];
    Code got[kFindBatch];
    alone = probe_batch(p, live, words, got);
    for (std::size_t j = 0; j < live; ++j) {
      if ((alone >> j & 1) != 0) continue;
      const std::size_t i = at[j];
      codes[i] = got[j];
      if (got[j] == Code::ok && values != nullptr && !values_.read(words[j], &values[i]))
        codes[i] = Code::corrupted;
    }
  }
  for (; alone != 0; alone &= alone - 1) {
    const std::size_t i = at[std::countr_zero(alone)];
    codes[i] = find(keys[i], values != nullptr ? &values[i] : nullptr);
  }
}

// find's steps for every key, one pass per step, each ending with a prefetch of what the key
// reads in the next: the jump node with its version word; the
// version, the next node's header and the fingerprint words; the last-mile check and the
// slots whose fingerprint matches; then find_slot, the value word and the version check
// exactly as find does them.
std::uint64_t PacTree::probe_batch(const Probe* p, std::size_t n, std::uint64_t* words,
                                   Code* got) const {
  std::uint64_t off[kFindBatch], ver[kFindBatch], next[kFindBatch];
  std::uint64_t alone = 0;
  const std::uint64_t all = n == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << n) - 1;
  for (std::size_t j = 0; j < n; ++j) {
    off[j] = jump_node(p[j]);
    index_common::prefetch_lines(node(off[j]), 64);
    index_common::prefetch_lines(&versions_->at(off[j]), 64);
  }
  for (std::size_t j = 0; j < n; ++j) {
    bool restart = false;
    ver[j] = versions_->at(off[j]).readLockOrRestart(restart);
    if (restart) {  // merged away: find moves on to the survivor
      alone |= std::uint64_t{1} << j;
      continue;
    }
    const DataNode* d = node(off[j]);
    next[j] = link_off(optimistic_read(d->h.next));
    if (next[j] != 0) index_common::prefetch_lines(node(next[j]), 64);
    index_common::prefetch_lines(d->fp_words, 64);
  }
  for (std::uint64_t m = all & ~alone; m != 0; m &= m - 1) {
    const auto j = static_cast<std::size_t>(std::countr_zero(m));
    if (next[j] != 0 && anchor_le(next[j], p[j])) {  // the last mile: find walks right
      alone |= std::uint64_t{1} << j;
      continue;
    }
    const DataNode* d = node(off[j]);
    for (std::uint64_t c = fp_candidates(d, p[j].fp, optimistic_read(d->h.bitmap)); c != 0;
         c &= c - 1)
      index_common::prefetch_lines(&d->slots[std::countr_zero(c)], 64);
  }
  for (std::uint64_t m = all & ~alone; m != 0; m &= m - 1) {
    const auto j = static_cast<std::size_t>(std::countr_zero(m));
    const DataNode* d = node(off[j]);
    const int i = find_slot(d, p[j], optimistic_read(d->h.bitmap));
    const std::uint64_t word = i >= 0 ? optimistic_read(d->slots[i].value) : 0;
    bool restart = false;
    versions_->at(off[j]).checkOrRestart(ver[j], restart);
    if (restart) {
      alone |= std::uint64_t{1} << j;
      continue;
    }
    got[j] = i < 0 ? Code::not_found : Code::ok;
    words[j] = word;
  }
  return alone;
}

void PacTree::write_slot(DataNode* n, unsigned i, std::uint64_t key_word,
                         std::uint64_t value_word, std::uint8_t fp) const {
  pm::publish(&n->slots[i].key, key_word);      // I1: the record into a free slot
  pm::publish(&n->slots[i].value, value_word);
  std::uint64_t fw = optimistic_read(n->fp_words[i / 8]);
  const unsigned shift = 8 * (i % 8);
  fw = (fw & ~(std::uint64_t{0xff} << shift)) | (std::uint64_t{fp} << shift);
  pm::publish(&n->fp_words[i / 8], fw);         // I1: its fingerprint
  pm::flush(&n->slots[i], sizeof(Slot));
  pm::flush(&n->fp_words[i / 8], 8);
  pm::fence();                                  // I2: both durable before the bit
}

Code PacTree::insert(std::string_view key, std::string_view value) {
  if (Code c = keys_.check(key); c != Code::ok) return c;
  if (Code c = values_.check(value); c != Code::ok) return c;
  if (Code c = writable(); c != Code::ok) return c;  // R9
  return count_insert(  // size()
      index_common::retry_after_reclaim(epochs_, [&] { return insert_once(key, value); }));
}

Code PacTree::insert_once(std::string_view key, std::string_view value) {
  const Probe p = keys_.probe(key);
  auto guard = epochs_.pin();
  for (;;) {
    const std::uint64_t off = lock_node(p);
    DataNode* n = node(off);
    const std::uint64_t bitmap = optimistic_read(n->h.bitmap);
    if (find_slot(n, p, bitmap) >= 0) {
      unlock(off);
      return Code::already_present;
    }
    if (bitmap == full_) {
      if (Code c = split(off); c != Code::ok) return c;
      continue;  // the key's node is the old one or the new one: find it again
    }
    Code code = Code::ok;
    const std::uint64_t vw = values_.make_word(value, &code);  // K1 (out of line)
    if (code != Code::ok) {
      unlock(off);
      return code;
    }
    const std::uint64_t kw = keys_.make_key_word(*pool_, p, &code);  // K1 (bytes keys)
    if (code != Code::ok) {
      values_.release(vw);
      unlock(off);
      return code;
    }
    const unsigned i = static_cast<unsigned>(std::countr_zero(~bitmap & full_));
    write_slot(n, i, kw, vw, p.fp);
    pm::publish(&n->h.bitmap, bitmap | (std::uint64_t{1} << i));
    pm::persist(&n->h.bitmap, 8);  // I3: the bit commits the insert
    unlock(off);
    return Code::ok;
  }
}

Code PacTree::update(std::string_view key, std::string_view value) {
  if (Code c = keys_.check(key); c != Code::ok) return c;
  if (Code c = values_.check(value); c != Code::ok) return c;
  if (Code c = writable(); c != Code::ok) return c;  // R9
  return index_common::retry_after_reclaim(epochs_, [&] { return update_once(key, value); });
}

Code PacTree::update_once(std::string_view key, std::string_view value) {
  const Probe p = keys_.probe(key);
  auto guard = epochs_.pin();
  const std::uint64_t off = lock_node(p);
  DataNode* n = node(off);
  const int i = find_slot(n, p, optimistic_read(n->h.bitmap));
  if (i < 0) {
    unlock(off);
    return Code::not_found;
  }
  Code code = Code::ok;
  const std::uint64_t vw = values_.make_word(value, &code);  // K1
  if (code != Code::ok) {
    unlock(off);
    return code;
  }
  const std::uint64_t old = optimistic_read(n->slots[i].value);
  pm::publish(&n->slots[i].value, vw);
  pm::persist(&n->slots[i].value, 8);  // U1: one 8-byte store switches the value
  unlock(off);
  retire_value(old);  // K3 once no reader can hold it
  return Code::ok;
}

Code PacTree::remove(std::string_view key) {
  if (Code c = keys_.check(key); c != Code::ok) return c;
  if (Code c = writable(); c != Code::ok) return c;  // R9
  const Probe p = keys_.probe(key);
  auto guard = epochs_.pin();
  const std::uint64_t off = lock_node(p);
  DataNode* n = node(off);
  const std::uint64_t bitmap = optimistic_read(n->h.bitmap);
  const int i = find_slot(n, p, bitmap);
  if (i < 0) {
    unlock(off);
    return Code::not_found;
  }
  const std::uint64_t kw = optimistic_read(n->slots[i].key);
  const std::uint64_t vw = optimistic_read(n->slots[i].value);
  pm::publish(&n->h.bitmap, bitmap & ~(std::uint64_t{1} << i));
  pm::persist(&n->h.bitmap, 8);  // D1: clearing the bit commits the remove
  Merge m = maybe_merge(off);
  unlock(off);
  retire_key(kw);  // K3
  retire_value(vw);
  if (m.lsn != 0) updater_.push(m.lsn, std::move(m.change));  // U8
  return Code::ok;
}

std::size_t PacTree::scan(std::string_view start, std::size_t max, ScanBuffer& out) const {
  out.clear();
  if (max == 0) return 0;
  const Probe p = keys_.probe(start);  // integer modes: a short start is padded with zeros
  auto guard = epochs_.pin();
  // R8: while the walk has not ended well, nodes are checked as find_checked does, and the
  // scan stops at damage (it has no code to answer with).
  const bool checking = checking_.load(std::memory_order_acquire);
  std::uint64_t off = checking ? checked_jump(p) : jump_node(p);
  std::string last;
  std::uint64_t last_word = 0;  // integer modes: the last key returned, as its key word
  bool have_last = false;
  std::vector<std::pair<std::string, std::uint64_t>> recs;
  std::string value;
  while (off != 0 && out.size() < max) {
    if (checking && !node_sound(off)) break;
    bool restart = false;
    const index_common::OptimisticLock& lock = versions_->at(off);
    const std::uint64_t v = lock.readLockOrRestart(restart);
    if (restart) {  // merged away: its records are in the survivor (keys emitted are skipped)
      off = survivor_of(off);
      continue;
    }
    const DataNode* n = node(off);
    const std::uint64_t link = optimistic_read(n->h.next);  // checking: node_sound saw it
    std::uint64_t next = link_off(link);
    if (checking && next != 0 &&
        (!node_sound(next) || !link_names(link) || !anchor_above(next, off)))
      next = 0;
    // The next node's lines are requested now, so their misses overlap this node's work (a
    // scan of 100 records spans two or three nodes). An unvalidated link: a prefetch of
    // any pool address is harmless.
    if (next != 0 && pool_->in_heap(next, node_size_)) index_common::prefetch_lines(node(next), node_size_);
    if (!keys_.bytes_mode()) {
      // Integer keys: the key words order as the keys do, so the node's (key word, value
      // word) pairs are sorted as integers and a key's bytes are made only when it is
      // returned (strings per slot and their sort cost about 4x the scan: issue 22).
      std::pair<std::uint64_t, std::uint64_t> words[kMaxSlots];
      unsigned k = 0;
      for (std::uint64_t b = optimistic_read(n->h.bitmap) & full_; b != 0; b &= b - 1) {
        const int i = std::countr_zero(b);
        words[k++] = {optimistic_read(n->slots[i].key), optimistic_read(n->slots[i].value)};
      }
      lock.checkOrRestart(v, restart);
      if (restart) {
        index_common::olc_pause();
        continue;  // the same node again: keys already emitted are skipped by last_word
      }
      std::sort(words, words + k);
      for (unsigned j = 0; j < k && out.size() < max; ++j) {
        const std::uint64_t kw = words[j].first;
        // Below start: its word is below the start's (a start longer than 8 bytes is above
        // its own first 8 bytes, a shorter one is padded with zeros: probe()).
        if (kw < p.word || (kw == p.word && start.size() > 8)) continue;
        if (have_last && kw <= last_word) continue;
        if (!values_.read(words[j].second, &value)) value.clear();
        out.append(encode_u64(kw), value);
        last_word = kw;
        have_last = true;
      }
      off = next;
      continue;
    }
    recs.clear();
    for (std::uint64_t b = optimistic_read(n->h.bitmap) & full_; b != 0; b &= b - 1) {
      const int i = std::countr_zero(b);
      recs.emplace_back(key_of(optimistic_read(n->slots[i].key)),
                        optimistic_read(n->slots[i].value));
    }
    lock.checkOrRestart(v, restart);
    if (restart) {
      index_common::olc_pause();
      continue;  // the same node again: keys already emitted are skipped by `last`
    }
    std::sort(recs.begin(), recs.end());  // no PM write: the order is computed per visit
    for (const auto& [k, w] : recs) {
      if (k < start || (have_last && k <= last)) continue;
      if (!values_.read(w, &value)) value.clear();
      out.append(k, value);
      last = k;
      have_last = true;
      if (out.size() == max) break;
    }
    off = next;
  }
  return out.size();
}

// --- split (S1-S8) --------------------------------------------------------------------------

// L1-L3: this thread's next SMO log entry, free (applied) before it is reused.
LogEntry* PacTree::log_slot(Code* code) {
  const std::size_t t = pm::this_thread_slot();
  std::uint64_t block = pm::load_acquire(&root_->logs[t]);
  if (block == 0) {
    const std::size_t bytes = kLogRing * sizeof(LogEntry);
    block = pool_->allocator().allocate(bytes, code);
    if (block == 0) return nullptr;
    pm::zero(pool_->at<void>(block), bytes);
    pm::persist(pool_->at<void>(block), bytes);  // L1: a zeroed ring
    pm::publish(&root_->logs[t], block);
    pm::persist(&root_->logs[t], 8);              // L1: named by the root
  }
  unsigned& cursor = log_cursor_[t];
  LogEntry* e = pool_->at<LogEntry>(block) + cursor;
  cursor = (cursor + 1) % kLogRing;
  // L3: an entry is reused only after the updater applied it (state 0). Its LSN's
  // predecessors belong to writers that already hold their LSN and never wait, so this ends.
  // Helping: a full ring under the background (or held) updater applies what is due itself,
  // so a writer never waits for the thread's wake-up.
  while (pm::load_acquire(&e->state) != 0) {
    if constexpr (pm::kTracing) {
      if (faults_.reuse_unapplied_log) break;  // Faults: the original's ring reuse
    }
    if (!updater_.apply_ready(/*wait=*/false)) index_common::olc_pause();
  }
  return e;
}

Code PacTree::split(std::uint64_t off) {
  DataNode* x = node(off);
  const std::uint64_t bitmap = optimistic_read(x->h.bitmap);
  std::vector<std::pair<std::string, unsigned>> keys;  // valid keys, sorted: the median splits
  for (std::uint64_t b = bitmap; b != 0; b &= b - 1) {
    const unsigned i = static_cast<unsigned>(std::countr_zero(b));
    keys.emplace_back(key_of(optimistic_read(x->slots[i].key)), i);
  }
  std::sort(keys.begin(), keys.end());
  const std::size_t half = keys.size() / 2;
  const std::string& median = keys[half].first;
  Code code = Code::ok;
  const std::uint64_t noff = pool_->allocator().allocate(node_block_, &code);
  if (noff == 0) {
    unlock(off);
    return code;
  }
  const std::uint64_t anchor = bytes_ ? index_common::write_record(*pool_, median, &code)  // K1
                                      : optimistic_read(x->slots[keys[half].second].key);
  LogEntry* le = code == Code::ok ? log_slot(&code) : nullptr;
  if (le == nullptr) {  // nothing shared was changed: give the blocks back
    if (bytes_ && anchor != 0) index_common::free_record(*pool_, anchor);
    pool_->allocator().deallocate(noff, node_block_);
    unlock(off);
    return code;
  }
  // S1: the new node, complete and durable before anything names it.
  alignas(64) DataNode img{};
  std::uint64_t moved = 0;
  const auto* xfp = reinterpret_cast<const std::uint8_t*>(x->fp_words);
  auto* nfp = reinterpret_cast<std::uint8_t*>(img.fp_words);
  for (std::size_t j = half; j < keys.size(); ++j) {
    const unsigned from = keys[j].second, to = static_cast<unsigned>(j - half);
    img.slots[to] = {optimistic_read(x->slots[from].key), optimistic_read(x->slots[from].value)};
    nfp[to] = xfp[from];
    moved |= std::uint64_t{1} << from;
  }
  const std::uint64_t old_next = optimistic_read(x->h.next);  // a tagged link or the end mark
  img.h.bitmap = (keys.size() - half == 64) ? ~std::uint64_t{0}
                                            : (std::uint64_t{1} << (keys.size() - half)) - 1;
  img.h.next = old_next;
  img.h.prev = off;
  img.h.anchor = anchor;
  img.h.tag = tags_.next();  // its own tag, in the header line persisted here
  const std::uint64_t new_link = make_link(noff, img.h.tag);
  DataNode* nn = node(noff);
  const std::size_t bytes = kHeaderBytes + (keys.size() - half) * sizeof(Slot);
  pm::copy(nn, &img, bytes);
  pm::persist(nn, bytes);
  index_common::recycle_unlocked(versions_->at(noff));
  // S2, S3 (L2): the log entry, its state word last.
  const std::uint64_t lsn = next_lsn_.fetch_add(1, std::memory_order_relaxed);  // relaxed:
  // a unique number; the updater applies in its order.
  const std::uint64_t words[3] = {make_link(off, optimistic_read(x->h.tag)), new_link, anchor};
  pm::copy(&le->left, words, sizeof words);
  pm::persist(&le->left, sizeof words);
  pm::publish(&le->state, (lsn << 8) | kStageSplitLogged);
  pm::persist(&le->state, 8);
  // S4: linking the new node (its offset and tag) commits the split.
  pm::publish(&x->h.next, new_link);
  pm::persist(&x->h.next, 8);
  // S5: the moved records leave the old node.
  pm::publish(&x->h.bitmap, bitmap & ~moved);
  pm::persist(&x->h.bitmap, 8);
  // S6: the right neighbour's prev hint (its owner is this node's lock holder).
  if (link_off(old_next) != 0) {
    pm::publish(&node(link_off(old_next))->h.prev, noff);
    pm::persist(&node(link_off(old_next))->h.prev, 8);
  }
  // S7: the data layer is done; recovery must no longer act on this entry.
  pm::publish(&le->state, (lsn << 8) | kStageSplitDone);
  pm::persist(&le->state, 8);
  unlock(off);
  splits_.fetch_add(1, std::memory_order_relaxed);  // relaxed: a statistic
  // S8: the search layer learns the new anchor, in LSN order.
  updater_.push(lsn, Pending{true, search_key(median), noff, le});
  return Code::ok;
}

// --- merge (M1-M6) --------------------------------------------------------------------------

// With `off` locked and sparse after a remove (at most a quarter full), merges its right
// neighbour into it when both fit in three quarters of a node. (Half a node, before, never
// merged a full pool emptied in key order: the right neighbour still held its keys when
// `off` thinned out. A split comes only at a full node and leaves two half-full ones, above
// the quarter that triggers a merge: no ping-pong.) Locks the neighbour (left to right, as every holder of two locks does,
// so waits form no cycle) and leaves `off` locked. Returns the search-layer change to push
// after the caller unlocks (lsn 0: no merge).
PacTree::Merge PacTree::maybe_merge(std::uint64_t off) {
  DataNode* x = node(off);
  const std::uint64_t xbits = optimistic_read(x->h.bitmap);
  const std::uint64_t nlink = optimistic_read(x->h.next);
  const std::uint64_t noff = link_off(nlink);
  if (noff == 0 || static_cast<unsigned>(std::popcount(xbits)) > slots_ / 4) return {};
  index_common::OptimisticLock& nlock = versions_->at(noff);
  bool restart = false;
  nlock.writeLockOrRestart(restart);  // a locked node's next is live: never obsolete here
  if (restart) return {};
  DataNode* n = node(noff);
  const std::uint64_t nbits = optimistic_read(n->h.bitmap);
  Code code = Code::ok;
  const auto together = static_cast<unsigned>(std::popcount(xbits) + std::popcount(nbits));
  LogEntry* le = together <= slots_ * 3 / 4 ? log_slot(&code) : nullptr;
  if (le == nullptr) {  // too full to merge, or no space for a log ring: not now
    nlock.writeUnlock();
    return {};
  }
  const std::uint64_t anchor = optimistic_read(n->h.anchor);
  const std::uint64_t after = optimistic_read(n->h.next);  // a tagged link or the end mark
  // M1 (L2): the log entry, its state word last.
  const std::uint64_t lsn = next_lsn_.fetch_add(1, std::memory_order_relaxed);  // relaxed:
  // a unique number; the updater applies in its order.
  const std::uint64_t words[3] = {make_link(off, optimistic_read(x->h.tag)), nlink, anchor};
  pm::copy(&le->left, words, sizeof words);
  pm::persist(&le->left, sizeof words);
  pm::publish(&le->state, (lsn << 8) | kStageMergeLogged);
  pm::persist(&le->state, 8);
  // M2: the neighbour's records into free slots of this node (bits still clear).
  const auto* nfp = reinterpret_cast<const std::uint8_t*>(n->fp_words);
  std::uint64_t added = 0, free = ~xbits & full_;
  for (std::uint64_t b = nbits; b != 0; b &= b - 1, free &= free - 1) {
    const unsigned from = static_cast<unsigned>(std::countr_zero(b));
    const unsigned to = static_cast<unsigned>(std::countr_zero(free));
    pm::publish(&x->slots[to].key, optimistic_read(n->slots[from].key));
    pm::publish(&x->slots[to].value, optimistic_read(n->slots[from].value));
    std::uint64_t fw = optimistic_read(x->fp_words[to / 8]);
    const unsigned shift = 8 * (to % 8);
    fw = (fw & ~(std::uint64_t{0xff} << shift)) | (std::uint64_t{nfp[from]} << shift);
    pm::publish(&x->fp_words[to / 8], fw);
    pm::flush(&x->slots[to], sizeof(Slot));
    added |= std::uint64_t{1} << to;
  }
  pm::flush(x->fp_words, sizeof x->fp_words);
  pm::fence();
  // M3: the copies become valid; they lie beyond this node's max (the neighbour's anchor), so
  // every reader still walks to the neighbour for them.
  pm::publish(&x->h.bitmap, xbits | added);
  pm::persist(&x->h.bitmap, 8);
  // M4: unlinking the neighbour commits the merge (its link word, tag included, is copied).
  pm::publish(&x->h.next, after);
  pm::persist(&x->h.next, 8);
  // M5: the prev hint of the node after it.
  if (link_off(after) != 0) {
    pm::publish(&node(link_off(after))->h.prev, off);
    pm::persist(&node(link_off(after))->h.prev, 8);
  }
  // M6: the data layer is done.
  pm::publish(&le->state, (lsn << 8) | kStageMergeDone);
  pm::persist(&le->state, 8);
  nlock.writeUnlockObsolete();  // readers that reach it move to its prev (this node)
  merges_.fetch_add(1, std::memory_order_relaxed);  // relaxed: a statistic
  // K3 for the node and its anchor record waits for the search layer to forget them (U8):
  // until then a lookup may still jump to the node and must find it obsolete, not reused.
  return Merge{lsn, Pending{false, search_key(key_of(anchor)), noff, le, anchor}};
}

void PacTree::release_node(void* self, std::uint64_t off) {
  auto* t = static_cast<PacTree*>(self);
  t->pool_->allocator().deallocate(off, t->node_block_);
}

// --- the updater (U8) ------------------------------------------------------------------------

void PacTree::Updater::set_mode(UpdaterMode m) {
  if (m == mode_) return;
  if (mode_ == UpdaterMode::background) stop();
  mode_ = m;
  if (m == UpdaterMode::background) {
    stop_.store(false, std::memory_order_relaxed);  // relaxed: before the thread exists
    thread_ = std::thread([this] { run(); });
  }
  if (m != UpdaterMode::held) (void)apply_ready(/*wait=*/true);  // what waited is due now
}

void PacTree::Updater::stop() {
  if (!thread_.joinable()) return;
  stop_.store(true, std::memory_order_release);  // pairs with run()'s acquire
  pushed_.fetch_add(1, std::memory_order_release);
  pushed_.notify_all();
  thread_.join();
}

void PacTree::Updater::run() {
  for (;;) {
    // acquire: pairs with push()'s release, so a push after this load changes the word and
    // the wait below returns at once (no lost wake-up).
    const std::uint64_t seen = pushed_.load(std::memory_order_acquire);
    (void)apply_ready(/*wait=*/true);
    if (stop_.load(std::memory_order_acquire)) return;
    pushed_.wait(seen, std::memory_order_acquire);
  }
}

void PacTree::Updater::push(std::uint64_t lsn, Pending p) {
  pm::yield_point("pactree.updater");
  if constexpr (pm::kTracing) {
    if (apply_on_arrival) {  // Faults: applied as it arrives, LSN order ignored
      std::lock_guard<sync::SpinLock> turn(apply_mu_);
      unapplied_.fetch_add(1, std::memory_order_relaxed);  // relaxed: as below
      apply(lsn, p);
      return;
    }
  }
  {
    std::lock_guard<sync::SpinLock> lock(queue_mu_);
    waiting_.emplace(lsn, std::move(p));
  }
  // relaxed: pending() is exact only for a quiescent index (its acquire pairs with apply()'s
  // release); the maximum is a statistic.
  const std::size_t now = unapplied_.fetch_add(1, std::memory_order_relaxed) + 1;
  if (now > max_pending_.load(std::memory_order_relaxed))
    max_pending_.store(now, std::memory_order_relaxed);
  if (mode_ == UpdaterMode::synchronous) {
    (void)apply_ready(/*wait=*/true);
  } else if (mode_ == UpdaterMode::background) {
    pushed_.fetch_add(1, std::memory_order_release);  // pairs with run()'s acquire
    pushed_.notify_one();
  }
}

bool PacTree::Updater::apply_ready(bool wait) {
  std::unique_lock<sync::SpinLock> turn(apply_mu_, std::defer_lock);
  if (wait) {
    turn.lock();
  } else if (!turn.try_lock()) {
    return false;
  }
  bool any = false;
  for (;;) {
    std::map<std::uint64_t, Pending>::node_type q;
    {
      std::lock_guard<sync::SpinLock> lock(queue_mu_);
      if (waiting_.empty() || waiting_.begin()->first != next_apply_) return any;
      q = waiting_.extract(waiting_.begin());
    }
    apply(q.key(), q.mapped());
    ++next_apply_;
    any = true;
  }
}

// Under apply_mu_: one search-layer change, then its log slot is freed.
void PacTree::Updater::apply(std::uint64_t lsn, Pending& q) {
  if (q.insert) {
    // A PM search layer may run out of space: the anchor then stays out of it (a lag the
    // last mile absorbs, counted for verify(); the next recovery inserts it).
    if (tree_->visit([&](auto& t) { return t.insert(q.search_key, q.node); }) != Code::ok)
      search_failed_.fetch_add(1, std::memory_order_relaxed);  // relaxed: a statistic
  } else {
    std::uint64_t old = 0;
    (void)tree_->visit([&](auto& t) { return t.remove(q.search_key, &old); });
    // K3: the merged node and its anchor record, once no lookup can reach them any more
    // (the search layer just dropped the last name; readers that hold it are pinned).
    owner_->retire_key(q.anchor);
    owner_->epochs_.retire(owner_, &release_node, q.node);
  }
  if (lsn_of(pm::load_acquire(&q.entry->state)) != lsn) {
    // The slot was reused before this entry was applied: it is another SMO's now, so it is
    // left alone and the fault counted (verify() reports it).
    overwritten_.fetch_add(1, std::memory_order_relaxed);  // relaxed: a statistic
  } else {
    pm::publish(&q.entry->state, 0);  // U8: the entry is applied; its slot may be reused
    pm::persist(&q.entry->state, 8);
  }
  applied_.fetch_add(1, std::memory_order_relaxed);  // relaxed: a statistic
  // release: whoever sees the count drop (verify() waiting for an idle updater) also sees the
  // search-layer change and the freed log slot.
  unapplied_.fetch_sub(1, std::memory_order_release);
}

std::size_t PacTree::Updater::pending() const {
  return unapplied_.load(std::memory_order_acquire);  // pairs with apply()'s release
}

std::size_t PacTree::updater_pending() const { return updater_.pending(); }

Footprint PacTree::footprint() const {
  Footprint f;
  const auto s = pool_->allocator().stats();
  f.pm_bytes = s.bytes_in_use;
  f.pm_reserved = s.bytes_reserved;
  f.dram_bytes = arena_.bytes_in_use() + versions_->dram_bytes();
  return f;
}

void PacTree::print_stats() const {
  if (!print_stats_) return;
  std::fprintf(stderr,
               "pactree: updater %s, SMOs applied %llu (splits %llu, merges %llu), pending %zu "
               "(max %zu), last-mile hops %llu, log slots overwritten %llu\n",
               updater_.mode() == UpdaterMode::background ? "background"
               : updater_.mode() == UpdaterMode::held     ? "held"
                                                          : "synchronous",
               static_cast<unsigned long long>(updater_.applied()),
               static_cast<unsigned long long>(splits()), static_cast<unsigned long long>(merges()),
               updater_.pending(), updater_.max_pending(),
               static_cast<unsigned long long>(last_mile_hops()),
               static_cast<unsigned long long>(updater_.overwritten()));
}

// A pool whose recovery walk met damage is left unclean: a clean close would record the
// damaged list's counts, and the next open would accept it whole.
Status PacTree::close() {
  Status walk = wait_recovery_walk();
  if (walker_.joinable()) walker_.join();  // its exit hands epoch registrations over (drain)
  if (!closed_ && !walk.ok()) {
    updater_.set_mode(UpdaterMode::held);  // nothing was pushed: writes answered corrupted
    closed_ = true;
  }
  if (!closed_) {
    // Everything due is applied and the thread joined: a clean pool has no pending entry.
    updater_.set_mode(UpdaterMode::synchronous);
    print_stats();
    updater_.set_mode(UpdaterMode::held);  // nothing runs after close
    epochs_.drain();
    search_.visit([](auto& t) { t.epochs().drain(); });
    // The counts let the next open see a list that lost nodes (one read-only walk here).
    std::uint64_t records = 0, nodes = 0;
    count_list(&records, &nodes);
    pool_->close_clean(records, nodes);
    closed_ = true;
  }
  return walk;
}

}  // namespace pmindex::pactree

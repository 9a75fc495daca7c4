// art::Tree operations: insert, find, update, remove. Included by art_tree_impl.h only.
// Each *_once makes one optimistic attempt: it returns with o.restart set when a version check
// failed (nothing was changed), with o.damaged set when it met a damaged node.
#pragma once

#include "index/common/prefetch.h"

namespace pmindex::art {

// --- insert -----------------------------------------------------------------------------------

template <class P>
Code Tree<P>::insert(std::string_view key, std::uint64_t value) {
  auto guard = epochs_.pin();
  if (key.size() == 8) {
    Code code = Code::ok;
    if (insert_word(key, value, &code)) return code;
  }
  return restart_loop([&](Olc& o) { return insert_once(key, value, o); });
}

// The same reads and validations as insert_once, in its order, with find_word's per-level
// compares (see there): the lock word against "this run's, unlocked, live", the parent's
// version, the shape against "reached at its level", the stored prefix as one masked word.
// insert_once validates the parent twice per level (after the slot word and after the
// child's lock word) and the node twice; here the parent once, after the child's lock word
// (the child word was read under the same version, so one check covers both), and the node
// once, after its slot word (which covers the shape and prefix read before it).
template <class P>
bool Tree<P>::insert_word(std::string_view key, std::uint64_t value, Code* code) {
  constexpr std::uint64_t kMustBeTag = ~NodeLock::kLowMask | NodeLock::kDamaged;
  const std::uint64_t want = std::uint64_t{tag_} << 32;
  std::uint64_t kw;
  std::memcpy(&kw, key.data(), 8);
  pm::yield_point("art.read");  // the scheduling points of read_lock and check (tracing only)
  Parent pa{root_lock_, NodeLock::load(*root_lock_), root_word_};
  if ((pa.version & kMustBeTag) != want) [[unlikely]] return false;
  std::uint32_t depth = 0;
  for (;;) {
    const std::uint64_t w = load_word(*pa.slot);
    if (w == 0 || is_record(w)) {
      pm::yield_point("art.check");
      if (w == 0 || NodeLock::load(*pa.lock) != pa.version) [[unlikely]] return false;
      Olc o;
      *code = leaf_split(pa, w, depth, key, value, o);  // w was validated after it was read
      return !o.stop();
    }
    NodeHeader* n = node(w);
    pm::yield_point("art.read");
    const std::uint64_t v = NodeLock::load(n->lock);
    if ((v & kMustBeTag) != want) [[unlikely]] return false;
    pm::yield_point("art.check");
    if (NodeLock::load(*pa.lock) != pa.version) [[unlikely]] return false;
    const std::uint64_t shape = load_word(n->shape);
    std::uint32_t branch = depth;
    if (shape != depth) {  // a compressed prefix, a stale level, or damage
      const std::uint32_t len = prefix_len_of(shape);
      if (level_of(shape) != depth || len >= 8 - depth) [[unlikely]] return false;
      const std::uint64_t mask = (std::uint64_t{1} << (8 * len)) - 1;
      if ((((kw >> (8 * depth)) ^ load_word(n->prefix)) & mask) != 0) return false;  // P5
      branch += len;
    }
    if (branch >= 8) [[unlikely]] return false;
    std::uint64_t* s = slot_of(n, static_cast<std::uint8_t>(kw >> (8 * branch)));
    const std::uint64_t cw = s != nullptr ? load_word(*s) : 0;
    pm::yield_point("art.check");
    if (NodeLock::load(n->lock) != v) [[unlikely]] return false;
    if (cw == 0) {
      Olc o;
      *code = add_child(pa, w, v, depth, branch, key, value, o);
      return !o.stop();
    }
    pa = Parent{&n->lock, v, s};
    depth = branch + 1;
  }
}

template <class P>
Code Tree<P>::insert_once(std::string_view key, std::uint64_t value, Olc& o) {
  Parent pa{root_lock_, read_lock(*root_lock_, nullptr, o), root_word_};
  if (o.stop()) return Code::ok;
  std::uint32_t depth = 0;
  for (;;) {
    const std::uint64_t w = load_word(*pa.slot);
    check(*pa.lock, pa.version, o);
    if (o.stop()) return Code::ok;
    if (w == 0) {  // the empty root (a descent follows only non-empty child slots)
      Code code = Code::ok;
      const std::uint64_t ref = new_record(key, value, &code);
      if (ref == 0) return code;
      if (!upgrade(*pa.lock, pa.version)) {
        p_.deallocate(ref, record_bytes(key.size()));
        o.restart = true;
        return Code::ok;
      }
      publish_persist(pa.slot, record_word(0, ref));  // P2
      unlock(*pa.lock);
      return Code::ok;
    }
    if (is_record(w)) return leaf_split(pa, w, depth, key, value, o);
    NodeHeader* n = node(w);
    std::uint64_t v = read_lock(n->lock, n, o);
    if (o.stop()) return Code::ok;
    check(*pa.lock, pa.version, o);
    if (o.stop()) return Code::ok;
    Prefix p;
    const bool shape_ok = prefix_at(n, depth, &p);
    const std::uint32_t mis = shape_ok ? match_prefix(n, p, key, depth, o) : 0;
    check(n->lock, v, o);
    if (o.stop()) return Code::ok;
    if (!shape_ok) {
      o.damaged = true;
      return Code::corrupted;
    }
    if (mis < p.len) return prefix_split(pa, w, v, p, mis, depth, key, value, o);
    const std::uint32_t branch = depth + p.len;
    if (key.size() == branch) {
      const std::uint64_t e = load_word(n->end);
      check(n->lock, v, o);
      if (o.stop()) return Code::ok;
      if (e != 0) return key_of(e) == key ? Code::already_present : Code::corrupted;
      Code code = Code::ok;
      const std::uint64_t ref = new_record(key, value, &code);
      if (ref == 0) return code;
      if (!upgrade(n->lock, v)) {
        p_.deallocate(ref, record_bytes(key.size()));
        o.restart = true;
        return Code::ok;
      }
      repair_if_stale(n, depth, key);
      publish_persist(&n->end, record_word(0, ref));  // P3 (end slot)
      unlock(n->lock);
      return Code::ok;
    }
    std::uint64_t* s = find_slot(n, static_cast<std::uint8_t>(key[branch]));
    const std::uint64_t cw = s != nullptr ? load_word(*s) : 0;
    check(n->lock, v, o);
    if (o.stop()) return Code::ok;
    if (cw == 0) return add_child(pa, w, v, depth, branch, key, value, o);
    pa = Parent{&n->lock, v, s};
    depth = branch + 1;
  }
}

// The slot holds a record with another key: a new N4 takes both, under their common prefix.
template <class P>
Code Tree<P>::leaf_split(Parent pa, std::uint64_t w, std::uint32_t depth, std::string_view key,
                         std::uint64_t value, Olc& o) {
  const std::string_view rk = key_of(w);
  if (rk == key) return Code::already_present;  // w was validated after it was read
  if (rk.size() < depth) return Code::corrupted;
  std::uint32_t m = 0;
  const std::size_t lim = std::min(key.size(), rk.size());
  while (depth + m < lim && key[depth + m] == rk[depth + m]) ++m;
  const std::uint32_t d2 = depth + m;
  Code code = Code::ok;
  const std::uint64_t ref = new_record(key, value, &code);
  if (ref == 0) return code;
  Entry e[2];
  unsigned k = 0;
  std::uint64_t end = 0;
  if (key.size() == d2) end = record_word(0, ref);
  else e[k++] = Entry{static_cast<std::uint8_t>(key[d2]), record_word(0, ref), 0};
  if (rk.size() == d2) end = rebyte(w, 0);
  else e[k++] = Entry{static_cast<std::uint8_t>(rk[d2]), w, 0};
  const std::uint64_t nw =
      new_node(NodeType::n4, make_shape(depth, m), bytes_word(key, depth, m), end, e, k, &code);
  if (nw == 0) {
    p_.deallocate(ref, record_bytes(key.size()));
    return code;
  }
  if (!upgrade(*pa.lock, pa.version)) {
    p_.deallocate(target_of(nw), sizeof(N4));
    p_.deallocate(ref, record_bytes(key.size()));
    o.restart = true;
    return Code::ok;
  }
  publish_persist(pa.slot, rebyte(nw, byte_of(w)));  // P2 (leaf split)
  unlock(*pa.lock);
  return Code::ok;
}

// The key leaves n's prefix at position mis: a new N4 with the common part takes n (under its
// prefix byte at mis) and the new record; n keeps the rest of its prefix (P5, P6).
template <class P>
Code Tree<P>::prefix_split(Parent pa, std::uint64_t w, std::uint64_t v, Prefix& p,
                           std::uint32_t mis, std::uint32_t depth, std::string_view key,
                           std::uint64_t value, Olc& o) {
  NodeHeader* n = node(w);
  if (p.len > p.avail && p.src.size() < std::size_t{depth} + p.len) {
    // The mismatch was in the stored bytes: n's remaining prefix comes from a record's key
    // (the upgrade below validates that n did not change meanwhile).
    p.src = any_key(n, o);
    if (o.stop()) return Code::ok;
    if (p.src.size() < std::size_t{depth} + p.len) {
      o.restart = true;
      return Code::ok;
    }
  }
  const std::uint32_t nlen = p.len - mis - 1;
  std::uint64_t nbytes = 0;
  for (std::uint32_t i = 0; i < std::min(nlen, kStoredPrefix); ++i)
    nbytes |= std::uint64_t{p.byte(depth, mis + 1 + i)} << (8 * i);
  const std::uint8_t nb = p.byte(depth, mis);
  Code code = Code::ok;
  const std::uint64_t ref = new_record(key, value, &code);
  if (ref == 0) return code;
  Entry e[2];
  unsigned k = 0;
  std::uint64_t end = 0;
  e[k++] = Entry{nb, w, 0};
  if (key.size() == depth + mis) end = record_word(0, ref);
  else e[k++] = Entry{static_cast<std::uint8_t>(key[depth + mis]), record_word(0, ref), 0};
  const std::uint64_t yw = new_node(NodeType::n4, make_shape(depth, mis),
                                    bytes_word(key, depth, mis), end, e, k, &code);
  auto drop = [&] {
    if (yw != 0) p_.deallocate(target_of(yw), sizeof(N4));
    p_.deallocate(ref, record_bytes(key.size()));
  };
  if (yw == 0) {
    drop();
    return code;
  }
  if (!upgrade(*pa.lock, pa.version)) {
    drop();
    o.restart = true;
    return Code::ok;
  }
  if (!upgrade(n->lock, v)) {
    unlock(*pa.lock);
    drop();
    o.restart = true;
    return Code::ok;
  }
  publish_persist(pa.slot, rebyte(yw, byte_of(w)));                // P5
  publish_persist(&n->prefix, nbytes);                              // P6a
  publish_persist(&n->shape, make_shape(depth + mis + 1, nlen));    // P6b
  unlock(n->lock);
  unlock(*pa.lock);
  prefix_splits_.fetch_add(1, std::memory_order_relaxed);  // relaxed: a statistic
  return Code::ok;
}

// No child for the key's byte at n's branch depth: a free slot takes the record (P3), or a
// larger copy of n does (P4).
template <class P>
Code Tree<P>::add_child(Parent pa, std::uint64_t w, std::uint64_t v, std::uint32_t node_depth,
                        std::uint32_t branch, std::string_view key, std::uint64_t value,
                        Olc& o) {
  NodeHeader* n = node(w);
  const std::uint8_t b = static_cast<std::uint8_t>(key[branch]);
  Code code = Code::ok;
  const std::uint64_t ref = new_record(key, value, &code);
  if (ref == 0) return code;
  const std::uint64_t rw = record_word(b, ref);
  if (!upgrade(n->lock, v)) {
    p_.deallocate(ref, record_bytes(key.size()));
    o.restart = true;
    return Code::ok;
  }
  const NodeType t = static_cast<NodeType>(n->type);
  if (n->count < capacity_of(t)) {
    repair_if_stale(n, node_depth, key);
    insert_in_place(n, b, rw);  // P3
    unlock(n->lock);
    return Code::ok;
  }
  if (!upgrade(*pa.lock, pa.version)) {
    unlock(n->lock);
    p_.deallocate(ref, record_bytes(key.size()));
    o.restart = true;
    return Code::ok;
  }
  Entry e[257];
  unsigned k = collect(n, e);
  e[k++] = Entry{b, rw, 0};
  const std::uint32_t len = branch - node_depth;
  const std::uint64_t nw = new_node(grown(t), make_shape(node_depth, len),
                                    bytes_word(key, node_depth, len), load_word(n->end), e, k,
                                    &code);
  if (nw == 0) {
    unlock(*pa.lock);
    unlock(n->lock);
    p_.deallocate(ref, record_bytes(key.size()));
    return code;
  }
  publish_persist(pa.slot, rebyte(nw, byte_of(w)));  // P4
  unlock_obsolete(n->lock);
  unlock(*pa.lock);
  retire_node(w);
  return Code::ok;
}

// --- find ---------------------------------------------------------------------------------------

template <class P>
Code Tree<P>::find(std::string_view key, std::uint64_t* value) const {
  return with_restarts([&](Olc& o) { return find_once(key, value, o); });
}

// Optimistic all the way: prefix bytes that are not stored (or not trusted) are skipped, and
// the record's full key decides. A record's value is read before the version of the lock that
// guards its slot is validated: a writer persists before it unlocks (P2-P9), so a validated
// read never returns a value or an absence that a crash could still take back.
template <class P>
Code Tree<P>::find_once(std::string_view key, std::uint64_t* value, Olc& o) const {
  const std::uint64_t* plock = root_lock_;
  std::uint64_t pv = read_lock(*root_lock_, nullptr, o);
  if (o.stop()) return Code::ok;
  std::uint64_t w = load_word(*root_word_);
  std::uint32_t depth = 0;
  for (;;) {
    if (w == 0 || is_record(w)) {
      const bool hit = w != 0 && key_equals(w, key);
      if (hit && value != nullptr) *value = load_word(record(w)->value);
      check(*plock, pv, o);
      if (o.stop()) return Code::ok;
      return hit ? Code::ok : Code::not_found;
    }
    NodeHeader* n = node(w);
    const std::uint64_t v = read_lock(n->lock, n, o);
    if (o.stop()) return Code::ok;
    check(*plock, pv, o);
    if (o.stop()) return Code::ok;
    Prefix p;
    if (!prefix_at(n, depth, &p)) {
      check(n->lock, v, o);
      if (!o.restart) o.damaged = true;
      return Code::ok;
    }
    bool mismatch = key.size() < std::size_t{depth} + p.len;
    for (std::uint32_t i = 0; i < p.avail && !mismatch; ++i)
      mismatch = static_cast<std::uint8_t>(key[depth + i]) != p.byte(depth, i);
    std::uint64_t next = 0;
    if (!mismatch) {
      depth += p.len;
      if (key.size() == depth) {
        next = load_word(n->end);
      } else {
        const std::uint64_t* s = find_slot(n, static_cast<std::uint8_t>(key[depth]));
        next = s != nullptr ? load_word(*s) : 0;
        ++depth;
      }
    }
    if (mismatch) {
      check(n->lock, v, o);
      return Code::not_found;
    }
    plock = &n->lock;
    pv = v;
    w = next;
  }
}

// Per level: one load of the node's lock word and one compare of it against "this run's tag,
// not locked, not obsolete" (a word of another run, a held or damaged word all fail it and go
// to find, whose read_lock admits, waits or answers corrupted: so the run tag costs nothing
// beyond the compare the locked/obsolete test needs anyway, and a node is still never read
// before its word carries this run's tag, i.e. before it passed its first-touch check, P10);
// then the parent's version (the coupling every reader needs: PROTOCOL.md "Readers", a word
// read under a version that is still unlocked was persisted); then the shape word, which
// says in one compare that the node is reached at its level with no prefix (shape == depth),
// the common case below the top of a tree of random 8-byte keys; else the stored prefix
// bytes are compared as one masked word, and a stale level (P7) goes to find. Key byte i is
// bits 8i..8i+7 of the key word read in memory order, as prefix byte i of a shape's level is.
// No key-length test per level: depth < 8 at every node (checked), so the key never ends at
// a node and its end slot is never the answer.
template <class P>
inline bool Tree<P>::find_word(std::string_view key, std::uint64_t* value, Code* code) const {
  constexpr std::uint64_t kMustBeTag = ~NodeLock::kLowMask | NodeLock::kDamaged;
  const std::uint64_t want = std::uint64_t{tag_} << 32;
  std::uint64_t kw;
  std::memcpy(&kw, key.data(), 8);
  const std::uint64_t* plock = root_lock_;
  pm::yield_point("art.read");  // the scheduling points of read_lock and check (tracing only)
  std::uint64_t pv = NodeLock::load(*root_lock_);
  if ((pv & kMustBeTag) != want) [[unlikely]] return false;
  std::uint64_t w = load_word(*root_word_);
  std::uint32_t depth = 0;
  while (w != 0 && !is_record(w)) {
    NodeHeader* n = node(w);
    pm::yield_point("art.read");
    const std::uint64_t v = NodeLock::load(n->lock);
    if ((v & kMustBeTag) != want) [[unlikely]] return false;
    pm::yield_point("art.check");
    if (NodeLock::load(*plock) != pv) [[unlikely]] return false;
    const std::uint64_t shape = load_word(n->shape);
    if (shape != depth) {  // a compressed prefix, a stale level, or damage
      const std::uint32_t len = prefix_len_of(shape);
      if (level_of(shape) != depth || len >= 8 - depth) [[unlikely]] return false;
      const std::uint64_t mask = (std::uint64_t{1} << (8 * len)) - 1;
      const std::uint64_t diff = ((kw >> (8 * depth)) ^ load_word(n->prefix)) & mask;
      if (diff != 0) {
        pm::yield_point("art.check");
        if (NodeLock::load(n->lock) != v) [[unlikely]] return false;
        *code = Code::not_found;
        return true;
      }
      depth += len;
    }
    if (depth >= 8) [[unlikely]] return false;  // only 8-byte keys' records lie below
    const std::uint64_t* s = slot_of(n, static_cast<std::uint8_t>(kw >> (8 * depth)));
    w = s != nullptr ? load_word(*s) : 0;
    ++depth;
    plock = &n->lock;
    pv = v;
  }
  bool hit = false;
  if (w != 0) {
    const Record* r = record(w);  // its length and key are immutable once published
    if (r->key_len == 8) {
      std::uint64_t rk;
      std::memcpy(&rk, r->key(), 8);
      hit = rk == kw;
    }
    if (hit) *value = load_word(r->value);
  }
  pm::yield_point("art.check");
  if (NodeLock::load(*plock) != pv) [[unlikely]] return false;
  *code = hit ? Code::ok : Code::not_found;
  return true;
}

// find_once's steps, one per round for each key of the batch (the same reads, locks and
// checks, in the same order per key).
template <class P>
void Tree<P>::find_batch(const std::string_view* keys, std::size_t n, std::uint64_t* values,
                         Code* codes) const {
  assert(n <= kMaxBatch);
  struct Cursor {
    const std::uint64_t* plock;  // the lock guarding the slot `w` was read from
    std::uint64_t pv;
    std::uint64_t w;             // what the key visits next
    std::uint32_t depth;
  };
  Cursor cur[kMaxBatch];
  std::uint64_t live = 0, alone = 0;
  for (std::size_t i = 0; i < n; ++i) {
    Olc o;
    const std::uint64_t pv = read_lock(*root_lock_, nullptr, o);
    const std::uint64_t bit = std::uint64_t{1} << i;
    if (o.stop()) {
      alone |= bit;
      continue;
    }
    cur[i] = Cursor{root_lock_, pv, load_word(*root_word_), 0};
    if (cur[i].w != 0) index_common::prefetch_lines(at<const char>(cur[i].w), 64);
    live |= bit;
  }
  while (live != 0) {
    for (std::uint64_t m = live; m != 0; m &= m - 1) {
      const auto i = static_cast<std::size_t>(std::countr_zero(m));
      const std::uint64_t bit = std::uint64_t{1} << i;
      const std::string_view key = keys[i];
      Cursor& c = cur[i];
      Olc o;
      if (c.w == 0 || is_record(c.w)) {
        const bool hit = c.w != 0 && key_equals(c.w, key);
        const std::uint64_t value = hit ? load_word(record(c.w)->value) : 0;
        check(*c.plock, c.pv, o);
        if (o.stop()) {
          alone |= bit;
        } else {
          codes[i] = hit ? Code::ok : Code::not_found;
          if (hit) values[i] = value;
        }
        live &= ~bit;
        continue;
      }
      NodeHeader* nd = node(c.w);
      const std::uint64_t v = read_lock(nd->lock, nd, o);
      if (!o.stop()) check(*c.plock, c.pv, o);
      Prefix p;
      if (o.stop() || !prefix_at(nd, c.depth, &p)) {  // find sorts out restart and damage
        alone |= bit;
        live &= ~bit;
        continue;
      }
      bool mismatch = key.size() < std::size_t{c.depth} + p.len;
      for (std::uint32_t j = 0; j < p.avail && !mismatch; ++j)
        mismatch = static_cast<std::uint8_t>(key[c.depth + j]) != p.byte(c.depth, j);
      if (mismatch) {
        check(nd->lock, v, o);
        if (o.stop()) alone |= bit;
        else codes[i] = Code::not_found;
        live &= ~bit;
        continue;
      }
      std::uint32_t depth = c.depth + p.len;
      std::uint64_t next = 0;
      if (key.size() == depth) {
        next = load_word(nd->end);
      } else {
        const std::uint64_t* s = find_slot(nd, static_cast<std::uint8_t>(key[depth]));
        next = s != nullptr ? load_word(*s) : 0;
        ++depth;
      }
      c = Cursor{&nd->lock, v, next, depth};
      if (next != 0) index_common::prefetch_lines(at<const char>(next), 64);
    }
  }
  for (; alone != 0; alone &= alone - 1) {
    const auto i = static_cast<std::size_t>(std::countr_zero(alone));
    codes[i] = find(keys[i], &values[i]);
  }
}

// --- update and remove ----------------------------------------------------------------------------

template <class P>
Code Tree<P>::locate(std::string_view key, Found* f, Olc& o) const {
  Parent pa{root_lock_, read_lock(*root_lock_, nullptr, o), root_word_};
  if (o.stop()) return Code::ok;
  Parent node_pa = pa;
  std::uint64_t nodew = 0, nv = 0;
  std::uint32_t depth = 0, nd = 0, br = 0;
  for (;;) {
    const std::uint64_t w = load_word(*pa.slot);
    check(*pa.lock, pa.version, o);
    if (o.stop()) return Code::ok;
    if (w == 0) return Code::not_found;
    if (is_record(w)) {
      if (key_of(w) != key) return Code::not_found;
      *f = Found{pa.lock, pa.version, pa.slot, w, nodew, node_pa, nd, br};
      return Code::ok;
    }
    NodeHeader* n = node(w);
    const std::uint64_t v = read_lock(n->lock, n, o);
    if (o.stop()) return Code::ok;
    check(*pa.lock, pa.version, o);
    if (o.stop()) return Code::ok;
    Prefix p;
    if (!prefix_at(n, depth, &p)) {
      check(n->lock, v, o);
      if (!o.restart) o.damaged = true;
      return Code::ok;
    }
    bool mismatch = key.size() < std::size_t{depth} + p.len;
    for (std::uint32_t i = 0; i < p.avail && !mismatch; ++i)
      mismatch = static_cast<std::uint8_t>(key[depth + i]) != p.byte(depth, i);
    if (mismatch) {
      check(n->lock, v, o);
      return Code::not_found;
    }
    node_pa = pa;
    nodew = w;
    nv = v;
    nd = depth;
    br = depth + p.len;
    std::uint64_t* s = &n->end;
    depth = br;
    if (key.size() != br) {
      s = find_slot(n, static_cast<std::uint8_t>(key[br]));
      depth = br + 1;
      if (s == nullptr) {
        check(n->lock, v, o);
        return Code::not_found;
      }
    }
    pa = Parent{&n->lock, nv, s};
  }
}

template <class P>
Code Tree<P>::update(std::string_view key, std::uint64_t value, std::uint64_t* old) {
  return with_restarts([&](Olc& o) { return update_once(key, value, old, o); });
}

// The container of the record's slot is locked, so updates and removes of one key serialise.
template <class P>
Code Tree<P>::update_once(std::string_view key, std::uint64_t value, std::uint64_t* old,
                          Olc& o) {
  Found f;
  const Code c = locate(key, &f, o);
  if (o.stop() || c != Code::ok) return c;
  if (!upgrade(*f.lock, f.version)) {
    o.restart = true;
    return Code::ok;
  }
  Record* r = p_.template at<Record>(target_of(f.rec));
  *old = load_word(r->value);
  publish_persist(&r->value, value);  // P8
  unlock(*f.lock);
  return Code::ok;
}

template <class P>
Code Tree<P>::relocate(std::string_view key, std::uint64_t from, std::uint64_t to,
                       bool copy_first) {
  return with_restarts([&](Olc& o) { return relocate_once(key, from, to, copy_first, o); });
}

// P11: as update_once, but the whole record moves. The container's lock serialises it with
// every writer of the slot (update, remove, a grow, shrink or collapse that copies the slot's
// word, a leaf split that moves it down): each of them validates or upgrades the version this
// bumps, so none publishes the old word again. Readers holding the old record keep reading
// it (same key, same value word until an update, which locks after this unlocks) until the
// epoch manager frees it.
template <class P>
Code Tree<P>::relocate_once(std::string_view key, std::uint64_t from, std::uint64_t to,
                            bool copy_first, Olc& o) {
  Found f;
  const Code c = locate(key, &f, o);
  if (o.stop() || c != Code::ok) return c;
  if (target_of(f.rec) != from) return Code::not_found;
  if (!upgrade(*f.lock, f.version)) {
    o.restart = true;
    return Code::ok;
  }
  const Record* old = record(f.rec);
  Record* r = p_.template at<Record>(to);
  const Record head{old->key_len, 0, load_word(old->value)};  // stable: the lock is held
  p_.write(r, &head, sizeof head);
  if (old->key_len != 0) p_.write(r->key(), old->key(), old->key_len);
  const std::size_t bytes = record_bytes(old->key_len);
  if (copy_first) p_.persist(r, bytes);                             // P11a
  publish_persist(f.slot, rebyte(record_word(0, to), byte_of(f.rec)));  // P11b
  if (!copy_first) p_.persist(r, bytes);  // known-bad: published before it was persisted
  unlock(*f.lock);
  retire_record(f.rec);
  return Code::ok;
}

template <class P>
Code Tree<P>::remove(std::string_view key, std::uint64_t* old) {
  return with_restarts([&](Olc& o) { return remove_once(key, old, o); });
}

template <class P>
Code Tree<P>::remove_once(std::string_view key, std::uint64_t* old, Olc& o) {
  Found f;
  const Code c = locate(key, &f, o);
  if (o.stop() || c != Code::ok) return c;
  if (f.node == 0) {  // the record is the root word
    if (!upgrade(*f.lock, f.version)) {
      o.restart = true;
      return Code::ok;
    }
    *old = load_word(record(f.rec)->value);
    publish_persist(f.slot, 0);  // P9a
    unlock(*f.lock);
    retire_record(f.rec);
    return Code::ok;
  }
  return remove_in(f.pa, f.node, f.version, f.node_depth, f.branch, f.slot, key, old, o);
}

// The record's slot is in node w: clear it in place (P9a), or replace w by a smaller copy
// (P9b) or, when one item would remain, by that item (P9c).
template <class P>
Code Tree<P>::remove_in(Parent pa, std::uint64_t w, std::uint64_t v, std::uint32_t node_depth,
                        std::uint32_t branch, std::uint64_t* rslot, std::string_view key,
                        std::uint64_t* old, Olc& o) {
  NodeHeader* n = node(w);
  if (!upgrade(n->lock, v)) {
    o.restart = true;
    return Code::ok;
  }
  const std::uint64_t rec = load_word(*rslot);
  const bool is_end = rslot == &n->end;
  const std::uint64_t end = load_word(n->end);
  const NodeType t = static_cast<NodeType>(n->type);
  const unsigned count = n->count;
  const unsigned after = count + (end != 0 ? 1 : 0) - 1;
  *old = load_word(record(rec)->value);
  bool replaced = false;
  if (after <= 1) {
    std::uint64_t remaining = is_end ? 0 : end;
    if (remaining == 0) {
      Entry e[256];
      const unsigned k = collect(n, e);
      for (unsigned j = 0; j < k && remaining == 0; ++j)
        if (e[j].word != rec) remaining = e[j].word;
    }
    const Code c = collapse(pa, w, node_depth, branch, remaining, o);
    if (o.stop()) {
      unlock(n->lock);
      return Code::ok;
    }
    replaced = c == Code::ok;  // pool_full: fall back to clearing the slot in place
  } else if (!is_end && t != NodeType::n4 && count - 1 <= shrink_at(t) &&
             upgrade(*pa.lock, pa.version)) {
    Entry e[256];
    unsigned k = 0;
    for (unsigned j = 0, m = collect(n, e); j < m; ++j)
      if (e[j].word != rec) e[k++] = e[j];
    const std::uint32_t len = branch - node_depth;
    Code code = Code::ok;
    const std::uint64_t nw = new_node(shrunk(t), make_shape(node_depth, len),
                                      bytes_word(key, node_depth, len), end, e, k, &code);
    if (nw != 0) {
      publish_persist(pa.slot, rebyte(nw, byte_of(load_word(*pa.slot))));  // P9b
      replaced = true;
    }
    unlock(*pa.lock);
  }
  if (replaced) {
    unlock_obsolete(n->lock);
    retire_node(w);
  } else {
    repair_if_stale(n, node_depth, key);
    publish_persist(rslot, 0);  // P9a
    if (!is_end) {
      if (t == NodeType::n48)
        set_accel_byte(reinterpret_cast<N48*>(n)->index, static_cast<std::uint8_t>(key[branch]), 0);
      set_count(n, n->count - 1u);
    }
    unlock(n->lock);
  }
  retire_record(rec);
  return Code::ok;
}

// P9c: n (locked by the caller) leaves its parent's slot to its one remaining item: a record
// moves up as is; a node C is replaced by a copy whose prefix is n's prefix, C's byte and C's
// prefix. Returns pool_full (nothing changed) if the copy cannot be allocated.
template <class P>
Code Tree<P>::collapse(Parent pa, std::uint64_t w, std::uint32_t node_depth,
                       std::uint32_t branch, std::uint64_t remaining, Olc& o) {
  (void)w;
  if (!upgrade(*pa.lock, pa.version)) {
    o.restart = true;
    return Code::ok;
  }
  const std::uint8_t slot_byte = byte_of(load_word(*pa.slot));
  if (remaining == 0 || is_record(remaining)) {
    publish_persist(pa.slot, remaining == 0 ? 0 : rebyte(remaining, slot_byte));  // P9c
    unlock(*pa.lock);
    return Code::ok;
  }
  NodeHeader* c = node(remaining);
  if (!write_lock(c->lock, c, o)) {
    unlock(*pa.lock);
    return Code::ok;
  }
  Prefix cp;
  Olc local;
  const std::string_view src = prefix_at(c, branch + 1, &cp) ? any_key(c, local) : std::string_view{};
  const std::uint32_t len = branch - node_depth + 1 + cp.len;
  if (local.damaged || src.size() < std::size_t{node_depth} + len) {
    unlock(c->lock);
    unlock(*pa.lock);
    o.damaged = true;
    return Code::ok;
  }
  Entry e[256];
  const unsigned k = collect(c, e);
  Code code = Code::ok;
  const std::uint64_t nw =
      new_node(static_cast<NodeType>(c->type), make_shape(node_depth, len),
               bytes_word(src, node_depth, len), load_word(c->end), e, k, &code);
  if (nw == 0) {
    unlock(c->lock);
    unlock(*pa.lock);
    return code;
  }
  publish_persist(pa.slot, rebyte(nw, slot_byte));  // P9c
  unlock_obsolete(c->lock);
  unlock(*pa.lock);
  retire_node(remaining);
  return Code::ok;
}

}  // namespace pmindex::art

#include "index/common/art/art_scan_impl.h"

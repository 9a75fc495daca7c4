// art::Tree: locks, first touch, node access and the write paths. Included by art_tree.h only.
// Persistence steps Pn: src/index/part/PROTOCOL.md.
#pragma once

#include <emmintrin.h>

#include <memory>

namespace pmindex::art {

namespace detail {
inline void restart_pause() {
  pm::yield_point("art.restart");
  __builtin_ia32_pause();
}
inline int compare_keys(std::string_view a, std::string_view b) {
  const std::size_t n = std::min(a.size(), b.size());
  const int c = n == 0 ? 0 : std::memcmp(a.data(), b.data(), n);
  if (c != 0) return c;
  return a.size() < b.size() ? -1 : a.size() > b.size() ? 1 : 0;
}
}  // namespace detail

template <class P>
template <class Once>
Code Tree<P>::with_restarts(Once&& once) const {
  auto guard = epochs_.pin();
  return restart_loop(once);
}

template <class P>
template <class Once>
Code Tree<P>::restart_loop(Once&& once) const {
  for (;;) {
    Olc o;
    const Code c = once(o);
    if (o.damaged) return Code::corrupted;
    if (!o.restart) return c;
    detail::restart_pause();
  }
}

// --- locks and first touch -----------------------------------------------------------------

// Waits while a writer holds the lock; returns the version to validate against. A word left by
// another run is admitted first (P10): checked, metadata rebuilt, retagged.
template <class P>
std::uint64_t Tree<P>::read_lock(std::uint64_t& word, NodeHeader* n, Olc& o) const {
  for (unsigned spins = 0;; ++spins) {
    pm::yield_point("art.read");
    std::uint64_t w = NodeLock::load(word);
    if (NodeLock::tag_of(w) != tag_) [[unlikely]] {
      if (n == nullptr) {
        P::cas(&word, w, NodeLock::fresh(tag_));  // the root lock guards no metadata
      } else if (!admit(n, w)) {
        o.damaged = true;
        return 0;
      }
      continue;
    }
    if (NodeLock::damaged(w)) [[unlikely]] {
      o.damaged = true;
      return 0;
    }
    if (NodeLock::locked(w)) {
      pm::yield_point("art.spin");
      __builtin_ia32_pause();
      continue;
    }
    if (NodeLock::obsolete(w)) o.restart = true;
    return w;
  }
}

// P10: the first thread to meet a word from another run locks the node (CAS from the stale
// word), checks it as recovery would, rebuilds the volatile metadata and unlocks it retagged;
// a node that fails the check is left damaged (every later visitor answers corrupted).
template <class P>
bool Tree<P>::admit(NodeHeader* n, std::uint64_t stale) const {
  std::uint64_t expected = stale;
  const std::uint64_t tag_word = std::uint64_t{tag_} << 32;
  if (!P::cas(&n->lock, expected, tag_word | NodeLock::kLocked)) return true;
  if (!check_node(n).empty()) {
    P::publish(&n->lock, tag_word | NodeLock::kDamaged);
    return false;
  }
  rebuild_accelerators(n);
  P::publish(&n->lock, NodeLock::fresh(tag_));
  return true;
}

template <class P>
std::string Tree<P>::check_child(std::uint64_t w) const {
  const std::uint64_t t = target_of(w);
  if ((w & 6) != 0) return "child word has reserved bits set";
  if (is_record(w)) {
    if (!p_.in_bounds(t, sizeof(Record), kRecordAlign)) return "record out of bounds";
    const Record* r = p_.template at<const Record>(t);
    if (r->key_len > max_key_ || !p_.in_bounds(t, record_bytes(r->key_len), kRecordAlign))
      return "record key length out of range";
    return {};
  }
  if (!p_.in_bounds(t, sizeof(NodeHeader), kNodeAlign)) return "node out of bounds";
  const std::uint8_t type = p_.template at<const NodeHeader>(t)->type;
  if (!valid_type(type)) return "node type byte is invalid";
  if (!p_.in_bounds(t, node_bytes(static_cast<NodeType>(type)), kNodeAlign))
    return "node out of bounds";
  return {};
}

// What admit, walk and verify check of one node: its own words and the bounds of what its
// words name (children's contents are checked when they are reached).
template <class P>
std::string Tree<P>::check_node(const NodeHeader* n) const {
  if (!valid_type(n->type)) return "node type byte is invalid";
  const NodeType t = static_cast<NodeType>(n->type);
  const std::uint64_t shape = load_word(n->shape);
  if (std::uint64_t{level_of(shape)} + prefix_len_of(shape) >= max_key_ + std::uint64_t{1})
    return "node prefix reaches past the key limit";
  const std::uint64_t end = load_word(n->end);
  if (end != 0) {
    if (!is_record(end) || byte_of(end) != 0) return "end slot does not hold a record";
    if (std::string e = check_child(end); !e.empty()) return e;
  }
  const std::uint64_t* ch = children_of(n);
  bool seen[256] = {};
  unsigned live = 0;
  for (unsigned j = 0; j < capacity_of(t); ++j) {
    const std::uint64_t w = load_word(ch[j]);
    if (w == 0) continue;
    const std::uint8_t b = byte_of(w);
    if (t == NodeType::n256 && b != j) return "N256 slot holds another byte";
    if (seen[b]) return "two live slots hold the same byte";
    seen[b] = true;
    if (std::string e = check_child(w); !e.empty()) return e;
    ++live;
  }
  if (live + (end != 0 ? 1 : 0) == 0) return "node holds nothing";
  return {};
}

template <class P>
void Tree<P>::set_accel_byte(std::uint64_t* words, unsigned i, std::uint8_t b) {
  const unsigned shift = 8 * (i % 8);
  const std::uint64_t old = load_word(words[i / 8]);
  // release (publish): optimistic readers load accelerator words with acquire.
  P::publish(&words[i / 8], (old & ~(std::uint64_t{0xff} << shift)) | std::uint64_t{b} << shift);
}

// P10: accelerators and count from the child words (the persistent truth). Caller holds the lock.
template <class P>
void Tree<P>::rebuild_accelerators(NodeHeader* n) const {
  const NodeType t = static_cast<NodeType>(n->type);
  std::uint64_t* ch = children_of(n);
  unsigned live = 0;
  if (t == NodeType::n48) {
    N48* n48 = reinterpret_cast<N48*>(n);
    for (auto& word : n48->index) P::publish(&word, 0);
  }
  for (unsigned j = 0; j < capacity_of(t); ++j) {
    const std::uint64_t w = load_word(ch[j]);
    if (w == 0) continue;
    ++live;
    if (t == NodeType::n4) set_accel_byte(&reinterpret_cast<N4*>(n)->keys, j, byte_of(w));
    if (t == NodeType::n16) set_accel_byte(reinterpret_cast<N16*>(n)->keys, j, byte_of(w));
    if (t == NodeType::n48)
      set_accel_byte(reinterpret_cast<N48*>(n)->index, byte_of(w), static_cast<std::uint8_t>(j + 1));
  }
  set_count(n, live);
}

// --- node access ------------------------------------------------------------------------------

// The live slot for byte b, or nullptr (N256: always its slot, which may be empty). Reads are
// optimistic: the caller validates the node's version before trusting the answer.
template <class P>
inline std::uint64_t* Tree<P>::slot_of(NodeHeader* n, std::uint8_t b) const {
  switch (static_cast<NodeType>(n->type)) {
    case NodeType::n4: {
      N4* x = reinterpret_cast<N4*>(n);
      const std::uint64_t keys = load_word(x->keys);
      for (unsigned j = 0; j < 4; ++j) {
        if (static_cast<std::uint8_t>(keys >> (8 * j)) != b) continue;
        const std::uint64_t w = load_word(x->child[j]);
        if (w != 0 && byte_of(w) == b) return &x->child[j];
      }
      return nullptr;
    }
    case NodeType::n16: {
      // One SSE2 byte compare of both key words marks every candidate slot (a byte-at-a-time
      // scan cost about 4 instructions per slot, most of a lookup's N16 visit); candidates are
      // then tried in slot order with the same child-word check as before. The key words are
      // read as words (load_word): a 16-byte vector load would race with writers' stores.
      N16* x = reinterpret_cast<N16*>(n);
      const __m128i keys = _mm_set_epi64x(static_cast<long long>(load_word(x->keys[1])),
                                          static_cast<long long>(load_word(x->keys[0])));
      const __m128i hit = _mm_cmpeq_epi8(keys, _mm_set1_epi8(static_cast<char>(b)));
      for (auto m = static_cast<unsigned>(_mm_movemask_epi8(hit)); m != 0; m &= m - 1) {
        const unsigned j = static_cast<unsigned>(std::countr_zero(m));
        const std::uint64_t w = load_word(x->child[j]);
        if (w != 0 && byte_of(w) == b) return &x->child[j];
      }
      return nullptr;
    }
    case NodeType::n48: {
      N48* x = reinterpret_cast<N48*>(n);
      const unsigned slot = static_cast<std::uint8_t>(load_word(x->index[b / 8]) >> (8 * (b % 8)));
      if (slot == 0 || slot > 48) return nullptr;
      const std::uint64_t w = load_word(x->child[slot - 1]);
      return w != 0 && byte_of(w) == b ? &x->child[slot - 1] : nullptr;
    }
    case NodeType::n256:
      return &reinterpret_cast<N256*>(n)->child[b];
  }
  return nullptr;
}

template <class P>
unsigned Tree<P>::collect(const NodeHeader* n, Entry* out) const {
  const std::uint64_t* ch = children_of(n);
  unsigned k = 0;
  for (unsigned j = 0; j < capacity_of(static_cast<NodeType>(n->type)); ++j) {
    const std::uint64_t w = load_word(ch[j]);
    if (w != 0) out[k++] = Entry{byte_of(w), w, 0};
  }
  return k;
}

// The node's prefix as seen from `depth`: false if the shape cannot hold there (damage, or a
// torn optimistic read the caller's validation will catch).
template <class P>
inline bool Tree<P>::prefix_at(const NodeHeader* n, std::uint32_t depth, Prefix* out) const {
  const std::uint64_t shape = load_word(n->shape);
  const std::uint32_t level = level_of(shape), len = prefix_len_of(shape);
  if (level > depth || depth - level > len) return false;
  const std::uint32_t skip = depth - level;
  out->len = len - skip;
  out->avail = skip == 0 ? std::min(len, kStoredPrefix) : 0;  // stale level: bytes untrusted
  out->stored = skip == 0 ? load_word(n->prefix) : 0;
  out->src = {};
  return true;
}

// The key of some record under n: it carries n's whole path, so prefix bytes beyond the stored
// ones (or all of them, under a stale level) are read from it.
template <class P>
std::string_view Tree<P>::any_key(NodeHeader* n, Olc& o) const {
  NodeHeader* c = n;
  for (std::uint32_t hops = 0; hops <= max_key_ + 1; ++hops) {
    const std::uint64_t e = load_word(c->end);
    if (e != 0 && is_record(e)) return key_of(e);
    const std::uint64_t* ch = children_of(c);
    std::uint64_t w = 0;
    for (unsigned j = 0; j < capacity_of(static_cast<NodeType>(c->type)) && w == 0; ++j)
      w = load_word(ch[j]);
    if (w == 0) {
      o.restart = true;  // torn read of a node being changed; validation decides
      return {};
    }
    if (is_record(w)) return key_of(w);
    c = node(w);
    Olc local;  // an obsolete node still holds keys with the path: only damage matters
    (void)read_lock(c->lock, c, local);  // admits c before its words are followed
    if (local.damaged) {
      o.damaged = true;
      return {};
    }
  }
  o.damaged = true;
  return {};
}

// First prefix position where key differs from n's prefix (p.len if none), pessimistic: bytes
// not stored are compared against a record's key (p.src is set then).
template <class P>
std::uint32_t Tree<P>::match_prefix(NodeHeader* n, Prefix& p, std::string_view key,
                                    std::uint32_t depth, Olc& o) const {
  for (std::uint32_t i = 0; i < p.avail; ++i) {
    if (depth + i >= key.size() || static_cast<std::uint8_t>(key[depth + i]) != p.byte(depth, i))
      return i;
  }
  if (p.len == p.avail) return p.len;
  p.src = any_key(n, o);
  if (o.stop()) return 0;
  if (p.src.size() < std::size_t{depth} + p.len) {
    o.restart = true;
    return 0;
  }
  for (std::uint32_t i = p.avail; i < p.len; ++i) {
    if (depth + i >= key.size() || key[depth + i] != p.src[depth + i]) return i;
  }
  return p.len;
}

template <class P>
std::uint64_t Tree<P>::bytes_word(std::string_view src, std::uint32_t from, std::uint32_t len) {
  std::uint64_t w = 0;
  for (std::uint32_t i = 0; i < std::min(len, kStoredPrefix); ++i)
    w |= std::uint64_t{static_cast<std::uint8_t>(src[from + i])} << (8 * i);
  return w;
}

// --- writes -----------------------------------------------------------------------------------

// P1: a record written and persisted while unreachable. Returns its reference, 0 on failure.
template <class P>
std::uint64_t Tree<P>::new_record(std::string_view key, std::uint64_t value, Code* code,
                                  bool persist) const {
  const std::uint64_t ref = p_.allocate(record_bytes(key.size()), code);
  if (ref == 0) return 0;
  Record* r = p_.template at<Record>(ref);
  const Record head{static_cast<std::uint32_t>(key.size()), 0, value};
  p_.write(r, &head, sizeof head);
  if (!key.empty()) p_.write(r->key(), key.data(), key.size());
  if (persist) p_.persist(r, record_bytes(key.size()));  // P1
  return ref;
}

// P1: a node image built in DRAM, copied into a fresh block and persisted while unreachable.
// Returns its child word (byte 0), 0 on failure.
template <class P>
std::uint64_t Tree<P>::new_node(NodeType t, std::uint64_t shape, std::uint64_t prefix,
                                std::uint64_t end, const Entry* e, unsigned k, Code* code,
                                bool persist) const {
  alignas(64) unsigned char buf[kMaxNodeBytes];
  const std::size_t bytes = node_bytes(t);
  std::memset(buf, 0, bytes);
  NodeHeader* h = reinterpret_cast<NodeHeader*>(buf);
  h->lock = NodeLock::fresh(tag_);
  h->shape = shape;
  h->prefix = prefix;
  h->end = end;
  h->type = static_cast<std::uint8_t>(t);
  h->count = static_cast<std::uint16_t>(k);
  std::uint64_t* ch = children_of(h);
  unsigned char* accel = buf + sizeof(NodeHeader);  // N4/N16 key bytes, N48 index
  for (unsigned j = 0; j < k; ++j) {
    const std::uint64_t w = rebyte(e[j].word, e[j].byte);
    if (t == NodeType::n256) {
      ch[e[j].byte] = w;
    } else {
      ch[j] = w;
      if (t == NodeType::n48) accel[e[j].byte] = static_cast<unsigned char>(j + 1);
      else accel[j] = e[j].byte;
    }
  }
  const std::uint64_t ref = p_.allocate(bytes, code);
  if (ref == 0) return 0;
  void* dst = p_.template at<void>(ref);
  p_.write(dst, buf, bytes);
  if (persist) p_.persist(dst, bytes);  // P1
  return node_word(0, ref);
}

// P3: one free slot takes the new child (the caller holds the lock and count < capacity).
template <class P>
void Tree<P>::insert_in_place(NodeHeader* n, std::uint8_t b, std::uint64_t w) const {
  const NodeType t = static_cast<NodeType>(n->type);
  std::uint64_t* ch = children_of(n);
  if (t == NodeType::n256) {
    publish_persist(&ch[b], w);  // P3
  } else {
    for (unsigned j = 0; j < capacity_of(t); ++j) {
      if (load_word(ch[j]) != 0) continue;
      // The accelerator first: a reader that finds byte b there still sees an empty slot.
      if (t == NodeType::n4) set_accel_byte(&reinterpret_cast<N4*>(n)->keys, j, b);
      if (t == NodeType::n16) set_accel_byte(reinterpret_cast<N16*>(n)->keys, j, b);
      if (t == NodeType::n48)
        set_accel_byte(reinterpret_cast<N48*>(n)->index, b, static_cast<std::uint8_t>(j + 1));
      publish_persist(&ch[j], w);  // P3
      break;
    }
  }
  set_count(n, n->count + 1u);
}

// P7: a node reached below its level (a crash hit between P5 and P6) gets its prefix bytes
// from `key`, which matched the whole path, then its shape; each persisted. Lock held.
template <class P>
void Tree<P>::repair_if_stale(NodeHeader* n, std::uint32_t depth, std::string_view key) const {
  const std::uint64_t shape = load_word(n->shape);
  if (level_of(shape) == depth) return;
  const std::uint32_t len = prefix_len_of(shape) - (depth - level_of(shape));
  publish_persist(&n->prefix, bytes_word(key, depth, len));  // P7a
  publish_persist(&n->shape, make_shape(depth, len));         // P7b
}

template <class P>
void Tree<P>::free_node(void* ctx, std::uint64_t ref) {
  const Tree* t = static_cast<const Tree*>(ctx);
  const NodeHeader* n = t->p_.template at<const NodeHeader>(ref);
  t->p_.deallocate(ref, node_bytes(static_cast<NodeType>(n->type)));
}

template <class P>
void Tree<P>::free_record(void* ctx, std::uint64_t ref) {
  const Tree* t = static_cast<const Tree*>(ctx);
  const Record* r = t->p_.template at<const Record>(ref);
  t->p_.deallocate(ref, record_bytes(r->key_len));
}

}  // namespace pmindex::art

#include "index/common/art/art_ops_impl.h"

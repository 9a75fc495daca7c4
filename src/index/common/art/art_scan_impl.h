// art::Tree scans, verify() and the recovery walk. Included by art_ops_impl.h only.
#pragma once

namespace pmindex::art {

namespace detail {
// A node's live entries: inline for small nodes, on the heap for N48/N256 (the walks recurse
// up to the key limit deep, so frames stay small).
template <class Entry>
struct EntryBuffer {
  Entry small[16];
  std::unique_ptr<Entry[]> big;
  Entry* get(unsigned capacity) {
    if (capacity <= 16) return small;
    big.reset(new Entry[capacity]);
    return big.get();
  }
};
}  // namespace detail

template <class P>
template <class Emit>
Code Tree<P>::scan(std::string_view start, std::size_t max, Emit&& emit) const {
  auto guard = epochs_.pin();
  std::size_t count = 0;
  std::string last;    // the last key emitted: a restart resumes after it
  std::string resume;  // last's copy for a resumed pass (last changes while the pass runs)
  for (;;) {
    Olc o;
    const bool resumed = count > 0;
    if (resumed) resume = last;
    // The first pass bounds by `start` itself: no copy (a seek's cost is a few node visits).
    const std::string_view bound = resumed ? std::string_view(resume) : start;
    const std::uint64_t rv = read_lock(*root_lock_, nullptr, o);
    const std::uint64_t w = o.stop() ? 0 : load_word(*root_word_);
    if (w != 0 && is_record(w)) {  // a lone record: its value is read under the root's version
      const std::uint64_t value = load_word(record(w)->value);
      check(*root_lock_, rv, o);
      if (!o.stop()) emit_record(w, value, true, bound, !resumed, max, count, emit, last);
    } else if (w != 0 && max <= kLazyScanMax) {
      seek_word(w, Via{root_lock_, rv}, 0, true, bound, !resumed, max, count, emit, o, last);
    } else if (w != 0) {
      scan_word(w, Via{root_lock_, rv}, 0, true, bound, !resumed, max, count, emit, o, last);
    }
    if (o.damaged) return Code::corrupted;
    if (!o.restart) return Code::ok;
    detail::restart_pause();
  }
}

// In-order walk of one child word. `bounded`: keys here may be below the bound and must be
// compared; otherwise everything here is above it. Returns false to stop (max reached,
// restart or damage in o).
template <class P>
template <class Emit>
bool Tree<P>::scan_word(std::uint64_t w, Via via, std::uint32_t depth, bool bounded,
                        std::string_view bound, bool inclusive, std::size_t max,
                        std::size_t& count, Emit& emit, Olc& o, std::string& last) const {
  if (count >= max) return false;  // w is a node: records are emitted by their container
  NodeHeader* n = nullptr;
  std::uint64_t v = 0;
  bool inner_bounded = bounded;
  std::uint32_t branch = 0;
  if (!enter_node(w, via, depth, bound, &n, &v, &inner_bounded, &branch, o)) return !o.stop();
  const std::uint64_t end = load_word(n->end);
  detail::EntryBuffer<Entry> buf;
  Entry* e = buf.get(capacity_of(static_cast<NodeType>(n->type)));
  const unsigned k = collect(n, e);
  // Record values are read before the node's version is validated (as find_once does), so
  // no value an unfinished update wrote is returned.
  detail::EntryBuffer<std::uint64_t> vbuf;
  std::uint64_t* values = vbuf.get(k + 1);
  values[k] = end != 0 ? load_word(record(end)->value) : 0;
  for (unsigned j = 0; j < k; ++j)
    values[j] = is_record(e[j].word) ? load_word(record(e[j].word)->value) : 0;
  check(n->lock, v, o);
  if (o.stop()) return false;
  for (unsigned j = 0; j < k; ++j) e[j].value = values[j];
  std::sort(e, e + k, [](const Entry& a, const Entry& b) { return a.byte < b.byte; });
  if (end != 0 && !emit_record(end, values[k], inner_bounded, bound, inclusive, max, count, emit, last))
    return false;
  const bool bound_goes_on = inner_bounded && bound.size() > branch;
  const std::uint8_t bb = bound_goes_on ? static_cast<std::uint8_t>(bound[branch]) : 0;
  for (unsigned j = 0; j < k; ++j) {
    if (bound_goes_on && e[j].byte < bb) continue;
    const bool child_bounded = bound_goes_on && e[j].byte == bb;
    const bool go_on =
        is_record(e[j].word)
            ? emit_record(e[j].word, e[j].value, child_bounded, bound, inclusive, max, count, emit, last)
            : scan_word(e[j].word, Via{&n->lock, v}, branch + 1, child_bounded, bound,
                        inclusive, max, count, emit, o, last);
    if (!go_on) return false;
  }
  return true;
}

// Opens node word w at depth for an ordered walk: *n and its read version *v, validated
// against `via` (w was read from that node at that version: if it changed since, w may no
// longer sit at this depth, e.g. after a prefix split put a node above it, so the walk
// restarts rather than read w's level as damage), then n's prefix (as seen from depth)
// compared with the bound. False: the walk must not enter n, because
// every key under it is below the bound (o clear) or the read failed (o set: a torn read, or
// damage such as a walk deeper than any key). Otherwise *branch is n's branch depth, and
// *bounded stays true only if the bound runs on through the whole prefix (else every key
// under n is above it).
template <class P>
bool Tree<P>::enter_node(std::uint64_t w, Via via, std::uint32_t depth, std::string_view bound,
                         NodeHeader** n_out, std::uint64_t* v_out, bool* bounded,
                         std::uint32_t* branch, Olc& o) const {
  if (depth > max_key_) {
    o.damaged = true;  // deeper than any key: a cycle
    return false;
  }
  NodeHeader* n = *n_out = node(w);
  const std::uint64_t v = *v_out = read_lock(n->lock, n, o);
  if (o.stop()) return false;
  check(*via.lock, via.version, o);
  if (o.stop()) return false;
  Prefix p;
  if (!prefix_at(n, depth, &p)) {
    check(n->lock, v, o);
    if (!o.restart) o.damaged = true;
    return false;
  }
  *branch = depth + p.len;
  if (!*bounded) return true;
  if (p.len > p.avail) {
    p.src = any_key(n, o);
    if (o.stop() || p.src.size() < std::size_t{depth} + p.len) {
      if (!o.damaged) o.restart = true;
      return false;
    }
  }
  for (std::uint32_t i = 0; i < p.len; ++i) {
    if (depth + i >= bound.size()) {
      *bounded = false;  // the bound ends inside the prefix: all keys here are above it
      return true;
    }
    const std::uint8_t bb = static_cast<std::uint8_t>(bound[depth + i]);
    const std::uint8_t pb = p.byte(depth, i);
    if (bb < pb) {
      *bounded = false;
      return true;
    }
    if (bb > pb) {  // everything here is below the bound
      check(n->lock, v, o);
      return false;
    }
  }
  return true;
}

// The live child word of n with the smallest byte >= from (from <= 256), 0 if none. An
// optimistic read: the caller validates n's version before using the word.
template <class P>
std::uint64_t Tree<P>::next_child(const NodeHeader* n, unsigned from) const {
  const NodeType t = static_cast<NodeType>(n->type);
  const std::uint64_t* ch = children_of(n);
  if (t == NodeType::n256) {
    for (unsigned b = from; b < 256; ++b)
      if (const std::uint64_t w = load_word(ch[b]); w != 0) return w;
    return 0;
  }
  if (t == NodeType::n48) {  // the index is in byte order: walk it from `from`
    const N48* x = reinterpret_cast<const N48*>(n);
    for (unsigned b = from; b < 256;) {
      const std::uint64_t word = load_word(x->index[b / 8]);
      for (; b < 256; ++b) {
        const unsigned slot = static_cast<std::uint8_t>(word >> (8 * (b % 8)));
        if (slot != 0 && slot <= 48) {
          const std::uint64_t w = load_word(x->child[slot - 1]);
          if (w != 0 && byte_of(w) == b) return w;
        }
        if (b % 8 == 7) {
          ++b;
          break;
        }
      }
    }
    return 0;
  }
  // N4/N16: a minimum over at most 16 unordered child words (their bytes are in the words).
  std::uint64_t best = 0;
  for (unsigned j = 0; j < capacity_of(t); ++j) {
    const std::uint64_t w = load_word(ch[j]);
    if (w != 0 && byte_of(w) >= from && (best == 0 || byte_of(w) < byte_of(best))) best = w;
  }
  return best;
}

// scan_word's lazy twin for small `max`: children are taken one at a time in byte order,
// starting at the bound's byte, so a seek does O(depth) node visits instead of gathering and
// sorting every node on its way. Each child word (and a record child's value) is read and
// then n's version validated before it is used, as scan_word does for the whole node.
template <class P>
template <class Emit>
bool Tree<P>::seek_word(std::uint64_t w, Via via, std::uint32_t depth, bool bounded,
                        std::string_view bound, bool inclusive, std::size_t max,
                        std::size_t& count, Emit& emit, Olc& o, std::string& last) const {
  if (count >= max) return false;
  NodeHeader* n = nullptr;
  std::uint64_t v = 0;
  bool inner_bounded = bounded;
  std::uint32_t branch = 0;
  if (!enter_node(w, via, depth, bound, &n, &v, &inner_bounded, &branch, o)) return !o.stop();
  const bool bound_goes_on = inner_bounded && bound.size() > branch;
  // The end record's key is n's path, a proper prefix of the bound when the bound goes on.
  if (!bound_goes_on) {
    const std::uint64_t end = load_word(n->end);
    const std::uint64_t value = end != 0 ? load_word(record(end)->value) : 0;
    check(n->lock, v, o);
    if (o.stop()) return false;
    if (end != 0 && !emit_record(end, value, inner_bounded, bound, inclusive, max, count, emit, last))
      return false;
  }
  const unsigned bb = bound_goes_on ? static_cast<std::uint8_t>(bound[branch]) : 0;
  for (unsigned from = bb; from < 256;) {
    const std::uint64_t cw = next_child(n, from);
    const std::uint64_t value = cw != 0 && is_record(cw) ? load_word(record(cw)->value) : 0;
    check(n->lock, v, o);
    if (o.stop()) return false;
    if (cw == 0) return true;
    const unsigned b = byte_of(cw);
    const bool child_bounded = bound_goes_on && b == bb;
    const bool go_on =
        is_record(cw)
            ? emit_record(cw, value, child_bounded, bound, inclusive, max, count, emit, last)
            : seek_word(cw, Via{&n->lock, v}, branch + 1, child_bounded, bound, inclusive, max,
                        count, emit, o, last);
    if (!go_on) return false;
    from = b + 1;
  }
  return true;
}

template <class P>
Code Tree<P>::seek_ge(std::string_view key, std::string* key_out, std::uint64_t* value) const {
  auto guard = epochs_.pin();
  std::string_view k;
  const Code c = seek_ge_view(key, &k, value);
  if (c == Code::ok && key_out != nullptr) key_out->assign(k);
  return c;
}

template <class P>
Code Tree<P>::seek_ge_view(std::string_view key, std::string_view* key_out,
                           std::uint64_t* value) const {
  bool deep = false;
  const Code c = restart_loop([&](Olc& o) { return seek_ge_once(key, key_out, value, &deep, o); });
  if (!deep) return c;
  // A path longer than seek_ge_once keeps: the ordered walk (scan(key, 1)) answers.
  bool got = false;
  const Code s = scan(key, 1, [&](std::string_view k, std::uint64_t v) {
    *key_out = k;  // the record's own bytes: readable while the caller's pin lasts
    *value = v;
    got = true;
  });
  if (s != Code::ok) return s;
  return got ? Code::ok : Code::not_found;
}

// One optimistic attempt: the key's path as find takes it, while it matches. Where the key
// leaves the trie (a prefix or record that differs, or no child at its byte) the answer is
// the least record of the first subtree to the right: the node's end record (its key is the
// node's path, below every child's), else its children in byte order. A node with nothing
// right of the path's byte sends the search back up the path to the next byte of the node
// above. Each word is read under the version of the node that holds it and validated before
// it is followed (as find_once does); a node revisited on the way back is validated again
// after its next child is read, so an answer comes only from versions that all held.
// seek_ge_once's position: the word to look at next, the lock and version of the node that
// holds it, the depth it is reached at, and whether every key under it is above the key (its
// least record answers).
template <class P>
struct Tree<P>::SeekCursor {
  std::uint64_t w;
  const std::uint64_t* plock;
  std::uint64_t pv;
  std::uint32_t depth;
  bool least;
};

// The key against n's path (its prefix, reached at c.depth): < 0 every key under n is above
// the key (the key ends inside the prefix, or at the node itself: its end record is the key),
// > 0 every key is below it, 0 the path goes on. A prefix longer than the node stores is read
// from a record under it; o stops when that record cannot be trusted.
template <class P>
inline int Tree<P>::seek_compare(NodeHeader* n, Prefix& p, std::uint32_t depth,
                                 std::string_view key, Olc& o) const {
  const std::uint32_t branch = depth + p.len;
  if (p.len > p.avail) {
    p.src = any_key(n, o);
    if (o.stop() || p.src.size() < branch) {
      if (!o.damaged) o.restart = true;
      return 0;
    }
  }
  for (std::uint32_t i = 0; i < p.len; ++i) {
    if (depth + i >= key.size()) return -1;  // the key ends inside the prefix
    const std::uint8_t kb = static_cast<std::uint8_t>(key[depth + i]);
    const std::uint8_t pb = p.byte(depth, i);
    if (kb != pb) return kb < pb ? -1 : 1;
  }
  return key.size() == branch ? -1 : 0;  // the end record is the key itself
}

// The child of n (read, not yet validated) the seek enters, at byte *b (256: the end record):
// under `least` (or cmp < 0) n's least item, else the key's byte at n's branch depth, else the
// first child right of it (which makes the rest `least`). 0: nothing at or right of the key.
template <class P>
inline std::uint64_t Tree<P>::seek_child(NodeHeader* n, std::uint32_t branch, std::string_view key,
                                         bool* least, unsigned* b) const {
  if (*least) {
    std::uint64_t next = load_word(n->end);
    *b = 256;
    if (next == 0) {
      next = next_child(n, 0);
      *b = next != 0 ? byte_of(next) : 0;
    }
    return next;
  }
  const unsigned kb = static_cast<std::uint8_t>(key[branch]);
  const std::uint64_t* s = slot_of(n, static_cast<std::uint8_t>(kb));
  std::uint64_t next = s != nullptr ? load_word(*s) : 0;
  *b = kb;
  if (next == 0 && kb < 255) {
    next = next_child(n, kb + 1);
    *least = next != 0;
    *b = next != 0 ? byte_of(next) : 0;
  }
  return next;
}

// Up the path: the next child right of the byte taken through each node, entered at its least
// record. Leaves c.w 0 when nothing lies right of the key; false when o stopped.
template <class P>
inline bool Tree<P>::seek_climb(SeekStep* path, unsigned& top, SeekCursor& c, Olc& o) const {
  c.w = 0;
  while (top > 0 && c.w == 0) {
    SeekStep& s = path[top - 1];
    const std::uint64_t next = s.next < 256 ? next_child(s.n, s.next) : 0;
    check(s.n->lock, s.v, o);
    if (o.stop()) return false;
    if (next == 0) {
      --top;
      continue;
    }
    s.next = byte_of(next) + 1;
    c = SeekCursor{next, &s.n->lock, s.v, s.branch + 1, true};
  }
  return true;
}

// One optimistic attempt: the key's path as find takes it, while it matches. Where the key
// leaves the trie (a prefix or record that differs, or no child at its byte) the answer is
// the least record of the first subtree to the right: the node's end record (its key is the
// node's path, below every child's), else its children in byte order. A node with nothing
// right of the path's byte sends the search back up the path to the next byte of the node
// above (seek_climb). Each word is read under the version of the node that holds it and
// validated before it is followed (as find_once does); a node revisited on the way back is
// validated again after its next child is read, so an answer comes only from versions that
// all held.
template <class P>
Code Tree<P>::seek_ge_once(std::string_view key, std::string_view* key_out, std::uint64_t* value,
                           bool* deep, Olc& o) const {
  SeekStep path[kSeekPath];
  unsigned top = 0;
  constexpr std::uint64_t kMustBeTag = ~NodeLock::kLowMask | NodeLock::kDamaged;
  const std::uint64_t want = std::uint64_t{tag_} << 32;
  SeekCursor c{0, root_lock_, read_lock(*root_lock_, nullptr, o), 0, false};
  if (o.stop()) return Code::ok;
  c.w = load_word(*root_word_);
  for (;;) {
    bool back = false;  // everything under c.w is below the key: go back up the path
    if (c.w == 0) {
      check(*c.plock, c.pv, o);  // the empty tree (children are followed only when not 0)
      return o.stop() ? Code::ok : Code::not_found;
    }
    if (is_record(c.w)) {
      const std::string_view k = key_of(c.w);  // its length and bytes are immutable once published
      const bool hit = c.least || detail::compare_keys(k, key) >= 0;
      const std::uint64_t val = hit ? load_word(record(c.w)->value) : 0;
      check(*c.plock, c.pv, o);
      if (o.stop()) return Code::ok;
      if (hit) {
        *key_out = k;
        *value = val;
        return Code::ok;
      }
      back = true;
    } else {
      if (c.depth > max_key_) {
        o.damaged = true;  // deeper than any key: a cycle
        return Code::ok;
      }
      NodeHeader* n = node(c.w);
      // read_lock's common case inline, as find_word tests it: this run's tag, neither held
      // nor obsolete nor damaged (else read_lock admits, waits or answers).
      pm::yield_point("art.read");
      std::uint64_t v = NodeLock::load(n->lock);
      if ((v & kMustBeTag) != want) [[unlikely]] {
        v = read_lock(n->lock, n, o);
        if (o.stop()) return Code::ok;
      }
      check(*c.plock, c.pv, o);
      if (o.stop()) return Code::ok;
      Prefix p;
      if (!prefix_at(n, c.depth, &p)) {
        check(n->lock, v, o);
        if (!o.restart) o.damaged = true;
        return Code::ok;
      }
      const std::uint32_t branch = c.depth + p.len;
      int cmp = 0;
      if (!c.least) {
        cmp = seek_compare(n, p, c.depth, key, o);
        if (o.stop()) return Code::ok;
      }
      unsigned b = 0;  // the byte of `next` (256: the end record)
      std::uint64_t next = 0;
      if (cmp <= 0) {
        c.least = c.least || cmp < 0;
        next = seek_child(n, branch, key, &c.least, &b);
      }
      check(n->lock, v, o);
      if (o.stop()) return Code::ok;
      if (next == 0) {
        back = true;
      } else {
        if (top == kSeekPath) {
          *deep = true;
          return Code::ok;
        }
        // The end record's key is the node's path: every child is right of it (next 0).
        path[top++] = SeekStep{n, v, branch, b == 256 ? 0u : b + 1};
        c = SeekCursor{next, &n->lock, v, branch + 1, c.least};
        continue;
      }
    }
    if (!back) continue;
    if (!seek_climb(path, top, c, o)) return Code::ok;
    if (c.w == 0) return Code::not_found;  // nothing right of the key
  }
}

template <class P>
template <class Emit>
bool Tree<P>::emit_record(std::uint64_t w, std::uint64_t value, bool bounded,
                          std::string_view bound, bool inclusive, std::size_t max,
                          std::size_t& count, Emit& emit, std::string& last) const {
  if (count >= max) return false;
  const std::string_view k = key_of(w);
  if (bounded) {
    const int c = detail::compare_keys(k, bound);
    if (c < 0 || (c == 0 && !inclusive)) return true;
  }
  emit(k, value);
  // At max the scan stops: every caller returns at once, so no pass resumes after k and its
  // copy would be wasted (a seek, max 1, paid it on every lookup of pactree's search layer).
  if (++count >= max) return false;
  last.assign(k);
  return true;
}

// --- verify ---------------------------------------------------------------------------------------

template <class P>
std::string Tree<P>::verify(TreeStats* stats, bool allow_stale,
                            bool (*value_ok)(const void*, std::uint64_t), const void* ctx) const {
  auto guard = epochs_.pin();
  TreeStats local;
  TreeStats* st = stats != nullptr ? stats : &local;
  *st = TreeStats{};
  std::string path, prev;
  bool any = false;
  const std::uint64_t root = load_word(*root_word_);
  if (root != 0) {
    if (std::string e = check_child(root); !e.empty()) return "root: " + e;
  }
  return verify_word(root, 0, path, 0, false, prev, any, st, allow_stale, value_ok, ctx);
}

// path: the key bytes [0, depth) every record below must start with.
template <class P>
std::string Tree<P>::verify_word(std::uint64_t w, std::uint32_t depth, std::string& path,
                                 std::uint8_t slot_byte, bool is_end, std::string& prev,
                                 bool& any, TreeStats* st, bool allow_stale,
                                 bool (*value_ok)(const void*, std::uint64_t),
                                 const void* ctx) const {
  if (w == 0) return {};
  const std::string at_path = " (under a path of " + std::to_string(depth) + " bytes)";
  if (byte_of(w) != slot_byte) return "child word's byte differs from its slot's" + at_path;
  if (is_record(w)) {
    const std::string_view k = key_of(w);
    if (k.size() < depth || k.compare(0, depth, path) != 0)
      return "record key does not start with its path" + at_path;
    if (is_end && k.size() != depth) return "end record is longer than its node's path" + at_path;
    if (any && detail::compare_keys(prev, k) >= 0) return "keys out of order" + at_path;
    if (value_ok != nullptr && !value_ok(ctx, load_word(record(w)->value)))
      return "record value is unreadable" + at_path;
    prev.assign(k);
    any = true;
    ++st->records;
    return {};
  }
  if (depth > max_key_) return "tree deeper than the key limit (a cycle?)";
  const NodeHeader* n = node(w);
  if (std::string e = check_node(n); !e.empty()) return e + at_path;
  const NodeType t = static_cast<NodeType>(n->type);
  ++st->nodes[n->type];
  st->max_depth = std::max(st->max_depth, depth);
  Prefix p;
  if (!prefix_at(n, depth, &p)) return "node level is above its depth or prefix too short" + at_path;
  if (level_of(load_word(n->shape)) != depth) {
    ++st->stale_prefixes;
    if (!allow_stale) return "node level differs from its depth (stale prefix)" + at_path;
  }
  // The prefix bytes: from a record below (every record must agree, checked at the records).
  Olc o;
  const std::string_view src = any_key(const_cast<NodeHeader*>(n), o);
  if (o.stop() || src.size() < std::size_t{depth} + p.len) return "node's records do not cover its prefix" + at_path;
  for (std::uint32_t i = 0; i < p.avail; ++i)
    if (p.byte(depth, i) != static_cast<std::uint8_t>(src[depth + i]))
      return "stored prefix byte " + std::to_string(i) + " differs from the records'" + at_path;
  const std::uint32_t branch = depth + p.len;
  detail::EntryBuffer<Entry> buf;
  Entry* e = buf.get(capacity_of(t));
  const unsigned k = collect(n, e);
  // Accelerators and count, once the node is admitted in this run (invariant 3).
  if (NodeLock::tag_of(NodeLock::load(n->lock)) == tag_) {
    if (n->count != k) return "node count " + std::to_string(n->count) + " != live children " + std::to_string(k) + at_path;
    const std::uint64_t* ch = children_of(n);
    for (unsigned j = 0; j < capacity_of(t); ++j) {
      const std::uint64_t cw = load_word(ch[j]);
      if (cw == 0 || t == NodeType::n256) continue;
      if (t == NodeType::n48) {
        const N48* x = reinterpret_cast<const N48*>(n);
        const unsigned b = byte_of(cw);
        if (static_cast<std::uint8_t>(x->index[b / 8] >> (8 * (b % 8))) != j + 1)
          return "N48 index disagrees with child " + std::to_string(j) + at_path;
      } else {
        const std::uint64_t* keys = t == NodeType::n4 ? &reinterpret_cast<const N4*>(n)->keys
                                                      : reinterpret_cast<const N16*>(n)->keys;
        if (static_cast<std::uint8_t>(keys[j / 8] >> (8 * (j % 8))) != byte_of(cw))
          return "key byte disagrees with child " + std::to_string(j) + at_path;
      }
    }
  }
  std::sort(e, e + k, [](const Entry& a, const Entry& b) { return a.byte < b.byte; });
  const std::size_t saved = path.size();
  path.append(src.substr(depth, p.len));
  std::string err = verify_word(load_word(n->end), branch, path, 0, true, prev, any, st,
                                allow_stale, value_ok, ctx);
  for (unsigned j = 0; j < k && err.empty(); ++j) {
    path.push_back(static_cast<char>(e[j].byte));
    err = verify_word(e[j].word, branch + 1, path, e[j].byte, false, prev, any, st,
                      allow_stale, value_ok, ctx);
    path.pop_back();
  }
  path.resize(saved);
  return err;
}

// --- recovery walk ----------------------------------------------------------------------------------

template <class P>
template <class Mark>
std::string Tree<P>::walk(Mark&& mark) const {
  const std::uint64_t root = load_word(*root_word_);
  if (root == 0) return {};
  if (std::string e = check_child(root); !e.empty()) return "root: " + e;
  return walk_word(root, 0, mark);
}

// Checks before following (bounds, type, shape against depth); marks after. A node reached
// twice is marked twice, which the allocator reports as an overlap; depth is bounded.
template <class P>
template <class Mark>
std::string Tree<P>::walk_word(std::uint64_t w, std::uint32_t depth, Mark& mark) const {
  if (is_record(w)) {
    const Record* r = record(w);
    if (r->key_len < depth) return "record key shorter than its path";
    return mark(target_of(w), record_bytes(r->key_len), true, load_word(r->value))
               ? std::string{} : std::string("record overlaps another block");
  }
  if (depth > max_key_) return "tree deeper than the key limit (a cycle?)";
  const NodeHeader* n = node(w);
  if (std::string e = check_node(n); !e.empty()) return e;
  Prefix p;
  if (!prefix_at(n, depth, &p)) return "node level is above its depth or prefix too short";
  if (!mark(target_of(w), node_bytes(static_cast<NodeType>(n->type)), false, 0))
    return "node overlaps another block";
  const std::uint32_t branch = depth + p.len;
  const std::uint64_t end = load_word(n->end);
  if (end != 0) {
    if (std::string e = walk_word(end, branch, mark); !e.empty()) return e;
  }
  detail::EntryBuffer<Entry> buf;
  Entry* e = buf.get(capacity_of(static_cast<NodeType>(n->type)));
  const unsigned k = collect(n, e);
  for (unsigned j = 0; j < k; ++j)
    if (std::string err = walk_word(e[j].word, branch + 1, mark); !err.empty()) return err;
  return {};
}

}  // namespace pmindex::art

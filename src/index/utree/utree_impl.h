// uTree operations (PROTOCOL.md U0..U9, W1, D1..D4, V1..V2). A header so tests can
// instantiate known-bad policies; the library instantiates UTree<Protocol> in utree.cpp.
// Recovery and verification: utree_recovery.h.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <tuple>

#include "index/common/key_group.h"
#include "index/common/hybrid_checks.h"
#include "index/common/olc.h"
#include "index/common/prefetch.h"
#include "index/common/reclaim.h"
#include "index/utree/utree.h"

namespace pmindex::utree {

using index_common::locked_write;
using index_common::olc_pause;
using index_common::optimistic_read;

namespace detail {
// The 8-byte big-endian prefix of a key (zero-padded), read as an integer: memcmp order.
inline std::uint64_t prefix_word(std::string_view key) {
  std::uint64_t be = 0;
  if (key.empty()) return 0;  // memcpy from a null data() is undefined even for 0 bytes
  std::memcpy(&be, key.data(), std::min<std::size_t>(key.size(), 8));
  return __builtin_bswap64(be);
}
// Acquire load of a PM word another thread publishes (pm::publish / pm::cas): a walker that
// sees a link sees the node it names, persisted and whole (U1 before U2).
inline std::uint64_t load(const std::uint64_t& w) { return pm::load_acquire(&w); }
}  // namespace detail

template <class P>
UTree<P>::UTree(std::unique_ptr<pm::Pool> pool, std::uint32_t node_size)
    : pool_(std::move(pool)),
      node_size_(node_size),
      cap_(utree::leaf_capacity(node_size)),
      inner_(kInnerKeys, arena_) {}

template <class P>
UTree<P>::~UTree() = default;

template <class P>
Index::ThreadScope UTree<P>::attach_thread() {
  auto participant = std::make_shared<sync::EpochManager::Participant>(epochs_.attach());
  return ThreadScope([participant]() mutable { participant.reset(); });
}

template <class P>
void UTree<P>::configure(const Root& r) {
  keys_.configure(pool_.get(), static_cast<KeyType>(r.key_mode), r.max_key_size);
  values_.configure(pool_.get(), r.max_value_size);
  bytes_ = keys_.bytes_mode();
  node_bytes_ = bytes_ ? kNodeBytesBytes : kNodeBytesWord;
}

template <class P>
void UTree<P>::init_dram() {
  first_leaf_ = new_leaf(false);
  if (first_leaf_ == nullptr) index_common::fatal("utree", "no DRAM for the first leaf");
  inner_.init_single(reinterpret_cast<std::uint64_t>(first_leaf_));
}

// U0: the root object, then its publication in the pool header.
template <class P>
Status UTree<P>::init_root(const Options& o) {
  pm::Pool& p = *pool_;
  Code code = Code::ok;
  const std::uint64_t off = p.allocator().allocate(sizeof(Root), &code);
  if (off == 0) return p.error(code, "no space for the index root");
  Root init{};
  init.magic = kRootMagic;
  init.head = kListEnd;  // R1t: an empty list ends at the end mark, never at 0
  init.node_size = node_size_;
  init.key_mode = static_cast<std::uint32_t>(o.key_type);
  init.max_key_size = o.key_type == KeyType::bytes ? o.max_key_size : 8;
  init.max_value_size = o.max_value_size;
  init.stamp = index_common::make_root_stamp(p.info().layout);
  pm::copy(p.at<Root>(off), &init, sizeof init);  // U0: the root object, list empty
  pm::persist(p.at<Root>(off), sizeof init);
  p.set_root(off);                                 // U0: published (atomic, persisted)
  root_ = p.at<Root>(off);
  configure(init);
  init_dram();
  return Status::Ok();
}

template <class P>
Result<std::unique_ptr<Index>> UTree<P>::create(std::unique_ptr<pm::Pool> pool,
                                                const Options& o) {
  const std::uint32_t ns = o.node_size == 0 ? kDefaultNodeSize : o.node_size;
  std::unique_ptr<UTree> idx(new UTree(std::move(pool), ns));
  if (Status s = idx->init_root(o); !s.ok()) return s;
  idx->recovery_.created = true;
  return std::unique_ptr<Index>(std::move(idx));
}

// --- keys and nodes ---------------------------------------------------------------------------

template <class P>
typename UTree<P>::Probe UTree<P>::probe(std::string_view key) const {
  Probe p;
  p.bytes = key;
  p.word = detail::prefix_word(key);
  return p;
}

template <class P>
int UTree<P>::compare_node(const Probe& p, NodeOff off) const {
  const ListNode* n = node_at(off);
  const std::uint64_t w = detail::load(n->key);
  if (p.word != w) return p.word < w ? -1 : 1;
  if (!bytes_) return 0;
  std::string_view stored;
  if (!index_common::read_record(*pool_, detail::load(n->key_record), keys_.max_key(), &stored))
    return 1;  // unreadable: only through an unvalidated read, which validation discards
  const int c = p.bytes.compare(stored);
  return c < 0 ? -1 : (c > 0 ? 1 : 0);
}

template <class P>
int UTree<P>::compare_entry(const Probe& p, std::uint64_t word, std::uint32_t idx) const {
  if (p.word != word) return p.word < word ? -1 : 1;
  if (!bytes_) return 0;
  const NodeOff off = node_offset(idx);
  if (!node_in_pool(off)) return 1;
  return compare_node(p, off);
}

template <class P>
std::string UTree<P>::node_key(NodeOff off) const {
  const ListNode* n = node_at(off);
  if (!bytes_) return encode_u64(detail::load(n->key));
  std::string_view stored;
  if (!index_common::read_record(*pool_, detail::load(n->key_record), keys_.max_key(), &stored))
    return std::string();
  return std::string(stored);
}

// U1: a node with key, key record (K1), value or value record (K1), next = 0 (not linked yet;
// never a reachable end, R1t); persisted by the caller once next is set (write_next). Nothing
// allocated is reachable yet.
template <class P>
typename UTree<P>::NodeOff UTree<P>::make_node(const Probe& p, std::string_view value,
                                               Code* code) {
  pm::Pool& pool = *pool_;
  std::uint64_t key_record = 0;
  if (bytes_) {
    key_record = index_common::write_record(pool, p.bytes, code);  // K1
    if (key_record == 0) return 0;
  }
  const std::uint64_t vw = values_.make_word(value, code);  // K1 for out-of-line values
  if (*code != Code::ok) {
    if (bytes_) index_common::free_record(pool, key_record);
    return 0;
  }
  const NodeOff off = pool.allocator().allocate(node_bytes_, code);
  if (off == 0) {
    values_.release(vw);
    if (bytes_) index_common::free_record(pool, key_record);
    return 0;
  }
  if (off % kNodeAlign != 0 || off >= kMaxPoolBytes)
    index_common::fatal("utree", "allocator returned a node offset the leaves cannot hold");
  ListNode* n = node_at(off);
  pm::publish(&n->next, 0);
  pm::publish(&n->key, p.word);
  pm::publish(&n->value, vw);
  if (bytes_) pm::publish(&n->key_record, key_record);
  return off;
}

// U1 (end): the node's next word, then the whole node persisted before any link names it.
template <class P>
void UTree<P>::write_next(NodeOff node, std::uint64_t next) {
  ListNode* n = node_at(node);
  pm::publish(&n->next, next);
  pm::persist(n, node_bytes_);
}

// A node that never became reachable (or is unreachable and persisted so) and its records.
template <class P>
void UTree<P>::free_node_now(NodeOff off) {
  const ListNode* n = node_at(off);
  values_.release(n->value);
  if (bytes_) index_common::free_record(*pool_, n->key_record);
  pool_->allocator().deallocate(off, node_bytes_);
}

template <class P>
void UTree<P>::free_node(void* self, std::uint64_t off) {
  static_cast<UTree*>(self)->free_node_now(off);
}

// --- DRAM leaves ------------------------------------------------------------------------------

template <class P>
Leaf* UTree<P>::new_leaf(bool locked) {
  Leaf* l = nullptr;
  {
    std::lock_guard<sync::SpinLock> g(free_leaves_mu_);
    if (!free_leaves_.empty()) {
      l = free_leaves_.back();
      free_leaves_.pop_back();
    }
  }
  if (l != nullptr) {
    // L3: a removed leaf again (type-stable: stale optimistic readers and walkers may still
    // read it). Its word restarts above every word it had (olc.h (3)), and it is filled under
    // its own lock, so a stale reader restarts or sees it whole. A stale thread may take the
    // fresh lock for an instant (it then finds the leaf is not what it looked for): wait.
    index_common::recycle_unlocked(l->h.lock);
    while (!index_common::try_write_lock(l->h.lock)) olc_pause();
    locked_write(l->h.count, 0u);
    locked_write(l->h.next, std::uint64_t{0});
    set_prev_hint(l, nullptr);
    if (!locked) l->h.lock.writeUnlock();
    return l;
  }
  void* mem = arena_.allocate(node_size_);
  if (mem == nullptr) return nullptr;
  std::memset(mem, 0, node_size_);  // never-written slots name offset 0 (mapped, harmless)
  l = static_cast<Leaf*>(mem);
  l->h.capacity = cap_;
  index_common::recycle_unlocked(l->h.lock);
  if (locked) index_common::recycle_locked(l->h.lock);
  return l;
}

// prev is a hint word outside any leaf's seqlock: acquire/release so a reader of the pointer
// sees the leaf it names initialised.
template <class P>
Leaf* UTree<P>::prev_hint(const Leaf* l) {
  return reinterpret_cast<Leaf*>(
      std::atomic_ref<std::uint64_t>(const_cast<std::uint64_t&>(l->h.prev))
          .load(std::memory_order_acquire));
}

template <class P>
void UTree<P>::set_prev_hint(Leaf* l, Leaf* prev) {
  std::atomic_ref<std::uint64_t>(l->h.prev)
      .store(reinterpret_cast<std::uint64_t>(prev), std::memory_order_release);
}

template <class P>
unsigned UTree<P>::search(const Leaf* l, const Probe& p, bool* found) const {
  unsigned cnt = optimistic_read(l->h.count);
  if (cnt > cap_) cnt = 0;  // torn read of a changing leaf: validation fails anyway
  const std::uint64_t* keys = l->keys();
  unsigned lo = 0, hi = cnt;
  if (!bytes_) {
    // Branchless lower_bound (a conditional move per step): the leaf's lines were prefetched
    // together, so the search waits on no miss, and a mispredicted branch per step would
    // cost more than the comparisons.
    if (cnt == 0) {
      *found = false;
      return 0;
    }
    // base ends at the last key <= p.word (or the first key if every key is larger).
    const std::uint64_t* base = keys;
    for (unsigned n = cnt; n > 1;) {
      const unsigned half = n / 2;
      base = optimistic_read(base[half]) <= p.word ? base + half : base;
      n -= half;
    }
    const std::uint64_t k = optimistic_read(*base);
    lo = static_cast<unsigned>(base - keys) + (k < p.word ? 1 : 0);
    *found = k == p.word;
    return lo;
  }
  const std::uint32_t* nodes = l->nodes();
  while (lo < hi) {
    const unsigned mid = (lo + hi) / 2;
    if (compare_entry(p, optimistic_read(keys[mid]), optimistic_read(nodes[mid])) > 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  *found = lo < cnt &&
           compare_entry(p, optimistic_read(keys[lo]), optimistic_read(nodes[lo])) == 0;
  return lo;
}

// A leaf's version as its parent names it (nullopt while it is locked: restart).
template <class P>
std::optional<std::uint64_t> UTree<P>::leaf_version(std::uint64_t lw) const {
  // All of the leaf's lines at once: the binary search would miss on them one by one.
  index_common::prefetch_lines(leaf_of(lw), node_size_);
  bool restart = false;
  const std::uint64_t v = leaf_of(lw)->h.lock.readLockOrRestart(restart);
  if (restart) return std::nullopt;
  return v;
}

// The leaf covering p and its version, read while its parent was valid (InnerTree contract).
template <class P>
std::pair<std::uint64_t, std::uint64_t> UTree<P>::descend_read(const Probe& p) const {
  auto on_leaf = [this](std::uint64_t lw) { return leaf_version(lw); };
  if (!bytes_) return inner_.descend<kInnerKeys>(index_common::WordProbe{p.word}, on_leaf);
  return inner_.descend<kInnerKeys>(
      [&p](std::uint64_t sep) { return p.bytes < index_common::SeparatorStore::view(sep); },
      on_leaf);
}

// The write lock of the leaf covering p: upgraded from the version read during the descent,
// so the leaf is still the right one (a split bumps its version).
template <class P>
Leaf* UTree<P>::lock_leaf(const Probe& p) {
  for (;;) {
    auto [lw, v] = descend_read(p);
    bool restart = false;
    leaf_of(lw)->h.lock.upgradeToWriteLockOrRestart(v, restart);
    if (!restart) return leaf_of(lw);
    olc_pause();
  }
}

// U4 (DRAM): shift the entries from pos right by one and write (word, node) at pos.
template <class P>
void UTree<P>::enter(Leaf* l, unsigned pos, std::uint64_t word, NodeOff node) {
  const unsigned cnt = l->h.count;
  std::uint64_t* keys = l->keys();
  std::uint32_t* nodes = l->nodes();
  for (unsigned i = cnt; i > pos; --i) {
    locked_write(keys[i], keys[i - 1]);
    locked_write(nodes[i], nodes[i - 1]);
  }
  locked_write(keys[pos], word);
  locked_write(nodes[pos], node_index(node));
  locked_write(l->h.count, cnt + 1);
}

template <class P>
void UTree<P>::erase(Leaf* l, unsigned pos) {
  const unsigned cnt = l->h.count;
  std::uint64_t* keys = l->keys();
  std::uint32_t* nodes = l->nodes();
  for (unsigned i = pos; i + 1 < cnt; ++i) {
    locked_write(keys[i], keys[i + 1]);
    locked_write(nodes[i], nodes[i + 1]);
  }
  locked_write(l->h.count, cnt - 1);
}

template <class P>
std::uint64_t UTree<P>::separator_for(std::uint64_t word, NodeOff node) {
  if (!bytes_) return word;
  return seps_.make(node_key(node));
}

// S1..S3 (DRAM only): l (locked, full) gives its upper half to a new leaf r, which enters the
// leaf chain and the inner tree while both are locked. Returns the leaf that now covers p,
// locked; the other is unlocked. nullptr (l unlocked) if DRAM is exhausted.
template <class P>
Leaf* UTree<P>::split(Leaf* l, const Probe& p) {
  Leaf* r = new_leaf(true);
  if (r == nullptr) {
    l->h.lock.writeUnlock();
    return nullptr;
  }
  const unsigned cnt = l->h.count, half = cnt / 2;
  // S1: r is not reachable from the tree yet, but a recycled r (L3) may still be read by stale
  // optimistic readers: release stores, as under any leaf lock.
  for (unsigned i = half; i < cnt; ++i) {
    locked_write(r->keys()[i - half], l->keys()[i]);
    locked_write(r->nodes()[i - half], l->nodes()[i]);
  }
  locked_write(r->h.count, cnt - half);
  Leaf* next = leaf_of(l->h.next);
  locked_write(r->h.next, reinterpret_cast<std::uint64_t>(next));
  set_prev_hint(r, l);
  if (next != nullptr) set_prev_hint(next, r);                   // S2: still left of next
  locked_write(l->h.next, reinterpret_cast<std::uint64_t>(r));  // S2: r in the chain
  locked_write(l->h.count, half);
  const std::uint64_t sep = separator_for(r->keys()[0], node_offset(r->nodes()[0]));
  bool ok;
  {
    auto smo = inner_.smo_lock();  // S3: r in the inner tree (l stays locked meanwhile)
    index_common::InnerTree::Path path;
    if (!bytes_) {
      inner_.path_to(index_common::WordProbe{p.word}, &path);
    } else {
      inner_.path_to(
          [&p](std::uint64_t s) { return p.bytes < index_common::SeparatorStore::view(s); },
          &path);
    }
    ok = inner_.insert_separator(path, reinterpret_cast<std::uint64_t>(l), sep,
                                 reinterpret_cast<std::uint64_t>(r));
  }
  if (!ok) index_common::fatal("utree", "inner tree refused a separator (DRAM exhausted?)");
  const bool right = compare_entry(p, r->keys()[0], r->nodes()[0]) >= 0;
  (right ? l : r)->h.lock.writeUnlock();
  return right ? r : l;
}

// L1-L2 (DRAM only): l (write-locked, just shrunk by a remove, not the first leaf) leaves the
// array layer if it is empty, or if its entries fit into its left neighbour with room to
// spare (a merge). Returns false, l still locked, if it stays. Lock order: l, then its left
// neighbour (waited for only while l's prev hint names it, so never a leaf to l's right),
// then the InnerTree SMO lock. The left neighbour is confirmed under its lock: its next is l
// and l's prev names it (a stale prev may name a leaf removed and reused meanwhile, L3, whose
// old next still says l).
template <class P>
bool UTree<P>::leave_or_merge(Leaf* l, const Probe& p) {
  const unsigned n = l->h.count;
  if (l == first_leaf_ || n > cap_ / 4) return false;
  const unsigned merge_max = cap_ * 3 / 4;  // a merged leaf keeps a quarter free for inserts
  auto fits = [&](const Leaf* left) { return n + optimistic_read(left->h.count) <= merge_max; };
  if (n > 0) {  // a look without the lock first: a full neighbour is left alone, unlocked
    const Leaf* left = prev_hint(l);
    if (left == nullptr || !fits(left)) return false;
  }
  Leaf* left = nullptr;
  for (;;) {
    left = prev_hint(l);
    if (left == nullptr) index_common::fatal("utree", "a leaf other than the first has no prev");
    pm::yield_point("utree.unlink_leaf");
    bool restart = false;
    std::uint64_t v = left->h.lock.tryReadLockOrRestart(restart);
    if (restart) {
      if (sync::OptimisticLock::isObsolete(v) || prev_hint(l) != left) {
        olc_pause();
        continue;
      }
      restart = false;
      v = left->h.lock.readLockOrRestart(restart);
      if (restart) {
        olc_pause();
        continue;
      }
    }
    left->h.lock.upgradeToWriteLockOrRestart(v, restart);
    if (restart) {
      olc_pause();
      continue;
    }
    if (leaf_of(left->h.next) == l && prev_hint(l) == left) break;
    left->h.lock.writeUnlock();  // a split or removal changed l's left neighbour: look again
    olc_pause();
  }
  if (n > 0 && !fits(left)) {  // filled up meanwhile: both stay
    left->h.lock.writeUnlock();
    return false;
  }
  // L1: l's entries (their keys all above left's) appended to left: both locked, so no list
  // node in either range changes meanwhile.
  const unsigned lc = left->h.count;
  for (unsigned i = 0; i < n; ++i) {
    locked_write(left->keys()[lc + i], l->keys()[i]);
    locked_write(left->nodes()[lc + i], l->nodes()[i]);
  }
  locked_write(left->h.count, lc + n);
  // L1: out of the chain. Readers that follow left's next validate left (scan), walkers that
  // follow right's prev check it still names their leaf (walk_start).
  Leaf* right = leaf_of(l->h.next);
  locked_write(left->h.next, reinterpret_cast<std::uint64_t>(right));
  if (right != nullptr) set_prev_hint(right, left);
  std::uint64_t dropped = 0;
  {
    auto smo = inner_.smo_lock();  // L1: out of the inner tree; its range joins left's
    index_common::InnerTree::Path path;
    if (!bytes_) {
      inner_.path_to(index_common::WordProbe{p.word}, &path);
    } else {
      inner_.path_to(
          [&p](std::uint64_t s) { return p.bytes < index_common::SeparatorStore::view(s); },
          &path);
    }
    if (!inner_.remove_leaf(path, reinterpret_cast<std::uint64_t>(l), &dropped,
                            /*join_left=*/true))
      index_common::fatal("utree", "a leaf that leaves is not in the inner tree");
  }
  if (bytes_) seps_.retire(dropped, epochs_);  // bytes-mode descents are all pinned
  // L2: obsolete, so every optimistic reader of l restarts; then onto the free list (L3).
  l->h.lock.writeUnlockObsolete();
  left->h.lock.writeUnlock();
  {
    std::lock_guard<sync::SpinLock> g(free_leaves_mu_);
    free_leaves_.push_back(l);
  }
  leaves_unlinked_.fetch_add(1, std::memory_order_relaxed);
  if (n > 0) leaves_merged_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// --- the list ---------------------------------------------------------------------------------

// A node whose key is below p (p in l's range, l locked by the caller) and that was linked
// and unmarked when read: the entry before pos, else the last entry of l's left neighbour (a
// validated snapshot), else root.head (0). The left neighbour is named by l's prev hint, which
// may name a leaf removed meanwhile (L1) and reused anywhere (L3): the snapshot counts only if
// prev still names that leaf after its validation and its last key is below p (L4);
// otherwise look again. A locked left leaf is waited for only while prev still names it (a
// leaf to the left: lock order), never a stale one, which may now lie to the right.
template <class P>
typename UTree<P>::NodeOff UTree<P>::walk_start(const Leaf* l, unsigned pos,
                                                const Probe& p) const {
  if (pos > 0) return node_offset(l->nodes()[pos - 1]);
  for (;;) {
    const Leaf* left = prev_hint(l);
    if (left == nullptr) return 0;
    pm::yield_point("utree.prev");
    bool restart = false;
    std::uint64_t v = left->h.lock.tryReadLockOrRestart(restart);
    if (restart) {  // locked or obsolete
      if (sync::OptimisticLock::isObsolete(v) || prev_hint(l) != left) {
        olc_pause();
        continue;
      }
      restart = false;
      v = left->h.lock.readLockOrRestart(restart);
      if (restart) {
        olc_pause();
        continue;
      }
    }
    const unsigned cnt = optimistic_read(left->h.count);
    const std::uint32_t idx = cnt > 0 && cnt <= cap_ ? optimistic_read(left->nodes()[cnt - 1]) : 0;
    left->h.lock.checkOrRestart(v, restart);
    if (restart) {
      olc_pause();
      continue;
    }
    // Only the first leaf is ever empty unlocked (L1), and root.head is always a valid start.
    if (cnt == 0) return 0;
    const NodeOff off = node_offset(idx);
    if constexpr (!P::kUncheckedLeafReuse) {
      if (prev_hint(l) != left || !node_in_pool(off) || compare_node(p, off) <= 0) {
        olc_pause();  // L4: left was removed (and maybe reused) since prev named it
        continue;
      }
    }
    return off;
  }
}

// W1: a dirty link is persisted before anyone acts on it, then cleaned. Returns the word now
// in place (clean unless someone changed it meanwhile).
template <class P>
std::uint64_t UTree<P>::settle(std::uint64_t* link, std::uint64_t w) {
  pm::persist(link, sizeof *link);  // W1
  std::uint64_t expected = w;
  const std::uint64_t clean = w & ~kDirtyBit;
  pm::yield_point("utree.settle");
  if (pm::cas(link, expected, clean)) return clean;
  return expected;
}

// From start (key below p, linked and unmarked when chosen) to the last node below p. False
// if that node turns out to be marked (a remover in another leaf is unlinking it): the caller
// picks a new start.
template <class P>
bool UTree<P>::walk(NodeOff start, const Probe& p, Pred* out) {
  NodeOff pred = start;
  std::uint64_t* link = link_of(pred);
  std::uint64_t w = detail::load(*link);
  for (;;) {
    if (pred != 0 && (w & kMarkBit) != 0) return false;
    if ((w & kDirtyBit) != 0) {
      w = settle(link, w);
      continue;
    }
    const NodeOff succ = link_target(w);
    if (succ == 0 || compare_node(p, succ) <= 0) {
      *out = {pred, w};
      return true;
    }
    pred = succ;
    link = link_of(succ);
    w = detail::load(*link);
  }
}

template <class P>
typename UTree<P>::Pred UTree<P>::find_pred(const Leaf* l, unsigned pos, const Probe& p) {
  Pred pred;
  while (!walk(walk_start(l, pos, p), p, &pred)) olc_pause();
  return pred;
}

// --- operations -------------------------------------------------------------------------------

template <class P>
Code UTree<P>::insert(std::string_view key, std::string_view value) {
  return this->count_insert(
      index_common::retry_after_reclaim(epochs_, [&] { return insert_once(key, value); }));
}

template <class P>
Code UTree<P>::insert_once(std::string_view key, std::string_view value) {
  if (Code c = keys_.check(key); c != Code::ok) return c;
  if (Code c = values_.check(value); c != Code::ok) return c;
  const Probe p = probe(key);
  auto guard = epochs_.pin();
  Leaf* l = lock_leaf(p);
  bool found = false;
  unsigned pos = search(l, p, &found);
  if (found) {  // present: nothing allocated
    l->h.lock.writeUnlock();
    return Code::already_present;
  }
  Code code = Code::ok;
  const NodeOff node = make_node(p, value, &code);  // U1
  if (node == 0) {
    l->h.lock.writeUnlock();
    return code;
  }
  if (l->h.count == cap_) {
    l = split(l, p);
    if (l == nullptr) {
      free_node_now(node);
      return Code::pool_full;  // DRAM exhausted; nothing changed
    }
    pos = search(l, p, &found);
  }
  if constexpr (P::kPublishBeforeLink) {
    const NodeOff start = walk_start(l, pos, p);  // the original's DRAM snapshot
    enter(l, pos, p.word, node);
    l->h.lock.writeUnlock();
    link_published_first(start, node);
    return Code::ok;
  }
  // R1t: the link names the node with its tag (from the key the node holds), in the same word:
  // U2 and U3 CAS exactly the words they did before, no store or line is added.
  const std::uint64_t tagged = link_to(node);
  for (;;) {
    const Pred pred = find_pred(l, pos, p);
    write_next(node, pred.word);  // U1: next = successor (its tag included), node persisted
    std::uint64_t expected = pred.word;
    pm::yield_point("utree.link");
    if (pm::cas(link_of(pred.node), expected, tagged | kDirtyBit)) {  // U2: linked
      std::uint64_t* link = link_of(pred.node);
      if constexpr (P::kUnlockBeforePersist) {
        enter(l, pos, p.word, node);
        l->h.lock.writeUnlock();
      }
      pm::persist(link, sizeof *link);  // U3: durable before the leaf shows it
      std::uint64_t dirty = tagged | kDirtyBit;
      (void)pm::cas(link, dirty, tagged);  // U3: clean (a walker may have cleaned it first)
      if constexpr (P::kUnlockBeforePersist) return Code::ok;
      break;
    }
    olc_pause();  // the predecessor changed (an insert or unlink next to it): find it again
  }
  enter(l, pos, p.word, node);  // U4: published
  l->h.lock.writeUnlock();
  return Code::ok;
}

// The original's link step, for the lost-key test only: the key is already in the DRAM leaf
// (another inserter may take this node as its predecessor and link onto it), and next is
// overwritten with a fresh read of the predecessor's successor.
template <class P>
void UTree<P>::link_published_first(NodeOff start, NodeOff node) {
  for (;;) {
    pm::yield_point("utree.link");
    std::uint64_t w = detail::load(*link_of(start));
    write_next(node, link_word(w));
    std::uint64_t expected = w;
    if (pm::cas(link_of(start), expected, link_to(node))) {
      pm::persist(link_of(start), 8);
      return;
    }
  }
}

template <class P>
Code UTree<P>::update(std::string_view key, std::string_view value) {
  return index_common::retry_after_reclaim(epochs_, [&] { return update_once(key, value); });
}

template <class P>
Code UTree<P>::update_once(std::string_view key, std::string_view value) {
  if (Code c = keys_.check(key); c != Code::ok) return c;
  if (Code c = values_.check(value); c != Code::ok) return c;
  const Probe p = probe(key);
  auto guard = epochs_.pin();
  Leaf* l = lock_leaf(p);
  bool found = false;
  const unsigned pos = search(l, p, &found);
  if (!found) {
    l->h.lock.writeUnlock();
    return Code::not_found;
  }
  ListNode* n = node_at(node_offset(l->nodes()[pos]));
  Code code = Code::ok;
  const std::uint64_t word = values_.make_word(value, &code);  // V1: K1 out of line
  if (code != Code::ok) {
    l->h.lock.writeUnlock();
    return code;
  }
  const std::uint64_t old = n->value;
  pm::publish(&n->value, word);  // V2: one failure-atomic 8-byte store
  pm::persist(&n->value, 8);
  l->h.lock.writeUnlock();       // readers validate after the persist: no dirty read
  if (!values_.inline_values())
    epochs_.retire(this, [](void* self, std::uint64_t w) {
      static_cast<UTree*>(self)->values_.release(w);
    }, old);  // K3
  return Code::ok;
}

template <class P>
Code UTree<P>::remove(std::string_view key) {
  if (Code c = keys_.check(key); c != Code::ok) return c;
  const Probe p = probe(key);
  auto guard = epochs_.pin();
  Leaf* l = lock_leaf(p);
  bool found = false;
  const unsigned pos = search(l, p, &found);
  if (!found) {
    l->h.lock.writeUnlock();
    return Code::not_found;
  }
  const NodeOff node = node_offset(l->nodes()[pos]);
  std::uint64_t* next = &node_at(node)->next;
  for (;;) {  // D1: mark (a dirty next is persisted first, W1)
    std::uint64_t w = detail::load(*next);
    if ((w & kDirtyBit) != 0) w = settle(next, w);
    if ((w & kDirtyBit) != 0) continue;
    std::uint64_t expected = w;
    pm::yield_point("utree.mark");
    if (pm::cas(next, expected, w | kMarkBit)) break;
  }
  pm::persist(next, sizeof *next);  // D1: the remove is durable (recovery drops marked nodes)
  // D2 copies the successor's word with its tag (R1t), without the mark.
  const std::uint64_t succ = link_word(detail::load(*next));
  for (;;) {  // D2: unlink
    const Pred pred = find_pred(l, pos, p);
    std::uint64_t expected = pred.word;
    pm::yield_point("utree.unlink");
    if (link_target(pred.word) != node)
      index_common::fatal("utree", "a marked node is missing from the list walk");
    if (pm::cas(link_of(pred.node), expected, succ)) {
      pm::persist(link_of(pred.node), 8);  // D3
      break;
    }
    olc_pause();
  }
  erase(l, pos);  // D4
  if (!leave_or_merge(l, p)) l->h.lock.writeUnlock();  // L1-L2 unlock l themselves
  epochs_.retire(this, &UTree::free_node, node);  // U9: node and records, once unobserved
  return this->count_remove(Code::ok);
}

template <class P>
Code UTree<P>::find(std::string_view key, std::string* value) const {
  if (!bytes_ && values_.inline_values()) return find_word(key, value);
  if (Code c = keys_.check(key); c != Code::ok) return c;
  const Probe p = probe(key);
  const auto guard = pin_for_records();
  std::string tmp;
  for (;;) {
    auto [lw, v] = descend_read(p);
    const Leaf* l = leaf_of(lw);
    bool found = false;
    const unsigned pos = search(l, p, &found);
    bool readable = true;
    if (found) {
      const NodeOff off = node_offset(optimistic_read(l->nodes()[pos]));
      if (!node_in_pool(off)) {
        readable = false;
      } else if (value != nullptr) {
        readable = values_.read(optimistic_read(node_at(off)->value), &tmp);
      }
    }
    bool restart = false;
    l->h.lock.checkOrRestart(v, restart);
    if (restart || !readable) {
      olc_pause();
      continue;
    }
    if (!found) return Code::not_found;
    if (value != nullptr) *value = std::move(tmp);
    return Code::ok;
  }
}

// Integer keys with inline values (the benchmarks' case): no epoch pin and no record (see
// pin_for_records), no temporary string; the value word goes straight into the caller's
// string once the leaf validated. Same reads and validation as find's general path.
template <class P>
Code UTree<P>::find_word(std::string_view key, std::string* value) const {
  if (Code c = keys_.check(key); c != Code::ok) return c;
  const Probe p = probe(key);
  for (;;) {
    auto [lw, v] = inner_.descend<kInnerKeys>(index_common::WordProbe{p.word},
                                              [this](std::uint64_t w) { return leaf_version(w); });
    const Leaf* l = leaf_of(lw);
    bool found = false;
    const unsigned pos = search(l, p, &found);
    std::uint64_t word = 0;
    bool readable = true;
    if (found) {
      const NodeOff off = node_offset(optimistic_read(l->nodes()[pos]));
      readable = node_in_pool(off);  // torn read of a changing leaf: validation fails anyway
      if (readable) word = optimistic_read(node_at(off)->value);
    }
    bool restart = false;
    l->h.lock.checkOrRestart(v, restart);
    if (restart || !readable) {
      olc_pause();
      continue;
    }
    if (!found) return Code::not_found;
    if (value != nullptr) {
      if (value->size() != 8) value->resize(8);  // no call once the caller's string holds 8 bytes
      std::memcpy(value->data(), &word, 8);
    }
    return Code::ok;
  }
}

// Batched lookups (Index::find_many), integer keys with inline values (the other modes pin and
// read records per key: one at a time). Three passes over the batch, each starting the loads
// of the next: InnerTree::descend_batch (it prefetches each leaf and reads its version a round
// later), the leaf searches (each prefetches its PM list node), then the value words and the
// leaf validations. A key whose descent or validation fails is looked up again alone by find.
template <class P>
void UTree<P>::find_batch(const std::string_view* keys, std::string* values, Code* codes,
                          std::size_t n) const {
  if (bytes_ || !values_.inline_values()) return Index::find_batch(keys, values, codes, n);
  static_assert(kFindBatch <= index_common::InnerTree::kMaxBatch);
  Probe p[kFindBatch];
  std::uint8_t at[kFindBatch];  // batch position of the j-th well-formed key
  const std::size_t live = index_common::compact_checked(
      keys, codes, n, [&](std::string_view k) { return keys_.check(k); },
      [&](std::string_view k) { return probe(k); }, p, at);
  std::pair<std::uint64_t, std::uint64_t> leaf[kFindBatch];
  std::uint64_t alone = inner_.descend_batch<kInnerKeys>(
      live, [&](std::size_t j) { return index_common::WordProbe{p[j].word}; },
      [&](std::uint64_t lw) { index_common::prefetch_lines(leaf_of(lw), node_size_); },
      [&](std::uint64_t lw) -> std::optional<std::uint64_t> {
        bool restart = false;
        const std::uint64_t v = leaf_of(lw)->h.lock.readLockOrRestart(restart);
        if (restart) return std::nullopt;
        return v;
      },
      leaf);
  NodeOff node[kFindBatch];  // 0: not found
  for (std::size_t j = 0; j < live; ++j) {
    if ((alone >> j & 1) != 0) continue;
    const Leaf* l = leaf_of(leaf[j].first);
    bool found = false;
    const unsigned pos = search(l, p[j], &found);
    node[j] = found ? node_offset(optimistic_read(l->nodes()[pos])) : 0;
    if (found && !node_in_pool(node[j])) alone |= std::uint64_t{1} << j;  // find sorts it out
    else if (found) index_common::prefetch_lines(&node_at(node[j])->value, 64);
  }
  for (std::size_t j = 0; j < live; ++j) {
    if ((alone >> j & 1) != 0) continue;
    const Leaf* l = leaf_of(leaf[j].first);
    const std::uint64_t word = node[j] != 0 ? optimistic_read(node_at(node[j])->value) : 0;
    bool restart = false;
    l->h.lock.checkOrRestart(leaf[j].second, restart);
    if (restart) {
      alone |= std::uint64_t{1} << j;
      continue;
    }
    const std::size_t i = at[j];
    codes[i] = node[j] != 0 ? Code::ok : Code::not_found;
    if (node[j] != 0 && values != nullptr) (void)values_.read(word, &values[i]);
  }
  for (; alone != 0; alone &= alone - 1) {
    const std::size_t i = at[std::countr_zero(alone)];
    codes[i] = find(keys[i], values != nullptr ? values + i : nullptr);
  }
}

// Leaf by leaf: node offsets and value words copied under the leaf's version, every node's
// line prefetched at once (one batch per leaf instead of one miss per next pointer), then
// validated; records named by validated words stay readable while pinned. The step to the
// next leaf couples versions: its version is read, then the current leaf's is checked again,
// so the next leaf is still the right neighbour (removing it locks this leaf, L1) and not a
// leaf reused elsewhere (L3). Any failure descends again from just after the last key out.
template <class P>
std::size_t UTree<P>::scan(std::string_view start, std::size_t max, ScanBuffer& out) const {
  out.clear();
  if (max == 0) return 0;
  Probe p = probe(start);
  bool after = false;      // skip an entry equal to p (a resumed scan)
  std::string resume;      // the last key out, which p names once resumed
  const auto guard = pin_for_records();
  struct Item {
    std::uint64_t key;    // key word (integer modes) or key record offset
    std::uint64_t value;  // value word
  };
  std::vector<Item> items;
  items.reserve(cap_);
  auto [lw, v] = descend_read(p);
  const Leaf* l = leaf_of(lw);
  for (;;) {
    items.clear();
    bool found = false;
    unsigned cnt = optimistic_read(l->h.count);
    if (cnt > cap_) cnt = 0;
    unsigned from = search(l, p, &found);
    if (after && found) ++from;
    const std::size_t want = std::min<std::size_t>(cnt - std::min(from, cnt), max - out.size());
    for (std::size_t i = 0; i < want; ++i) {
      const NodeOff off = node_offset(optimistic_read(l->nodes()[from + i]));
      if (node_in_pool(off)) index_common::prefetch_lines(node_at(off), node_bytes_);
    }
    bool bad = false;
    for (std::size_t i = 0; i < want && !bad; ++i) {
      const NodeOff off = node_offset(optimistic_read(l->nodes()[from + i]));
      if (!node_in_pool(off)) { bad = true; break; }
      const ListNode* n = node_at(off);
      items.push_back({bytes_ ? detail::load(n->key_record) : optimistic_read(l->keys()[from + i]),
                       detail::load(n->value)});
    }
    const Leaf* next = leaf_of(optimistic_read(l->h.next));
    bool restart = bad;
    l->h.lock.checkOrRestart(v, restart);
    if (!restart) {
      std::string value;
      for (const Item& it : items) {
        std::string_view key_view;
        std::string key_buf;
        if (bytes_) {
          if (!index_common::read_record(*pool_, it.key, keys_.max_key(), &key_view)) continue;
        } else {
          key_buf = encode_u64(it.key);
          key_view = key_buf;
        }
        if (!values_.read(it.value, &value)) continue;
        out.append(key_view, value);
      }
      if (out.size() >= max || next == nullptr) break;
      pm::yield_point("utree.scan_next");
      const std::uint64_t nv = next->h.lock.readLockOrRestart(restart);
      // L4: next is still l's right neighbour (not removed, not reused elsewhere)
      if constexpr (!P::kUncoupledScan) l->h.lock.checkOrRestart(v, restart);
      if (!restart) {
        l = next;
        v = nv;
        continue;
      }
    }
    // Descend again: from the start, or from just after the last key out.
    olc_pause();
    if (out.size() != 0) {
      resume.assign(out.key(out.size() - 1));
      p = probe(resume);
      after = true;
    }
    std::tie(lw, v) = descend_read(p);
    l = leaf_of(lw);
  }
  return out.size();
}

}  // namespace pmindex::utree

// APEX public operations: key checks, traversal, insert/update/upsert/find/remove/scan.
// Persistence steps (A<n>) are defined in PROTOCOL.md.
#include "index/apex/apex.h"
#include "index/common/prefetch.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <utility>

namespace pmindex::apex {

Apex::Apex(std::unique_ptr<pm::Pool> pool) : pool_(std::move(pool)), base_(pool_->base()) {
  kt_ = pool_->info().layout.key_mode;
  open_start_ = std::chrono::steady_clock::now();
}

Apex::~Apex() {
  if (walker_.joinable()) walker_.join();
  epochs_.drain();  // runs the pending deleters while the pool and the metas still exist
}

void Apex::note_answer() const {
  // relaxed flag: only the first answer's time matters; exchange elects one writer.
  if (!first_answer_.load(std::memory_order_relaxed) &&
      !first_answer_.exchange(true, std::memory_order_relaxed)) {
    first_answer_seconds_.store(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - open_start_).count(),
        std::memory_order_relaxed);
    // relaxed: a stale false only sends a lookup the general way.
    flat_find_.store(kt_ == KeyType::u64, std::memory_order_relaxed);
  }
}

std::uint64_t Apex::traverse(std::uint64_t key, std::vector<PathStep>* path) const {
  if (path != nullptr) path->clear();
  // acquire: child slots and the root word are published (release) after the node they
  // point at is written, so its header and model are visible here. The root offset was
  // checked by recover() (R1); every later root is one this session built.
  return walk_down(pm::load_acquire(&root_->root_node), key, path, 0);
}

std::uint64_t Apex::walk_down(std::uint64_t off, std::uint64_t key, std::vector<PathStep>* path,
                              std::size_t depth) const {
  // `off` is the root or a child of an admitted node, so its 64 B header lies in the heap
  // (inner_damage checked every child offset). An inner node is admitted (checked) once per
  // session, on first touch; after that the loop costs one compare of its L with the tag.
  for (;; ++depth) {
    const std::uint64_t tv = pm::load_acquire(pool_->at<std::uint64_t>(off));
    if (static_cast<NodeType>(tv & kTypeMask) != NodeType::inner) return off;  // meta_for checks
    if ((tv >> kVersionShift) != tag_ && !admit_inner(off)) return 0;
    if (depth >= kMaxDepth) {
      (void)damaged(off, "the path is deeper than kMaxDepth (a cycle of child offsets)");
      return 0;
    }
    const InnerNode* in = inner(off);
    const std::uint32_t slot = route(in, key);
    if (path != nullptr) path->push_back({off, slot});
    off = pm::load_acquire(&in->children()[slot]);
  }
}

DataMeta* Apex::leaf(std::uint64_t key, std::uint64_t* off, std::vector<PathStep>* path) const {
  *off = traverse(key, path);
  DataMeta* m = *off != 0 ? meta_for(*off) : nullptr;
  if (m == nullptr) return nullptr;
  // A sound tree routes a key from the root only to the node whose range holds it (a replaced
  // node keeps its range), so a miss here is a child offset pointing at the wrong node. Two
  // compares on the header line the model is read from.
  const DataNode* dn = data(*off);
  if (key < dn->lo || key > dn->hi) {
    (void)damaged(*off, "a key is routed to a data node whose range does not hold it");
    return nullptr;
  }
  return m;
}

Code Apex::damaged(std::uint64_t off, std::string_view what) const {
  std::lock_guard<sync::SpinLock> lock(damage_mu_);
  if (damage_.ok())
    damage_ = pool_->error(Code::corrupted,
                           "apex node at offset " + std::to_string(off) + ": " + std::string(what));
  corrupted_.store(true, std::memory_order_relaxed);  // relaxed: see refusing_writes()
  return Code::corrupted;
}

std::uint64_t Apex::descend(std::uint64_t key, std::vector<PathStep>& path) const {
  // The deepest inner node of the cursor's path whose range holds `key`. The path may be
  // stale (a node replaced since): the caller checks the data node it reaches (range and
  // lock obsolescence) and falls back to traverse().
  while (!path.empty()) {
    const InnerNode* in = inner(path.back().inner);
    if (key >= in->lo && key <= in->hi) break;
    path.pop_back();
  }
  if (path.empty()) return traverse(key, &path);
  const std::uint64_t off = path.back().inner;
  path.pop_back();
  return walk_down(off, key, &path, path.size());
}

Index::ThreadScope Apex::attach_thread() {
  auto participant = std::make_shared<sync::EpochManager::Participant>(epochs_.attach());
  return ThreadScope([participant]() mutable { participant.reset(); });
}

Code Apex::insert(std::string_view key, std::string_view value) {
  std::uint64_t k = 0;
  if (Code c = check_key(key, &k); c != Code::ok) return c;
  if (value.size() != 8) return value.size() > 8 ? Code::value_too_large : Code::invalid_argument;
  std::uint64_t payload = 0;
  std::memcpy(&payload, value.data(), 8);
  if (refusing_writes()) return Code::corrupted;
  const AnswerNote answered{this};  // records the time when this answer is complete
  for (;;) {
    {
      const auto guard = epochs_.pin();
      std::uint64_t off = 0;
      DataMeta* mp = leaf_fast(k, &off);
      if (mp == nullptr) return Code::corrupted;
      DataMeta& m = *mp;
      const DataNode* dn = data(off);
      const LockSpan span = lock_span(m, k);
      if (!lock_window(m, span)) continue;  // replaced by an SMO: restart from the root
      if (locate(off, m, k, /*use_pa_fp=*/true, span.p).rec != nullptr) {
        unlock_window(m, span);
        return Code::already_present;
      }
      if (!needs_smo(dn, m)) {
        const Code c = insert_into(off, m, k, payload, span.p);
        unlock_window(m, span);
        return count_insert(c);
      }
      unlock_window(m, span);
    }
    // The node is too dense or its inserts cost too much: an SMO (holding no lock now; it
    // locks top-down).
    const Code c = smo_locked(k, /*contract=*/false);
    if (c != Code::ok) return c;
  }
}

bool Apex::needs_smo(const DataNode* dn, const DataMeta& m) const {
  if (m.keys() + 1 < m.smo_retry_at.load(std::memory_order_relaxed)) return false;
  const double capacity = static_cast<double>(dn->pa_slots + dn->sa_slots);
  return static_cast<double>(m.keys() + 1) > kDensityUpper * capacity || cost_drifted(m);
}

bool Apex::cost_drifted(const DataMeta& m) const {
  // Cost deviation (PROTOCOL.md "SMO policy"): the empirical insert cost of the inserts since
  // the node was built — their probe-and-stash cost 1 + 2·(share that went to the stash) plus
  // the overflow buckets and extended stash blocks they allocated per insert — against the
  // node's cost when built. Needs max(kDriftMinInserts, built keys / 8) inserts first.
  const std::uint64_t n = m.ins_total.load(std::memory_order_relaxed);
  if (n < std::max(kDriftMinInserts, m.built_keys / 8)) return false;
  const double stash = static_cast<double>(m.ins_stash.load(std::memory_order_relaxed));
  const double allocs = static_cast<double>(m.ins_allocs.load(std::memory_order_relaxed));
  const double cost = 1.0 + (2.0 * stash + allocs) / static_cast<double>(n);
  return cost > std::max(kCostDeviation * m.created_cost, kDriftCostFloor);
}

bool Apex::too_sparse(const DataNode* dn, const DataMeta& m) const {
  // Below the lower density bound (and below the key count of the last failed attempt, so a
  // node that can neither merge nor shrink is not retried at every delete).
  const std::uint64_t capacity = std::uint64_t{dn->pa_slots} + dn->sa_slots;
  return static_cast<double>(m.keys()) < kDensityLower * static_cast<double>(capacity) &&
         m.keys() < m.contract_below.load(std::memory_order_relaxed);
}

Code Apex::smo_locked(std::uint64_t k, bool contract) {
  std::shared_lock<sync::SharedSpinLock> global(smo_mu_);
  const auto guard = epochs_.pin();
  bool parent_exclusive = false;
  std::vector<PathStep> path;
  for (;;) {
    std::uint64_t off = 0;
    if (leaf(k, &off, &path) == nullptr) return Code::corrupted;
    const std::uint64_t parent = path.back().inner;
    // Grandparent (or the root word's lock) shared: its slot of the parent stays put.
    std::shared_lock<sync::SharedSpinLock> gp_lock;
    if (path.size() >= 2) {
      InnerMeta& g = *inner_meta_for(path[path.size() - 2].inner);  // admitted by traverse
      gp_lock = std::shared_lock<sync::SharedSpinLock>(g.mu);
      if (g.obsolete || pm::load_acquire(&inner(path[path.size() - 2].inner)
                                              ->children()[path[path.size() - 2].slot]) != parent)
        continue;
    } else {
      gp_lock = std::shared_lock<sync::SharedSpinLock>(root_mu_);
      if (pm::load_acquire(&root_->root_node) != parent) continue;
    }
    // Parent: shared to switch this child's slots, exclusive to replace the parent.
    InnerMeta& pmeta = *inner_meta_for(parent);  // admitted by traverse
    std::shared_lock<sync::SharedSpinLock> p_shared;
    std::unique_lock<sync::SharedSpinLock> p_excl;
    if (parent_exclusive) {
      p_excl = std::unique_lock<sync::SharedSpinLock>(pmeta.mu);
    } else {
      p_shared = std::shared_lock<sync::SharedSpinLock>(pmeta.mu);
    }
    if (pmeta.obsolete || pm::load_acquire(&inner(parent)->children()[path.back().slot]) != off)
      continue;
    DataMeta& m = *meta_for(off);  // built by leaf()
    std::unique_lock<sync::SpinLock> node_smo(m.smo_mu);
    if (m.retired || !lock_all(m)) continue;
    const DataNode* dn = data(off);
    if (contract ? !too_sparse(dn, m) : !needs_smo(dn, m)) {
      unlock_window(m, {0, m.num_locks - 1});
      return Code::ok;  // another thread already did it
    }
    bool parent_replaced = false;
    Code c = Code::ok;
    if (contract) {
      c = contract_locked(off, m, path, parent_exclusive, k);
    } else {
      c = smo(off, path, k, parent_exclusive, &parent_replaced);
    }
    const bool node_replaced = c == Code::ok && !parent_replaced;
    if (node_replaced) {
      // The data node is unlinked: everyone who reaches it from now on restarts.
      m.retired = true;
      for (std::uint32_t i = 0; i < m.num_locks; ++i) m.locks[i].writeUnlockObsolete();
      node_smo.unlock();
      retire_node(off);  // A18
      if (!contract) return Code::ok;
      // The new node may still be sparse (an emptied pair merges into an empty node): go on
      // merging it, so the empty nodes of a parent end as one node, which then collapses the
      // parent, and so on upwards (each round removes a node; too_sparse ends it).
      parent_exclusive = false;
      continue;
    }
    unlock_window(m, {0, m.num_locks - 1});
    if (c == Code::busy) {  // wants to replace the parent: retry holding it exclusively
      parent_exclusive = true;
      continue;
    }
    if (contract) return Code::ok;  // nothing to merge or shrink (or no space): fine
    if (c == Code::ok) {  // inner expansion: the parent was replaced
      pmeta.obsolete = true;
      return Code::ok;
    }
    if (c == Code::unsupported) {
      // No SMO possible (keys the models cannot separate): stash records for a while.
      m.smo_retry_at.store(m.keys() + m.keys() / 4 + 16, std::memory_order_relaxed);
      return Code::ok;
    }
    return c;
  }
}

Code Apex::update(std::string_view key, std::string_view value) {
  std::uint64_t k = 0;
  if (Code c = check_key(key, &k); c != Code::ok) return c;
  if (value.size() != 8) return value.size() > 8 ? Code::value_too_large : Code::invalid_argument;
  std::uint64_t payload = 0;
  std::memcpy(&payload, value.data(), 8);
  if (refusing_writes()) return Code::corrupted;
  const AnswerNote answered{this};  // records the time when this answer is complete
  const auto guard = epochs_.pin();
  for (;;) {
    std::uint64_t off = 0;
    DataMeta* mp = leaf_fast(k, &off);
    if (mp == nullptr) return Code::corrupted;
    DataMeta& m = *mp;
    const LockSpan span = lock_span(m, k);
    if (!lock_window(m, span)) continue;
    const Location loc = locate(off, m, k, true, span.p);
    Code c = Code::not_found;
    if (loc.rec != nullptr) {
      pm::publish(&loc.rec->payload, payload);                // A10: payload in place
      pm::persist(&loc.rec->payload, sizeof payload);         // A11: one flush + fence
      c = Code::ok;
    }
    unlock_window(m, span);
    return c;
  }
}

// The lookup hot path (issue 16), built as a leaf function: no call in its common case, so
// it saves no registers and its instructions are few, which lets the core overlap more
// consecutive lookups' misses. For 8-byte unsigned keys: an inline key decode, a flat epoch
// pin (EpochManager::try_pin_flat), the descent through DRAM state only (descend<true,
// false>: no key-type test per level, no resolution), one model prediction, the version of
// the record lock covering the probe window (two locks only when the window crosses a
// 256-record block), a plain probe of PA[p, p+D) — lookups skip the fingerprints (§4.2) — and
// a miss is an answer when the window's group has no overflow bucket. Everything else (other
// key types, an unresolved slot, a held lock, a replaced node, the stash, items pending at
// unpin, a buffer to size) leaves through a cold tail call: find_unpin_any pins again
// and runs the general loop (find_pinned). The answers before the first one is noted
// (recovery_stats's time to first answer) also go to find_any, which notes it.
Code Apex::find(std::string_view key, std::string* value) const {
  // relaxed: as note_answer; a stale false only sends this lookup the noting way.
  if (key.size() != 8 || !flat_find_.load(std::memory_order_relaxed)) [[unlikely]] {
    return find_any(key, value);
  }
  std::uint64_t be;
  std::memcpy(&be, key.data(), 8);
  const std::uint64_t k = __builtin_bswap64(be);  // the big-endian encoding (encode_u64)
  const sync::EpochManager::FlatPin pin = epochs_.try_pin_flat();
  if (!pin) [[unlikely]] return find_any(key, value);
  const DataMeta* mp = descend<true, false>(k);
  if (mp == nullptr) [[unlikely]] return find_unpin_any(pin, k, value);
  const DataMeta& m = *mp;
  const std::uint32_t p = search_slot(m.model, x_of<true>(k, m.model.lo));
  // No prefetch of PA[p] here (lock_span has one): the probe's loads do not depend on the
  // lock word's value, only on a predicted branch, so the core issues them alongside it.
  const Record* pa = m.pa;
  const std::uint32_t end = std::min(p + kProbeDistance, m.model.slots);
  const std::uint32_t first = p / 256, last = (end - 1) / 256;
  bool restart = false;
  const std::uint64_t v1 = m.locks[first].tryReadLockOrRestart(restart);
  std::uint64_t v2 = v1;
  if (last != first) [[unlikely]] v2 = m.locks[last].tryReadLockOrRestart(restart);
  if (restart) [[unlikely]] return find_unpin_any(pin, k, value);  // a writer, or replaced
  // A pointer walk (no index arithmetic per slot): end > p, since p < slots.
  const Record* rec = pa + p;
  const Record* const stop = pa + end;
  while (sync::optimistic_read(rec->key) != k) {
    if (++rec == stop) {
      // The stash holds the key only if the group's overflow bucket exists (find_stash).
      if (m.bucket(p / kGroup) != nullptr) [[unlikely]] return find_unpin_any(pin, k, value);
      rec = nullptr;
      break;
    }
  }
  const std::uint64_t payload = rec != nullptr ? sync::optimistic_read(rec->payload) : 0;
  m.locks[first].checkOrRestart(v1, restart);
  if (last != first) [[unlikely]] m.locks[last].checkOrRestart(v2, restart);
  if (restart) [[unlikely]] return find_unpin_any(pin, k, value);  // a writer ran
  const Code c = rec != nullptr ? Code::ok : Code::not_found;
  if (epochs_.unpin_flat(pin)) [[unlikely]] return find_unpin_pending(pin, c, payload, value);
  if (c != Code::ok || value == nullptr) return c;
  if (value->size() != 8) [[unlikely]] return store_payload(payload, value);
  std::memcpy(value->data(), &payload, 8);  // straight into the caller's buffer
  return Code::ok;
}

Code Apex::find_unpin_any(sync::EpochManager::FlatPin pin, std::uint64_t k,
                          std::string* value) const {
  if (epochs_.unpin_flat(pin)) epochs_.after_unpin_flat(pin);
  const auto guard = epochs_.pin();  // the first answer is noted already (flat_find_)
  return find_pinned(k, value);
}

Code Apex::find_unpin_pending(sync::EpochManager::FlatPin pin, Code c, std::uint64_t payload,
                              std::string* value) const {
  epochs_.after_unpin_flat(pin);
  if (c != Code::ok || value == nullptr) return c;
  return store_payload(payload, value);
}

Code Apex::store_payload(std::uint64_t payload, std::string* value) {
  value->resize(8);
  std::memcpy(value->data(), &payload, 8);
  return Code::ok;
}

// find for any key (an f64 key, a key of the wrong size, any key before the first answer):
// check_key, then the general loop.
Code Apex::find_any(std::string_view key, std::string* value) const {
  std::uint64_t k = 0;
  if (Code c = check_key(key, &k); c != Code::ok) return c;
  const AnswerNote answered{this};  // records the time when this answer is complete
  const auto guard = epochs_.pin();
  return find_pinned(k, value);
}

Code Apex::find_pinned(std::uint64_t k, std::string* value) const {
  for (;;) {
    std::uint64_t off = 0;
    const DataMeta* mp = leaf_fast(k, &off);
    if (mp == nullptr) [[unlikely]] return Code::corrupted;
    const DataMeta& m = *mp;
    const LockSpan span = lock_span(m, k);
    bool restart = false;
    const std::uint64_t v1 = m.locks[span.first].readLockOrRestart(restart);
    const std::uint64_t v2 =
        span.last != span.first ? m.locks[span.last].readLockOrRestart(restart) : v1;
    if (restart) continue;  // obsolete: the node was replaced, restart from the root
    const Record* rec = nullptr;
    const Record* pa = m.pa;
    const std::uint32_t end = std::min(span.p + kProbeDistance, m.model.slots);
    for (std::uint32_t i = span.p; i < end; ++i) {
      if (sync::optimistic_read(pa[i].key) == k) {
        rec = &pa[i];
        break;
      }
    }
    if (rec == nullptr) rec = find_stash(m, k, span.p);
    const std::uint64_t payload = rec != nullptr ? sync::optimistic_read(rec->payload) : 0;
    m.locks[span.first].checkOrRestart(v1, restart);
    if (span.last != span.first) m.locks[span.last].checkOrRestart(v2, restart);
    if (restart) continue;
    if (rec == nullptr) return Code::not_found;
    if (value != nullptr) {
      if (value->size() != 8) value->resize(8);
      std::memcpy(value->data(), &payload, 8);
    }
    return Code::ok;
  }
}

inline bool Apex::probe_window(const DataMeta& dm, const LockSpan& span, std::uint64_t key,
                               const Record** rec, std::uint64_t* payload) const {
  bool restart = false;
  const std::uint64_t v1 = dm.locks[span.first].readLockOrRestart(restart);
  const std::uint64_t v2 =
      span.last != span.first ? dm.locks[span.last].readLockOrRestart(restart) : v1;
  const Record* r = nullptr;
  if (!restart) {
    const std::uint32_t end = std::min(span.p + kProbeDistance, dm.model.slots);
    for (std::uint32_t s = span.p; s < end && r == nullptr; ++s)
      if (sync::optimistic_read(dm.pa[s].key) == key) r = &dm.pa[s];
    if (r == nullptr) r = find_stash(dm, key, span.p);
  }
  *payload = r != nullptr ? sync::optimistic_read(r->payload) : 0;
  dm.locks[span.first].checkOrRestart(v1, restart);
  if (span.last != span.first) dm.locks[span.last].checkOrRestart(v2, restart);
  *rec = r;
  return !restart;
}

// Batched lookups (Index::find_many): find's steps for every key of the batch, as a small
// state machine per key advanced round-robin. Each step ends by prefetching what the key's
// next step reads (an inner node's DRAM state, its child slot, the data node's DataMeta, its
// record locks and predicted PA lines), and the other keys' steps run while those lines come.
// The fast path only: a key that meets an unresolved slot, a range it is not in, a depth
// beyond kMaxDepth or a failed validation is looked up again alone by find, which handles
// all of them.
void Apex::find_batch(const std::string_view* keys, std::string* values, Code* codes,
                      std::size_t n) const {
  enum class Step : std::uint8_t { inner, child, data, probe };
  struct Cursor {
    Step step;
    std::uint32_t depth;
    std::uint32_t slot;           // child: the slot of `im` routed to
    const void* node;             // inner/child: the InnerMeta; data/probe: the DataMeta
    LockSpan span;                // probe
    std::uint64_t key;
  };
  static_assert(kFindBatch <= 64);  // masks of one word
  Cursor cur[kFindBatch];
  std::uint64_t live = 0, alone = 0;
  for (std::size_t i = 0; i < n; ++i) {
    codes[i] = check_key(keys[i], &cur[i].key);
    if (codes[i] == Code::ok) live |= std::uint64_t{1} << i;
  }
  if (live == 0) return;
  const AnswerNote answered{this};  // records the time when this answer is complete
  const auto guard = epochs_.pin();
  // acquire: pairs with the release stores of resolve_root / resolve_child (as leaf_fast).
  const InnerMeta* root = root_meta_.load(std::memory_order_acquire);
  if (root == nullptr) root = resolve_root();
  if (root == nullptr) alone = std::exchange(live, 0);  // find reports the damage
  for (std::uint64_t m = live; m != 0; m &= m - 1) {
    Cursor& c = cur[std::countr_zero(m)];
    c.step = Step::inner;
    c.depth = 0;
    c.node = root;
  }
  while (live != 0) {
    for (std::uint64_t m = live; m != 0; m &= m - 1) {
      const auto i = static_cast<std::size_t>(std::countr_zero(m));
      Cursor& c = cur[i];
      bool give_up = false, done = false;
      switch (c.step) {
        case Step::inner: {  // route; the child slot is read next round
          const auto* im = static_cast<const InnerMeta*>(c.node);
          c.slot = search_slot(im->model, x_of(c.key, im->model.lo));
          index_common::prefetch_lines(&im->child[c.slot], 64);
          c.step = Step::child;
          break;
        }
        case Step::child: {
          const auto* im = static_cast<const InnerMeta*>(c.node);
          // acquire: as leaf_fast (fully built states).
          const std::uintptr_t ch = im->child[c.slot].load(std::memory_order_acquire);
          if (ch == 0 || ++c.depth >= kMaxDepth) {
            give_up = true;
          } else if ((ch & kInnerTag) != 0) {
            c.node = reinterpret_cast<const InnerMeta*>(ch & ~kInnerTag);
            index_common::prefetch_lines(c.node, 64);
            c.step = Step::inner;
          } else {
            c.node = reinterpret_cast<const DataMeta*>(ch);
            index_common::prefetch_lines(c.node, 64);  // model, range, PA address
            c.step = Step::data;
          }
          break;
        }
        case Step::data: {  // predict (lock_span prefetches the PA lines), then the locks
          const auto* dm = static_cast<const DataMeta*>(c.node);
          if (c.key < dm->model.lo || c.key > dm->hi) {
            give_up = true;
            break;
          }
          c.span = lock_span(*dm, c.key);
          index_common::prefetch_lines(&dm->locks[c.span.first], 64);
          index_common::prefetch_lines(&dm->locks[c.span.last], 64);
          c.step = Step::probe;
          break;
        }
        case Step::probe: {  // find's body, once
          const Record* rec = nullptr;
          std::uint64_t payload = 0;
          if (!probe_window(*static_cast<const DataMeta*>(c.node), c.span, c.key, &rec, &payload)) {
            give_up = true;
            break;
          }
          codes[i] = rec != nullptr ? Code::ok : Code::not_found;
          if (rec != nullptr && values != nullptr) {
            if (values[i].size() != 8) values[i].resize(8);
            std::memcpy(values[i].data(), &payload, 8);
          }
          done = true;
          break;
        }
      }
      if (give_up) alone |= std::uint64_t{1} << i;
      if (give_up || done) live &= ~(std::uint64_t{1} << i);
    }
  }
  for (; alone != 0; alone &= alone - 1) {
    const auto i = static_cast<std::size_t>(std::countr_zero(alone));
    codes[i] = find(keys[i], values != nullptr ? values + i : nullptr);
  }
}

Code Apex::remove(std::string_view key) {
  std::uint64_t k = 0;
  if (Code c = check_key(key, &k); c != Code::ok) return c;
  if (refusing_writes()) return Code::corrupted;
  const AnswerNote answered{this};  // records the time when this answer is complete
  const auto guard = epochs_.pin();
  for (;;) {
    std::uint64_t off = 0;
    DataMeta* mp = leaf_fast(k, &off);
    if (mp == nullptr) return Code::corrupted;
    DataMeta& m = *mp;
    const LockSpan span = lock_span(m, k);
    if (!lock_window(m, span)) continue;
    const Location loc = locate(off, m, k, true, span.p);
    if (loc.rec != nullptr) erase_at(off, m, loc, k);
    unlock_window(m, span);
    if (loc.rec == nullptr) return Code::not_found;
    // Below the lower density bound: contract the node (an expand_data SMO to a smaller size,
    // same hybrid-logged protocol). Its failure (pool full) does not undo the delete.
    if (too_sparse(data(off), m)) (void)smo_locked(k, /*contract=*/true);
    return count_remove(Code::ok);
  }
}

// One data node's part of a scan (see scan below): PA from the prediction of `cur` until it
// holds `need` records, D-1 slots more, and the stash records of the groups passed, each slot
// read under the version of its record lock; the snapshot is retried until the versions hold.
bool Apex::scan_node(const DataNode* dn, const DataMeta& m, std::uint64_t cur, std::size_t need,
                     std::vector<Record>& recs,
                     std::vector<std::pair<std::uint32_t, std::uint64_t>>& versions,
                     std::uint64_t* cutoff) const {
  const std::uint64_t inv = dn->invalid_key;
  bool restart = false, obsolete = false;
  auto version_of = [&](std::uint32_t slot) {
    const std::uint32_t l = slot / 256;
    if (versions.empty() || versions.back().first < l) {
      for (std::uint32_t x = versions.empty() ? l : versions.back().first + 1; x <= l; ++x) {
        bool r = false;
        versions.push_back({x, m.locks[x].readLockOrRestart(r)});
        if (r) obsolete = true;
      }
    }
  };
  do {
    restart = false;
    obsolete = false;
    versions.clear();
    recs.clear();
    const std::uint32_t p = predict(dn, cur);
    std::uint32_t i = p;
    std::size_t got = 0;
    std::uint64_t max_key = 0;
    for (; i < dn->pa_slots && got < need; ++i) {
      version_of(i);
      const Record& r = dn->pa()[i];
      const std::uint64_t key = sync::optimistic_read(r.key);
      if (key != inv && key >= cur) {
        recs.push_back({key, sync::optimistic_read(r.payload)});
        ++got;
        max_key = std::max(max_key, key);
      }
    }
    // PA[p..j] (j = i-1) holds `need` records: take D-1 more slots, and keys up to the largest.
    const std::uint32_t j = i == 0 ? 0 : i - 1;
    if (i < dn->pa_slots) {
      *cutoff = max_key;
      const std::uint32_t end = std::min(i + kProbeDistance - 1, dn->pa_slots);
      for (; i < end; ++i) {
        version_of(i);
        const Record& r = dn->pa()[i];
        const std::uint64_t key = sync::optimistic_read(r.key);
        if (key != inv && key >= cur && key <= *cutoff)
          recs.push_back({key, sync::optimistic_read(r.payload)});
      }
    } else {
      *cutoff = ~std::uint64_t{0};
    }
    for (std::uint32_t g = p / kGroup; g <= j / kGroup && !obsolete; ++g) {
      version_of(g * kGroup);
      std::uint32_t chain = 0;
      for (const OverflowBucket* b = m.bucket(g); b != nullptr && chain++ < (1u << 20);
           b = sync::optimistic_read(b->next)) {
        for (const std::uint64_t& slot : b->entry) {
          const std::uint64_t e = sync::optimistic_read(slot);
          if (e == 0) continue;
          const Record* r = pool_->at<Record>(e & kOffsetMask);
          const std::uint64_t key = sync::optimistic_read(r->key);
          if (key != inv && key >= cur && key <= *cutoff)
            recs.push_back({key, sync::optimistic_read(r->payload)});
        }
      }
    }
    for (const auto& [l, v] : versions) m.locks[l].checkOrRestart(v, restart);
  } while (restart && !obsolete);
  return !obsolete;
}

// Range scan (paper §4.1): in each data node, collect PA[p..j+D-1] where p predicts the scan's
// current key and PA[p..j] holds enough records, plus the stash records indexed by the overflow
// buckets of groups p/16..j/16; sort only that. Every key <= the largest key of PA[p..j] is then
// present (PA records sit at most D-1 slots right of their prediction, stash records are in
// the bucket of their predicted group, predictions are monotone). The cursor keeps the
// root-to-leaf path and resumes at the deepest inner node holding the next key (no re-descent
// from the root; see PROTOCOL.md "Scans").
std::size_t Apex::scan(std::string_view start, std::size_t max, ScanBuffer& out) const {
  out.clear();
  // Any 8 bytes bound a scan (even a NaN encoding, which sorts outside every double).
  if (start.size() != 8 || max == 0) return 0;
  const std::uint64_t k = decode_u64(start);
  const AnswerNote answered{this};  // records the time when this answer is complete
  const auto guard = epochs_.pin();
  std::vector<Record> recs;
  std::vector<std::pair<std::uint32_t, std::uint64_t>> versions;  // (lock, version)
  std::vector<PathStep> path;
  std::uint64_t cur = k;
  bool fresh = true;  // path must be rebuilt from the root
  for (;;) {
    const bool from_root = fresh;
    const std::uint64_t off = fresh ? traverse(cur, &path) : descend(cur, path);
    fresh = false;
    const DataMeta* mp = off != 0 ? meta_for(off) : nullptr;
    if (mp == nullptr) {  // damaged (recorded): scan has no code to answer, so it returns none
      out.clear();
      return 0;
    }
    const DataNode* dn = data(off);
    if (cur < dn->lo || cur > dn->hi) {
      if (from_root) {  // see leaf(): a sound tree never routes there from the root
        (void)damaged(off, "a key is routed to a data node whose range does not hold it");
        out.clear();
        return 0;
      }
      fresh = true;  // a stale cursor: not the node holding cur
      continue;
    }
    std::uint64_t cutoff = ~std::uint64_t{0};
    if (!scan_node(dn, *mp, cur, max - out.size(), recs, versions, &cutoff)) {
      fresh = true;  // obsolete: re-descend
      continue;
    }
    std::sort(recs.begin(), recs.end(),
              [](const Record& a, const Record& b) { return a.key < b.key; });
    for (const Record& r : recs) {
      if (out.size() >= max) break;
      const std::string kb = encode_u64(r.key);
      out.append(kb, {reinterpret_cast<const char*>(&r.payload), 8});
    }
    if (out.size() >= max) break;
    if (cutoff != ~std::uint64_t{0}) {
      // Fewer than `need` in range after all (duplicates filtered): continue past the cutoff.
      cur = cutoff + 1;
      continue;
    }
    if (dn->hi == ~std::uint64_t{0}) break;
    cur = dn->hi + 1;
  }
  return out.size();
}

Record* Apex::debug_record(std::string_view key) {
  std::uint64_t k = 0;
  if (check_key(key, &k) != Code::ok) return nullptr;
  std::unique_lock<sync::SharedSpinLock> global(smo_mu_);
  std::uint64_t off = 0;
  const DataMeta* m = leaf(k, &off, nullptr);
  return m != nullptr ? locate(off, *m, k, false).rec : nullptr;
}

DataNode* Apex::debug_data_node(std::string_view key) {
  std::uint64_t k = 0;
  if (check_key(key, &k) != Code::ok) return nullptr;
  std::unique_lock<sync::SharedSpinLock> global(smo_mu_);
  const std::uint64_t off = traverse(k, nullptr);
  return off != 0 ? data(off) : nullptr;
}

RecoveryStats Apex::recovery_stats() const {
  std::unique_lock<sync::SharedSpinLock> global(smo_mu_);
  RecoveryStats r = recovery_;
  if (first_answer_.load(std::memory_order_relaxed))
    r.seconds = first_answer_seconds_.load(std::memory_order_relaxed);
  return r;
}

Footprint Apex::footprint() const {
  Footprint f;
  std::unique_lock<sync::SharedSpinLock> global(smo_mu_);
  epochs_.drain();  // quiescent by contract: retired nodes are freed before counting
  const auto s = pool_->allocator().stats();
  f.pm_bytes = s.bytes_in_use;
  f.pm_reserved = s.bytes_reserved;
  std::lock_guard<sync::SpinLock> metas(metas_mu_);
  for (const auto& [off, im] : inner_metas_)  // the InnerMeta and its child shadow
    f.dram_bytes += sizeof(InnerMeta) + 8ull * im->model.slots;
  for (const auto& [off, m] : metas_) {
    f.dram_bytes += sizeof(DataMeta) + m->accel.size() * sizeof(Accelerator) +
                    m->stash_used.size() * 8 + m->ext.size() * sizeof(ExtInfo);
    for (const Accelerator& a : m->accel) {
      for (auto* b = reinterpret_cast<const OverflowBucket*>(a.word >> kBucketShift); b != nullptr;
           b = b->next)
        f.dram_bytes += sizeof(OverflowBucket);
    }
  }
  return f;
}

Status Apex::close() {
  wait_recovery_walk();
  std::unique_lock<sync::SharedSpinLock> global(smo_mu_);
  epochs_.drain();
  if (!walk_status_.ok()) return walk_status_;
  if (refusing_writes()) {  // not marked clean: the next open recovers (and checks) again
    std::lock_guard<sync::SpinLock> lock(damage_mu_);
    return damage_;
  }
  if (!closed_) {
    // The counts let the next open see a tree that lost nodes or records (one read-only walk).
    std::uint64_t records = 0, nodes = 0;
    std::unordered_set<std::uint64_t> seen;
    if (!count_tree(root_->root_node, 0, seen, &records, &nodes)) records = nodes = pm::kNoCount;
    pool_->close_clean(records, nodes);
    closed_ = true;
  }
  return Status::Ok();
}

}  // namespace pmindex::apex

// NBTree structural modification: the three-phase SMO (copy, sync, link; steps S1..S14),
// sync of one slot (shared by the sync phase, sync-on-write and sync-on-read) and the inner
// nodes (N1..N3). See PROTOCOL.md.
#include <algorithm>
#include <thread>

#include "index/nbtree/nbtree.h"

namespace pmindex::nbtree {

namespace {
inline void full_fence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void spin_pause(const char* tag) {
  pm::yield_point(tag);
  std::this_thread::yield();
}

// N1: seqlock writer side (inner_mu_ held). The version is odd while the node changes.
class InnerWrite {
 public:
  explicit InnerWrite(Inner* n) : n_(n), v_(n->version.load(std::memory_order_relaxed)) {
    n_->version.store(v_ + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
  }
  ~InnerWrite() { n_->version.store(v_ + 2, std::memory_order_release); }
  InnerWrite(const InnerWrite&) = delete;
  InnerWrite& operator=(const InnerWrite&) = delete;

 private:
  Inner* n_;
  std::uint64_t v_;
};
}  // namespace

// --- pool allocation (alloc_mu_, see nbtree.h) ---------------------------------------------------

std::uint64_t NBTree::pm_allocate(std::size_t bytes, Code* code) {
  std::lock_guard<sync::SpinLock> lock(alloc_mu_);
  return pool_->allocator().allocate(bytes, code);
}

void NBTree::pm_free(std::uint64_t off, std::size_t bytes) {
  std::lock_guard<sync::SpinLock> lock(alloc_mu_);
  pool_->allocator().deallocate(off, bytes);
}

// --- new leaves -------------------------------------------------------------------------------------

Leaf* NBTree::new_leaf(std::uint64_t low, std::uint64_t high, Code* code) {
  const std::uint64_t off = pm_allocate(node_size_, code);
  if (off == 0) return nullptr;
  pm::zero(pool_->at<char>(off), node_size_);  // the allocator does not zero (S2)
  auto* leaf = make_dram<Leaf>();
  leaf->data_off = off;
  leaf->low = low;
  leaf->high = high;
  return leaf;
}

void NBTree::destroy_unpublished(SmoDesc* d) {
  for (int i = 0; i < d->count; ++i) {
    pm_free(d->leaves[i]->data_off, node_size_);
    drop_dram(d->leaves[i]);
  }
  // Bytes mode: the split bound was made for this copy and never published (S3 lost).
  if (bytes_ && d->split != 0) seps_.retire(d->split, epochs_);
  delete d;
}

// S2: copy the live committed entries into one new leaf, or two split at the median when
// more than half the capacity is live. Every copied value carries copy_bit. The new blocks
// are zeroed, filled and persisted before copy_ptr can publish them (S3). Bytes mode: a copy
// names the same key record as the old slot (the record is shared, never copied; the old
// block's retirement frees no record, E1), sorted by the record bytes (memcmp), and the split
// bound is a new SeparatorStore copy of the right leaf's smallest key.
SmoDesc* NBTree::copy_phase(Leaf* leaf) {
  struct Rec {
    std::uint64_t key, word;
    int slot;
    std::string_view bytes;  // bytes mode: the key record's bytes (the thread is pinned)
  };
  std::vector<Rec> recs;
  recs.reserve(kMaxSlots);
  const std::uint64_t b = leaf->bitmap.load(std::memory_order_acquire) & ~Leaf::kSmoBit;
  const Entry* e = entries(leaf);
  for (std::uint64_t bits = b; bits != 0; bits &= bits - 1) {
    const int i = __builtin_ctzll(bits);
    const std::uint64_t k1 = pm::load_acquire(&e[i].key);
    const std::uint64_t w = pm::load_acquire(&e[i].value);
    const std::uint64_t k2 = pm::load_acquire(&e[i].key);
    if (k1 == 0 || k1 != k2) continue;  // deleted: nothing to copy
    recs.push_back({k1, w, i, bytes_ ? probe_of_word(k1).bytes : std::string_view()});
  }
  if (bytes_) {
    std::sort(recs.begin(), recs.end(),
              [](const Rec& a, const Rec& c) { return a.bytes < c.bytes; });
  } else {
    std::sort(recs.begin(), recs.end(), [](const Rec& a, const Rec& c) { return a.key < c.key; });
  }
  auto* d = new SmoDesc;
  std::fill(std::begin(d->map_leaf), std::end(d->map_leaf), 0xff);
  std::fill(std::begin(d->map_slot), std::end(d->map_slot), 0xff);
  const bool two = static_cast<int>(recs.size()) > cap_ / 2 && recs.size() >= 2;
  d->count = two ? 2 : 1;
  std::size_t cut = recs.size();
  if (two) {
    cut = recs.size() / 2;
    d->split = make_bound(recs[cut].bytes, recs[cut].key);
  }
  Code code = Code::ok;
  for (int li = 0; li < d->count; ++li) {
    const std::uint64_t low = li == 0 ? leaf->low : d->split;
    const std::uint64_t high = (two && li == 0) ? high_before(d->split) : leaf->high;
    Leaf* n = new_leaf(low, high, &code);
    if (n == nullptr) {
      d->count = li;
      destroy_unpublished(d);
      return nullptr;
    }
    d->leaves[li] = n;
  }
  for (int li = 0; li < d->count; ++li) {
    Leaf* n = d->leaves[li];
    Entry* ne = entries(n);
    const std::size_t begin = li == 0 ? 0 : cut;
    const std::size_t end = li == 0 ? cut : recs.size();
    std::uint64_t bitmap = 0;
    int s = 0;
    for (std::size_t r = begin; r < end; ++r, ++s) {
      pm::store(&ne[s], Entry{recs[r].key, payload_of(recs[r].word) | kCopyBit});
      n->keys[s].store(recs[r].key, std::memory_order_relaxed);
      n->set_fp(s, leaf->fp(recs[r].slot));  // the same key: the same fingerprint
      n->state[s].store(Leaf::kDone, std::memory_order_relaxed);
      bitmap |= std::uint64_t{1} << s;
      d->map_leaf[recs[r].slot] = static_cast<std::uint8_t>(li);
      d->map_slot[recs[r].slot] = static_cast<std::uint8_t>(s);
    }
    n->num.store(static_cast<std::uint32_t>(s), std::memory_order_relaxed);
    n->bitmap.store(bitmap, std::memory_order_relaxed);
    if (two && li == 0) {
      // Left's next is right, in both layers; right's next is set in the link phase (S9).
      n->next.store(d->leaves[1], std::memory_order_relaxed);
      pm::store(&block(n)->next, d->leaves[1]->data_off);
    }
    pm::persist(block(n), node_size_);  // S2: the whole new block, before S3 publishes it
  }
  return d;
}

// --- sync of one slot ----------------------------------------------------------------------------------

// S7 / W1 / R3: make the copy of old slot `slot` in the new leaf match the old leaf. Reads the
// new entry before the old one and retries after every successful CAS, so the last writer of
// the old slot always leaves the new entry equal to it (PROTOCOL.md, "Why sync converges").
// A new entry without copy_bit/sync_bit was written directly after the SMO and is newer than
// anything in the old leaf: it is left alone. Then, if the new leaf is itself in an SMO, the
// change is carried one level further (the same rule as sync-on-write).
void NBTree::sync_slot(Leaf* old_leaf, int slot, const SmoDesc* d) const {
  auto* self = const_cast<NBTree*>(this);
  for (;;) {
    const int li = d->map_leaf[slot];
    if (li == 0xff) return;
    Leaf* nl = d->leaves[li];
    const int m = d->map_slot[slot];
    Entry* ne = &entries(nl)[m];
    const Entry* oe = &entries(old_leaf)[slot];
    bool wrote = false;
    for (;;) {
      const std::uint64_t nk = pm::load_acquire(&ne->key);
      if (nk == 0) break;  // already deleted in the new leaf
      std::uint64_t n = pm::load_acquire(&ne->value);
      if ((n & kStateBits) == 0) break;  // written directly after the SMO: newer
      const std::uint64_t ok1 = pm::load_acquire(&oe->key);
      const std::uint64_t o = pm::load_acquire(&oe->value);
      const std::uint64_t ok2 = pm::load_acquire(&oe->key);
      if (adr() && old_leaf->pending[slot].load(std::memory_order_seq_cst) != 0) {
        // R1 for the old entry: before S11 the old block is what a crash keeps, so what this
        // sync copies (and a sync-on-read returns) must be durable there first.
        pm::persist(oe, sizeof(Entry));
        reader_persists_.fetch_add(1, std::memory_order_relaxed);
      }
      if (ok1 == 0 || ok2 == 0) {
        // The key was deleted in the old leaf: delete it in the new one (S6 / W1).
        hook(HookPoint::sync_before_cas, nl);
        pm::yield_point("nbtree.sync.cas");
        begin_write(nl, m);
        std::uint64_t expected = nk;
        const bool ok = pm::cas(&ne->key, expected, 0);
        std::uint64_t v = 0;
        if (ok) {
          v = pm::load_acquire(&ne->value);
          while ((payload_of(v) & kOutOfLine) != 0 && !pm::cas(&ne->value, v, 0)) {
          }
        }
        end_write(nl, m, ne);
        if (ok) {
          wrote = true;
          full_fence();
          if ((nl->bitmap.load(std::memory_order_seq_cst) & Leaf::kSmoBit) == 0) {
            self->retire_value(v);
            self->retire_key(nk);  // K3 (bytes mode), under V4's rule
          }
        }
        break;
      }
      if (payload_of(n) == payload_of(o)) break;  // in sync
      hook(HookPoint::sync_before_cas, nl);
      pm::yield_point("nbtree.sync.cas");
      begin_write(nl, m);
      const bool ok = pm::cas(&ne->value, n, payload_of(o) | kSyncBit);  // S7: clears copy_bit
      end_write(nl, m, ne);
      if (ok) {
        wrote = true;
        full_fence();
        // V4: n's record is no longer referenced by a leaf outside an SMO.
        if ((nl->bitmap.load(std::memory_order_seq_cst) & Leaf::kSmoBit) == 0) {
          self->retire_value(n);
        }
      }
    }
    if (!wrote) return;
    full_fence();
    const SmoDesc* next = nl->copy_ptr.load(std::memory_order_seq_cst);
    if (next == nullptr) return;
    old_leaf = nl;  // W3: carry the change into the new leaf's own SMO
    slot = m;
    d = next;
  }
}

// --- the three phases ------------------------------------------------------------------------------------

void NBTree::help_smo(Leaf* leaf) {
  hook(HookPoint::smo_started, leaf);
  SmoDesc* d = leaf->copy_ptr.load(std::memory_order_acquire);
  if (d == nullptr) {
    d = copy_and_publish(leaf);
    if (d == nullptr) return;  // pool full: rolled back (S2x), or another helper rolls back
  }
  full_fence();
  hook(HookPoint::smo_after_copy_ptr, leaf);
  if ((leaf->flag.load(std::memory_order_acquire) & Leaf::kSynced) == 0) {
    // S8a: seal the old leaf: an update or delete that has not registered yet (W2) goes to
    // the new leaves instead (it helps this SMO, then retries).
    pm::yield_point("nbtree.smo.seal");
    leaf->flag.fetch_or(Leaf::kSealed, std::memory_order_seq_cst);
    // S4-S7: sync every committed slot the copy phase may have missed an update or delete of.
    const std::uint64_t b = leaf->bitmap.load(std::memory_order_acquire) & ~Leaf::kSmoBit;
    for (std::uint64_t bits = b; bits != 0; bits &= bits - 1) {
      sync_slot(leaf, __builtin_ctzll(bits), d);
    }
    drain_writers(leaf);  // S8b
    pm::yield_point("nbtree.smo.flag");
    leaf->flag.fetch_or(Leaf::kSynced, std::memory_order_acq_rel);  // S8
    hook(HookPoint::smo_after_sync, leaf);
  }
  if ((leaf->flag.load(std::memory_order_acquire) & Leaf::kLinked) == 0) link_phase(leaf, d);
}

// S2g: the copy gate. A helper builds and publishes a copy (S2, S3) only inside the gate, and
// only while the gate is open and the smo bit is set, so a roll-back (S2x) that closed the
// gate and saw it empty knows no copy can be published until it reopens it. seq_cst on the
// gate and the loads after it: the roll-back's close / wait / bit clear / reopen and a
// helper's enter / loads are ordered in the single total order (a helper that enters after
// the reopen sees the cleared bit, or a later S1). Returns the published copy, or nullptr.
SmoDesc* NBTree::copy_and_publish(Leaf* leaf) {
  auto leave = [leaf] { leaf->copiers.fetch_sub(1, std::memory_order_seq_cst); };
  if ((leaf->copiers.fetch_add(1, std::memory_order_seq_cst) & Leaf::kGateClosed) != 0) {
    leave();  // a roll-back runs: the pool is full
    return nullptr;
  }
  SmoDesc* d = leaf->copy_ptr.load(std::memory_order_seq_cst);
  if (d != nullptr || (leaf->bitmap.load(std::memory_order_seq_cst) & Leaf::kSmoBit) == 0) {
    leave();  // published meanwhile, or rolled back meanwhile (nothing to copy)
    return d;
  }
  SmoDesc* mine = copy_phase(leaf);  // S2 (each helper builds its own; one wins S3)
  if (mine == nullptr) return roll_back_smo(leaf);  // S2x (leaves the gate itself)
  hook(HookPoint::smo_before_copy_ptr_cas, leaf);
  pm::yield_point("nbtree.smo.copy_ptr");
  SmoDesc* expected = nullptr;
  // S3: publish the copy. seq_cst: pairs with W1/R2 (writers and readers of the old leaf
  // store/read, fence, then load copy_ptr).
  if (leaf->copy_ptr.compare_exchange_strong(expected, mine, std::memory_order_seq_cst)) {
    d = mine;
  } else {
    destroy_unpublished(mine);
    d = expected;
  }
  leave();
  return d;
}

// S2x: this helper's copy found the pool full (copy_phase freed what it had allocated).
// Close the gate, wait until the helpers inside have left (each publishes or fails S3; none
// waits for anything), then, if no copy was published, clear the smo bit: the leaf is as it
// was before S1 (full, every slot claimed), so the next insert sets S1 again and retries the
// copy, and verify() sees no SMO in progress. If a copy was published before the close, the
// SMO goes on with it. Only DRAM words change: nothing of this reaches PM.
SmoDesc* NBTree::roll_back_smo(Leaf* leaf) {
  pm::yield_point("nbtree.smo.rollback");
  const std::uint32_t g = leaf->copiers.fetch_or(Leaf::kGateClosed, std::memory_order_seq_cst);
  leaf->copiers.fetch_sub(1, std::memory_order_seq_cst);  // leave the gate ourselves
  if ((g & Leaf::kGateClosed) != 0) return nullptr;       // another helper rolls back
  while ((leaf->copiers.load(std::memory_order_seq_cst) & ~Leaf::kGateClosed) != 0)
    spin_pause("nbtree.smo.rollback");
  SmoDesc* d = leaf->copy_ptr.load(std::memory_order_seq_cst);
  if (d == nullptr) leaf->bitmap.fetch_and(~Leaf::kSmoBit, std::memory_order_seq_cst);
  leaf->copiers.fetch_and(~Leaf::kGateClosed, std::memory_order_seq_cst);  // reopen
  return d;
}

// S8b: wait until no update or delete registered before the seal (W2) is still in flight on
// the old leaf: each finishes its CAS and its sync-on-write (W1) into the new leaves. Only
// then may S8 let the link phase make the new leaves reachable (S13, S14); otherwise a
// direct write of a new leaf could come first and the old leaf's late write would be lost
// or, for a delete, counted twice (issue 18: a delete of the old slot returned ok after a
// remove and a re-insert of the same key in the new leaf, and the key stayed present).
// A writer never waits while registered, so this wait ends.
void NBTree::drain_writers(Leaf* leaf) const {
  for (int i = 0; i < cap_; ++i) {
    if (leaf->pending[i].load(std::memory_order_seq_cst) == 0) continue;
    hook(HookPoint::smo_drain_wait, leaf);
    while (leaf->pending[i].load(std::memory_order_seq_cst) != 0) spin_pause("nbtree.smo.drain");
  }
}

// S9-S14, lock-free and cooperative: any number of helpers may run it at once; every step is
// a CAS from the state before it (or idempotent), so a stale helper's late step fails instead
// of undoing a later SMO's link. Only the parent install (S13) takes the inner-node writer
// lock, as every inner-node write does (N1).
void NBTree::link_phase(Leaf* leaf, SmoDesc* d) {
  if ((leaf->flag.load(std::memory_order_acquire) & Leaf::kLinked) != 0) return;
  // S9: freeze the old leaf's next (tag bit), so the link of its right neighbour's SMO cannot
  // change it any more; that SMO helps this one and then links into our last new leaf.
  Leaf* n = leaf->next.load(std::memory_order_acquire);
  while (!Leaf::frozen(n)) {
    pm::yield_point("nbtree.link.freeze");
    if (leaf->next.compare_exchange_weak(n, Leaf::with_frozen(n), std::memory_order_acq_rel,
                                         std::memory_order_acquire)) {
      break;
    }
  }
  Leaf* const succ = Leaf::untag(n);
  // S9: the last new leaf continues where the old one did, in both layers. CAS from the
  // unlinked state (null / 0): once the successor's own SMO has moved it on, a late helper
  // fails here.
  Leaf* last = d->leaves[d->count - 1];
  Leaf* unset = nullptr;
  pm::yield_point("nbtree.link.last_next");
  last->next.compare_exchange_strong(unset, succ, std::memory_order_acq_rel,
                                     std::memory_order_acquire);
  std::uint64_t zero = 0;
  pm::cas(&block(last)->next, zero, succ != nullptr ? succ->data_off : 0);
  pm::persist(&block(last)->next, sizeof(std::uint64_t));
  // S10-S12: switch the predecessor (the current leaf covering low - 1, or the head) from the
  // old leaf to the first new leaf: DRAM CAS, then PM CAS (S11, the SMO's durability point) and
  // its write-back. DRAM `next` words are read only by link phases, so switching DRAM first
  // exposes nothing; the PM CAS expects the old block, so a late helper cannot undo a later
  // link of the same word.
  Leaf* const first = d->leaves[0];
  for (;;) {
    if ((leaf->flag.load(std::memory_order_acquire) & Leaf::kLinked) != 0) return;
    Leaf* pred = leaf->low != first_low_ ? find_leaf_before(leaf->low) : nullptr;
    std::atomic<Leaf*>& link = pred != nullptr ? pred->next : head_;
    Leaf* cur = link.load(std::memory_order_acquire);
    if (cur == leaf) {
      pm::yield_point("nbtree.link.pred_cas");
      if (!link.compare_exchange_strong(cur, first, std::memory_order_acq_rel,
                                        std::memory_order_acquire)) {
        continue;  // the predecessor froze or changed: look again
      }
      cur = first;
    }
    if (Leaf::untag(cur) == leaf) {
      // The predecessor is in its own link phase and took our old leaf along: finish its link
      // (cooperative), then switch its replacement.
      help_link(pred);
      continue;
    }
    if (Leaf::untag(cur) != first) {
      // The predecessor already points past our first new leaf: first was installed in the
      // parent (S13), filled and linked an SMO of its own, so another helper did S11 long ago.
      break;
    }
    hook(HookPoint::smo_link_before_pm, leaf);
    std::uint64_t* pm_link = pred != nullptr ? &block(pred)->next : &root_->head;
    std::uint64_t expected = leaf->data_off;
    pm::cas(pm_link, expected, first->data_off);  // S11: the SMO's durability point
    pm::persist(pm_link, sizeof(std::uint64_t));
    break;
  }
  hook(HookPoint::smo_link_after_list, leaf);
  install_in_parent(leaf, d);  // S13 (inner_mu_; idempotent)
  pm::yield_point("nbtree.smo.linked");
  // S14: the helper that sets the flag retires the old leaf.
  if ((leaf->flag.fetch_or(Leaf::kLinked, std::memory_order_acq_rel) & Leaf::kLinked) != 0) {
    return;
  }
  hook(HookPoint::smo_done, leaf);
  // E1: the old leaf (DRAM metadata and PM block) and the descriptor go once no pinned
  // thread can still reach them. Its value records now belong to the new leaves (V4).
  const std::uint64_t off = leaf->data_off;
  const std::uint32_t bytes = node_size_;
  epochs_.retire([this, leaf, d, off, bytes] {
    pm_free(off, bytes);
    drop_dram(leaf);
    delete d;
  });
}

// A leaf whose next is frozen is in its link phase (its sync phase is over): finish it.
void NBTree::help_link(Leaf* leaf) {
  SmoDesc* d = leaf->copy_ptr.load(std::memory_order_acquire);
  link_phase(leaf, d);
}

// --- inner nodes (inner_mu_ held) ---------------------------------------------------------------

std::vector<Inner*> NBTree::path_to(std::uint64_t low) const {
  const Probe key = probe_of_bound(low);
  std::vector<Inner*> path;
  Inner* node = root_node_.load(std::memory_order_acquire);
  for (;;) {
    while (probe_above(key, node->high.load(std::memory_order_relaxed))) {
      node = node->sibling.load(std::memory_order_relaxed);
    }
    path.push_back(node);
    if (node->level == 1) return path;
    const int n = node->count.load(std::memory_order_relaxed);
    int pos = 0;
    for (int i = 1; i < n; ++i) {
      if (probe_ge(key, node->keys[i].load(std::memory_order_relaxed))) pos = i;
    }
    node = static_cast<Inner*>(node->children[pos].load(std::memory_order_relaxed));
  }
}

// S13: the old leaf's child pointer is replaced by the left new leaf and the split key with
// the right new leaf is inserted in ONE node write (one InnerWrite, or one split whose left half
// is rewritten in one InnerWrite). Done as two writes, a reader between them would follow the
// old pointer's slot to the left leaf for a key >= split, outside the left leaf's range: an
// insert would put the key in the wrong leaf (later updates/finds miss it) and a scan would set
// its cursor back to `split` (keys below the start key, not ascending).
void NBTree::install_in_parent(Leaf* old_leaf, SmoDesc* d) {
  std::lock_guard<sync::SpinLock> lock(inner_mu_);
  std::vector<Inner*> path = path_to(old_leaf->low);
  Inner* p = path.back();
  const int n = p->count.load(std::memory_order_relaxed);
  int pos = -1;
  for (int i = 0; i < n; ++i) {
    if (p->children[i].load(std::memory_order_relaxed) == old_leaf) pos = i;
  }
  if (pos < 0) return;  // another helper installed it (S13 runs once per SMO, under inner_mu_)
  if (d->count == 2) {
    insert_into_inner(path, static_cast<int>(path.size()) - 1, d->split, d->leaves[1], old_leaf,
                      d->leaves[0]);
    return;
  }
  {
    InnerWrite w(p);  // N1: replacing one child pointer
    p->children[pos].store(d->leaves[0], std::memory_order_relaxed);
  }
  hook(HookPoint::inner_node_written, nullptr);
}

// Inserts separator `key` with right child `child` into path[idx]; splits it when full (the
// new right sibling is complete before the node's high key and sibling change, N1/N3). A
// `replace_from` child of the node becomes `replace_to` in the same node write (S13).
void NBTree::insert_into_inner(std::vector<Inner*>& path, int idx, std::uint64_t key,
                               void* child, void* replace_from, void* replace_to) {
  Inner* node = path[idx];
  const int n = node->count.load(std::memory_order_relaxed);
  if (n < fanout_) {
    {
      InnerWrite w(node);
      if (replace_from != nullptr) {
        for (int i = 0; i < n; ++i) {
          if (node->children[i].load(std::memory_order_relaxed) == replace_from) {
            node->children[i].store(replace_to, std::memory_order_relaxed);
          }
        }
      }
      int pos = n;
      while (pos > 1 && bound_less(key, node->keys[pos - 1].load(std::memory_order_relaxed))) {
        node->keys[pos].store(node->keys[pos - 1].load(std::memory_order_relaxed),
                              std::memory_order_release);
        node->children[pos].store(node->children[pos - 1].load(std::memory_order_relaxed),
                                  std::memory_order_relaxed);
        --pos;
      }
      node->keys[pos].store(key, std::memory_order_release);
      node->children[pos].store(child, std::memory_order_relaxed);
      node->count.store(n + 1, std::memory_order_relaxed);
    }
    hook(HookPoint::inner_node_written, nullptr);
    return;
  }
  // Split: gather n + 1 entries, left keeps the first half.
  std::vector<std::pair<std::uint64_t, void*>> all;
  all.reserve(n + 1);
  for (int i = 0; i < n; ++i) {
    all.emplace_back(node->keys[i].load(std::memory_order_relaxed),
                     node->children[i].load(std::memory_order_relaxed));
  }
  if (replace_from != nullptr) {
    for (auto& e : all) {
      if (e.second == replace_from) e.second = replace_to;
    }
  }
  all.insert(std::upper_bound(all.begin() + 1, all.end(), key,
                              [this](std::uint64_t k, const auto& e) {
                                return bound_less(k, e.first);
                              }),
             {key, child});
  const int left_n = static_cast<int>(all.size()) / 2;
  auto* right = make_dram<Inner>();
  all_inner_.push_back(right);
  right->level = node->level;
  for (std::size_t i = left_n; i < all.size(); ++i) {
    right->keys[i - left_n].store(all[i].first, std::memory_order_release);
    right->children[i - left_n].store(all[i].second, std::memory_order_relaxed);
  }
  right->count.store(static_cast<int>(all.size()) - left_n, std::memory_order_relaxed);
  right->high.store(node->high.load(std::memory_order_relaxed), std::memory_order_release);
  right->sibling.store(node->sibling.load(std::memory_order_relaxed), std::memory_order_relaxed);
  const std::uint64_t sep = all[left_n].first;
  {
    InnerWrite w(node);
    for (int i = 0; i < left_n; ++i) {
      node->keys[i].store(all[i].first, std::memory_order_release);
      node->children[i].store(all[i].second, std::memory_order_relaxed);
    }
    node->count.store(left_n, std::memory_order_relaxed);
    node->high.store(high_before(sep), std::memory_order_release);
    node->sibling.store(right, std::memory_order_release);  // N3: right is complete
  }
  hook(HookPoint::inner_node_written, nullptr);
  if (idx > 0) {
    insert_into_inner(path, idx - 1, sep, right);
    return;
  }
  auto* root = make_dram<Inner>();
  all_inner_.push_back(root);
  root->level = node->level + 1;
  root->keys[0].store(node->keys[0].load(std::memory_order_relaxed), std::memory_order_release);
  root->children[0].store(node, std::memory_order_relaxed);
  root->keys[1].store(sep, std::memory_order_release);
  root->children[1].store(right, std::memory_order_relaxed);
  root->count.store(2, std::memory_order_relaxed);
  root_node_.store(root, std::memory_order_release);
  hook(HookPoint::inner_node_written, nullptr);
}

// Bulk-builds the inner levels over a leaf chain (recovery and bulk load; no readers yet).
void NBTree::build_inner_from_leaves(const std::vector<Leaf*>& leaves) {
  for (Inner* n : all_inner_) drop_dram(n);
  all_inner_.clear();
  const int per = std::max(2, fanout_ * 3 / 4);
  std::vector<std::pair<std::uint64_t, void*>> level;
  for (Leaf* l : leaves) level.emplace_back(l->low, l);
  int lvl = 1;
  for (;;) {
    std::vector<Inner*> nodes;
    for (std::size_t i = 0; i < level.size(); i += per) {
      auto* n = make_dram<Inner>();
      all_inner_.push_back(n);
      n->level = lvl;
      const std::size_t end = std::min(level.size(), i + per);
      for (std::size_t j = i; j < end; ++j) {
        n->keys[j - i].store(level[j].first, std::memory_order_release);
        n->children[j - i].store(level[j].second, std::memory_order_relaxed);
      }
      n->count.store(static_cast<int>(end - i), std::memory_order_relaxed);
      if (!nodes.empty()) {
        nodes.back()->high.store(high_before(level[i].first), std::memory_order_release);
        nodes.back()->sibling.store(n, std::memory_order_relaxed);
      }
      nodes.push_back(n);
    }
    if (nodes.size() == 1) {
      root_node_.store(nodes[0], std::memory_order_release);
      return;
    }
    level.clear();
    for (Inner* n : nodes) level.emplace_back(n->keys[0].load(std::memory_order_relaxed), n);
    ++lvl;
  }
}

void NBTree::free_dram() {
  Leaf* l = head_.load(std::memory_order_acquire);
  while (l != nullptr) {
    Leaf* next = l->next.load(std::memory_order_acquire);
    drop_dram(l);
    l = next;
  }
  head_.store(nullptr, std::memory_order_release);
  for (Inner* n : all_inner_) drop_dram(n);
  all_inner_.clear();
  root_node_.store(nullptr, std::memory_order_release);
}

}  // namespace pmindex::nbtree

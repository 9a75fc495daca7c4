// NBTree structural modification: the three-phase SMO (copy, sync, link; steps S1..S14),
// sync of one slot (shared by the sync phase, sync-on-write and sync-on-read) and the inner
// nodes (N1..N3). See PROTOCOL.md.
#include <algorithm>
#include <bit>
#include <thread>

#include "index/nbtree/nbtree.h"

namespace pmindex::nbtree {

using detail::full_fence;
using detail::spin_pause;

namespace {

// S9 / M5: sets the frozen bit of l's next (never cleared), so no other link phase changes it
// any more; returns the successor it names. acq_rel: the successor's initialisation is seen,
// and the freeze is seen by whoever reads the word next.
Leaf* freeze_next(Leaf* l) {
  Leaf* n = l->next.load(std::memory_order_acquire);
  while (!Leaf::frozen(n)) {
    pm::yield_point("nbtree.link.freeze");
    if (l->next.compare_exchange_weak(n, Leaf::with_frozen(n), std::memory_order_acq_rel,
                                      std::memory_order_acquire)) {
      break;
    }
  }
  return Leaf::untag(n);
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
  pm::store(&pool_->at<BlockHeader>(off)->tag, tags_.next());  // persisted with the block
  auto* leaf = make_dram<Leaf>();
  leaf->data_off = off;
  leaf->low = low;
  leaf->high = high;
  return leaf;
}

// S9 / M5: the last new leaf continues where the frozen old leaf did (`succ`, null at the end),
// in both layers. CAS from the unlinked state (null / 0): once the successor's own SMO has
// moved it on, a late helper fails here. When the PM CAS succeeds succ is still live (its own
// link phase helps this one to finish first), so reading its tag is safe.
void NBTree::continue_chain(Leaf* last, Leaf* succ) {
  Leaf* unset = nullptr;
  pm::yield_point("nbtree.link.last_next");
  last->next.compare_exchange_strong(unset, succ, std::memory_order_acq_rel,
                                     std::memory_order_acquire);
  std::uint64_t zero = 0;
  pm::cas(&block(last)->next, zero, link_to(succ));
  pm::persist(&block(last)->next, sizeof(std::uint64_t));
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
      pm::store(&block(n)->next, link_to(d->leaves[1]));
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
          nl->deleted.fetch_add(1, std::memory_order_relaxed);  // M0's live count
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
    if (!wrote) {
      // S5b, ADR: this helper found the new entry synced (or deleted), possibly by another
      // thread's CAS that is not written back yet; it may link the new leaf (S11) before that
      // write-back, after which a crash keeps the new block. R1 applied to the new entry: the
      // other writer's pending increment is sequenced before its CAS, so a helper that read
      // the CAS's result sees the increment or the decrement after the write-back.
      if (adr() && nl->pending[m].load(std::memory_order_seq_cst) != 0 &&
          fault_ != Fault::skip_sync_stop_persist) [[unlikely]] {
        pm::persist(ne, sizeof(Entry));
        reader_persists_.fetch_add(1, std::memory_order_relaxed);
      }
      return;
    }
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
  if (MergeDesc* md = confirmed_merge(leaf)) {  // M: the bit is a merge's; help it
    help_merge(md);
    return;
  }
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
  if (d->merge != nullptr) {  // a merge's source (M5: succ's link helps the merge)
    MergeDesc* md = d->merge;
    merge_link(md, md->left->copy_ptr.load(std::memory_order_acquire));
    return;
  }
  // S9: freeze the old leaf's next (tag bit), so the link of its right neighbour's SMO cannot
  // change it any more; that SMO helps this one and then links into our last new leaf.
  Leaf* const succ = freeze_next(leaf);
  continue_chain(d->leaves[d->count - 1], succ);  // S9
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
    std::uint64_t expected = link_to(leaf);
    pm::cas(pm_link, expected, link_to(first));  // S11: the SMO's durability point
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
  // A finished merge attempt this leaf still names loses the leaf's reference (M1).
  release_merge(leaf->merge.exchange(kMergeRetired, std::memory_order_seq_cst));
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

// --- merge SMO (M0..M7, PROTOCOL.md "Merge SMO") -------------------------------------------
//
// Two adjacent leaves P (left) and E (right) of one level-1 node become one new leaf N with
// range [P.low, E.high]. It is the split's SMO with two sources: each source gets its own
// descriptor (both naming N), so the sync (S4..S8b), sync-on-write/read and resolve work on
// each source as for a split; the link switches P's predecessor from P to N (M5p) after N's
// next took E's successor, and the parent loses E's separator in the same node write that
// replaces P by N (M6).

namespace {
// Live records of a leaf by its DRAM counters (a snapshot; exact on a quiescent leaf).
int live_of(const Leaf* l) {
  const std::uint64_t b = l->bitmap.load(std::memory_order_acquire) & ~Leaf::kSmoBit;
  return std::popcount(b) - static_cast<int>(l->deleted.load(std::memory_order_acquire));
}
// M1: the smo bit set by CAS from clear, so the caller knows it is the bit's owner.
bool claim_smo_bit(Leaf* l) {
  std::uint64_t b = l->bitmap.load(std::memory_order_seq_cst);
  for (;;) {
    if ((b & Leaf::kSmoBit) != 0) return false;
    pm::yield_point("nbtree.merge.freeze");
    if (l->bitmap.compare_exchange_weak(b, b | Leaf::kSmoBit, std::memory_order_seq_cst)) {
      return true;
    }
  }
}
// M1: name the merge in a leaf's merge word, replacing nothing or a finished attempt.
bool name_merge(Leaf* l, MergeDesc* md, MergeDesc** replaced) {
  MergeDesc* cur = l->merge.load(std::memory_order_seq_cst);
  if (cur == kMergeRetired || (cur != nullptr && cur->live())) return false;
  if (!l->merge.compare_exchange_strong(cur, md, std::memory_order_seq_cst)) return false;
  *replaced = cur;
  return true;
}
}  // namespace

namespace {
thread_local bool t_merge_pool_full = false;  // this thread's last merge copy found no space
}  // namespace

bool NBTree::merge_found_pool_full() {
  const bool was = t_merge_pool_full;
  t_merge_pool_full = false;
  return was;
}

void NBTree::release_merge(MergeDesc* md) {
  if (md == nullptr || md == kMergeRetired) return;
  if (md->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    epochs_.retire([md] { delete md; });  // a pinned helper may still read it
  }
}

// M0: a delete left `right` with a third of its capacity live (or none): merge it
// into its left neighbour under the same level-1 node when the two fit (an emptied leaf
// always fits; otherwise at most 3/4 of a leaf: hysteresis against the split). Optional:
// every obstacle gives up. Child 0 of a level-1 node stays.
void NBTree::maybe_merge(Leaf* right) {
  if (!merges_on_) return;
  // Only when the delete made the leaf empty or brought it to a third: at most two attempts
  // per leaf and delete sequence, so deletes in sparse leaves do not all take inner_mu_.
  const int live_right = live_of(right);
  if (live_right != 0 && live_right != cap_ / 3) return;
  if ((right->bitmap.load(std::memory_order_acquire) & Leaf::kSmoBit) != 0) return;
  Leaf* left = nullptr;
  {
    std::lock_guard<sync::SpinLock> lock(inner_mu_);
    std::vector<Inner*> path = path_to(right->low);
    if (path.back()->children[0].load(std::memory_order_relaxed) == right &&
        merge_inner_left(path)) {
      path = path_to(right->low);  // M0b: right is no longer a child 0
    }
    Inner* x = path.back();
    const int n = x->count.load(std::memory_order_relaxed);
    for (int i = 1; i < n; ++i) {
      if (x->children[i].load(std::memory_order_relaxed) == right) {
        left = static_cast<Leaf*>(x->children[i - 1].load(std::memory_order_relaxed));
      }
    }
  }
  if (left == nullptr) return;  // child 0, or the leaf was replaced meanwhile
  const int limit = live_right == 0 ? cap_ : cap_ * 3 / 4;
  if (live_of(left) + live_right > limit) return;
  if (left->next.load(std::memory_order_acquire) != right) return;  // in a link phase
  start_merge(left, right);
}

// M0b (inner_mu_ held): the last node of `path` (Y) moves all its entries into its left
// sibling X under the same parent when they fit, so Y's child 0 gets a left neighbour in its
// own node. Two node writes (N1): X takes Y's entries, high key and sibling; then the parent
// drops Y's separator. Between them the parent still routes Y's range to Y, which is never
// changed again and stays consistent (a reader that reaches it later, holding an older
// snapshot, finds leaves that resolve as before); a reader of X above its old high finds the
// keys in X instead of moving right. Y is not freed before close (all_inner_). DRAM only.
bool NBTree::merge_inner_left(const std::vector<Inner*>& path) {
  if (path.size() < 2) return false;
  Inner* y = path.back();
  Inner* parent = path[path.size() - 2];
  const int pn = parent->count.load(std::memory_order_relaxed);
  int ypos = -1;
  for (int i = 1; i < pn; ++i) {
    if (parent->children[i].load(std::memory_order_relaxed) == y) ypos = i;
  }
  if (ypos < 1) return false;  // Y is its parent's child 0 (or reached by a B-link move)
  auto* x = static_cast<Inner*>(parent->children[ypos - 1].load(std::memory_order_relaxed));
  const int xn = x->count.load(std::memory_order_relaxed);
  const int yn = y->count.load(std::memory_order_relaxed);
  if (x->sibling.load(std::memory_order_relaxed) != y || xn + yn > fanout_) return false;
  {
    InnerWrite w(x);
    for (int i = 0; i < yn; ++i) {
      x->keys[xn + i].store(y->keys[i].load(std::memory_order_relaxed), std::memory_order_release);
      x->children[xn + i].store(y->children[i].load(std::memory_order_relaxed),
                                std::memory_order_relaxed);
    }
    x->count.store(xn + yn, std::memory_order_relaxed);
    x->high.store(y->high.load(std::memory_order_relaxed), std::memory_order_release);
    x->sibling.store(y->sibling.load(std::memory_order_relaxed), std::memory_order_release);
  }
  hook(HookPoint::inner_node_written, nullptr);
  {
    InnerWrite w(parent);
    for (int i = ypos; i + 1 < pn; ++i) {
      parent->keys[i].store(parent->keys[i + 1].load(std::memory_order_relaxed),
                            std::memory_order_release);
      parent->children[i].store(parent->children[i + 1].load(std::memory_order_relaxed),
                                std::memory_order_relaxed);
    }
    parent->count.store(pn - 1, std::memory_order_relaxed);
  }
  hook(HookPoint::inner_node_written, nullptr);
  return true;
}

// M1: freeze P, then E, each by a CAS of its smo bit from clear, after naming the merge in
// the leaf's merge word. A helper that meets a bit whose merge is still an intent cancels the
// intent (confirmed_merge), so the bit is then an ordinary SMO's; the merger confirms only if
// no helper cancelled. Any obstacle undoes the bits this merger set (S2x through the gate).
bool NBTree::start_merge(Leaf* left, Leaf* right) {
  auto* md = new MergeDesc;
  md->left = left;
  md->right = right;
  md->refs.store(2, std::memory_order_relaxed);  // left's and right's merge words
  MergeDesc* replaced = nullptr;
  if (!name_merge(left, md, &replaced)) {
    delete md;
    return false;
  }
  release_merge(replaced);
  auto give_up = [&](bool undo_left, bool undo_right) {
    std::uint8_t st = MergeDesc::kIntent;
    md->state.compare_exchange_strong(st, MergeDesc::kCancelled, std::memory_order_seq_cst);
    if (undo_left) undo_freeze(left);
    if (undo_right) undo_freeze(right);
    return false;
  };
  if (!claim_smo_bit(left)) {
    release_merge(md);  // right's reference: never named there
    return give_up(false, false);
  }
  if (!name_merge(right, md, &replaced)) {
    release_merge(md);
    return give_up(true, false);
  }
  release_merge(replaced);
  if (!claim_smo_bit(right)) return give_up(true, false);
  std::uint8_t st = MergeDesc::kIntent;
  if (!md->state.compare_exchange_strong(st, MergeDesc::kConfirmed, std::memory_order_seq_cst)) {
    return give_up(true, true);  // a helper cancelled: the bits are ordinary SMOs' now
  }
  help_merge(md);
  return left->copy_ptr.load(std::memory_order_acquire) != nullptr;
}

// The merge that owns `leaf`'s smo bit, or null (an ordinary SMO's bit). An intent found here
// is cancelled: its merger had not confirmed, so the bit is treated as an ordinary SMO's.
MergeDesc* NBTree::confirmed_merge(Leaf* leaf) const {
  MergeDesc* md = leaf->merge.load(std::memory_order_seq_cst);
  if (md == nullptr || md == kMergeRetired) return nullptr;
  std::uint8_t st = md->state.load(std::memory_order_seq_cst);
  if (st == MergeDesc::kIntent) {
    md->state.compare_exchange_strong(st, MergeDesc::kCancelled, std::memory_order_seq_cst);
  }
  return st == MergeDesc::kConfirmed ? md : nullptr;
}

// S2x on one leaf by a thread outside its gate: enter, then roll back (a published copy, if a
// helper made one meanwhile, goes on as an ordinary SMO).
void NBTree::undo_freeze(Leaf* leaf) {
  leaf->copiers.fetch_add(1, std::memory_order_seq_cst);
  roll_back_smo(leaf);
}

// M2..M7, cooperative: any thread that meets either smo bit of a confirmed merge runs it.
void NBTree::help_merge(MergeDesc* md) {
  Leaf* const p = md->left;
  Leaf* const e = md->right;
  SmoDesc* d = p->copy_ptr.load(std::memory_order_acquire);
  if (d == nullptr) {
    d = merge_copy_and_publish(md);
    if (d == nullptr) return;  // aborted (M2x): both leaves are back as they were
  }
  // Aborted earlier and P has since begun an ordinary SMO of its own: not this merge's.
  if (d->merge != md) return;
  // M3 on E: the same new leaf, E's own slot map. Until this CAS E is latest for its keys
  // (R2); its writes after the copy are carried by E's sync below.
  SmoDesc* expected = nullptr;
  pm::yield_point("nbtree.merge.copy_ptr_right");
  e->copy_ptr.compare_exchange_strong(expected, d->partner, std::memory_order_seq_cst);
  full_fence();
  hook(HookPoint::smo_after_copy_ptr, p);
  if ((e->flag.load(std::memory_order_acquire) & Leaf::kSynced) == 0) {
    // M4: S8a, S4..S7, S8b, S8 on both sources.
    pm::yield_point("nbtree.smo.seal");
    p->flag.fetch_or(Leaf::kSealed, std::memory_order_seq_cst);
    e->flag.fetch_or(Leaf::kSealed, std::memory_order_seq_cst);
    for (Leaf* src : {p, e}) {
      const SmoDesc* sd = src->copy_ptr.load(std::memory_order_acquire);
      const std::uint64_t b = src->bitmap.load(std::memory_order_acquire) & ~Leaf::kSmoBit;
      for (std::uint64_t bits = b; bits != 0; bits &= bits - 1) {
        sync_slot(src, __builtin_ctzll(bits), sd);
      }
    }
    drain_writers(p);
    drain_writers(e);
    pm::yield_point("nbtree.smo.flag");
    p->flag.fetch_or(Leaf::kSynced, std::memory_order_acq_rel);
    e->flag.fetch_or(Leaf::kSynced, std::memory_order_acq_rel);
    hook(HookPoint::smo_after_sync, p);
  }
  merge_link(md, d);
}

// M2/M3 inside P's copy gate (S2g): build N from both committed sets, then, under inner_mu_,
// check that P and E are still adjacent children of one level-1 node (M6's precondition:
// after this check an inner split keeps them together, merge_pair) and publish on P.
SmoDesc* NBTree::merge_copy_and_publish(MergeDesc* md) {
  Leaf* const p = md->left;
  auto leave = [p] { p->copiers.fetch_sub(1, std::memory_order_seq_cst); };
  if ((p->copiers.fetch_add(1, std::memory_order_seq_cst) & Leaf::kGateClosed) != 0) {
    leave();  // an abort (or a pool_full roll-back) runs
    return nullptr;
  }
  SmoDesc* d = p->copy_ptr.load(std::memory_order_seq_cst);
  if (d != nullptr || (p->bitmap.load(std::memory_order_seq_cst) & Leaf::kSmoBit) == 0 ||
      md->state.load(std::memory_order_seq_cst) != MergeDesc::kConfirmed) {
    leave();  // published, or aborted meanwhile
    return d;
  }
  Code code = Code::ok;
  SmoDesc* mine = merge_copy_phase(md, &code);
  if (mine == nullptr) {  // too many records, or the pool is full
    if (code == Code::pool_full) t_merge_pool_full = true;
    return abort_merge(md);
  }
  hook(HookPoint::smo_before_copy_ptr_cas, p);
  pm::yield_point("nbtree.smo.copy_ptr");
  bool published = false;
  {
    std::lock_guard<sync::SpinLock> lock(inner_mu_);
    if (adjacent_in_parent(p, md->right)) {
      SmoDesc* expected = nullptr;
      published = p->copy_ptr.compare_exchange_strong(expected, mine, std::memory_order_seq_cst);
      d = published ? mine : expected;
    }
  }
  if (!published) {
    destroy_unpublished_merge(mine);
    if (d == nullptr) return abort_merge(md);  // no longer adjacent
  }
  leave();
  return d;
}

// M2: the live committed entries of P then E (each sorted) into one new zeroed block, copy
// bits set, persisted before M3 can publish it. Null if they exceed the limit (3/4 of a leaf
// unless a source is empty) or the pool is full.
SmoDesc* NBTree::merge_copy_phase(MergeDesc* md, Code* code) {
  struct Rec {
    std::uint64_t key, word;
    int slot;
    std::string_view bytes;
  };
  std::vector<Rec> recs[2];
  const Leaf* const src[2] = {md->left, md->right};
  for (int si = 0; si < 2; ++si) {
    const std::uint64_t b = src[si]->bitmap.load(std::memory_order_acquire) & ~Leaf::kSmoBit;
    const Entry* e = entries(src[si]);
    for (std::uint64_t bits = b; bits != 0; bits &= bits - 1) {
      const int i = __builtin_ctzll(bits);
      const std::uint64_t k1 = pm::load_acquire(&e[i].key);
      const std::uint64_t w = pm::load_acquire(&e[i].value);
      const std::uint64_t k2 = pm::load_acquire(&e[i].key);
      if (k1 == 0 || k1 != k2) continue;
      recs[si].push_back({k1, w, i, bytes_ ? probe_of_word(k1).bytes : std::string_view()});
    }
    if (bytes_) {
      std::sort(recs[si].begin(), recs[si].end(),
                [](const Rec& a, const Rec& c) { return a.bytes < c.bytes; });
    } else {
      std::sort(recs[si].begin(), recs[si].end(),
                [](const Rec& a, const Rec& c) { return a.key < c.key; });
    }
  }
  const std::size_t total = recs[0].size() + recs[1].size();
  const bool one_empty = recs[0].empty() || recs[1].empty();
  if (total > static_cast<std::size_t>(one_empty ? cap_ : cap_ * 3 / 4)) return nullptr;
  Leaf* n = new_leaf(md->left->low, md->right->high, code);
  if (n == nullptr) return nullptr;
  SmoDesc* d[2] = {new SmoDesc, new SmoDesc};
  for (SmoDesc* x : d) {
    std::fill(std::begin(x->map_leaf), std::end(x->map_leaf), 0xff);
    std::fill(std::begin(x->map_slot), std::end(x->map_slot), 0xff);
    x->count = 1;
    x->leaves[0] = n;
    x->merge = md;
  }
  d[0]->partner = d[1];
  Entry* ne = entries(n);
  std::uint64_t bitmap = 0;
  int s = 0;
  for (int si = 0; si < 2; ++si) {
    for (const Rec& r : recs[si]) {
      pm::store(&ne[s], Entry{r.key, payload_of(r.word) | kCopyBit});
      n->keys[s].store(r.key, std::memory_order_relaxed);
      n->set_fp(s, src[si]->fp(r.slot));
      n->state[s].store(Leaf::kDone, std::memory_order_relaxed);
      bitmap |= std::uint64_t{1} << s;
      d[si]->map_leaf[r.slot] = 0;
      d[si]->map_slot[r.slot] = static_cast<std::uint8_t>(s);
      ++s;
    }
  }
  n->num.store(static_cast<std::uint32_t>(s), std::memory_order_relaxed);
  n->bitmap.store(bitmap, std::memory_order_relaxed);
  pm::persist(block(n), node_size_);  // M2: the whole block, before M3 publishes it
  return d[0];
}

void NBTree::destroy_unpublished_merge(SmoDesc* d) {
  pm_free(d->leaves[0]->data_off, node_size_);
  drop_dram(d->leaves[0]);
  delete d->partner;
  delete d;
}

// M2x (inside P's gate): no copy can be published: close P's gate, wait until no helper is
// inside, and if P has no copy, mark the merge aborted before clearing P's bit, then undo E's
// freeze the same way (S2x). Helpers that read the merge as confirmed find P's gate closed,
// P's bit clear, or the state aborted, and leave; inserters then retry on the leaves as they
// were. Only DRAM words change.
SmoDesc* NBTree::abort_merge(MergeDesc* md) {
  Leaf* const p = md->left;
  pm::yield_point("nbtree.merge.abort");
  const std::uint32_t g = p->copiers.fetch_or(Leaf::kGateClosed, std::memory_order_seq_cst);
  p->copiers.fetch_sub(1, std::memory_order_seq_cst);
  if ((g & Leaf::kGateClosed) != 0) return nullptr;  // another helper aborts
  while ((p->copiers.load(std::memory_order_seq_cst) & ~Leaf::kGateClosed) != 0)
    spin_pause("nbtree.merge.abort");
  SmoDesc* d = p->copy_ptr.load(std::memory_order_seq_cst);
  if (d == nullptr) {
    md->state.store(MergeDesc::kAborted, std::memory_order_seq_cst);
    p->bitmap.fetch_and(~Leaf::kSmoBit, std::memory_order_seq_cst);
  }
  p->copiers.fetch_and(~Leaf::kGateClosed, std::memory_order_seq_cst);
  if (d == nullptr) undo_freeze(md->right);
  return d;
}

// inner_mu_ held: P and E are children i and i + 1 of one level-1 node.
bool NBTree::adjacent_in_parent(const Leaf* left, const Leaf* right) const {
  Inner* x = path_to(left->low).back();
  const int n = x->count.load(std::memory_order_relaxed);
  for (int i = 0; i + 1 < n; ++i) {
    if (x->children[i].load(std::memory_order_relaxed) == left) {
      return x->children[i + 1].load(std::memory_order_relaxed) == right;
    }
  }
  return false;
}

// inner_mu_ held (an inner split): a and b are a published merge's P and E.
bool NBTree::merge_pair(const void* a, const void* b) const {
  const auto* l = static_cast<const Leaf*>(a);
  const SmoDesc* d = l->copy_ptr.load(std::memory_order_acquire);
  return d != nullptr && d->merge != nullptr && d->merge->left == l && d->merge->right == b;
}

// M5..M7, lock-free and cooperative like S9..S14.
void NBTree::merge_link(MergeDesc* md, SmoDesc* d) {
  Leaf* const p = md->left;
  Leaf* const e = md->right;
  Leaf* const merged = d->leaves[0];
  if ((p->flag.load(std::memory_order_acquire) & Leaf::kLinked) != 0) return;
  // M5 (S9 on E): freeze E's next; N continues where E did, in both layers.
  continue_chain(merged, freeze_next(e));
  // M5 (S9 on P): P's next (E) is frozen too; only E's link could change it, and that is this.
  (void)freeze_next(p);
  // M5p: P's predecessor from P to N, DRAM then PM (the merge's durability point): one
  // 8-byte CAS takes both P and E out of the PM chain.
  for (;;) {
    if ((p->flag.load(std::memory_order_acquire) & Leaf::kLinked) != 0) return;
    Leaf* pred = p->low != first_low_ ? find_leaf_before(p->low) : nullptr;
    std::atomic<Leaf*>& link = pred != nullptr ? pred->next : head_;
    Leaf* cur = link.load(std::memory_order_acquire);
    if (cur == p) {
      pm::yield_point("nbtree.link.pred_cas");
      if (!link.compare_exchange_strong(cur, merged, std::memory_order_acq_rel,
                                        std::memory_order_acquire)) {
        continue;
      }
      cur = merged;
    }
    if (Leaf::untag(cur) == p) {
      help_link(pred);  // the predecessor's own link phase took P along: finish it first
      continue;
    }
    if (Leaf::untag(cur) != merged) break;  // N already linked and replaced (S10's rule)
    hook(HookPoint::smo_link_before_pm, p);
    std::uint64_t* pm_link = pred != nullptr ? &block(pred)->next : &root_->head;
    std::uint64_t expected = link_to(p);
    if (pm::cas(pm_link, expected, link_to(merged))) {  // M5p
      merges_linked_.fetch_add(1, std::memory_order_relaxed);
    }
    if (fault_ != Fault::skip_merge_link_persist) [[likely]] {
      pm::persist(pm_link, sizeof(std::uint64_t));
    }
    break;
  }
  hook(HookPoint::smo_link_after_list, p);
  install_merge_in_parent(p, e, merged);  // M6
  pm::yield_point("nbtree.smo.linked");
  // M7: S14 on both; the helper that sets P's flag retires both leaves.
  e->flag.fetch_or(Leaf::kLinked, std::memory_order_acq_rel);
  if ((p->flag.fetch_or(Leaf::kLinked, std::memory_order_acq_rel) & Leaf::kLinked) != 0) return;
  hook(HookPoint::smo_done, p);
  // Both merge words name md (a confirmed merge is never replaced): its two references go
  // with the leaves.
  p->merge.exchange(kMergeRetired, std::memory_order_seq_cst);
  e->merge.exchange(kMergeRetired, std::memory_order_seq_cst);
  // Bytes mode: E's low (P's high) left the tree with M6's write.
  if (bytes_) seps_.retire(e->low, epochs_);
  SmoDesc* de = e->copy_ptr.load(std::memory_order_acquire);
  const std::uint32_t bytes = node_size_;
  epochs_.retire([this, p, e, d, de, md, bytes] {
    pm_free(p->data_off, bytes);
    pm_free(e->data_off, bytes);
    drop_dram(p);
    drop_dram(e);
    delete d;
    delete de;
    delete md;
  });
}

// M6: one inner-node write replaces child P by N and removes E's separator and child (E is
// P's right neighbour in the same node: checked at M3 under inner_mu_, kept by merge_pair).
// Idempotent: a helper that no longer finds P returns.
void NBTree::install_merge_in_parent(Leaf* left, Leaf* right, Leaf* merged) {
  std::lock_guard<sync::SpinLock> lock(inner_mu_);
  Inner* x = path_to(left->low).back();
  const int n = x->count.load(std::memory_order_relaxed);
  int pos = -1;
  for (int i = 0; i < n; ++i) {
    if (x->children[i].load(std::memory_order_relaxed) == left) pos = i;
  }
  if (pos < 0) return;  // installed by another helper
  // M3's check and merge_pair keep E right of P in this node: anything else is a bug.
  if (pos + 1 >= n || x->children[pos + 1].load(std::memory_order_relaxed) != right) std::abort();
  {
    InnerWrite w(x);  // N1
    x->children[pos].store(merged, std::memory_order_relaxed);
    for (int i = pos + 1; i + 1 < n; ++i) {
      x->keys[i].store(x->keys[i + 1].load(std::memory_order_relaxed), std::memory_order_release);
      x->children[i].store(x->children[i + 1].load(std::memory_order_relaxed),
                           std::memory_order_relaxed);
    }
    x->count.store(n - 1, std::memory_order_relaxed);
  }
  hook(HookPoint::inner_node_written, nullptr);
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
  int left_n = static_cast<int>(all.size()) / 2;
  // M6: a split never separates the two sources of a published merge, so the merge's parent
  // write (one node) always finds them side by side.
  if (node->level == 1 && merge_pair(all[left_n - 1].second, all[left_n].second)) {
    left_n += left_n + 1 < static_cast<int>(all.size()) ? 1 : -1;
  }
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
    Leaf* next = Leaf::untag(l->next.load(std::memory_order_acquire));
    MergeDesc* md = l->merge.load(std::memory_order_relaxed);
    if (md != nullptr && md != kMergeRetired && md->refs.fetch_sub(1) == 1) delete md;
    drop_dram(l);
    l = next;
  }
  head_.store(nullptr, std::memory_order_release);
  for (Inner* n : all_inner_) drop_dram(n);
  all_inner_.clear();
  root_node_.store(nullptr, std::memory_order_release);
}

}  // namespace pmindex::nbtree

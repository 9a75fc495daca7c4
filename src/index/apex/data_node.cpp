// Data node operations: lazy rebuild of the DRAM accelerators, probe-and-stash lookup, insert
// into PA / SA / extended stash, delete. Persistence steps (A<n>): PROTOCOL.md.
#include <algorithm>
#include <bit>

#include <emmintrin.h>

#include "index/apex/apex.h"

namespace pmindex::apex {

namespace {
// Bit i set if fp16[i] == fp (SSE2, part of x86-64).
std::uint32_t fp_matches(const std::uint8_t* fp16, std::uint8_t fp) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(fp16));
  const __m128i want = _mm_set1_epi8(static_cast<char>(fp));
  return static_cast<std::uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(v, want)));
}
}  // namespace

DataMeta::~DataMeta() {
  for (const Accelerator& a : accel) {
    auto* b = reinterpret_cast<OverflowBucket*>(a.word >> kBucketShift);
    while (b != nullptr) {
      OverflowBucket* next = b->next;
      delete b;
      b = next;
    }
  }
}

DataMeta* Apex::build_meta(std::uint64_t off) const {
  // First access in this session (L != tag). Built under metas_mu_: a node nobody has a
  // DataMeta for cannot be written (writers need its locks), so the rebuild reads a quiescent
  // node; a second thread waits here and then finds the state. The rebuild checks the node
  // (R4): a damaged one gets no state, so it is never written, and stays refused.
  DataNode* dn = data(off);
  std::lock_guard<sync::SpinLock> lock(metas_mu_);
  if ((pm::load_acquire(&dn->type_version) >> kVersionShift) == tag_)
    return reinterpret_cast<DataMeta*>(pm::load_acquire(&dn->dram));
  if (bad_nodes_.count(off) != 0) return nullptr;
  std::string why;
  auto m = rebuild_meta(off, &why);
  if (m == nullptr) {
    bad_nodes_.insert(off);
    (void)damaged(off, why);
    return nullptr;
  }
  DataMeta& ref = *m;
  metas_[off] = std::move(m);
  // R4: `dram` first, then L := tag (release; never flushed: a stale L means "rebuild").
  pm::publish(&dn->dram, reinterpret_cast<std::uint64_t>(&ref));
  pm::publish(&dn->type_version,
              static_cast<std::uint64_t>(NodeType::data) | (tag_ << kVersionShift));
  return &ref;
}

InnerMeta* Apex::inner_meta_for(std::uint64_t off) const {
  InnerNode* in = inner(off);
  const std::uint64_t tv = pm::load_acquire(&in->type_version);
  if ((tv >> kVersionShift) != tag_ && !admit_inner(off)) return nullptr;
  return reinterpret_cast<InnerMeta*>(pm::load_acquire(&in->dram));
}

bool Apex::admit_inner(std::uint64_t off) const {
  InnerNode* in = inner(off);
  std::lock_guard<sync::SpinLock> lock(metas_mu_);
  if ((pm::load_acquire(&in->type_version) >> kVersionShift) == tag_) return true;
  if (bad_nodes_.count(off) != 0) return false;
  // R4: checked once per session; from here on traversals trust the node's header, model and
  // child offsets (children an SMO of this session writes are nodes it built).
  if (const std::string why = inner_damage(off); !why.empty()) {
    bad_nodes_.insert(off);
    (void)damaged(off, why);
    return false;
  }
  auto m = std::make_unique<InnerMeta>();
  m->model = {in->slope, in->intercept, in->lo, static_cast<double>(in->fanout - 1), in->fanout};
  m->child = std::make_unique<std::atomic<std::uintptr_t>[]>(in->fanout);  // zero: unresolved
  m->pm_child = in->children();
  InnerMeta& ref = *m;
  inner_metas_[off] = std::move(m);
  pm::publish(&in->dram, reinterpret_cast<std::uint64_t>(&ref));
  pm::publish(&in->type_version,
              static_cast<std::uint64_t>(NodeType::inner) | (tag_ << kVersionShift));
  return true;
}

const InnerMeta* Apex::resolve_root() const {
  // acquire: see traverse().
  const std::uint64_t r = pm::load_acquire(&root_->root_node);
  const InnerMeta* im = type_of(r) == NodeType::inner ? inner_meta_for(r) : nullptr;
  if (im == nullptr) return nullptr;  // leaf() reports the damage
  std::lock_guard<sync::SpinLock> lock(metas_mu_);
  // Stored only if the root word still names r: the root's switcher clears root_meta_ under
  // metas_mu_ after storing the word, so a stale root is never left behind (unshadow).
  // release: the state was built before it is published.
  if (pm::load_acquire(&root_->root_node) == r) root_meta_.store(im, std::memory_order_release);
  return im;
}

std::uintptr_t Apex::resolve_child(const InnerMeta& im, std::uint32_t slot) const {
  // The node of `im` was admitted, so its child offsets lie in the heap (inner_damage) or are
  // nodes this session built; the child is checked when its own state is built.
  const std::uint64_t c = pm::load_acquire(&im.pm_child[slot]);
  std::uintptr_t v = 0;
  if (type_of(c) == NodeType::inner) {
    const InnerMeta* cm = inner_meta_for(c);
    if (cm != nullptr) v = reinterpret_cast<std::uintptr_t>(cm) | kInnerTag;
  } else if (const DataMeta* dm = meta_for(c)) {
    v = reinterpret_cast<std::uintptr_t>(dm);
  }
  if (v == 0) return 0;  // damaged: leaf() reports it
  std::lock_guard<sync::SpinLock> lock(metas_mu_);
  // As in resolve_root: only while the PM slot still holds c (switch_children clears the
  // entry under metas_mu_ after storing the slot). A state for an old c is still returned:
  // it is what a PM descent would have found, and its obsolete locks restart the caller.
  // release: pairs with leaf_fast's acquire load.
  if (pm::load_acquire(&im.pm_child[slot]) == c) im.child[slot].store(v, std::memory_order_release);
  return v;
}

void Apex::unshadow(std::uint64_t parent, std::uint32_t s, std::uint32_t e) {
  std::lock_guard<sync::SpinLock> lock(metas_mu_);
  if (parent == 0) {
    root_meta_.store(nullptr, std::memory_order_release);
    return;
  }
  // A parent not admitted in this session has no shadow (recovery's redo runs before any).
  const auto it = inner_metas_.find(parent);
  if (it == inner_metas_.end()) return;
  for (std::uint32_t i = s; i <= e; ++i) it->second->child[i].store(0, std::memory_order_release);
}

void Apex::resolve_all(const InnerMeta& im, std::uint32_t depth) const {
  if (depth >= kMaxDepth) return;  // a cycle: lookups fall back to leaf(), which reports it
  std::uintptr_t prev = 0;
  for (std::uint32_t i = 0; i < im.model.slots; ++i) {
    const std::uintptr_t c = resolve_child(im, i);
    if ((c & kInnerTag) != 0 && c != prev)  // a child over several slots is walked once
      resolve_all(*reinterpret_cast<const InnerMeta*>(c & ~kInnerTag), depth + 1);
    prev = c;
  }
}

// Rebuilds a node's DRAM state from PM (first access in this session: L != tag), checking it
// on the way (R4): the header (data_header_damage), every record (a used PA slot holds a key
// of the node's range inside its probe window; a used SA or extended stash slot a key of the
// range) and the extended stash chain (offsets in the heap, 256 B aligned, outside the node,
// no cycle). Free slots are the ones holding the node's invalid key; stash records are
// indexed in the overflow bucket of the group their key predicts to.
std::unique_ptr<DataMeta> Apex::rebuild_meta(std::uint64_t off, std::string* why) const {
  if (std::string d = data_header_damage(off); !d.empty()) {
    *why = std::move(d);
    return nullptr;
  }
  DataNode* dn = data(off);
  auto m = std::make_unique<DataMeta>();
  m->model = {dn->slope, dn->intercept, dn->lo, static_cast<double>(dn->pa_slots - 1),
              dn->pa_slots};
  m->hi = dn->hi;
  m->pa = dn->pa();
  m->off = off;
  const std::uint64_t inv = dn->invalid_key;
  auto in_range = [&](std::uint64_t k) { return k >= dn->lo && k <= dn->hi; };
  m->num_locks = (dn->pa_slots + 255) / 256;  // <= kMaxRecordLocks: bytes <= data_max_ checked
  m->accel.assign(dn->pa_slots / kGroup, Accelerator{});
  for (std::uint32_t i = 0; i < dn->pa_slots; ++i) {
    Accelerator& a = m->accel[i / kGroup];
    const std::uint64_t k = dn->pa()[i].key;
    if (k == inv) {
      a.word |= std::uint64_t{1} << (i % kGroup);
      continue;
    }
    const std::uint32_t p = predict(dn, k);
    if (!in_range(k) || i < p || i >= p + kProbeDistance) {
      *why = "PA slot " + std::to_string(i) + " holds a key outside the range or probe window";
      return nullptr;
    }
    a.fp[i % kGroup] = fingerprint(k);
    m->add_keys(1);
  }
  m->stash_used.assign((dn->sa_slots + 63) / 64, 0);
  auto* self = const_cast<Apex*>(this);
  for (std::uint32_t i = 0; i < dn->sa_slots; ++i) {
    const Record& r = dn->sa()[i];
    if (r.key == inv) continue;
    if (!in_range(r.key)) {
      *why = "SA slot " + std::to_string(i) + " holds a key outside the node's range";
      return nullptr;
    }
    m->stash_used[i / 64] |= std::uint64_t{1} << (i % 64);
    self->bucket_add(*m, predict(dn, r.key) / kGroup, r.key, pool_->offset_of(&r));
    m->add_keys(1);
    m->add_stash(1);
  }
  if (!rebuild_ext(off, *m, why)) return nullptr;
  m->created_cost = search_cost(*m);
  m->built_keys = m->keys();
  return m;
}

// rebuild_meta's extended stash part: indexes the chain's records, checking every block
// (in the heap, 256 B aligned, outside the node, no cycle) and key (in the node's range).
bool Apex::rebuild_ext(std::uint64_t off, DataMeta& m, std::string* why) const {
  const DataNode* dn = data(off);
  const std::uint64_t inv = dn->invalid_key;
  auto* self = const_cast<Apex*>(this);
  // Brent's cycle check: `mark` is revisited iff the chain loops (O(1) memory).
  std::uint64_t mark = 0, steps = 0, lap = 1;
  for (std::uint64_t b = dn->ext_head; b != 0; b = pool_->at<ExtStash>(b)->next) {
    if (b == mark || pool_->checked<ExtStash>(b, sizeof(ExtStash), 256) == nullptr ||
        (b + sizeof(ExtStash) > off && b < off + dn->bytes)) {
      *why = "extended stash block " + std::to_string(b) + " is out of bounds, misaligned, "
             "inside the node or on a cycle";
      return false;
    }
    if (++steps == lap) {
      mark = b;
      lap *= 2;
      steps = 0;
    }
    ExtInfo info{b, 0};
    const ExtStash* blk = pool_->at<ExtStash>(b);
    for (std::uint32_t j = 0; j < kExtRecords; ++j) {
      const Record& r = blk->rec[j];
      if (r.key == inv) continue;
      if (r.key < dn->lo || r.key > dn->hi) {
        *why = "extended stash block " + std::to_string(b) + " holds a key outside the range";
        return false;
      }
      info.used = static_cast<std::uint16_t>(info.used | (1u << j));
      self->bucket_add(m, predict(dn, r.key) / kGroup, r.key, pool_->offset_of(&r));
      m.add_keys(1);
      m.add_stash(1);
    }
    m.ext.push_back(info);
  }
  return true;
}

double Apex::search_cost(const DataMeta& m) const {
  // Cost model (PROTOCOL.md "SMO policy"): expected cache misses of probe-and-stash. A PA hit
  // costs one line; an overflowed key costs the PA probe (up to 2 lines), the bucket and the
  // stash line: about 3 in all.
  if (m.keys() == 0) return 1.0;
  const double o = static_cast<double>(m.stashed()) / static_cast<double>(m.keys());
  return 1.0 + 2.0 * o;
}

bool Apex::lock_window(DataMeta& m, LockSpan span) const {
  for (std::uint32_t i = span.first; i <= span.last; ++i) {  // left to right: no deadlock
    bool obsolete = false;
    m.locks[i].writeLockOrRestart(obsolete);  // waits while locked; fails only if obsolete
    if (obsolete) {
      // An SMO replaced the node: release what we hold; the caller restarts from the root.
      for (std::uint32_t j = i; j-- > span.first;) m.locks[j].writeUnlock();
      return false;
    }
  }
  return true;
}

bool Apex::lock_all(DataMeta& m) const {
  return lock_window(m, {0, m.num_locks - 1});
}

void Apex::unlock_window(DataMeta& m, LockSpan span) const {
  for (std::uint32_t i = span.last + 1; i-- > span.first;) m.locks[i].writeUnlock();
}

bool Apex::bucket_add(DataMeta& m, std::uint32_t group, std::uint64_t key,
                      std::uint64_t rec_off) {
  const std::uint64_t entry = (std::uint64_t{fingerprint(key)} << kFpShift) | rec_off;
  OverflowBucket* b = m.bucket(group);
  OverflowBucket* last = nullptr;
  // Lock holder only. Entries and links are release stores: optimistic readers load them
  // with acquire and validate their version afterwards.
  for (; b != nullptr; last = b, b = b->next) {
    for (std::uint64_t& e : b->entry) {
      if (e == 0) {
        sync::locked_write(e, entry);
        return false;
      }
    }
  }
  auto* fresh = new OverflowBucket{};
  fresh->entry[0] = entry;  // not yet visible to anyone
  if (last == nullptr) {
    m.set_bucket(group, fresh);
  } else {
    sync::locked_write(last->next, fresh);
  }
  return true;
}

void Apex::bucket_remove(DataMeta& m, std::uint32_t group, std::uint64_t rec_off) {
  for (OverflowBucket* b = m.bucket(group); b != nullptr; b = b->next) {
    for (std::uint64_t& e : b->entry) {
      if ((e & kOffsetMask) == rec_off) {
        sync::locked_write(e, std::uint64_t{0});
        return;
      }
    }
  }
}

// Probe-and-stash: PA[p, p+D) (left to right, clipped at the PA end), then the overflow bucket
// chain of p's group. Inserts, updates and deletes filter PA slots through the fingerprints and
// free bits first (use_pa_fp); lookups read PA directly (§4.2).
Apex::Location Apex::locate(std::uint64_t off, const DataMeta& m, std::uint64_t key,
                            bool use_pa_fp, std::uint32_t p) const {
  DataNode* dn = data(off);
  if (p == kNoPrediction) p = predict(dn, key);
  const std::uint32_t end = std::min(p + kProbeDistance, dn->pa_slots);
  if (use_pa_fp) {
    // One 16-byte compare per accelerator group (the window spans at most two): the used
    // slots of [p, end) whose fingerprint matches, then only those records are read.
    const std::uint8_t fp = fingerprint(key);
    for (std::uint32_t base = p / kGroup * kGroup; base < end; base += kGroup) {
      const Accelerator& a = m.accel[base / kGroup];
      std::uint32_t cand = fp_matches(a.fp, fp) & ~static_cast<std::uint32_t>(a.word & kFreeMask);
      if (p > base) cand &= ~((1u << (p - base)) - 1);
      if (end < base + kGroup) cand &= (1u << (end - base)) - 1;
      for (; cand != 0; cand &= cand - 1) {
        const std::uint32_t i = base + static_cast<std::uint32_t>(std::countr_zero(cand));
        if (sync::optimistic_read(dn->pa()[i].key) == key)
          return {&dn->pa()[i], Location::Where::pa, i};
      }
    }
  } else {
    for (std::uint32_t i = p; i < end; ++i)
      if (sync::optimistic_read(dn->pa()[i].key) == key)
        return {&dn->pa()[i], Location::Where::pa, i};
  }
  const Record* r = find_stash(m, key, p);
  if (r == nullptr) return {};
  const Record* sa = dn->sa();
  auto* rec = const_cast<Record*>(r);
  if (r >= sa && r < sa + dn->sa_slots)
    return {rec, Location::Where::sa, static_cast<std::uint32_t>(r - sa)};
  return {rec, Location::Where::ext, 0};
}

const Record* Apex::find_stash(const DataMeta& m, std::uint64_t key, std::uint32_t p) const {
  const std::uint8_t fp = fingerprint(key);
  // Readers may see a bucket mid-update; every entry they follow is a record offset of this
  // node (buckets live as long as the node), and the caller validates the version.
  for (const OverflowBucket* b = m.bucket(p / kGroup); b != nullptr;
       b = sync::optimistic_read(b->next)) {
    for (const std::uint64_t& slot : b->entry) {
      const std::uint64_t e = sync::optimistic_read(slot);
      if (e == 0 || (e >> kFpShift) != fp) continue;
      const Record* r = pool_->at<Record>(e & kOffsetMask);
      if (sync::optimistic_read(r->key) == key) return r;
    }
  }
  return nullptr;
}

Code Apex::insert_into(std::uint64_t off, DataMeta& m, std::uint64_t key, std::uint64_t payload,
                       std::uint32_t p) {
  DataNode* dn = data(off);
  if (p == kNoPrediction) p = predict(dn, key);
  const std::uint32_t end = std::min(p + kProbeDistance, dn->pa_slots);
  // Release stores (pm::publish): optimistic readers load these words concurrently.
  auto write = [&](Record* r) {
    pm::publish(&r->payload, payload);  // A1: payload first ...
    pm::publish(&r->key, key);          // A2: ... then the key, in the same line
    pm::persist(r, sizeof(Record));     // A3: one flush + fence commits the insert
  };
  for (std::uint32_t i = p; i < end; ++i) {
    Accelerator& a = m.accel[i / kGroup];
    const std::uint64_t bit = std::uint64_t{1} << (i % kGroup);
    if ((a.word & bit) == 0) continue;
    m.add_keys(1);  // before the persist (see DataMeta::note_insert)
    m.note_insert(false, 0);
    write(&dn->pa()[i]);
    m.set_word(i / kGroup, a.word & ~bit);
    a.fp[i % kGroup] = fingerprint(key);
    return Code::ok;
  }
  // Stash array: claim the first free slot of the stash bitmap by CAS (writers holding other
  // locks of this node claim slots concurrently).
  for (std::size_t w = 0; w < m.stash_used.size(); ++w) {
    const std::uint64_t limit =
        std::min<std::uint64_t>(64, dn->sa_slots - static_cast<std::uint64_t>(w) * 64);
    const std::uint64_t full = limit == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << limit) - 1;
    std::atomic_ref<std::uint64_t> word(m.stash_used[w]);
    std::uint64_t cur = word.load(std::memory_order_acquire);
    while ((~cur & full) != 0) {
      const unsigned b = static_cast<unsigned>(std::countr_zero(~cur & full));
      pm::yield_point("apex.stash_claim");
      if (!word.compare_exchange_weak(cur, cur | (std::uint64_t{1} << b), std::memory_order_acq_rel,
                                      std::memory_order_acquire))
        continue;
      Record* r = &dn->sa()[w * 64 + b];
      m.add_keys(1);
      m.add_stash(1);
      write(r);
      const bool fresh = bucket_add(m, p / kGroup, key, pool_->offset_of(r));
      m.note_insert(true, fresh ? 1 : 0);
      return Code::ok;
    }
  }
  // Extended stash blocks, under the node's extended-stash mutex.
  std::lock_guard<sync::SpinLock> ext_lock(m.ext_mu);
  for (ExtInfo& info : m.ext) {
    if (info.used == (1u << kExtRecords) - 1) continue;
    const unsigned j = static_cast<unsigned>(std::countr_zero(static_cast<unsigned>(~info.used)));
    Record* r = &pool_->at<ExtStash>(info.off)->rec[j];
    m.add_keys(1);
    m.add_stash(1);
    write(r);
    info.used = static_cast<std::uint16_t>(info.used | (1u << j));
    const bool fresh = bucket_add(m, p / kGroup, key, pool_->offset_of(r));
    m.note_insert(true, fresh ? 1 : 0);
    return Code::ok;
  }
  Code code = Code::ok;
  const std::uint64_t b = pool_->allocator().allocate(sizeof(ExtStash), &code);
  if (b == 0) return code;
  ExtStash* blk = pool_->at<ExtStash>(b);
  ExtStash init{};
  init.next = dn->ext_head;
  for (Record& r : init.rec) r = {dn->invalid_key, 0};
  pm::copy(blk, &init, sizeof init);          // A4: a fresh block, every slot free
  pm::persist(blk, sizeof init);              // A5: persisted before it is reachable
  pm::publish(&dn->ext_head, b);              // A6: link it at the head of the chain
  pm::persist(&dn->ext_head, sizeof b);       // A7: the block is owned from here on
  m.ext.insert(m.ext.begin(), ExtInfo{b, 0});
  Record* r = &blk->rec[0];
  m.add_keys(1);
  m.add_stash(1);
  write(r);
  m.ext.front().used = 1;
  const bool fresh = bucket_add(m, p / kGroup, key, pool_->offset_of(r));
  m.note_insert(true, fresh ? 2 : 1);  // the extended stash block, and maybe a bucket
  return Code::ok;
}

void Apex::erase_at(std::uint64_t off, DataMeta& m, const Location& loc, std::uint64_t key) {
  DataNode* dn = data(off);
  m.add_keys(-1);  // before the persist (see DataMeta::note_insert)
  pm::publish(&loc.rec->key, dn->invalid_key);     // A8: the invalid key frees the slot
  pm::persist(&loc.rec->key, sizeof(std::uint64_t));  // A9: one flush + fence
  switch (loc.where) {
    case Location::Where::pa:
      m.set_word(loc.index / kGroup,
                 m.accel[loc.index / kGroup].word | (std::uint64_t{1} << (loc.index % kGroup)));
      return;
    case Location::Where::sa:
      // release: the invalid key (A8) is written before the slot can be claimed again.
      std::atomic_ref<std::uint64_t>(m.stash_used[loc.index / 64])
          .fetch_and(~(std::uint64_t{1} << (loc.index % 64)), std::memory_order_release);
      break;
    case Location::Where::ext: {
      std::lock_guard<sync::SpinLock> ext_lock(m.ext_mu);
      const std::uint64_t roff = pool_->offset_of(loc.rec);
      for (ExtInfo& info : m.ext) {
        if (roff >= info.off && roff < info.off + sizeof(ExtStash)) {
          const auto j = static_cast<unsigned>((roff - info.off - offsetof(ExtStash, rec)) / 16);
          info.used = static_cast<std::uint16_t>(info.used & ~(1u << j));
        }
      }
      break;
    }
    case Location::Where::none:
      return;
  }
  m.add_stash(-1);
  bucket_remove(m, predict(dn, key) / kGroup, pool_->offset_of(loc.rec));
}

void Apex::collect(std::uint64_t off, std::vector<Record>& out) const {
  const DataNode* dn = data(off);
  const std::uint64_t inv = dn->invalid_key;
  for (std::uint32_t i = 0; i < dn->pa_slots + dn->sa_slots; ++i) {
    const Record& r = dn->pa()[i];
    if (r.key != inv) out.push_back(r);
  }
  for (std::uint64_t b = dn->ext_head; b != 0; b = pool_->at<ExtStash>(b)->next)
    for (const Record& r : pool_->at<ExtStash>(b)->rec)
      if (r.key != inv) out.push_back(r);
}

}  // namespace pmindex::apex

// Structural modification operations with hybrid logging (paper §4.4): data node expansion,
// sideways split, downward split, inner node expansion, and after deletes merge and
// contraction. Each SMO:
//   UNDO stage: log line written, new node(s) built and persisted (not reachable yet)
//   REDO stage: parent slots switched to the new node(s) (idempotent, redone at recovery)
//   none:       log cleared, old node(s) retired (freed through epochs)
// Steps A12..A18 in PROTOCOL.md; the locks the caller (smo_locked) holds: "Concurrency" there.
#include <algorithm>
#include <cmath>

#include "index/apex/apex.h"
#include "pmindex/pm/thread_slot.h"

namespace pmindex::apex {

namespace {
bool by_key(const Record& a, const Record& b) { return a.key < b.key; }
}  // namespace

SmoLog* Apex::my_log() const {
  // One line per thread slot: concurrent SMOs of different threads use different lines.
  return pool_->at<SmoLog>(root_->logs) + (pm::this_thread_slot() % kMaxLogs);
}

void Apex::log_begin(SmoLog* log, SmoKind kind, std::uint64_t old_node, std::uint64_t parent,
                     std::uint64_t key, std::uint32_t s, std::uint32_t e, std::uint32_t m) {
  current_kind_.store(kind, std::memory_order_relaxed);
  SmoLog init{0, old_node, 0, 0, parent, key, s, e, m, 0};
  pm::copy(&log->old_node, &init.old_node, sizeof(SmoLog) - 8);   // A12: log fields ...
  pm::publish(&log->stage_kind, stage_word(SmoStage::undo, kind)); // ... stage UNDO last
  pm::persist(log, sizeof(SmoLog));
}

void Apex::log_stage(SmoLog* log, SmoStage stage, SmoKind kind) {
  pm::publish(&log->stage_kind, stage_word(stage, kind));
  pm::persist(&log->stage_kind, 8);
}

void Apex::switch_children(std::uint64_t parent, std::uint32_t s, std::uint32_t e,
                           std::uint64_t to) {
  if (parent == 0) {
    pm::publish(&root_->root_node, to);                       // A16: root word
    pm::persist(&root_->root_node, 8);
  } else {
    std::uint64_t* ch = inner(parent)->children();
    for (std::uint32_t i = s; i <= e; ++i) pm::publish(&ch[i], to);  // A16: child slots
    pm::persist(&ch[s], 8ull * (e - s + 1));
  }
  unshadow(parent, s, e);  // DRAM only, after the PM words: see InnerMeta
}

void Apex::slot_range(std::uint64_t parent, std::uint64_t child, std::uint32_t slot,
                      std::uint32_t* s, std::uint32_t* e) const {
  const InnerNode* in = inner(parent);
  const std::uint64_t* ch = in->children();
  std::uint32_t a = slot, b = slot;
  // acquire: SMOs of sibling children publish their own slots concurrently (shared parent
  // lock); a sibling's slot never holds `child`, whichever value we read.
  while (a > 0 && pm::load_acquire(&ch[a - 1]) == child) --a;
  while (b + 1 < in->fanout && pm::load_acquire(&ch[b + 1]) == child) ++b;
  *s = a;
  *e = b;
}

std::uint32_t Apex::sideways_boundary(const InnerNode* p, const std::vector<Record>& recs,
                                      std::uint32_t s, std::uint32_t e) const {
  std::vector<std::uint64_t> per_slot(e - s + 1, 0);
  for (const Record& r : recs) {
    const std::uint32_t sl = std::clamp(route(p, r.key), s, e);
    ++per_slot[sl - s];
  }
  std::uint64_t left = 0, best_left = 0;
  std::uint32_t best_m = 0;
  std::uint64_t best_gap = ~std::uint64_t{0};
  for (std::uint32_t mid = s + 1; mid <= e; ++mid) {
    left += per_slot[mid - 1 - s];
    const std::uint64_t right = recs.size() - left;
    const std::uint64_t gap = left > right ? left - right : right - left;
    if (gap < best_gap) {
      best_gap = gap;
      best_m = mid;
      best_left = left;
    }
  }
  return best_left > 0 && best_left < recs.size() ? best_m : 0;
}

Code Apex::smo(std::uint64_t off, const std::vector<PathStep>& path, std::uint64_t key,
               bool parent_exclusive, bool* parent_replaced) {
  *parent_replaced = false;
  DataMeta& m = *meta_for(off);  // built when the SMO's path was taken
  const std::uint64_t parent = path.back().inner;
  std::uint32_t s = 0, e = 0;
  slot_range(parent, off, path.back().slot, &s, &e);
  const std::uint64_t n = m.keys();
  const bool can_expand = slots_for(n) <= max_data_slots();
  // Cost model (PROTOCOL.md "SMO policy"): expanding retrains the model on the records, so
  // when the node's cost has drifted (its probe-and-stash cost, or the inserts' cost, is 1.5x
  // what it was when built) expand only if a model refitted to the expanded PA keeps the
  // simulated probe-and-stash cost 1 + 2·O within kDataCostLimit (the bulk loader's rule for a
  // data node); else the keys are not linear enough for one node: split. A node whose cost
  // has not drifted just expands (no simulation: it would cost as much as the copy). Nodes of
  // < 64 keys always expand.
  std::vector<Record> recs;
  collect(off, recs);
  std::sort(recs.begin(), recs.end(), by_key);
  bool want_split = !can_expand;
  if (!want_split && n >= 64 && (search_cost(m) > kCostDeviation * m.created_cost || cost_drifted(m))) {
    const auto pa = static_cast<std::uint32_t>(slots_for(n) * (1.0 - kStashMin)) / kGroup * kGroup;
    want_split = 1.0 + 2.0 * simulate_overflow(recs, data(off)->lo, std::max(pa, kGroup)) >
                 kDataCostLimit;
  }
  if (!want_split) return expand_data(off, parent, s, e, key);

  const InnerNode* p = inner(parent);
  const LinearModel pm_model{p->slope, p->intercept};
  if (e > s) {
    if (const std::uint32_t mid = sideways_boundary(p, recs, s, e); mid != 0)
      return split_sideways(off, parent, s, e, mid, key);
  }
  // Inner node expansion (fanout 2F), in one of two exact forms:
  //   doubling:  slope and intercept x2, so slot i becomes 2i, 2i+1 (same key domain, finer);
  //   extending: same model, new slots F..2F-1 all point at the last child, so keys beyond
  //              the old domain (appends) get slots of their own.
  // Worth it if, within a few expansions that fit the inner maximum, the expanded model
  // separates this node's records (later SMOs then split sideways); else split downward.
  std::uint64_t grand = 0;
  std::uint32_t gs = 0, ge = 0;
  if (path.size() >= 2) {
    grand = path[path.size() - 2].inner;
    slot_range(grand, parent, path[path.size() - 2].slot, &gs, &ge);
  }
  const bool last_child = e + 1 == p->fanout;
  // An inner expansion needs one block of twice the parent's size; when the pool has no such
  // block free (pool_full: the free space is in smaller pieces), the downward split needs only
  // small ones (a fanout-2 inner node and two data nodes), so it is the fallback.
  auto expand_parent = [&](InnerExpansion how) {
    Code c = expand_inner(parent, grand, gs, ge, key, how);
    *parent_replaced = c == Code::ok;
    if (c == Code::pool_full) {
      c = split_downward(off, parent, s, e, key);
      if (c == Code::unsupported) c = Code::pool_full;
    }
    return c;
  };
  for (std::uint32_t k = 1; k <= 4; ++k) {
    const std::uint64_t f = std::uint64_t{p->fanout} << k;
    if (f > 0xffffffffu || inner_bytes(static_cast<std::uint32_t>(f)) > inner_max_) break;
    const double scale = std::ldexp(1.0, static_cast<int>(k));
    const LinearModel scaled{pm_model.slope * scale, pm_model.intercept * scale};
    const auto fanout = static_cast<std::uint32_t>(f);
    auto separates = [&](const LinearModel& mm) {
      return predict_slot(mm, x_of(recs.front().key, p->lo), fanout) !=
             predict_slot(mm, x_of(recs.back().key, p->lo), fanout);
    };
    // Replacing the parent needs its lock exclusively: ask the caller to retry so.
    if (std::isfinite(scaled.slope) && std::isfinite(scaled.intercept) && separates(scaled)) {
      if (!parent_exclusive) return Code::busy;
      return expand_parent(InnerExpansion::doubling);
    }
    if (last_child && separates(pm_model)) {
      if (!parent_exclusive) return Code::busy;
      return expand_parent(InnerExpansion::extend_right);
    }
    const LinearModel shifted{pm_model.slope,
                              pm_model.intercept + static_cast<double>(f - p->fanout)};
    if (s == 0 && std::isfinite(shifted.intercept) && separates(shifted)) {
      if (!parent_exclusive) return Code::busy;
      const Code c = expand_parent(InnerExpansion::extend_left);
      if (c != Code::unsupported) return c;
    }
  }
  if (Code c = split_downward(off, parent, s, e, key); c != Code::unsupported) return c;
  if (can_expand) return expand_data(off, parent, s, e, key);
  return Code::unsupported;
}

Code Apex::expand_data(std::uint64_t off, std::uint64_t parent, std::uint32_t s, std::uint32_t e,
                       std::uint64_t key) {
  DataMeta& m = *meta_for(off);  // built when the SMO's path was taken
  const DataNode* old = data(off);
  std::vector<Record> recs;
  collect(off, recs);
  std::sort(recs.begin(), recs.end(), by_key);
  // S = O: the new node's stash ratio is the old node's overflow ratio (clamped by build_data).
  const double o = recs.empty() ? 0.0 : static_cast<double>(m.stashed()) / static_cast<double>(recs.size());
  SmoLog* log = my_log();
  log_begin(log, SmoKind::expand_data, off, parent, key, s, e, 0);       // A12
  step("undo");
  Code code = Code::ok;
  const std::uint64_t fresh = build_data(recs, old->lo, old->hi, o, slots_for(recs.size()), &code);
  if (fresh == 0) {
    log_stage(log, SmoStage::none, SmoKind::none);
    return code;
  }
  pm::publish(&log->new_a, fresh);                                       // A14: new in the log
  pm::persist(&log->new_a, 8);
  step("built");
  log_stage(log, SmoStage::redo, SmoKind::expand_data);                  // A15: UNDO -> REDO
  step("redo");
  switch_children(parent, s, e, fresh);                                  // A16
  step("switched");
  log_stage(log, SmoStage::none, SmoKind::none);                         // A17
  step("done");
  // A18: the caller retires the old node (smo_locked) once its locks are obsolete.
  if (data(fresh)->bytes >= old->bytes) {
    counters_.expansions.fetch_add(1, std::memory_order_relaxed);
  } else {
    counters_.contractions.fetch_add(1, std::memory_order_relaxed);
  }
  return Code::ok;
}

Code Apex::contract_locked(std::uint64_t off, DataMeta& m, const std::vector<PathStep>& path,
                           bool parent_exclusive, std::uint64_t key) {
  // Held: the grandparent's lock (shared), the parent's (shared, or exclusive when
  // parent_exclusive), m.smo_mu and every record lock of `off`. Returns ok when `off` was
  // replaced (the caller releases its locks obsolete and retires it), busy when a collapse
  // needs the parent exclusively, unsupported when nothing was done.
  const std::uint64_t parent = path.back().inner;
  const std::uint32_t slot = path.back().slot;
  const DataNode* dn = data(off);
  const InnerNode* p = inner(parent);
  std::uint32_t s = 0, e = 0;
  slot_range(parent, off, slot, &s, &e);
  const std::uint64_t n = m.keys();
  // 1. Merge with a neighbour in the same parent: the right one (lock order: left to right),
  //    else the left one if its SMO lock is free right now (try_lock: we hold the right one).
  for (const bool right : {true, false}) {
    if (right ? e + 1 >= p->fanout : s == 0) continue;
    const std::uint64_t other = pm::load_acquire(&p->children()[right ? e + 1 : s - 1]);
    if (type_of(other) != NodeType::data) continue;
    const DataNode* on = data(other);
    if ((right ? dn->lo : on->lo) == 0 && (right ? on->hi : dn->hi) == ~std::uint64_t{0})
      continue;  // the smallest and largest keys must stay in different nodes (invariant 2)
    DataMeta* omp = meta_for(other);  // checked now if not yet touched in this session
    if (omp == nullptr) continue;     // damaged (recorded): no merge with it
    if (right ? on->lo != dn->hi + 1 : on->hi + 1 != dn->lo) {  // not the neighbour's range
      (void)damaged(other, "a data node's range does not adjoin its neighbour's");
      continue;
    }
    DataMeta& om = *omp;
    std::unique_lock<sync::SpinLock> other_smo(om.smo_mu, std::defer_lock);
    if (right) other_smo.lock(); else if (!other_smo.try_lock()) continue;
    if (om.retired || !lock_all(om)) continue;
    const std::uint64_t total = n + om.keys();
    if (slots_for(total) > max_data_slots()) {  // merged node would exceed max at density 0.6
      unlock_window(om, {0, om.num_locks - 1});
      continue;
    }
    std::uint32_t os = 0, oe = 0;
    slot_range(parent, other, right ? e + 1 : s - 1, &os, &oe);
    MergeTarget to{parent, std::min(s, os), std::max(e, oe), false};
    // Collapse: the two nodes fill a non-root parent, so the merged node (whose range is then
    // the parent's: children partition their parent's range) replaces the parent itself.
    if (to.s == 0 && to.e + 1 == p->fanout && path.size() >= 2 &&
        std::min(dn->lo, on->lo) == p->lo && std::max(dn->hi, on->hi) == p->hi) {
      if (!parent_exclusive) {  // the parent is replaced: redo the SMO holding it exclusively
        unlock_window(om, {0, om.num_locks - 1});
        return Code::busy;
      }
      const PathStep& g = path[path.size() - 2];
      to = {g.inner, 0, 0, true};
      slot_range(g.inner, parent, g.slot, &to.s, &to.e);
    }
    const Code c = merge_data(off, other, parent, to, key);
    if (c != Code::ok) {
      unlock_window(om, {0, om.num_locks - 1});
      return c;
    }
    om.retired = true;
    for (std::uint32_t i = 0; i < om.num_locks; ++i) om.locks[i].writeUnlockObsolete();
    other_smo.unlock();
    retire_node(other);  // A18
    if (to.collapse) {
      // Under its exclusive lock: SMOs that then take it see the parent replaced and retry.
      inner_meta_for(parent)->obsolete = true;
      retire_node(parent);  // A18
    }
    return Code::ok;
  }
  // 2. Contract: rebuild at density 0.6 if that frees at least a quarter of the node. From
  //    0.6 the node is below the bound (0.5) again after a sixth of its keys go, but shrinks
  //    again only once a quarter of them went (0.45): an O(n) rebuild per n/4 deletes. (Halving
  //    it, as before, left nodes emptied to 0.3-0.45 at their full size: a full pool with every
  //    other key removed took back 2,190 of 8,409 new keys, issue 19.)
  const std::uint64_t capacity = std::uint64_t{dn->pa_slots} + dn->sa_slots;
  if (4 * std::max<std::uint64_t>(slots_for(n), 2 * kGroup) <= 3 * capacity)
    return expand_data(off, parent, s, e, key);
  // 3. Neither: retry only after another quarter of the keys is gone.
  m.contract_below.store(n - n / 4, std::memory_order_relaxed);
  return Code::unsupported;
}

Code Apex::merge_data(std::uint64_t off, std::uint64_t other, std::uint64_t parent,
                      const MergeTarget& to, std::uint64_t key) {
  const DataNode* a = data(off);
  const DataNode* b = data(other);
  const std::uint64_t lo = std::min(a->lo, b->lo), hi = std::max(a->hi, b->hi);
  std::vector<Record> recs;
  collect(off, recs);
  collect(other, recs);
  std::sort(recs.begin(), recs.end(), by_key);
  SmoLog* log = my_log();
  // A collapse logs the replaced parent as the old node and the grandparent as the parent:
  // recovery redoes it as a merge, one publish of new_a into the logged slot run (R3).
  const SmoKind kind = to.collapse ? SmoKind::collapse : SmoKind::merge;
  log_begin(log, kind, to.collapse ? parent : off, to.node, key, to.s, to.e, 0);  // A12
  step("undo");
  Code code = Code::ok;
  const std::uint64_t fresh = build_data(recs, lo, hi, kStashMin, slots_for(recs.size()), &code);
  if (fresh == 0) {
    log_stage(log, SmoStage::none, SmoKind::none);
    return code;
  }
  pm::publish(&log->new_a, fresh);                                       // A14
  pm::persist(&log->new_a, 8);
  step("built");
  if (fault_ != Fault::merge_switch_in_undo) [[likely]]
    log_stage(log, SmoStage::redo, kind);                                 // A15
  step("redo");
  switch_children(to.node, to.s, to.e, fresh);                           // A16
  step("switched");
  log_stage(log, SmoStage::none, SmoKind::none);                         // A17
  step("done");
  counters_.merges.fetch_add(1, std::memory_order_relaxed);
  if (to.collapse) counters_.collapses.fetch_add(1, std::memory_order_relaxed);
  return Code::ok;  // A18: the caller retires both old nodes (and a collapsed parent)
}

Code Apex::split_sideways(std::uint64_t off, std::uint64_t parent, std::uint32_t s,
                          std::uint32_t e, std::uint32_t mid, std::uint64_t key) {
  DataMeta& m = *meta_for(off);  // built when the SMO's path was taken
  const DataNode* old = data(off);
  const InnerNode* p = inner(parent);
  std::uint64_t bound = 0;
  if (!boundary({p->slope, p->intercept}, p->fanout, p->lo, old->lo, old->hi, mid, &bound) ||
      bound == old->lo)
    return Code::unsupported;
  std::vector<Record> recs;
  collect(off, recs);
  std::sort(recs.begin(), recs.end(), by_key);
  const auto cut = std::partition_point(recs.begin(), recs.end(),
                                        [&](const Record& r) { return r.key < bound; });
  std::vector<Record> left(recs.begin(), cut), right(cut, recs.end());
  const double o = recs.empty() ? 0.0 : static_cast<double>(m.stashed()) / static_cast<double>(recs.size());
  SmoLog* log = my_log();
  log_begin(log, SmoKind::split_sideways, off, parent, key, s, e, mid);  // A12
  step("undo");
  Code code = Code::ok;
  const std::uint64_t a = build_data(left, old->lo, bound - 1, o, slots_for(left.size()), &code);
  const std::uint64_t b =
      a == 0 ? 0 : build_data(right, bound, old->hi, o, slots_for(right.size()), &code);
  if (b == 0) {
    if (a != 0) free_node(a);
    log_stage(log, SmoStage::none, SmoKind::none);
    return code;
  }
  pm::publish(&log->new_a, a);                                           // A14
  pm::publish(&log->new_b, b);
  pm::persist(&log->new_a, 16);
  step("built");
  log_stage(log, SmoStage::redo, SmoKind::split_sideways);               // A15
  step("redo");
  switch_children(parent, s, mid - 1, a);                                // A16
  step("half-switched");
  switch_children(parent, mid, e, b);
  step("switched");
  log_stage(log, SmoStage::none, SmoKind::none);                         // A17
  step("done");
  // A18: the caller retires the old node (smo_locked) once its locks are obsolete.
  counters_.sideways.fetch_add(1, std::memory_order_relaxed);
  return Code::ok;
}

Code Apex::split_downward(std::uint64_t off, std::uint64_t parent, std::uint32_t s,
                          std::uint32_t e, std::uint64_t key) {
  DataMeta& m = *meta_for(off);  // built when the SMO's path was taken
  const DataNode* old = data(off);
  std::vector<Record> recs;
  collect(off, recs);
  std::sort(recs.begin(), recs.end(), by_key);
  if (recs.size() < 2) return Code::unsupported;
  // A fanout-2 model with its boundary halfway between two neighbouring keys near the median
  // whose model inputs differ (u64 inputs are relative to lo, so they differ unless the node
  // spans more than 2^53).
  const std::uint64_t lo = old->lo, hi = old->hi;
  std::size_t h = recs.size() / 2;
  std::size_t found = 0;
  for (std::size_t d = 0; d < recs.size() && found == 0; ++d) {
    for (const std::size_t c : {h + d, h - std::min(h, d)}) {
      if (c >= 1 && c < recs.size() && x_of(recs[c - 1].key, lo) < x_of(recs[c].key, lo)) {
        found = c;
        break;
      }
    }
  }
  if (found == 0) return Code::unsupported;
  const double xa = x_of(recs[found - 1].key, lo), xb = x_of(recs[found].key, lo);
  const double t = xa / 2 + xb / 2;
  // Prefer a gentle slope (1 / the records' spread): later expansions of the new inner node
  // (which double its model) then spread keys beyond the current ones over new slots. Fall
  // back to a steep step between the two median keys if rounding defeats the gentle one.
  auto valid = [&](const LinearModel& c) {
    return std::isfinite(c.slope) && std::isfinite(c.intercept) && c.slope > 0 &&
           predict_slot(c, xa, 2) == 0 && predict_slot(c, xb, 2) == 1;
  };
  const double spread = x_of(recs.back().key, lo) - x_of(recs.front().key, lo);
  LinearModel model{1.0 / spread, 1.0 - t / spread};
  if (!valid(model)) {
    const double sl = 2.0 / (xb - xa);
    model = {sl, 1.0 - t * sl};
    if (!valid(model)) return Code::unsupported;
  }
  std::uint64_t bound = 0;
  if (!boundary(model, 2, lo, lo, hi, 1, &bound) || bound == lo) return Code::unsupported;
  const auto cut = std::partition_point(recs.begin(), recs.end(),
                                        [&](const Record& r) { return r.key < bound; });
  std::vector<Record> left(recs.begin(), cut), right(cut, recs.end());
  if (left.empty() || right.empty()) return Code::unsupported;
  const double o = static_cast<double>(m.stashed()) / static_cast<double>(recs.size());
  SmoLog* log = my_log();
  log_begin(log, SmoKind::split_downward, off, parent, key, s, e, 0);    // A12
  step("undo");
  Code code = Code::ok;
  const std::uint64_t a = build_data(left, lo, bound - 1, o, slots_for(left.size()), &code);
  const std::uint64_t b = a == 0 ? 0 : build_data(right, bound, hi, o, slots_for(right.size()), &code);
  const std::uint64_t in = b == 0 ? 0 : pool_->allocator().allocate(inner_bytes(2), &code);
  if (in == 0) {
    if (a != 0) free_node(a);
    if (b != 0) free_node(b);
    log_stage(log, SmoStage::none, SmoKind::none);
    return code;
  }
  struct {
    InnerNode h;
    std::uint64_t ch[2];
  } img{};
  img.h.type_version = static_cast<std::uint64_t>(NodeType::inner);
  img.h.slope = model.slope;
  img.h.intercept = model.intercept;
  img.h.lo = lo;
  img.h.hi = hi;
  img.h.fanout = 2;
  img.ch[0] = a;
  img.ch[1] = b;
  pm::copy(pool_->at<void>(in), &img, sizeof img);                        // A13
  pm::persist(pool_->at<void>(in), sizeof img);
  pm::publish(&log->new_a, in);                                          // A14
  pm::persist(&log->new_a, 8);
  step("built");
  log_stage(log, SmoStage::redo, SmoKind::split_downward);               // A15
  step("redo");
  switch_children(parent, s, e, in);                                     // A16
  step("switched");
  log_stage(log, SmoStage::none, SmoKind::none);                         // A17
  step("done");
  // A18: the caller retires the old node (smo_locked) once its locks are obsolete.
  counters_.downward.fetch_add(1, std::memory_order_relaxed);
  return Code::ok;
}

Code Apex::expand_inner(std::uint64_t off, std::uint64_t parent, std::uint32_t s,
                        std::uint32_t e, std::uint64_t key, InnerExpansion how) {
  const InnerNode* old = inner(off);
  const std::uint32_t f = old->fanout * 2;
  const LinearModel old_model{old->slope, old->intercept};
  const LinearModel left{old->slope, old->intercept + static_cast<double>(old->fanout)};
  if (how == InnerExpansion::extend_left) {
    // Adding F to the intercept is not exact in floating point, so check that every child
    // boundary keeps its place: the first key of each child must route to its old first slot
    // + F and the key before it below that. By monotonicity every key then keeps its child.
    std::uint32_t sl = 1;
    while (sl < old->fanout) {
      if (old->children()[sl] != old->children()[sl - 1]) {
        std::uint64_t b = 0;
        if (!boundary(old_model, old->fanout, old->lo, old->lo, old->hi, sl, &b) || b == old->lo)
          return Code::unsupported;
        if (predict_slot(left, x_of(b, old->lo), f) < sl + old->fanout ||
            predict_slot(left, x_of(b - 1, old->lo), f) >= sl + old->fanout)
          return Code::unsupported;
      }
      ++sl;
    }
  }
  SmoLog* log = my_log();
  log_begin(log, SmoKind::expand_inner, off, parent, key, s, e, 0);      // A12
  step("undo");
  Code code = Code::ok;
  const std::uint64_t fresh = pool_->allocator().allocate(inner_bytes(f), &code);
  if (fresh == 0) {
    log_stage(log, SmoStage::none, SmoKind::none);
    return code;
  }
  std::vector<std::uint64_t> img(inner_bytes(f) / 8, 0);
  auto* h = reinterpret_cast<InnerNode*>(img.data());
  h->type_version = static_cast<std::uint64_t>(NodeType::inner);
  h->lo = old->lo;
  h->hi = old->hi;
  h->fanout = f;
  if (how == InnerExpansion::extend_right) {
    // Same model: keys below slot F-1 keep their slots; keys that clamped to F-1 now land in
    // [F-1, 2F-1], all of which point at the old last child, so its range is unchanged.
    h->slope = old->slope;
    h->intercept = old->intercept;
    for (std::uint32_t i = 0; i < f; ++i)
      h->children()[i] = old->children()[std::min(i, old->fanout - 1)];
  } else if (how == InnerExpansion::extend_left) {
    // Intercept + F (boundaries checked above): old slot i becomes i + F; keys that clamped
    // to slot 0 now land in [0, F], all of which point at the old first child.
    h->slope = left.slope;
    h->intercept = left.intercept;
    for (std::uint32_t i = 0; i < f; ++i)
      h->children()[i] = old->children()[i < old->fanout ? 0 : i - old->fanout];
  } else {
    // Doubling slope and intercept is exact in binary floating point, so the new slot of a
    // key is 2*old or 2*old+1: each child occupies twice its slots and keeps its key range.
    h->slope = old->slope * 2;
    h->intercept = old->intercept * 2;
    for (std::uint32_t i = 0; i < old->fanout; ++i) {
      h->children()[2 * i] = old->children()[i];
      h->children()[2 * i + 1] = old->children()[i];
    }
  }
  pm::copy(pool_->at<void>(fresh), img.data(), inner_bytes(f));           // A13
  pm::persist(pool_->at<void>(fresh), inner_bytes(f));
  pm::publish(&log->new_a, fresh);                                       // A14
  pm::persist(&log->new_a, 8);
  step("built");
  log_stage(log, SmoStage::redo, SmoKind::expand_inner);                 // A15
  step("redo");
  switch_children(parent, s, e, fresh);                                  // A16
  step("switched");
  log_stage(log, SmoStage::none, SmoKind::none);                         // A17
  step("done");
  retire_node(off);                                                      // A18 (epochs)
  counters_.inner_expansions.fetch_add(1, std::memory_order_relaxed);
  return Code::ok;
}

}  // namespace pmindex::apex

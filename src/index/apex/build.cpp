// Building and freeing nodes: data node construction (model fit, PA/SA sizing, placement by
// probe-and-stash into a DRAM image that is copied and persisted once), routing boundaries.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "index/apex/apex.h"

namespace pmindex::apex {

bool Apex::boundary(const LinearModel& m, std::uint32_t fanout, std::uint64_t base,
                    std::uint64_t lo, std::uint64_t hi, std::uint32_t slot,
                    std::uint64_t* out) const {
  auto r = [&](std::uint64_t k) { return predict_slot(m, x_of(k, base), fanout); };
  if (r(hi) < slot) return false;
  if (r(lo) >= slot) {
    *out = lo;
    return true;
  }
  // Invariant: r(a) < slot <= r(b). Routing is monotone, so bisection finds the first key.
  std::uint64_t a = lo, b = hi;
  while (b - a > 1) {
    const std::uint64_t mid = a + (b - a) / 2;
    if (r(mid) >= slot) b = mid; else a = mid;
  }
  *out = b;
  return true;
}

void Apex::data_shape(std::uint64_t total_slots, double stash_ratio, std::uint64_t* pa_out,
                      std::uint64_t* sa_out) const {
  const std::uint64_t max_slots = max_data_slots();
  const std::uint64_t total = std::clamp<std::uint64_t>(total_slots, 2 * kGroup, max_slots);
  const double s = std::clamp(stash_ratio, kStashMin, kStashMax);
  // PA is a whole number of groups. Rounding PA down alone pushed S of small nodes up to 0.5
  // (total 32 -> PA 16, SA 16). Now S stays in [kStashMin, kStashMax] exactly (layout.h:
  // stash_ratio_ok): PA is the group multiple nearest (1 - S)·total among those that leave
  // SA = total - PA inside the bound (exactly `total` slots: a bulk load at the lower density
  // bound stays at it). Small nodes may have none (total < 64): then PA is the nearest group
  // multiple and SA is clamped into the bound; if that leaves fewer slots than asked, PA gains
  // a group (a node smaller than asked could start above density 0.9: an SMO loop), and if
  // the node exceeds the maximum, PA loses one.
  const double pa_want = (1.0 - s) * static_cast<double>(total);
  std::uint64_t pa = 0;
  double best_gap = HUGE_VAL;
  for (std::uint64_t c = kGroup; c < total; c += kGroup) {
    const double gap = std::fabs(static_cast<double>(c) - pa_want);
    if (stash_ratio_ok(c, total - c) && gap < best_gap) {
      pa = c;
      best_gap = gap;
    }
  }
  auto sa_for = [&](std::uint64_t p) {
    return std::clamp(total > p ? total - p : 0, stash_sa_min(p), stash_sa_max(p));
  };
  if (pa == 0) {
    pa = std::max<std::uint64_t>(kGroup, static_cast<std::uint64_t>(std::llround(pa_want / kGroup)) * kGroup);
    while (pa + sa_for(pa) < total) pa += kGroup;
    while (pa > kGroup && pa + sa_for(pa) > max_slots) pa -= kGroup;
  }
  *pa_out = pa;
  *sa_out = sa_for(pa);
}

std::uint64_t Apex::build_data(const std::vector<Record>& recs, std::uint64_t lo,
                               std::uint64_t hi, double stash_ratio, std::uint64_t total_slots,
                               Code* code) {
  std::uint64_t pa = 0, sa = 0;
  data_shape(total_slots, stash_ratio, &pa, &sa);
  const std::size_t bytes = data_bytes(static_cast<std::uint32_t>(pa), static_cast<std::uint32_t>(sa));
  const std::uint64_t inv = invalid_key_for(lo, hi);

  // The node image in DRAM: header, PA and SA with every slot free.
  std::vector<std::uint64_t> image_words((bytes + 7) / 8, 0);
  auto* img = reinterpret_cast<DataNode*>(image_words.data());
  img->type_version = static_cast<std::uint64_t>(NodeType::data);
  img->lo = lo;
  img->hi = hi;
  img->pa_slots = static_cast<std::uint32_t>(pa);
  img->sa_slots = static_cast<std::uint32_t>(sa);
  img->bytes = bytes;
  img->invalid_key = inv;
  for (std::uint64_t i = 0; i < pa + sa; ++i) img->pa()[i] = {inv, 0};
  std::vector<double> xs(recs.size());
  for (std::size_t i = 0; i < recs.size(); ++i) xs[i] = x_of(recs[i].key, lo);
  const LinearModel model =
      fit_ranks(xs, recs.empty() ? 0.0 : static_cast<double>(pa) / static_cast<double>(recs.size()));
  img->slope = model.slope;
  img->intercept = model.intercept;

  // Place each record by probe-and-stash, as an insert would.
  std::uint64_t next_sa = 0;
  std::vector<ExtStash> ext;
  for (std::size_t i = 0; i < recs.size(); ++i) {
    const std::uint32_t p = predict_slot(model, xs[i], static_cast<std::uint32_t>(pa));
    const std::uint32_t end = std::min<std::uint32_t>(p + kProbeDistance, static_cast<std::uint32_t>(pa));
    bool placed = false;
    for (std::uint32_t j = p; j < end && !placed; ++j) {
      if (img->pa()[j].key == inv) {
        img->pa()[j] = recs[i];
        placed = true;
      }
    }
    if (placed) continue;
    if (next_sa < sa) {
      img->sa()[next_sa++] = recs[i];
      continue;
    }
    if (ext.empty() || ext.back().reserved == kExtRecords) {
      ExtStash blk{};
      for (Record& r : blk.rec) r = {inv, 0};
      ext.push_back(blk);
    }
    ExtStash& blk = ext.back();
    blk.rec[blk.reserved++] = recs[i];  // `reserved` counts records while building
  }

  // Extended stash blocks first (back to front, so each links to the next), then the node.
  std::uint64_t next = 0;
  std::vector<std::uint64_t> ext_offs;
  for (auto it = ext.rbegin(); it != ext.rend(); ++it) {
    const std::uint64_t b = pool_->allocator().allocate(sizeof(ExtStash), code);
    if (b == 0) {
      for (std::uint64_t o : ext_offs) pool_->allocator().deallocate(o, sizeof(ExtStash));
      return 0;
    }
    it->next = next;
    it->reserved = 0;
    ExtStash* dst = pool_->at<ExtStash>(b);
    pm::copy(dst, &*it, sizeof(ExtStash));    // A13: new node contents (extended stash)
    pm::persist(dst, sizeof(ExtStash));
    ext_offs.push_back(b);
    next = b;
  }
  img->ext_head = next;
  const std::uint64_t off = pool_->allocator().allocate(bytes, code);
  if (off == 0) {
    for (std::uint64_t o : ext_offs) pool_->allocator().deallocate(o, sizeof(ExtStash));
    return 0;
  }
  void* dst = pool_->at<void>(off);
  pm::copy(dst, img, bytes);                    // A13: new node contents
  pm::persist(dst, bytes);                      // A14: persisted before it becomes reachable
  return off;
}

void Apex::free_block(std::uint64_t off, std::size_t bytes) {
  // During a start-now recovery a block from before the restart (below the recovery
  // high-water mark) may only be freed once marked; an unlinked one is never marked, so
  // finish_recovery() frees it. Blocks allocated in this session are freed normally.
  if (walk_pending_ && off < recovery_hwm_) return;
  pool_->allocator().deallocate(off, bytes);
}

void Apex::free_node(std::uint64_t off) {
  // Only for nodes no other thread can reach (never published, or the index is quiescent).
  if (type_of(off) == NodeType::inner) {
    free_block(off, inner_bytes(inner(off)->fanout));
    std::lock_guard<sync::SpinLock> lock(metas_mu_);
    inner_metas_.erase(off);
    return;
  }
  DataNode* dn = data(off);
  for (std::uint64_t b = dn->ext_head; b != 0;) {
    const std::uint64_t next = pool_->at<ExtStash>(b)->next;
    free_block(b, sizeof(ExtStash));
    b = next;
  }
  free_block(off, dn->bytes);
  std::lock_guard<sync::SpinLock> lock(metas_mu_);
  metas_.erase(off);
}

void Apex::retire_node(std::uint64_t off) {
  // A18. The blocks are listed now (the caller holds smo_mu_, so walk_pending_ is stable and
  // the node's ext chain no longer changes: the node is unlinked and its locks are obsolete)
  // and freed, with the node's DRAM state, once every operation pinned before the unlink has
  // finished. The DRAM state goes first, so a reused offset never finds a stale entry.
  std::vector<std::pair<std::uint64_t, std::size_t>> blocks;
  auto add = [&](std::uint64_t o, std::size_t bytes) {
    if (walk_pending_ && o < recovery_hwm_) return;  // left to finish_recovery (see free_block)
    blocks.emplace_back(o, bytes);
  };
  if (type_of(off) == NodeType::inner) {
    add(off, inner_bytes(inner(off)->fanout));
  } else {
    const DataNode* dn = data(off);
    for (std::uint64_t b = pm::load_acquire(&dn->ext_head); b != 0;
         b = pool_->at<ExtStash>(b)->next)
      add(b, sizeof(ExtStash));
    add(off, dn->bytes);
  }
  epochs_.retire([this, off, blocks = std::move(blocks)] {
    {
      std::lock_guard<sync::SpinLock> lock(metas_mu_);
      metas_.erase(off);
      inner_metas_.erase(off);
    }
    for (const auto& [o, bytes] : blocks) pool_->allocator().deallocate(o, bytes);
  });
}

}  // namespace pmindex::apex

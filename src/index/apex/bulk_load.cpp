// Bulk load: greedy top-down RMI growth (paper §4.5; ALEX's cost model is not in the papers,
// so the rule is ours and documented in PROTOCOL.md "Bulk load"):
//   * a non-root range with at most `cap` keys (max data slots x target density) whose
//     simulated probe-and-stash cost is at most kDataCostLimit becomes a data node, with stash
//     ratio S = max(0.05, min(0.3, 1.5 x O)), O = overflow ratio simulated at density d_u with
//     every slot in PA;
//   * otherwise try fanouts 2, 4, ... up to the inner maximum: fit a linear model of key ->
//     rank scaled to the fanout, group consecutive slots into children of at most `cap` keys,
//     and estimate cost = 1 (this level) + 0.05 log2(fanout) (inner node size) + the
//     key-weighted expected cache misses of each child (simulated for children that fit in a
//     data node, 3 for children that must recurse); keep the cheapest; recurse.
//   * ranges the models cannot separate fall back to a median split, then (u64) to halving the
//     range, then to one data node whose overflow lives in extended stash blocks.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "index/apex/apex.h"

namespace pmindex::apex {

struct Apex::BulkPlan {
  LinearModel model;
  std::uint32_t fanout = 0;
  std::vector<std::uint32_t> group_start;  // first slot of each child group
  double cost = 0;
};

namespace {
// PA slots of a simulated data node of k keys: at the upper density bound, whole groups,
// at most the largest data node.
std::uint32_t pa_sim(std::uint64_t k, std::uint64_t max_slots) {
  const auto slots = static_cast<std::uint64_t>(std::ceil(static_cast<double>(k) / kDensityUpper));
  return static_cast<std::uint32_t>(std::clamp<std::uint64_t>((slots + kGroup - 1) / kGroup * kGroup,
                                                              kGroup, max_slots / kGroup * kGroup));
}
}  // namespace

double Apex::simulate_overflow(std::span<const Record> recs, std::uint64_t lo,
                               std::uint32_t pa) const {
  if (recs.empty()) return 0;
  std::vector<double> xs(recs.size());
  for (std::size_t i = 0; i < recs.size(); ++i) xs[i] = x_of(recs[i].key, lo);
  const LinearModel m = fit_ranks(xs, static_cast<double>(pa) / static_cast<double>(recs.size()));
  std::vector<bool> used(pa, false);
  std::size_t overflow = 0;
  for (const double x : xs) {
    const std::uint32_t p = predict_slot(m, x, pa);
    const std::uint32_t end = std::min(p + kProbeDistance, pa);
    std::uint32_t j = p;
    while (j < end && used[j]) ++j;
    if (j < end) used[j] = true; else ++overflow;
  }
  return static_cast<double>(overflow) / static_cast<double>(recs.size());
}

Status Apex::bulk_load(std::span<const KeyValue> sorted, double fill) {
  if (!(fill > 0.0 && fill <= 1.0))
    return Status(Code::invalid_argument, "fill factor must be in (0, 1]");
  std::vector<Record> recs;
  recs.reserve(sorted.size());
  for (const KeyValue& kv : sorted) {
    std::uint64_t k = 0;
    if (check_key(kv.key, &k) != Code::ok)
      return Status(Code::invalid_argument, "bulk_load: a key is not a valid 8-byte key (or NaN)");
    if (kv.value.size() != 8)
      return Status(Code::invalid_argument, "bulk_load: apex payloads are exactly 8 bytes");
    if (!recs.empty() && recs.back().key >= k)
      return Status(Code::invalid_argument, "bulk_load: keys are not sorted and distinct");
    std::uint64_t v = 0;
    std::memcpy(&v, kv.value.data(), 8);
    recs.push_back({k, v});
  }
  std::unique_lock<sync::SharedSpinLock> global(smo_mu_);
  const auto guard = epochs_.pin();
  Stats st;
  // stats_node checks every node it visits: free_tree then walks only sound nodes.
  if (refusing_writes() || !stats_node(root_->root_node, 0, &st))
    return pool_->error(Code::corrupted, "bulk_load: the apex tree is damaged");
  if (st.records != 0)
    return Status(Code::invalid_argument, "bulk_load needs an empty apex index");
  Code code = Code::ok;
  const std::uint64_t fresh = bulk_build(recs, 0, ~std::uint64_t{0}, true, fill, &code);
  if (fresh == 0) return pool_->error(code, "bulk_load: out of pool space");
  const std::uint64_t old = root_->root_node;
  pm::publish(&root_->root_node, fresh);      // A20: one 8-byte store swaps in the new tree
  pm::persist(&root_->root_node, 8);
  unshadow(0, 0, 0);
  free_tree(old);
  // The DRAM state of the new tree is built here, not by the first lookups (issue 16).
  if (const InnerMeta* im = resolve_root(); im != nullptr) resolve_all(*im, 0);
  count_loaded(sorted.size());
  return Status::Ok();
}

std::uint64_t Apex::bulk_build(std::span<const Record> recs, std::uint64_t lo, std::uint64_t hi,
                               bool is_root, double fill, Code* code) {
  const double d = std::clamp(kDensityInit * fill, kDensityLower, kDensityInit);
  const std::uint64_t max_slots = max_data_slots();
  const std::uint64_t cap = static_cast<std::uint64_t>(static_cast<double>(max_slots) * d);
  const std::uint64_t n = recs.size();
  auto make_data = [&](std::span<const Record> rs, std::uint64_t a, std::uint64_t b) {
    const double o = simulate_overflow(rs, a, pa_sim(rs.size(), max_slots));
    const double s = std::max(kStashMin, std::min(kStashMax, kStashCoefficient * o));
    const auto total = static_cast<std::uint64_t>(std::ceil(static_cast<double>(rs.size()) / d));
    std::vector<Record> v(rs.begin(), rs.end());
    return build_data(v, a, b, s, total, code);
  };
  if (!is_root && n <= cap &&
      (n <= 64 || 1.0 + 2.0 * simulate_overflow(recs, lo, pa_sim(n, max_slots)) <= kDataCostLimit))
    return make_data(recs, lo, hi);

  std::vector<double> xs(n);
  for (std::size_t i = 0; i < n; ++i) xs[i] = x_of(recs[i].key, lo);
  const BulkPlan best = bulk_plan(recs, xs, lo, hi, is_root, cap);
  if (best.fanout == 0) return make_data(recs, lo, hi);  // overflow goes to extended stash
  return bulk_inner(recs, lo, hi, best, fill, code);
}

// The cheapest model fanout (2, 4, ... up to the inner maximum) by the cost rule above; else a
// median split; else (u64, or the root) halving the range.
Apex::BulkPlan Apex::bulk_plan(std::span<const Record> recs, const std::vector<double>& xs,
                               std::uint64_t lo, std::uint64_t hi, bool is_root,
                               std::uint64_t cap) const {
  const std::uint64_t n = recs.size();
  const std::uint64_t max_slots = max_data_slots();
  // Groups consecutive slots into children of at most `cap` keys (a slot with more keys is a
  // child of its own); slots without keys join their neighbour.
  auto group = [&](const LinearModel& m, std::uint32_t f, BulkPlan* plan) {
    plan->model = m;
    plan->fanout = f;
    plan->group_start.assign(1, 0);
    std::uint64_t in_group = 0;
    std::uint32_t prev_slot = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t sl = predict_slot(m, xs[i], f);
      if (sl != prev_slot && in_group > 0) {
        // Count the keys of slot `sl` to decide whether it still fits the current group.
        std::size_t j = i;
        while (j < n && predict_slot(m, xs[j], f) == sl) ++j;
        if (in_group + (j - i) > cap) {
          plan->group_start.push_back(sl);
          in_group = 0;
        }
      }
      prev_slot = sl;
      ++in_group;
    }
  };
  BulkPlan best;
  best.cost = HUGE_VAL;
  for (std::uint32_t f = 2; inner_bytes(f) <= inner_max_ && f <= 8 * (n / std::max<std::uint64_t>(cap, 1) + 1) * 2;
       f *= 2) {
    const LinearModel m = fit_ranks(xs, static_cast<double>(f) / static_cast<double>(n));
    if (!(m.slope > 0)) break;
    BulkPlan plan;
    group(m, f, &plan);
    if (plan.group_start.size() < 2) continue;
    double cost = 1.0 + 0.05 * std::log2(static_cast<double>(f));
    std::size_t i = 0;
    std::size_t largest = 0;
    for (std::size_t g = 0; g < plan.group_start.size(); ++g) {
      const std::uint32_t end_slot = g + 1 < plan.group_start.size() ? plan.group_start[g + 1] : f;
      std::size_t j = i;
      while (j < n && predict_slot(m, xs[j], f) < end_slot) ++j;
      const std::size_t k = j - i;
      largest = std::max(largest, k);
      const double c = k <= cap ? 1.0 + 2.0 * simulate_overflow(recs.subspan(i, k), lo, pa_sim(k, max_slots)) : 3.0;
      cost += c * static_cast<double>(k) / static_cast<double>(n);
      i = j;
    }
    // A model that leaves most keys in one oversized child barely partitions (clustered
    // keys under a fit dominated by outliers); the median split below does better.
    if (largest > cap && largest > n / 2) continue;
    plan.cost = cost;
    if (cost < best.cost) best = std::move(plan);
  }
  if (best.fanout == 0 && n >= 2) {
    // Median split, as a downward split does.
    for (std::size_t c = n / 2; c < n && best.fanout == 0; ++c) {
      if (!(xs[c - 1] < xs[c])) continue;
      // Gentle slope (1 / spread of the keys) first, as a downward split does; a steep step
      // between the two middle keys if rounding defeats it.
      const double t = xs[c - 1] / 2 + xs[c] / 2, spread = xs[n - 1] - xs[0];
      const double steep = 2.0 / (xs[c] - xs[c - 1]);
      for (const LinearModel m : {LinearModel{1.0 / spread, 1.0 - t / spread},
                                  LinearModel{steep, 1.0 - t * steep}}) {
        if (std::isfinite(m.slope) && std::isfinite(m.intercept) && m.slope > 0 &&
            predict_slot(m, xs[c - 1], 2) == 0 && predict_slot(m, xs[c], 2) == 1) {
          best.model = m;
          best.fanout = 2;
          best.group_start = {0, 1};
          break;
        }
      }
    }
  }
  if (best.fanout == 0 && (is_root || (kt_ == KeyType::u64 && hi - lo >= 1))) {
    // Halve the range (always separates a u64 range; the root default model for f64).
    best.model = kt_ == KeyType::u64
                     ? LinearModel{2.0 / (static_cast<double>(hi - lo) + 1.0), 0.0}
                     : LinearModel{1.0 / DBL_MAX, 1.0};
    best.fanout = 2;
    best.group_start = {0, 1};
  }
  return best;
}

std::uint64_t Apex::bulk_inner(std::span<const Record> recs, std::uint64_t lo, std::uint64_t hi,
                               const BulkPlan& plan, double fill, Code* code) {
  const std::uint64_t n = recs.size();
  // Children: group g covers slots [start_g, start_{g+1}) and keys [B(start_g), B(next) - 1].
  const std::uint32_t f = plan.fanout;
  std::vector<std::uint64_t> bounds;
  for (std::uint32_t s : plan.group_start) {
    std::uint64_t b = lo;
    if (s != 0 && !boundary(plan.model, f, lo, lo, hi, s, &b)) b = hi + 1;  // (hi + 1: none)
    bounds.push_back(b);
  }
  std::vector<std::uint64_t> img(inner_bytes(f) / 8, 0);
  auto* h = reinterpret_cast<InnerNode*>(img.data());
  h->type_version = static_cast<std::uint64_t>(NodeType::inner);
  h->slope = plan.model.slope;
  h->intercept = plan.model.intercept;
  h->lo = lo;
  h->hi = hi;
  h->fanout = f;
  std::vector<std::uint64_t> built;
  auto fail = [&]() -> std::uint64_t {
    for (std::uint64_t c : built) free_tree(c);
    return 0;
  };
  std::size_t i = 0;
  for (std::size_t g = 0; g < plan.group_start.size(); ++g) {
    const std::uint32_t s = plan.group_start[g];
    const std::uint32_t e = g + 1 < plan.group_start.size() ? plan.group_start[g + 1] - 1 : f - 1;
    const std::uint64_t clo = bounds[g];
    const bool last = g + 1 == plan.group_start.size();
    if (!last && bounds[g + 1] == hi + 1 && hi == ~std::uint64_t{0}) return fail();
    const std::uint64_t chi = last ? hi : bounds[g + 1] - 1;
    if (clo > chi || (!last && bounds[g + 1] <= clo)) return fail();  // empty range: a bug
    std::size_t j = i;
    while (j < n && recs[j].key <= chi) ++j;
    const std::uint64_t child = bulk_build(recs.subspan(i, j - i), clo, chi, false, fill, code);
    if (child == 0) return fail();
    built.push_back(child);
    for (std::uint32_t sl = s; sl <= e; ++sl) h->children()[sl] = child;
    i = j;
  }
  const std::uint64_t off = pool_->allocator().allocate(inner_bytes(f), code);
  if (off == 0) return fail();
  pm::copy(pool_->at<void>(off), img.data(), inner_bytes(f));   // A19: bulk-loaded inner node
  pm::persist(pool_->at<void>(off), inner_bytes(f));
  return off;
}

void Apex::free_tree(std::uint64_t off) {
  // The old tree is unlinked; concurrent readers may still be in it: retire (epochs).
  if (type_of(off) == NodeType::inner) {
    const InnerNode* in = inner(off);
    for (std::uint32_t i = 0; i < in->fanout; ++i)
      if (i == 0 || in->children()[i] != in->children()[i - 1]) free_tree(in->children()[i]);
    InnerMeta& im = *inner_meta_for(off);  // sound: stats_node checked it (bulk_load)
    std::lock_guard<sync::SharedSpinLock> lock(im.mu);
    im.obsolete = true;
  } else if (DataMeta* mp = meta_for(off); mp != nullptr) {  // nullptr: damaged, never locked
    DataMeta& m = *mp;
    std::lock_guard<sync::SpinLock> node_smo(m.smo_mu);
    if (lock_all(m)) {
      m.retired = true;
      for (std::uint32_t i = 0; i < m.num_locks; ++i) m.locks[i].writeUnlockObsolete();
    }
  }
  retire_node(off);
}

}  // namespace pmindex::apex

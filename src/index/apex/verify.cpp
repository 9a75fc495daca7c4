// verify(): every structural invariant listed in apex.h, and node statistics.
#include <algorithm>
#include <bit>
#include <unordered_set>

#include "index/apex/apex.h"
#include "index/common/close_counts.h"

namespace pmindex::apex {

Status Apex::verify() const {
  walk_running_.wait(true, std::memory_order_acquire);  // pairs with the walker's release
  std::unique_lock<sync::SharedSpinLock> global(smo_mu_);
  if (!walk_status_.ok()) return walk_status_;
  if (refusing_writes()) {  // damage found by an operation (first-touch check or routing)
    std::lock_guard<sync::SpinLock> lock(damage_mu_);
    return damage_;
  }
  const SmoLog* logs = pool_->at<SmoLog>(root_->logs);
  for (std::size_t i = 0; i < kMaxLogs; ++i)
    if (stage_of(logs[i].stage_kind) != SmoStage::none)
      return pool_->error(Code::corrupted, "verify: SMO log line " + std::to_string(i) +
                                               " is not cleared");
  if (type_of(root_->root_node) != NodeType::inner)
    return pool_->error(Code::corrupted, "verify: the root is not an inner node");
  std::uint64_t records = 0;
  if (Status s = verify_node(root_->root_node, 0, ~std::uint64_t{0}, 0, &records); !s.ok())
    return s;
  // Quiescent: size() is the walk's count plus this session's net inserts and removes.
  const auto net = static_cast<std::int64_t>(size()) - static_cast<std::int64_t>(walk_records_);
  return index_common::check_close_records_since(*pool_, "apex", records, net);
}

Status Apex::verify_node(std::uint64_t off, std::uint64_t lo, std::uint64_t hi,
                         std::uint32_t depth, std::uint64_t* records) const {
  const pm::Pool& p = *pool_;
  auto fail = [&](const std::string& what) {
    return p.error(Code::corrupted, "verify: node " + std::to_string(off) + ": " + what);
  };
  if (depth > kMaxDepth) return fail("tree deeper than kMaxDepth levels");
  if (p.checked<InnerNode>(off, sizeof(InnerNode), 64) == nullptr) return fail("bad offset");
  if (type_of(off) == NodeType::data) {
    if (p.checked<DataNode>(off, sizeof(DataNode), 64) == nullptr) return fail("bad offset");
    const DataNode* dn = data(off);
    if (dn->lo != lo || dn->hi != hi)
      return fail("data node range [" + std::to_string(dn->lo) + ", " + std::to_string(dn->hi) +
                  "] differs from the range its parent routes to it [" + std::to_string(lo) +
                  ", " + std::to_string(hi) + "]");
    return verify_data(off, records);
  }
  if (type_of(off) != NodeType::inner) return fail("bad node type");
  const InnerNode* in = inner(off);
  if (in->fanout < 2 || !std::has_single_bit(in->fanout) || inner_bytes(in->fanout) > inner_max_ ||
      !p.in_heap(off, inner_bytes(in->fanout)))
    return fail("bad fanout");
  if (in->lo != lo || in->hi != hi) return fail("inner node range differs from its parent's");
  if (!(in->slope >= 0) || !std::isfinite(in->slope) || !std::isfinite(in->intercept))
    return fail("inner model is not monotone and finite");
  const LinearModel m{in->slope, in->intercept};
  std::unordered_set<std::uint64_t> seen;
  std::uint32_t s = 0;
  while (s < in->fanout) {
    const std::uint64_t child = in->children()[s];
    std::uint32_t e = s;
    while (e + 1 < in->fanout && in->children()[e + 1] == child) ++e;
    if (!seen.insert(child).second) return fail("a child appears in non-adjacent slots");
    // The keys routed to slots [s, e]: exact partition by binary search on the monotone model.
    std::uint64_t clo = lo, next = 0;
    if (s != 0 && !boundary(m, in->fanout, in->lo, lo, hi, s, &clo))
      return fail("slot " + std::to_string(s) + " receives no key");
    std::uint64_t chi = hi;
    if (e + 1 < in->fanout) {
      if (!boundary(m, in->fanout, in->lo, lo, hi, e + 1, &next) || next <= clo)
        return fail("slots [" + std::to_string(s) + ", " + std::to_string(e) +
                    "] receive no key or the next slot receives none");
      chi = next - 1;
    }
    if (Status st = verify_node(child, clo, chi, depth + 1, records); !st.ok()) return st;
    s = e + 1;
  }
  return Status::Ok();
}

Status Apex::verify_data(std::uint64_t off, std::uint64_t* records) const {
  const pm::Pool& p = *pool_;
  const DataNode* dn = data(off);
  auto fail = [&](const std::string& what) {
    return p.error(Code::corrupted, "verify: data node " + std::to_string(off) + ": " + what);
  };
  if (dn->lo == 0 && dn->hi == ~std::uint64_t{0})
    return fail("holds both the smallest and the largest key (no invalid key exists)");
  if (dn->invalid_key != invalid_key_for(dn->lo, dn->hi)) return fail("wrong invalid key");
  if (dn->pa_slots == 0 || dn->pa_slots % kGroup != 0 ||
      dn->bytes != data_bytes(dn->pa_slots, dn->sa_slots) || dn->bytes > data_max_ ||
      !p.in_heap(off, dn->bytes))
    return fail("bad PA/SA sizes");
  if (!stash_ratio_ok(dn->pa_slots, dn->sa_slots))
    return fail("stash ratio SA / (PA + SA) = " + std::to_string(dn->sa_slots) + " / " +
                std::to_string(dn->pa_slots + dn->sa_slots) + " is outside [0.05, 0.3]");
  if (!std::isfinite(dn->slope) || !std::isfinite(dn->intercept) || !(dn->slope >= 0))
    return fail("model is not monotone and finite");
  const std::uint64_t inv = dn->invalid_key;
  std::vector<std::uint64_t> keys;
  std::vector<const Record*> stash;
  for (std::uint32_t i = 0; i < dn->pa_slots; ++i) {
    const std::uint64_t k = dn->pa()[i].key;
    if (k == inv) continue;
    if (k < dn->lo || k > dn->hi) return fail("PA key outside the node range");
    const std::uint32_t pr = predict(dn, k);
    if (i < pr || i >= pr + kProbeDistance)
      return fail("PA key at slot " + std::to_string(i) + " is outside its probe window from " +
                  std::to_string(pr));
    keys.push_back(k);
  }
  for (std::uint32_t i = 0; i < dn->sa_slots; ++i) {
    const Record& r = dn->sa()[i];
    if (r.key == inv) continue;
    if (r.key < dn->lo || r.key > dn->hi) return fail("SA key outside the node range");
    keys.push_back(r.key);
    stash.push_back(&r);
  }
  std::vector<std::uint64_t> ext_chain;
  std::uint64_t limit = p.size() / sizeof(ExtStash);
  for (std::uint64_t b = dn->ext_head; b != 0; b = p.at<ExtStash>(b)->next) {
    if (limit-- == 0 || p.checked<ExtStash>(b, sizeof(ExtStash), 256) == nullptr)
      return fail("extended stash chain is invalid or cyclic");
    ext_chain.push_back(b);
    for (const Record& r : p.at<ExtStash>(b)->rec) {
      if (r.key == inv) continue;
      if (r.key < dn->lo || r.key > dn->hi) return fail("extended stash key outside the range");
      keys.push_back(r.key);
      stash.push_back(&r);
    }
  }
  std::sort(keys.begin(), keys.end());
  if (std::adjacent_find(keys.begin(), keys.end()) != keys.end()) return fail("duplicate key");
  *records += keys.size();

  // DRAM state, if this generation built it.
  std::unique_lock<sync::SpinLock> metas(metas_mu_);
  auto it = metas_.find(off);
  if (it == metas_.end()) return Status::Ok();
  metas.unlock();
  return verify_data_meta(off, *it->second, keys.size(), stash, ext_chain);
}

Status Apex::verify_data_meta(std::uint64_t off, const DataMeta& m, std::size_t keys,
                              const std::vector<const Record*>& stash,
                              const std::vector<std::uint64_t>& ext_chain) const {
  const pm::Pool& p = *pool_;
  const DataNode* dn = data(off);
  const std::uint64_t inv = dn->invalid_key;
  auto fail = [&](const std::string& what) {
    return p.error(Code::corrupted, "verify: data node " + std::to_string(off) + ": " + what);
  };
  if (m.keys() != keys || m.stashed() != stash.size())
    return fail("DRAM key/stash counts disagree with PM");
  if (m.accel.size() != dn->pa_slots / kGroup) return fail("accelerator count is wrong");
  for (std::uint32_t i = 0; i < dn->pa_slots; ++i) {
    const Accelerator& a = m.accel[i / kGroup];
    const bool free_bit = (a.word >> (i % kGroup)) & 1u;
    const std::uint64_t k = dn->pa()[i].key;
    if (free_bit != (k == inv)) return fail("free bitmap disagrees with PA slot " + std::to_string(i));
    if (k != inv && a.fp[i % kGroup] != fingerprint(k))
      return fail("fingerprint disagrees with PA slot " + std::to_string(i));
  }
  if (m.stash_used.size() != (dn->sa_slots + 63) / 64) return fail("stash bitmap size is wrong");
  for (std::uint32_t i = 0; i < m.stash_used.size() * 64; ++i) {
    const bool used = (m.stash_used[i / 64] >> (i % 64)) & 1u;
    const bool pm_used = i < dn->sa_slots && dn->sa()[i].key != inv;
    if (used != pm_used) return fail("stash bitmap disagrees with SA slot " + std::to_string(i));
  }
  if (m.ext.size() != ext_chain.size()) return fail("DRAM extended stash list has a wrong length");
  for (std::size_t b = 0; b < ext_chain.size(); ++b) {
    if (m.ext[b].off != ext_chain[b]) return fail("DRAM extended stash list is out of order");
    for (std::uint32_t j = 0; j < kExtRecords; ++j) {
      const bool used = (m.ext[b].used >> j) & 1u;
      if (used != (p.at<ExtStash>(ext_chain[b])->rec[j].key != inv))
        return fail("extended stash bitmap disagrees with PM");
    }
  }
  std::uint64_t entries = 0;
  for (const Accelerator& a : m.accel)
    for (auto* b = reinterpret_cast<const OverflowBucket*>(a.word >> kBucketShift); b != nullptr;
         b = b->next)
      for (const std::uint64_t e : b->entry) entries += e != 0;
  if (entries != stash.size())
    return fail("overflow buckets hold " + std::to_string(entries) + " entries for " +
                std::to_string(stash.size()) + " stash records");
  for (const Record* r : stash) {
    const std::uint64_t want = (std::uint64_t{fingerprint(r->key)} << kFpShift) | p.offset_of(r);
    int found = 0;
    for (const OverflowBucket* b = m.bucket(predict(dn, r->key) / kGroup); b != nullptr; b = b->next)
      for (const std::uint64_t e : b->entry) found += e == want;
    if (found != 1) return fail("stash record " + std::to_string(r->key) + " is lost from its overflow bucket");
  }
  return Status::Ok();
}

bool Apex::stats_node(std::uint64_t off, std::uint32_t depth, Stats* s) const {
  // Checked like the recovery walk (stats may run before it has): header checks, bounded
  // depth and extended stash chains.
  if (depth > kMaxDepth) return false;
  s->max_depth = std::max(s->max_depth, depth);
  if (pool_->checked<InnerNode>(off, sizeof(InnerNode), 64) == nullptr) return false;
  if (type_of(off) == NodeType::inner) {
    if (!inner_damage(off).empty()) return false;
    ++s->inner_nodes;
    const InnerNode* in = inner(off);
    s->inner_bytes += inner_bytes(in->fanout);
    for (std::uint32_t i = 0; i < in->fanout; ++i)
      if (i == 0 || in->children()[i] != in->children()[i - 1])
        if (!stats_node(in->children()[i], depth + 1, s)) return false;
    return true;
  }
  if (!data_header_damage(off).empty()) return false;
  ++s->data_nodes;
  const DataNode* dn = data(off);
  s->data_bytes += dn->bytes;
  s->depth_sum += depth;
  s->stash_ratio_sum += static_cast<double>(dn->sa_slots) / (dn->pa_slots + dn->sa_slots);
  for (std::uint32_t i = 0; i < dn->pa_slots + dn->sa_slots; ++i) {
    if (dn->pa()[i].key == dn->invalid_key) continue;
    ++s->records;
    if (i >= dn->pa_slots) ++s->stash_records;
  }
  std::uint64_t limit = pool_->size() / sizeof(ExtStash);
  for (std::uint64_t b = dn->ext_head; b != 0; b = pool_->at<ExtStash>(b)->next) {
    if (limit-- == 0 || pool_->checked<ExtStash>(b, sizeof(ExtStash), 256) == nullptr)
      return false;
    ++s->ext_blocks;
    s->ext_bytes += sizeof(ExtStash);
    for (const Record& r : pool_->at<ExtStash>(b)->rec)
      if (r.key != dn->invalid_key) {
        ++s->records;
        ++s->stash_records;
      }
  }
  return true;
}

Apex::Stats Apex::stats() const {
  std::unique_lock<sync::SharedSpinLock> global(smo_mu_);
  Stats s;
  if (!stats_node(root_->root_node, 0, &s)) return Stats{};  // damaged: verify() says where
  if (s.data_nodes > 0) {
    s.avg_depth = static_cast<double>(s.depth_sum) / static_cast<double>(s.data_nodes);
    s.avg_stash_ratio = s.stash_ratio_sum / static_cast<double>(s.data_nodes);
  }
  if (s.records > 0)
    s.overflow_ratio = static_cast<double>(s.stash_records) / static_cast<double>(s.records);
  add_smo_counts(&s);
  return s;
}

Apex::Stats Apex::smo_counts() const {
  Stats s;
  add_smo_counts(&s);
  return s;
}

// relaxed: statistics, exact only when quiescent.
void Apex::add_smo_counts(Stats* s) const {
  s->expansions = counters_.expansions.load(std::memory_order_relaxed);
  s->sideways_splits = counters_.sideways.load(std::memory_order_relaxed);
  s->downward_splits = counters_.downward.load(std::memory_order_relaxed);
  s->inner_expansions = counters_.inner_expansions.load(std::memory_order_relaxed);
  s->contractions = counters_.contractions.load(std::memory_order_relaxed);
  s->merges = counters_.merges.load(std::memory_order_relaxed);
  s->collapses = counters_.collapses.load(std::memory_order_relaxed);
}

}  // namespace pmindex::apex

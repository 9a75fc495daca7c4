// APEX public operations: key checks, traversal, insert/update/upsert/find/remove/scan.
// Persistence steps (A<n>) are defined in PROTOCOL.md.
#include "index/apex/apex.h"

#include <algorithm>
#include <cstring>

namespace pmindex::apex {

Apex::Apex(std::unique_ptr<pm::Pool> pool) : pool_(std::move(pool)) {
  kt_ = pool_->info().layout.key_mode;
  open_start_ = std::chrono::steady_clock::now();
}

Apex::~Apex() {
  if (walker_.joinable()) walker_.join();
}

void Apex::note_answer() const {
  // relaxed flag: only the first answer's time matters; exchange elects one writer.
  if (!first_answer_.load(std::memory_order_relaxed) &&
      !first_answer_.exchange(true, std::memory_order_relaxed)) {
    first_answer_seconds_.store(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - open_start_).count(),
        std::memory_order_relaxed);
  }
}

Code Apex::check_key(std::string_view key, std::uint64_t* out) const {
  if (key.size() != 8) return Code::invalid_argument;
  const std::uint64_t k = decode_u64(key);
  if (kt_ == KeyType::f64 && std::isnan(ordered_to_f64(k))) return Code::invalid_argument;
  *out = k;
  return Code::ok;
}

std::uint32_t Apex::route(const InnerNode* in, std::uint64_t key) const {
  return predict_slot({in->slope, in->intercept}, x_of(key, in->lo), in->fanout);
}

std::uint32_t Apex::predict(const DataNode* dn, std::uint64_t key) const {
  return predict_slot({dn->slope, dn->intercept}, x_of(key, dn->lo), dn->pa_slots);
}

std::uint64_t Apex::traverse(std::uint64_t key, std::vector<PathStep>* path) const {
  if (path != nullptr) path->clear();
  std::uint64_t off = root_->root_node;
  while (type_of(off) == NodeType::inner) {
    const InnerNode* in = inner(off);
    const std::uint32_t slot = route(in, key);
    if (path != nullptr) path->push_back({off, slot});
    off = in->children()[slot];
  }
  return off;
}

Code Apex::insert(std::string_view key, std::string_view value) {
  std::uint64_t k = 0;
  if (Code c = check_key(key, &k); c != Code::ok) return c;
  if (value.size() != 8) return value.size() > 8 ? Code::value_too_large : Code::invalid_argument;
  std::uint64_t payload = 0;
  std::memcpy(&payload, value.data(), 8);
  const AnswerNote answered{this};  // records the time when this answer is complete
  for (;;) {
    {
      std::shared_lock<std::shared_mutex> tree(tree_mu_);
      const std::uint64_t off = traverse(k, nullptr);
      DataMeta& m = meta_for(off);
      const DataNode* dn = data(off);
      const LockSpan span = lock_span(dn, k);
      lock_window(m, span);
      if (locate(off, m, k, /*use_pa_fp=*/true).rec != nullptr) {
        unlock_window(m, span);
        return Code::already_present;
      }
      const double capacity = static_cast<double>(dn->pa_slots + dn->sa_slots);
      const bool full = static_cast<double>(m.keys() + 1) > kDensityUpper * capacity &&
                        m.keys() + 1 >= m.smo_retry_at;
      if (!full) {
        const Code c = insert_into(off, m, k, payload);
        unlock_window(m, span);
        return c;
      }
      unlock_window(m, span);
    }
    // The node is too dense: an SMO, with the tree to ourselves.
    const Code c = smo_exclusive(k);
    if (c != Code::ok) return c;
  }
}

Code Apex::smo_exclusive(std::uint64_t k) {
  std::unique_lock<std::shared_mutex> tree(tree_mu_);
  std::vector<PathStep> path;
  const std::uint64_t off = traverse(k, &path);
  DataMeta& m = meta_for(off);
  const DataNode* dn = data(off);
  const double capacity = static_cast<double>(dn->pa_slots + dn->sa_slots);
  if (!(static_cast<double>(m.keys() + 1) > kDensityUpper * capacity &&
        m.keys() + 1 >= m.smo_retry_at))
    return Code::ok;  // another thread already made room
  const Code c = smo(off, path, k);
  if (c == Code::unsupported) {
    // No SMO possible (keys the models cannot separate): stash records for a while.
    m.smo_retry_at = m.keys() + m.keys() / 4 + 16;
    return Code::ok;
  }
  return c;
}

Code Apex::update(std::string_view key, std::string_view value) {
  std::uint64_t k = 0;
  if (Code c = check_key(key, &k); c != Code::ok) return c;
  if (value.size() != 8) return value.size() > 8 ? Code::value_too_large : Code::invalid_argument;
  std::uint64_t payload = 0;
  std::memcpy(&payload, value.data(), 8);
  const AnswerNote answered{this};  // records the time when this answer is complete
  std::shared_lock<std::shared_mutex> tree(tree_mu_);
  const std::uint64_t off = traverse(k, nullptr);
  DataMeta& m = meta_for(off);
  const LockSpan span = lock_span(data(off), k);
  lock_window(m, span);
  const Location loc = locate(off, m, k, true);
  Code c = Code::not_found;
  if (loc.rec != nullptr) {
    pm::publish(&loc.rec->payload, payload);                // A10: payload in place
    pm::persist(&loc.rec->payload, sizeof payload);         // A11: one flush + fence
    c = Code::ok;
  }
  unlock_window(m, span);
  return c;
}

Code Apex::upsert(std::string_view key, std::string_view value) {
  for (;;) {
    const Code c = insert(key, value);
    if (c != Code::already_present) return c;
    const Code u = update(key, value);
    if (u != Code::not_found) return u;  // removed in between: insert again
  }
}

Code Apex::find(std::string_view key, std::string* value) const {
  std::uint64_t k = 0;
  if (Code c = check_key(key, &k); c != Code::ok) return c;
  const AnswerNote answered{this};  // records the time when this answer is complete
  std::shared_lock<std::shared_mutex> tree(tree_mu_);
  const std::uint64_t off = traverse(k, nullptr);
  const DataMeta& m = meta_for(off);
  const LockSpan span = lock_span(data(off), k);
  for (;;) {
    bool restart = false;
    const std::uint64_t v1 = m.locks[span.first].readLockOrRestart(restart);
    const std::uint64_t v2 = m.locks[span.last].readLockOrRestart(restart);
    if (restart) continue;
    // Lookups do not consult PA fingerprints (paper §4.2): the key is usually in PA.
    const Location loc = locate(off, m, k, /*use_pa_fp=*/false);
    const std::uint64_t payload = loc.rec != nullptr ? sync::optimistic_read(loc.rec->payload) : 0;
    m.locks[span.first].checkOrRestart(v1, restart);
    m.locks[span.last].checkOrRestart(v2, restart);
    if (restart) continue;
    if (loc.rec == nullptr) return Code::not_found;
    if (value != nullptr) value->assign(reinterpret_cast<const char*>(&payload), 8);
    return Code::ok;
  }
}

Code Apex::remove(std::string_view key) {
  std::uint64_t k = 0;
  if (Code c = check_key(key, &k); c != Code::ok) return c;
  const AnswerNote answered{this};  // records the time when this answer is complete
  std::shared_lock<std::shared_mutex> tree(tree_mu_);
  const std::uint64_t off = traverse(k, nullptr);
  DataMeta& m = meta_for(off);
  const LockSpan span = lock_span(data(off), k);
  lock_window(m, span);
  const Location loc = locate(off, m, k, true);
  if (loc.rec != nullptr) erase_at(off, m, loc, k);
  unlock_window(m, span);
  return loc.rec != nullptr ? Code::ok : Code::not_found;
}

std::size_t Apex::scan(std::string_view start, std::size_t max, ScanBuffer& out) const {
  out.clear();
  // Any 8 bytes bound a scan (even a NaN encoding, which sorts outside every double).
  if (start.size() != 8 || max == 0) return 0;
  const std::uint64_t k = decode_u64(start);
  const AnswerNote answered{this};  // records the time when this answer is complete
  std::shared_lock<std::shared_mutex> tree(tree_mu_);
  std::vector<Record> recs;
  std::uint64_t cur = k;
  for (;;) {
    const std::uint64_t off = traverse(cur, nullptr);
    const DataNode* dn = data(off);
    const DataMeta& m = meta_for(off);
    const std::uint64_t inv = dn->invalid_key;
    auto take = [&](const Record& r) {
      const std::uint64_t key = sync::optimistic_read(r.key);
      if (key != inv && key >= cur) recs.push_back({key, sync::optimistic_read(r.payload)});
    };
    std::vector<std::uint64_t> versions(m.num_locks);
    for (;;) {
      // A scan reads the whole node: it validates every lock of the node.
      bool restart = false;
      for (std::uint32_t i = 0; i < m.num_locks; ++i)
        versions[i] = m.locks[i].readLockOrRestart(restart);
      if (restart) continue;
      recs.clear();
      // Keys >= cur sit at PA slots >= predict(cur) (no key is stored left of its
      // prediction), plus any stash record; only the collected result is sorted.
      for (std::uint32_t i = predict(dn, cur); i < dn->pa_slots; ++i) take(dn->pa()[i]);
      for (std::uint32_t i = 0; i < dn->sa_slots; ++i) take(dn->sa()[i]);
      for (std::uint64_t b = pm::load_acquire(&dn->ext_head); b != 0;
           b = pool_->at<ExtStash>(b)->next)
        for (const Record& r : pool_->at<ExtStash>(b)->rec) take(r);
      for (std::uint32_t i = 0; i < m.num_locks; ++i) m.locks[i].checkOrRestart(versions[i], restart);
      if (!restart) break;
    }
    std::sort(recs.begin(), recs.end(),
              [](const Record& a, const Record& b) { return a.key < b.key; });
    for (const Record& r : recs) {
      if (out.size() >= max) break;
      const std::string kb = encode_u64(r.key);
      out.append(kb, {reinterpret_cast<const char*>(&r.payload), 8});
    }
    if (out.size() >= max || dn->hi == ~std::uint64_t{0}) break;
    cur = dn->hi + 1;
  }
  return out.size();
}

Record* Apex::debug_record(std::string_view key) {
  std::uint64_t k = 0;
  if (check_key(key, &k) != Code::ok) return nullptr;
  std::unique_lock<std::shared_mutex> tree(tree_mu_);
  const std::uint64_t off = traverse(k, nullptr);
  return locate(off, meta_for(off), k, false).rec;
}

RecoveryStats Apex::recovery_stats() const {
  std::shared_lock<std::shared_mutex> tree(tree_mu_);
  RecoveryStats r = recovery_;
  if (first_answer_.load(std::memory_order_relaxed))
    r.seconds = first_answer_seconds_.load(std::memory_order_relaxed);
  return r;
}

Footprint Apex::footprint() const {
  Footprint f;
  const auto s = pool_->allocator().stats();
  f.pm_bytes = s.bytes_in_use;
  f.pm_reserved = s.bytes_reserved;
  std::unique_lock<std::shared_mutex> tree(tree_mu_);
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
  std::unique_lock<std::shared_mutex> tree(tree_mu_);
  if (!walk_status_.ok()) return walk_status_;
  if (!closed_) {
    pool_->close_clean();
    closed_ = true;
  }
  return Status::Ok();
}

}  // namespace pmindex::apex

// FPTree: creation, recovery (micro-log replay, chain walk, inner rebuild), verify, and the
// explicit instantiations for 8, 16, 32 and 64 entries per leaf. Operations: fptree_ops.h;
// structural changes: fptree_smo.h.
#include "index/fptree/fptree.h"

#include <algorithm>
#include <chrono>
#include <map>

#include "index/common/leaf_chain.h"
#include "index/fptree/fptree_smo.h"

namespace pmindex::fptree {

template <unsigned N>
FPTree<N>::FPTree(std::unique_ptr<pm::Pool> pool)
    : pool_(std::move(pool)), inner_(inner_keys_for(N), arena_) {}

template <unsigned N>
FPTree<N>::~FPTree() = default;

template <unsigned N>
void FPTree<N>::init_dram() {
  head_ = root_->head;
  logs_ = pool_->at<MicroLog>(root_->logs);
  keys_.configure(pool_.get(), static_cast<KeyType>(root_->key_mode), root_->max_key_size);
  versions_ = std::make_unique<index_common::LeafVersions>(pool_->size());
  inner_.init_single(head_);
}

template <unsigned N>
Status FPTree<N>::init_root(const Options& o) {
  pm::Pool& p = *pool_;
  Code code = Code::ok;
  const std::uint64_t head = p.allocator().allocate(kBlock, &code);
  const std::uint64_t logs = head == 0 ? 0 : p.allocator().allocate(kLogCount * sizeof(MicroLog), &code);
  const std::uint64_t off = logs == 0 ? 0 : p.allocator().allocate(sizeof(Root), &code);
  if (off == 0) return p.error(code, "no space for the fptree root, logs and first leaf");
  pm::zero(p.at<char>(head), sizeof(LeafT));  // C1: an empty head leaf, clear logs, the root
  pm::persist(p.at<char>(head), sizeof(LeafT));
  pm::zero(p.at<char>(logs), kLogCount * sizeof(MicroLog));
  pm::persist(p.at<char>(logs), kLogCount * sizeof(MicroLog));
  Root init{};
  init.magic = kRootMagic;
  init.head = head;
  init.logs = logs;
  init.entries = N;
  init.key_mode = static_cast<std::uint32_t>(o.key_type);
  init.max_key_size = o.key_type == KeyType::bytes ? o.max_key_size : 8;
  init.log_count = kLogCount;
  pm::copy(p.at<Root>(off), &init, sizeof init);
  pm::persist(p.at<Root>(off), sizeof init);
  p.set_root(off);  // C2: published (one failure-atomic store, persisted)
  root_ = p.at<Root>(off);
  init_dram();
  return Status::Ok();
}

template <unsigned N>
Result<std::unique_ptr<Index>> FPTree<N>::create(std::unique_ptr<pm::Pool> pool,
                                                 const Options& o) {
  if (o.key_type == KeyType::bytes && o.max_key_size > kMaxKeyBytes)
    return pool->error(Code::invalid_argument, "fptree keys are limited to 8192 bytes");
  if (o.max_value_size != 8)
    return pool->error(Code::invalid_argument, "fptree stores 8-byte values inline only");
  std::unique_ptr<FPTree> idx(new FPTree(std::move(pool)));
  if (Status s = idx->init_root(o); !s.ok()) return s;
  idx->recovery_.created = true;
  return std::unique_ptr<Index>(std::move(idx));
}

template <unsigned N>
Result<std::unique_ptr<Index>> FPTree<N>::recover(std::unique_ptr<pm::Pool> pool,
                                                  const Options& o) {
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<FPTree> idx(new FPTree(std::move(pool)));
  pm::Pool& p = *idx->pool_;
  idx->recovery_.clean_shutdown = p.was_clean();
  p.allocator().begin_recovery(/*start_now=*/false);
  const std::uint64_t root_off = p.root();
  if (root_off == 0) {  // crash before C2: nothing was reachable
    if (Status s = p.allocator().finish_recovery(); !s.ok()) return s;
    p.commit_open();
    if (Status s = idx->init_root(o); !s.ok()) return s;
  } else {
    Root* r = p.checked<Root>(root_off, sizeof(Root), 64);
    if (r == nullptr || r->magic != kRootMagic)
      return p.error(Code::corrupted, "fptree root object is missing or has a wrong magic");
    if (r->entries != N || r->log_count != kLogCount ||
        r->key_mode != static_cast<std::uint32_t>(p.info().layout.key_mode) ||
        r->max_key_size > kMaxKeyBytes ||
        p.checked<char>(r->head, sizeof(LeafT), 256) == nullptr ||
        p.checked<char>(r->logs, kLogCount * sizeof(MicroLog), 64) == nullptr)
      return p.error(Code::corrupted, "fptree root holds impossible sizes or offsets");
    idx->root_ = r;
    idx->init_dram();
    if (p.allocator().mark_reachable(root_off, sizeof(Root)) != Code::ok ||
        p.allocator().mark_reachable(r->logs, kLogCount * sizeof(MicroLog)) != Code::ok)
      return p.allocator().finish_recovery();
    if (Status s = idx->rebuild(std::max(1u, o.recovery_threads)); !s.ok()) return s;
  }
  idx->recovery_.threads = 1;
  idx->recovery_.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return std::unique_ptr<Index>(std::move(idx));
}

// Recovery (PROTOCOL.md R1..R5). Pass 1 only reads PM and decides (a refused pool stays
// unchanged); the repairs run after commit_open.
template <unsigned N>
Status FPTree<N>::rebuild(unsigned /*threads*/) {
  pm::Pool& p = *pool_;
  auto fail = [&](const std::string& what) {
    (void)p.allocator().finish_recovery();
    return p.error(Code::corrupted, "fptree recovery: " + what);
  };
  auto leaf_ok = [&](std::uint64_t off) { return p.checked<char>(off, sizeof(LeafT), 256) != nullptr; };
  // R1: micro-logs. A split whose leaf is still full is rolled back (the new leaf is not
  // marked, so it is free again); otherwise S6 happened and the link S7 is (re)done. A delete
  // whose predecessor still points at the leaf is finished (D4 redone).
  std::map<std::uint64_t, std::uint64_t> relink;  // leaf -> the successor recovery installs
  std::vector<unsigned> dirty_logs;
  for (unsigned i = 0; i < kLogCount; ++i) {
    const MicroLog& g = logs_[i];
    if ((g.split_leaf | g.split_new | g.delete_leaf | g.delete_prev) != 0) dirty_logs.push_back(i);
    if (g.split_leaf != 0 && g.split_new != 0) {
      if (!leaf_ok(g.split_leaf) || !leaf_ok(g.split_new)) return fail("bad split log offsets");
      if ((leaf_at(g.split_leaf)->bitmap & LeafT::kFullMask) != LeafT::kFullMask) {
        relink[g.split_leaf] = g.split_new;
        ++recovery_.repaired;
      }
    }
    if (g.delete_leaf != 0 && g.delete_prev != 0) {
      if (!leaf_ok(g.delete_leaf) || !leaf_ok(g.delete_prev)) return fail("bad delete log offsets");
      if (leaf_at(g.delete_prev)->next == g.delete_leaf &&
          (leaf_at(g.delete_leaf)->bitmap & LeafT::kFullMask) == 0) {
        relink[g.delete_prev] = leaf_at(g.delete_leaf)->next;
        ++recovery_.repaired;
      }
    }
  }
  auto next_of = [&](std::uint64_t off) {
    const auto it = relink.find(off);
    return it != relink.end() ? it->second : leaf_at(off)->next;
  };
  // R2: walk the chain as the logs complete it; check and mark every leaf and key record.
  std::vector<std::uint64_t> leaves;
  if (Status s = index_common::walk_leaf_chain(p, head_, sizeof(LeafT), 256, next_of, &leaves);
      !s.ok()) {
    (void)p.allocator().finish_recovery();
    return s;
  }
  std::vector<std::string> min_key(leaves.size());
  std::vector<std::uint64_t> min_word(leaves.size(), 0);
  std::string prev_max;
  bool have_prev = false;
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    const LeafT* l = leaf_at(leaves[i]);
    if (p.allocator().mark_reachable(leaves[i], kBlock) != Code::ok)
      return fail("leaf at " + std::to_string(leaves[i]) + " overlaps another block");
    if ((l->bitmap & ~LeafT::kFullMask) != 0) return fail("bitmap bits beyond the slots");
    std::vector<std::string> ks;
    for (std::uint64_t m = l->bitmap; m != 0; m &= m - 1) {
      const auto s = static_cast<unsigned>(std::countr_zero(m));
      const std::uint64_t kw = l->kv[s][0];
      if (keys_.bytes_mode() && index_common::mark_record(p, kw, keys_.max_key()) != Code::ok)
        return fail("bad key record in leaf " + std::to_string(leaves[i]));
      ks.push_back(keys_.key_bytes(kw));
      if (ks.size() == 1 || ks.back() < min_key[i]) {
        min_key[i] = ks.back();
        min_word[i] = kw;
      }
    }
    if (ks.empty()) continue;
    const std::string mx = *std::max_element(ks.begin(), ks.end());
    if (have_prev && !(prev_max < min_key[i]))
      return fail("leaves out of key order at " + std::to_string(leaves[i]));
    prev_max = mx;
    have_prev = true;
    recovery_.records += ks.size();
  }
  if (Status fs = p.allocator().finish_recovery(); !fs.ok()) return fs;
  p.commit_open();
  // R3: install the log decisions (S7 / D4 redone), then clear the logs.
  for (const auto& [leaf, next] : relink) {
    detail::put(&leaf_at(leaf)->next, next);
    pm::persist(&leaf_at(leaf)->next, 8);
  }
  for (unsigned i : dirty_logs) {
    MicroLog* g = &logs_[i];
    for (std::uint64_t* w : {&g->split_leaf, &g->split_new, &g->delete_leaf, &g->delete_prev})
      detail::put(w, 0);
    pm::persist(g, sizeof *g);
  }
  // R4: clear stale lock words; unlink empty non-head leaves (one NAW each, like D4; a crash
  // here leaves either state, both valid).
  std::vector<std::pair<std::uint64_t, std::uint64_t>> items;
  std::uint64_t kept = 0;
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    LeafT* l = leaf_at(leaves[i]);
    if (l->lock != 0) {
      detail::put(&l->lock, 0);
      pm::persist(&l->lock, 8);
    }
    if (i > 0 && (l->bitmap & LeafT::kFullMask) == 0) {
      detail::put(&leaf_at(kept)->next, l->next);
      pm::persist(&leaf_at(kept)->next, 8);
      p.allocator().deallocate(leaves[i], kBlock);
      ++recovery_.repaired;
      continue;
    }
    kept = leaves[i];
    items.emplace_back(i == 0 ? 0 : keys_.separator_for(min_key[i], min_word[i], seps_), kept);
  }
  // R5: rebuild the DRAM inner nodes.
  inner_.bulk_build(items, 0.9, 1);
  recovery_.nodes = items.size();
  return Status::Ok();
}

template <unsigned N>
std::uint64_t FPTree<N>::leaf_count() const {
  std::vector<std::uint64_t> leaves;
  const Status s = index_common::walk_leaf_chain(
      *pool_, head_, sizeof(LeafT), 256,
      [&](std::uint64_t off) { return relaxed_load(&leaf_at(off)->next); }, &leaves);
  return s.ok() ? leaves.size() : 0;
}

// Quiescent check of every invariant in fptree.h.
template <unsigned N>
Status FPTree<N>::verify() const {
  const pm::Pool& p = *pool_;
  auto bad = [&](std::uint64_t off, const std::string& what) {
    return p.error(Code::corrupted, "verify: fptree leaf at " + std::to_string(off) + ": " + what);
  };
  for (unsigned i = 0; i < kLogCount; ++i) {  // invariant 4
    const MicroLog& g = logs_[i];
    if ((g.split_leaf | g.split_new | g.delete_leaf | g.delete_prev) != 0)
      return p.error(Code::corrupted, "verify: micro-log " + std::to_string(i) + " is not clear");
  }
  std::vector<std::uint64_t> leaves;
  Status s = index_common::walk_leaf_chain(
      p, head_, sizeof(LeafT), 256,
      [&](std::uint64_t off) { return relaxed_load(&leaf_at(off)->next); }, &leaves);
  if (!s.ok()) return s;
  auto block = [](std::size_t n) { return pm::Allocator::class_size(pm::Allocator::class_of(n)); };
  std::uint64_t reachable = block(sizeof(Root)) + block(kLogCount * sizeof(MicroLog)) +
                            leaves.size() * block(kBlock);
  std::vector<std::vector<std::string>> keys(leaves.size());
  const std::string* prev_max = nullptr;
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    const std::uint64_t off = leaves[i];
    const LeafT* l = leaf_at(off);
    if (relaxed_load(&l->lock) != 0 || versions_->at(off).is_locked())
      return bad(off, "left locked");
    const std::uint64_t bm = relaxed_load(&l->bitmap);
    if ((bm & ~LeafT::kFullMask) != 0) return bad(off, "bitmap bits beyond the slots");
    for (std::uint64_t m = bm; m != 0; m &= m - 1) {
      const auto sl = static_cast<unsigned>(std::countr_zero(m));
      const std::uint64_t kw = relaxed_load(&l->kv[sl][0]);
      if (keys_.bytes_mode()) {
        std::string_view rec;
        if (!index_common::read_record(p, kw, keys_.max_key(), &rec))
          return bad(off, "slot " + std::to_string(sl) + " has a bad key record");
        reachable += block(index_common::record_bytes(rec.size()));
      }
      if (get_fp(l, sl) != keys_.fingerprint(kw))
        return bad(off, "slot " + std::to_string(sl) + ": fingerprint does not match the key");
      keys[i].push_back(keys_.key_bytes(kw));
    }
    std::sort(keys[i].begin(), keys[i].end());
    if (std::adjacent_find(keys[i].begin(), keys[i].end()) != keys[i].end())
      return bad(off, "duplicate key");
    if (keys[i].empty()) continue;
    if (prev_max != nullptr && !(*prev_max < keys[i].front()))
      return bad(off, "keys not above the previous leaf's keys");
    prev_max = &keys[i].back();
  }
  const std::uint64_t in_use = p.allocator().stats().bytes_in_use;
  if (in_use != reachable)
    return p.error(Code::corrupted, "verify: allocator has " + std::to_string(in_use) +
                                        " bytes in use but " + std::to_string(reachable) +
                                        " are reachable");
  std::size_t next = 0;
  s = inner_.verify(
      [&](std::uint64_t a, std::uint64_t b) { return keys_.separator_less(a, b); },
      [&](std::uint64_t leaf, const std::uint64_t* lo, const std::uint64_t* hi) -> Status {
        if (next >= leaves.size() || leaves[next] != leaf)
          return p.error(Code::corrupted, "verify: inner tree leaf order differs from the chain");
        const auto& ks = keys[next++];
        if (ks.empty()) return Status::Ok();
        if (lo != nullptr && ks.front() < keys_.separator_bytes(*lo))
          return bad(leaf, "key below the inner-node fence");
        if (hi != nullptr && !(ks.back() < keys_.separator_bytes(*hi)))
          return bad(leaf, "key not below the inner-node fence");
        return Status::Ok();
      });
  if (!s.ok()) return s;
  if (next != leaves.size())
    return p.error(Code::corrupted, "verify: chain has leaves the inner tree lacks");
  return Status::Ok();
}

template <unsigned N>
Footprint FPTree<N>::footprint() const {
  Footprint f;
  const auto st = pool_->allocator().stats();
  f.pm_bytes = st.bytes_in_use;
  f.pm_reserved = st.bytes_reserved;
  f.dram_bytes = inner_.dram_bytes() + versions_->dram_bytes() + seps_.dram_bytes();
  return f;
}

template <unsigned N>
Status FPTree<N>::close() {
  if (!closed_) {
    pool_->close_clean();  // every operation persisted its own steps
    closed_ = true;
  }
  return Status::Ok();
}

template class FPTree<8>;
template class FPTree<16>;
template class FPTree<32>;
template class FPTree<64>;

// --- registry entry points ----------------------------------------------------------------

namespace {
// node_size is the leaf's byte size (sizeof Leaf<N>); 0 selects the paper's 64 entries.
std::uint32_t entries_for(std::uint32_t node_size) {
  switch (node_size) {
    case 0:
    case sizeof(Leaf<64>): return 64;
    case sizeof(Leaf<8>): return 8;
    case sizeof(Leaf<16>): return 16;
    case sizeof(Leaf<32>): return 32;
    default: return 0;
  }
}
std::uint32_t leaf_bytes(std::uint32_t entries) {
  switch (entries) {
    case 8: return sizeof(Leaf<8>);
    case 16: return sizeof(Leaf<16>);
    case 32: return sizeof(Leaf<32>);
    default: return sizeof(Leaf<64>);
  }
}
}  // namespace

// The layout id records the leaf size in bytes and, as the variant, the entries per leaf.
pm::Layout layout_for(const Options& o) {
  const std::uint32_t n = entries_for(o.node_size);
  return pm::Layout{"fptree", n == 0 ? o.node_size : leaf_bytes(n), o.key_type, n};
}

std::size_t default_pool_size(const Options& o) {
  std::size_t per_record = 48;  // a 64-entry leaf at ~70% fill, rounded up
  if (o.key_type == KeyType::bytes) per_record += 64 + o.max_key_size;
  return std::max<std::size_t>(std::size_t{16} << 20, o.expected_records * per_record * 2);
}

Result<std::unique_ptr<Index>> create(std::unique_ptr<pm::Pool> pool, const Options& o) {
  switch (entries_for(o.node_size)) {
    case 8: return FPTree<8>::create(std::move(pool), o);
    case 16: return FPTree<16>::create(std::move(pool), o);
    case 32: return FPTree<32>::create(std::move(pool), o);
    case 64: return FPTree<64>::create(std::move(pool), o);
    default:
      return pool->error(Code::invalid_argument,
                         "fptree node_size must be 192, 320, 576 or 1152 (8..64 entries)");
  }
}

Result<std::unique_ptr<Index>> recover(std::unique_ptr<pm::Pool> pool, const Options& o) {
  const pm::Layout& l = pool->info().layout;
  if (entries_for(l.node_size) != l.variant)
    return pool->error(Code::corrupted, "fptree pool has an impossible leaf size");
  switch (l.variant) {
    case 8: return FPTree<8>::recover(std::move(pool), o);
    case 16: return FPTree<16>::recover(std::move(pool), o);
    case 32: return FPTree<32>::recover(std::move(pool), o);
    case 64: return FPTree<64>::recover(std::move(pool), o);
    default: return pool->error(Code::corrupted, "fptree pool has an impossible leaf size");
  }
}

}  // namespace pmindex::fptree

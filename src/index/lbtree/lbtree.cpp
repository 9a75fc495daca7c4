// LB+-Tree: creation, recovery (§4.2), verify, and the explicit instantiations for 256 B,
// 512 B and 1 KiB leaves. Operations: lbtree_ops.h; structural changes: lbtree_smo.h.
#include "index/lbtree/lbtree.h"

#include <chrono>
#include <thread>

#include "index/common/hybrid_checks.h"
#include "index/common/leaf_chain.h"
#include "index/common/recovery_frame.h"
#include "index/lbtree/lbtree_ops.h"
#include "index/lbtree/lbtree_smo.h"
#include "isa.h"

namespace pmindex::lbtree {

template <unsigned M>
LBTree<M>::LBTree(std::unique_ptr<pm::Pool> pool)
    : pool_(std::move(pool)), inner_(kInnerKeys, arena_), versions_(pool_->size()) {}

template <unsigned M>
LBTree<M>::~LBTree() = default;

template <unsigned M>
Index::ThreadScope LBTree<M>::attach_thread() {
  auto participant = std::make_shared<sync::EpochManager::Participant>(epochs_.attach());
  return ThreadScope([participant]() mutable { participant.reset(); });
}

template <unsigned M>
void LBTree<M>::init_dram() {
  head_ = root_->head;
  keys_.configure(pool_.get(), static_cast<KeyType>(root_->key_mode), root_->max_key_size);
  max_value_ = root_->max_value_size;
  inline_values_ = max_value_ == 8;
  search_avx2_ = isa::search_level() == isa::Level::avx2;
  inner_.init_single(head_);
}

template <unsigned M>
Status LBTree<M>::init_root(const Options& o) {
  pm::Pool& p = *pool_;
  Code code = Code::ok;
  const std::uint64_t head = p.allocator().allocate(LeafT::kBytes, &code);
  if (head == 0) return p.error(code, "no space for the first leaf");
  pm::zero(p.at<char>(head), LeafT::kBytes);  // P0: an empty leaf (bitmaps 0, no sibling)
  const std::uint64_t end = make_sibling(0, kEndTag8, tags_.next());  // its tag, the end mark
  pm::store(&p.at<LeafT>(head)->block[0].tail[0], end);
  pm::store(&p.at<LeafT>(head)->block[0].tail[1], end);
  pm::persist(p.at<char>(head), LeafT::kBytes);
  const std::uint64_t off = p.allocator().allocate(sizeof(Root), &code);
  if (off == 0) return p.error(code, "no space for the index root");
  Root init{};
  init.magic = kRootMagic;
  init.head = head;
  init.node_size = LeafT::kBytes;
  init.key_mode = static_cast<std::uint32_t>(o.key_type);
  init.max_key_size = o.key_type == KeyType::bytes ? o.max_key_size : 8;
  init.max_value_size = o.max_value_size;
  init.stamp = index_common::make_root_stamp(p.info().layout);
  pm::copy(p.at<Root>(off), &init, sizeof init);  // P0: the root object
  pm::persist(p.at<Root>(off), sizeof init);
  p.set_root(off);                                 // P0: published (atomic, persisted)
  root_ = p.at<Root>(off);
  init_dram();
  return Status::Ok();
}

template <unsigned M>
Result<std::unique_ptr<Index>> LBTree<M>::create(std::unique_ptr<pm::Pool> pool,
                                                 const Options& o) {
  std::unique_ptr<LBTree> idx(new LBTree(std::move(pool)));
  if (Status s = idx->init_root(o); !s.ok()) return s;
  idx->recovery_.created = true;
  return std::unique_ptr<Index>(std::move(idx));
}

template <unsigned M>
Result<std::unique_ptr<Index>> LBTree<M>::recover(std::unique_ptr<pm::Pool> pool,
                                                  const Options& o) {
  std::unique_ptr<LBTree> idx(new LBTree(std::move(pool)));
  LBTree& t = *idx;
  pm::Pool& p = *t.pool_;
  const Status s = index_common::run_recovery(
      p, &t.recovery_, [&] { return t.init_root(o); },  // crash before P0: nothing reachable
      [&](std::uint64_t root_off) -> Status {
        Root* r = p.checked<Root>(root_off, sizeof(Root), 64);
        if (r != nullptr && r->magic == kRootMagicUntagged)
          return p.error(Code::corrupted,
                         "lbtree root is of format LBTREE01 (sibling words without tags, before "
                         "pmindex adopted tagged links): load the records into a new pool");
        if (r == nullptr || r->magic != kRootMagic)
          return p.error(Code::corrupted, "lbtree root object is missing or has a wrong magic");
        if (Status st = index_common::check_root_stamp(r->stamp, p); !st.ok()) return st;
        if (r->node_size != LeafT::kBytes ||
            r->key_mode != static_cast<std::uint32_t>(p.info().layout.key_mode) ||
            r->max_key_size > kMaxKeyBytes || r->max_value_size < 8 ||
            r->max_value_size > kMaxValueBytes ||
            p.checked<char>(r->head, LeafT::kBytes, 256) == nullptr)
          return p.error(Code::corrupted, "lbtree root holds impossible sizes or head offset");
        t.root_ = r;
        t.init_dram();
        if (p.allocator().mark_reachable(root_off, sizeof(Root)) != Code::ok)
          return p.allocator().finish_recovery();
        return t.rebuild(std::max(1u, o.recovery_threads));
      });
  if (!s.ok()) return s;
  t.recovery_.threads = std::max(1u, o.recovery_threads);
  idx->set_recovered_records(t.recovery_.records);  // rebuild() counted every leaf's records
  return std::unique_ptr<Index>(std::move(idx));
}

// R2 for one leaf: marks the leaf and its out-of-line records reachable, checks the block
// headers, and summarises the keys. Runs concurrently for different leaves (writes only *in).
template <unsigned M>
void LBTree<M>::summarise_leaf(std::uint64_t off, index_common::LeafSummary* in) {
  pm::Pool& p = *pool_;
  LeafT* l = leaf_at(off);
  if (p.allocator().mark_reachable(off, LeafT::kBytes) != Code::ok) {
    in->error = "leaf block overlaps another block";
    return;
  }
  const bool alt = (l->block[0].front[0] & kAltBit) != 0;
  in->locked = (l->block[0].front[0] & kLockBit) != 0;
  for (unsigned b = 0; b < M; ++b) {
    const DWord d = load_header(active_header(l, b, alt));
    if (b > 0 && (d.w[0] & (kLockBit | kAltBit)) != 0) {
      in->error = "block header flags set";
      return;
    }
    for (std::uint64_t m = d.bitmap(); m != 0; m &= m - 1) {
      const auto sl = static_cast<unsigned>(std::countr_zero(m));
      const std::uint64_t kw = l->block[b].entry[sl][0];
      const std::uint64_t vw = l->block[b].entry[sl][1];
      if (keys_.bytes_mode() && index_common::mark_record(p, kw, keys_.max_key()) != Code::ok) {
        in->error = "bad key record";
        return;
      }
      if (!inline_values_ && index_common::mark_record(p, vw, max_value_) != Code::ok) {
        in->error = "bad value record";
        return;
      }
      in->add(kw, keys_);
    }
  }
}

// A sibling word zeroed, or redirected to another valid leaf, after any end (clean or not) no
// longer names its successor's own tag; the last leaf's must carry the end mark (layout.h).
template <unsigned M>
Status LBTree<M>::check_sibling_tags(const std::vector<std::uint64_t>& leaves) const {
  const std::string bad = index_common::check_chain_tags(
      leaves, kEndTag8, "sibling word",
      [&](std::uint64_t off) { return sib_own_tag(active_sibling(leaf_at(off))); },
      [&](std::uint64_t off) {
        const std::uint64_t w = active_sibling(leaf_at(off));
        return index_common::ChainLink{sib_off(w), sib_succ_tag(w)};
      });
  if (bad.empty()) return Status::Ok();
  return pool_->error(Code::corrupted,
                      "lbtree recovery: " + bad + " (a damaged or redirected sibling pointer)");
}

// Recovery (PROTOCOL.md R1..R5): the hybrid indexes' shared pass (leaf_recovery.h) with
// LB+-Tree's parts. Pass 1 only reads PM (a refused pool stays unchanged); repairs happen after
// commit_open.
template <unsigned M>
struct LBTree<M>::RecoveryPolicy {
  LBTree& t;
  const char* name = "lbtree";
  std::size_t leaf_bytes = LeafT::kBytes;
  std::size_t block_bytes = LeafT::kBytes;
  std::uint64_t next(std::uint64_t off) { return t.next_leaf(off); }  // R1
  Status check_links(const std::vector<std::uint64_t>& leaves) {
    return t.check_sibling_tags(leaves);  // R1b
  }
  // R2: check headers and records, mark every reachable block, find the min and max keys.
  void summarise(std::uint64_t off, index_common::LeafSummary* s) { t.summarise_leaf(off, s); }
  const index_common::KeyCodec& keys() { return t.keys_; }
  void before_repairs() {}
  void clear_lock(std::uint64_t off) {  // R3: a stale lock bit
    LeafT* l = t.leaf_at(off);
    detail::put(&l->block[0].front[0], l->block[0].front[0] & ~kLockBit);
    pm::persist(l->block[0].front, 16);
  }
  // R4: an empty leaf left by a crash between D2 and U3 leaves the chain.
  void unlink(std::uint64_t kept, std::uint64_t off) {
    LeafT* l = t.leaf_at(off);
    const bool alt = (l->block[0].front[0] & kAltBit) != 0;
    t.switch_sibling(t.leaf_at(kept), l->block[0].tail[alt ? 1 : 0]);
  }
  std::uint64_t separator(std::uint64_t min_word) { return t.make_separator(min_word); }
  // R5: the DRAM inner nodes from the recorded leaf positions.
  void build_inner(const std::vector<std::pair<std::uint64_t, std::uint64_t>>& items,
                   unsigned threads) {
    t.inner_.bulk_build(items, 0.9, threads);
  }
};

template <unsigned M>
Status LBTree<M>::rebuild(unsigned threads) {
  const auto start = std::chrono::steady_clock::now();
  RecoveryPolicy policy{*this};
  unsigned used = 1;
  const Status s =
      index_common::recover_leaf_chain(*pool_, head_, threads, policy, &recovery_, &used);
  if (!s.ok()) return s;
  rebuild_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return Status::Ok();
}

// Records and leaves on the chain (quiescent: close). kNoCount if the chain fails its walk.
template <unsigned M>
void LBTree<M>::count_chain(std::uint64_t* records, std::uint64_t* leaves) const {
  std::vector<std::uint64_t> offs;
  if (!index_common::walk_leaf_chain(*pool_, head_, LeafT::kBytes, 256,
                                     [&](std::uint64_t off) { return next_leaf(off); }, &offs)
           .ok()) {
    *records = *leaves = pm::kNoCount;
    return;
  }
  *records = 0;
  *leaves = offs.size();
  for (const std::uint64_t off : offs) {
    LeafT* l = leaf_at(off);
    const bool alt = (l->block[0].front[0] & kAltBit) != 0;
    for (unsigned b = 0; b < M; ++b)
      *records += static_cast<std::uint64_t>(std::popcount(load_header(active_header(l, b, alt)).bitmap()));
  }
}

template <unsigned M>
std::uint64_t LBTree<M>::leaf_count() const {
  std::vector<std::uint64_t> leaves;
  Status s = index_common::walk_leaf_chain(
      *pool_, head_, LeafT::kBytes, 256,
      [&](std::uint64_t off) { return next_leaf(off); },
      &leaves);
  return s.ok() ? leaves.size() : 0;
}

// Quiescent check of every invariant in lbtree.h. The leaf layout part is here; key order,
// the inner tree against the chain and reachability are the shared hybrid_checks.h steps.
template <unsigned M>
Status LBTree<M>::verify() const {
  epochs_.drain();  // quiescent: retired records are free before reachability is counted
  const pm::Pool& p = *pool_;
  using index_common::block_bytes;
  using index_common::leaf_error;
  index_common::ChainKeys chain;
  Status s = index_common::walk_leaf_chain(
      p, head_, LeafT::kBytes, 256,
      [&](std::uint64_t off) { return next_leaf(off); },
      &chain.leaves);
  if (s.ok()) s = check_sibling_tags(chain.leaves);
  if (!s.ok()) return s;
  std::uint64_t reachable =
      block_bytes(sizeof(Root)) + chain.leaves.size() * block_bytes(LeafT::kBytes);
  chain.keys.resize(chain.leaves.size());
  for (std::size_t i = 0; i < chain.leaves.size(); ++i) {
    const std::uint64_t off = chain.leaves[i];
    LeafT* l = leaf_at(off);
    const std::uint64_t w0 = optimistic_read(l->block[0].front[0]);
    if ((w0 & kLockBit) != 0 || versions_.is_locked(off)) return leaf_error(p, off, "left locked");
    const bool alt = (w0 & kAltBit) != 0;
    for (unsigned b = 0; b < M; ++b) {
      const DWord d = load_header(active_header(l, b, alt));
      if (b > 0 && (d.w[0] & (kLockBit | kAltBit)) != 0)
        return leaf_error(p, off, "block " + std::to_string(b) + " header has lock/alt bits");
      for (std::uint64_t m = d.bitmap(); m != 0; m &= m - 1) {
        const auto sl = static_cast<unsigned>(std::countr_zero(m));
        const std::uint64_t kw = optimistic_read(l->block[b].entry[sl][0]);
        const std::uint64_t vw = optimistic_read(l->block[b].entry[sl][1]);
        std::string_view rec;
        if (keys_.bytes_mode()) {
          if (!index_common::read_record(p, kw, keys_.max_key(), &rec))
            return leaf_error(p, off, "slot " + std::to_string(sl) + " has a bad key record");
          reachable += block_bytes(index_common::record_bytes(rec.size()));
        }
        if (!inline_values_) {
          if (!index_common::read_record(p, vw, max_value_, &rec))
            return leaf_error(p, off, "slot " + std::to_string(sl) + " has a bad value record");
          reachable += block_bytes(index_common::record_bytes(rec.size()));
        }
        if (d.fp(sl) != keys_.fingerprint(kw))
          return leaf_error(p, off, "block " + std::to_string(b) + " slot " + std::to_string(sl) +
                                        ": fingerprint does not match the key");
        chain.keys[i].push_back(keys_.key_bytes(kw));
      }
    }
  }
  if (s = index_common::check_key_order(p, chain); !s.ok()) return s;
  if (s = index_common::check_reachable(p, reachable); !s.ok()) return s;
  s = index_common::check_inner_against_chain(
      p, inner_, chain,
      [&](std::uint64_t a, std::uint64_t b) { return keys_.separator_less(a, b); },
      [&](std::uint64_t sep) { return keys_.separator_bytes(sep); });
  if (!s.ok()) return s.code() == Code::corrupted && s.message().rfind("verify", 0) == 0
                          ? s
                          : p.error(s.code(), "verify: " + s.message());
  return Status::Ok();
}

template <unsigned M>
Footprint LBTree<M>::footprint() const {
  return index_common::hybrid_footprint(*pool_, inner_, versions_, seps_);
}

template <unsigned M>
Status LBTree<M>::close() {
  if (!closed_) {
    epochs_.drain();  // retired separator copies (no operation runs concurrently)
    // Every operation persisted its own steps; the counts let the next open see a chain that
    // lost leaves (one read-only chain walk here, none per operation).
    std::uint64_t records = 0, leaves = 0;
    count_chain(&records, &leaves);
    pool_->close_clean(records, leaves);
    closed_ = true;
  }
  return Status::Ok();
}

template class LBTree<1>;
template class LBTree<2>;
template class LBTree<4>;

// --- registry entry points ------------------------------------------------------------------

namespace {
std::uint32_t node_size_of(const Options& o) { return o.node_size == 0 ? 256 : o.node_size; }
}  // namespace

pm::Layout layout_for(const Options& o) {
  return pm::Layout{"lbtree", node_size_of(o), o.key_type, 0};
}

std::size_t default_pool_size(const Options& o) {
  std::size_t per_record = 64;  // leaf share at 70% fill, rounded up generously
  if (o.key_type == KeyType::bytes) per_record += 64 + o.max_key_size;
  if (o.max_value_size > 8) per_record += 64 + o.max_value_size;
  return std::max<std::size_t>(std::size_t{16} << 20, o.expected_records * per_record * 2);
}

Status validate(const Options& o) {
  const std::uint32_t ns = node_size_of(o);
  if (ns != 256 && ns != 512 && ns != 1024)
    return Status(Code::invalid_argument, "lbtree node_size must be 256, 512 or 1024");
  if (o.key_type == KeyType::bytes && o.max_key_size > kMaxKeyBytes)
    return Status(Code::invalid_argument, "lbtree keys are limited to 8192 bytes");
  if (o.max_value_size < 8 || o.max_value_size > kMaxValueBytes)
    return Status(Code::invalid_argument,
                  "lbtree max_value_size must be 8 (inline) or 9..65536 (out of line)");
  return Status::Ok();
}

// Options passed validate(): node_size is one of the three instantiations.
Result<std::unique_ptr<Index>> create(std::unique_ptr<pm::Pool> pool, const Options& o) {
  switch (node_size_of(o)) {
    case 256: return LBTree<1>::create(std::move(pool), o);
    case 512: return LBTree<2>::create(std::move(pool), o);
    default: return LBTree<4>::create(std::move(pool), o);
  }
}

Result<std::unique_ptr<Index>> recover(std::unique_ptr<pm::Pool> pool, const Options& o) {
  switch (pool->info().layout.node_size) {
    case 256: return LBTree<1>::recover(std::move(pool), o);
    case 512: return LBTree<2>::recover(std::move(pool), o);
    case 1024: return LBTree<4>::recover(std::move(pool), o);
    default:
      return pool->error(Code::corrupted, "lbtree pool has an impossible node size");
  }
}

}  // namespace pmindex::lbtree

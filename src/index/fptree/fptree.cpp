// FPTree: creation, recovery (micro-log replay, chain walk, inner rebuild), verify, and the
// explicit instantiations for 8, 16, 32 and 64 entries per leaf. Operations: fptree_ops.h;
// structural changes: fptree_smo.h.
#include "index/fptree/fptree.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <sstream>
#include <utility>

#include "index/common/hybrid_checks.h"
#include "index/common/leaf_chain.h"
#include "index/common/leaf_recovery.h"
#include "index/common/recovery_frame.h"
#include "index/common/traits.h"
#include "index/fptree/fptree_smo.h"
#include "isa.h"

namespace pmindex::fptree {

template <unsigned N>
FPTree<N>::FPTree(std::unique_ptr<pm::Pool> pool)
    : pool_(std::move(pool)),
      inner_(inner_keys_for(N), arena_),
      versions_(std::make_unique<index_common::LeafVersions>(pool_->size())) {}

template <unsigned N>
FPTree<N>::~FPTree() {
  epochs_.drain();  // retired records: freed (or, if a crash is simulated, left to recovery)
}

template <unsigned N>
Index::ThreadScope FPTree<N>::attach_thread() {
  auto participant = std::make_shared<sync::EpochManager::Participant>(epochs_.attach());
  return ThreadScope([participant]() mutable { participant.reset(); });
}

// The DRAM side of the root object r (versions are all zero from construction).
template <unsigned N>
void FPTree<N>::attach(Root* r) {
  root_ = r;
  keys_.configure(pool_.get(), static_cast<KeyType>(r->key_mode), r->max_key_size);
  values_.configure(pool_.get(), r->max_value_size == 0 ? 8 : r->max_value_size);
  has_records_ = keys_.bytes_mode() || !values_.inline_values();
  search_avx2_ = isa::search_level() == isa::Level::avx2;
  logs_ = pool_->at<MicroLog>(r->logs);
  inner_.init_single(head_ = r->head);
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
  detail::put(&leaf_at(head)->tag, new_tag());
  detail::put(&leaf_at(head)->next, kChainEnd);
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
  init.max_value_size = o.max_value_size;
  init.stamp = index_common::make_root_stamp(p.info().layout);
  pm::copy(p.at<Root>(off), &init, sizeof init);
  pm::persist(p.at<Root>(off), sizeof init);
  p.set_root(off);  // C2: published (one failure-atomic store, persisted)
  attach(p.at<Root>(off));
  return Status::Ok();
}

template <unsigned N>
Result<std::unique_ptr<Index>> FPTree<N>::create(std::unique_ptr<pm::Pool> pool,
                                                 const Options& o) {
  std::unique_ptr<FPTree> t(new FPTree(std::move(pool)));
  t->recovery_.created = true;
  const Status s = t->init_root(o);
  return s.ok() ? Result<std::unique_ptr<Index>>(std::unique_ptr<Index>(std::move(t)))
                : Result<std::unique_ptr<Index>>(s);
}

template <unsigned N>
Result<std::unique_ptr<Index>> FPTree<N>::recover(std::unique_ptr<pm::Pool> pool,
                                                  const Options& o) {
  std::unique_ptr<FPTree> idx(new FPTree(std::move(pool)));
  FPTree& t = *idx;
  pm::Pool& p = *t.pool_;
  const Status s = index_common::run_recovery(
      p, &t.recovery_, [&] { return t.init_root(o); },  // crash before C2: start afresh
      [&](std::uint64_t root_off) -> Status {
        Root* r = p.checked<Root>(root_off, sizeof(Root), 64);
        const bool sane =
            r != nullptr && r->magic == kRootMagic && r->entries == N &&
            r->log_count == kLogCount && r->max_key_size <= kMaxKeyBytes &&
            (r->max_value_size == 0 || index_common::ValueCodec::valid_limit(r->max_value_size)) &&
            r->key_mode == static_cast<std::uint32_t>(p.info().layout.key_mode) &&
            p.checked<char>(r->head, sizeof(LeafT), 256) != nullptr &&
            p.checked<char>(r->logs, kLogCount * sizeof(MicroLog), 64) != nullptr;
        if (r != nullptr && r->magic == kRootMagic) {  // the layout first: its message is clearer
          if (Status st = index_common::check_root_stamp(r->stamp, p); !st.ok()) return st;
        }
        if (!sane) return p.error(Code::corrupted, "fptree root object is missing or impossible");
        t.attach(r);
        if (p.allocator().mark_reachable(root_off, sizeof(Root)) != Code::ok ||
            p.allocator().mark_reachable(r->logs, kLogCount * sizeof(MicroLog)) != Code::ok)
        {
          (void)p.allocator().finish_recovery();
          return p.error(Code::corrupted, "fptree root or log block overlaps another block");
        }
        return t.rebuild(std::max(1u, o.recovery_threads));
      });
  if (!s.ok()) return s;
  idx->set_recovered_records(t.recovery_.records);  // rebuild() counted every leaf's records
  return std::unique_ptr<Index>(std::move(idx));
}

// A link zeroed, or redirected to another valid leaf, after any end (clean or not) no longer
// carries the tag of the leaf it names; the last leaf's link must say the chain ends there.
template <unsigned N>
template <class NextOf>
Status FPTree<N>::check_links(const std::vector<std::uint64_t>& leaves, NextOf next_of) const {
  const std::string bad = index_common::check_chain_tags(
      leaves, kEndTag, "link", [&](std::uint64_t off) { return leaf_at(off)->tag; },
      [&](std::uint64_t off) {
        const std::uint64_t link = next_of(off);
        return index_common::ChainLink{link_off(link), link_tag(link)};
      });
  if (bad.empty()) return Status::Ok();
  return pool_->error(Code::corrupted,
                      "fptree recovery: " + bad + " (a damaged or redirected next pointer)");
}

// Recovery (PROTOCOL.md R1..R5): R1's micro-log decisions, then the hybrid indexes' shared pass
// (leaf_recovery.h) with FPTree's parts. Pass 1 only reads PM and decides (a refused pool stays
// unchanged); the repairs run after commit_open.
template <unsigned N>
struct FPTree<N>::RecoveryPolicy {
  FPTree& t;
  const Relink& relink;
  const std::vector<unsigned>& dirty_logs;
  const char* name = "fptree";
  std::size_t leaf_bytes = sizeof(LeafT);
  std::size_t block_bytes = kBlock;
  std::uint64_t link(std::uint64_t off) const {  // the link word as the logs complete it, tagged
    const auto it = relink.find(off);
    return it != relink.end() ? it->second : t.leaf_at(off)->next;
  }
  // R2: walk the chain as the logs complete it, and check every link's tag ...
  std::uint64_t next(std::uint64_t off) { return link_off(link(off)); }
  Status check_links(const std::vector<std::uint64_t>& leaves) {
    return t.check_links(leaves, [this](std::uint64_t off) { return link(off); });
  }
  // ... then check and mark every leaf and record and summarise each leaf's keys.
  void summarise(std::uint64_t off, index_common::LeafSummary* s) { t.summarise_leaf(off, s); }
  const index_common::KeyCodec& keys() { return t.keys_; }
  // R3: install the log decisions (S7 / D4 redone), then clear the logs.
  void before_repairs() {
    for (const auto& [leaf, next] : relink) {
      detail::put(&t.leaf_at(leaf)->next, next);
      pm::persist(&t.leaf_at(leaf)->next, 8);
    }
    for (unsigned i : dirty_logs) {
      MicroLog* g = &t.logs_[i];
      for (std::uint64_t* w : {&g->split_leaf, &g->split_new, &g->delete_leaf, &g->delete_prev})
        detail::put(w, 0);
      pm::persist(g, sizeof *g);
    }
  }
  // R4: clear stale lock words; unlink empty non-head leaves (one NAW each, like D4; a crash
  // here leaves either state, both valid).
  void clear_lock(std::uint64_t off) {
    detail::put(&t.leaf_at(off)->lock, 0);
    pm::persist(&t.leaf_at(off)->lock, 8);
  }
  void unlink(std::uint64_t kept, std::uint64_t off) {
    detail::put(&t.leaf_at(kept)->next, t.leaf_at(off)->next);
    pm::persist(&t.leaf_at(kept)->next, 8);
  }
  std::uint64_t separator(std::uint64_t min_word) {
    return t.keys_.separator_of_word(min_word, t.seps_);
  }
  // R5: the DRAM inner nodes (level 1 on the recovery's threads).
  void build_inner(const std::vector<std::pair<std::uint64_t, std::uint64_t>>& items,
                   unsigned threads) {
    t.inner_.bulk_build(items, 0.9, threads);
  }
};

template <unsigned N>
Status FPTree<N>::rebuild(unsigned threads) {
  const auto began = std::chrono::steady_clock::now();
  Relink relink;
  std::vector<unsigned> dirty_logs;
  if (Status s = replay_logs(&relink, &dirty_logs); !s.ok()) {
    (void)pool_->allocator().finish_recovery();
    return s;
  }
  RecoveryPolicy policy{*this, relink, dirty_logs};
  const Status s = index_common::recover_leaf_chain(*pool_, head_, threads, policy, &recovery_,
                                                    &recovery_.threads);
  if (!s.ok()) return s;
  rebuild_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  return Status::Ok();
}

// R1: micro-logs. A split whose leaf is still full is rolled back (the new leaf is not marked,
// so it is free again); otherwise S6 happened and the link S7 is (re)done. A delete whose
// predecessor still points at the leaf is finished (D4 redone), and so is a merge (same log)
// whose moved entries are valid in the predecessor (J5 redone); one whose are not is left
// (rolled back). Decides only: *relink gets
// the links to install, *dirty_logs the logs to clear (R3).
template <unsigned N>
Status FPTree<N>::replay_logs(Relink* relink, std::vector<unsigned>* dirty_logs) {
  pm::Pool& p = *pool_;
  auto leaf_ok = [&](std::uint64_t off) { return p.checked<char>(off, sizeof(LeafT), 256) != nullptr; };
  auto bad = [&](const char* what) {
    return p.error(Code::corrupted, std::string("fptree recovery: ") + what);
  };
  for (unsigned i = 0; i < kLogCount; ++i) {
    const MicroLog& g = logs_[i];
    if ((g.split_leaf | g.split_new | g.delete_leaf | g.delete_prev) != 0) dirty_logs->push_back(i);
    if (g.split_leaf != 0 && g.split_new != 0) {
      if (!leaf_ok(g.split_leaf) || !leaf_ok(g.split_new)) return bad("bad split log offsets");
      if ((leaf_at(g.split_leaf)->bitmap & LeafT::kFullMask) != LeafT::kFullMask) {
        (*relink)[g.split_leaf] = make_link(g.split_new, leaf_at(g.split_new)->tag);  // S7 redone
        ++recovery_.repaired;
      }
    }
    if (g.delete_leaf != 0 && g.delete_prev != 0) {
      if (!leaf_ok(g.delete_leaf) || !leaf_ok(g.delete_prev) || g.delete_leaf == g.delete_prev)
        return bad("bad delete log offsets");
      const LeafT* a = leaf_at(g.delete_prev);
      const LeafT* l = leaf_at(g.delete_leaf);
      // Still linked (by a link carrying L's own tag; a damaged link is left for R2's tag
      // check): L's valid entries are all valid in A too (J4 durable; vacuously for an empty
      // L, D3) -> finish the unlink (D4 / J5 redone); none of them -> the merge did not
      // commit (its copies sit in A's unused slots) -> nothing to do; some -> refused.
      if (a->next == make_link(g.delete_leaf, l->tag)) {
        unsigned in_a = 0, in_l = 0;
        for (std::uint64_t m = l->bitmap & LeafT::kFullMask; m != 0; m &= m - 1, ++in_l) {
          const std::uint64_t kw = l->kv[std::countr_zero(m)][0];
          for (std::uint64_t ma = a->bitmap & LeafT::kFullMask; ma != 0; ma &= ma - 1)
            if (a->kv[std::countr_zero(ma)][0] == kw) {
              ++in_a;
              break;
            }
        }
        if (in_a != 0 && in_a != in_l) return bad("merge log: the two leaves share some keys");
        if (in_a == in_l) {
          (*relink)[g.delete_prev] = l->next;
          ++recovery_.repaired;
        }
      }
    }
  }
  return Status::Ok();
}

// R2's per-leaf pass (any thread, one leaf each): the leaf's block and its key and value
// records marked, its bitmap checked, its keys summarised for the order check.
template <unsigned N>
void FPTree<N>::summarise_leaf(std::uint64_t off, index_common::LeafSummary* sum) {
  pm::Pool& p = *pool_;
  const LeafT* l = leaf_at(off);
  if (p.allocator().mark_reachable(off, kBlock) != Code::ok) {
    sum->error = "leaf block overlaps another block";
    return;
  }
  sum->locked = l->lock != 0;
  if ((l->bitmap & ~LeafT::kFullMask) != 0) {
    sum->error = "bitmap bits beyond the slots";
    return;
  }
  for (std::uint64_t m = l->bitmap; m != 0; m &= m - 1) {
    const auto s = static_cast<unsigned>(std::countr_zero(m));
    const std::uint64_t kw = l->kv[s][0];
    if (keys_.bytes_mode() && index_common::mark_record(p, kw, keys_.max_key()) != Code::ok) {
      sum->error = "bad key record in slot " + std::to_string(s);
      return;
    }
    if (values_.mark(l->kv[s][1]) != Code::ok) {
      sum->error = "bad value record in slot " + std::to_string(s);
      return;
    }
    sum->add(kw, keys_);
  }
}

template <unsigned N>
std::uint64_t FPTree<N>::leaf_count() const {
  std::vector<std::uint64_t> leaves;
  const Status s = index_common::walk_leaf_chain(
      *pool_, head_, sizeof(LeafT), 256,
      [&](std::uint64_t off) { return link_off(optimistic_read(leaf_at(off)->next)); }, &leaves);
  return s.ok() ? leaves.size() : 0;
}

// Quiescent check of every invariant in fptree.h (the chain-level steps are the shared ones
// of index_common/hybrid_checks.h).
template <unsigned N>
Status FPTree<N>::verify() const {
  epochs_.drain();  // quiescent: free what was retired, so reachable == in use
  const pm::Pool& p = *pool_;
  for (unsigned i = 0; i < kLogCount; ++i) {  // invariant 4
    const MicroLog& g = logs_[i];
    if ((g.split_leaf | g.split_new | g.delete_leaf | g.delete_prev) != 0)
      return p.error(Code::corrupted, "verify: micro-log " + std::to_string(i) + " is not clear");
  }
  index_common::ChainKeys chain;
  if (Status s = index_common::walk_leaf_chain(
          p, head_, sizeof(LeafT), 256,
          [&](std::uint64_t off) { return link_off(optimistic_read(leaf_at(off)->next)); },
          &chain.leaves);
      !s.ok())
    return s;
  if (Status s = check_links(chain.leaves,
                             [&](std::uint64_t off) { return optimistic_read(leaf_at(off)->next); });
      !s.ok())
    return s;
  using index_common::block_bytes;
  std::uint64_t reachable = block_bytes(sizeof(Root)) + block_bytes(kLogCount * sizeof(MicroLog)) +
                            chain.leaves.size() * block_bytes(kBlock);
  for (const std::uint64_t off : chain.leaves) {
    const LeafT* l = leaf_at(off);
    std::vector<std::string>& ks = chain.keys.emplace_back();
    auto bad = [&](const std::string& what) { return index_common::leaf_error(p, off, what); };
    if (optimistic_read(l->lock) != 0 || versions_->is_locked(off)) return bad("left locked");
    const std::uint64_t bm = optimistic_read(l->bitmap);
    if ((bm & ~LeafT::kFullMask) != 0) return bad("bitmap bits beyond the slots");
    for (std::uint64_t m = bm; m != 0; m &= m - 1) {
      const auto sl = static_cast<unsigned>(std::countr_zero(m));
      const std::uint64_t kw = optimistic_read(l->kv[sl][0]);
      std::string_view rec;
      if (keys_.bytes_mode() && !index_common::read_record(p, kw, keys_.max_key(), &rec))
        return bad("slot " + std::to_string(sl) + " has a bad key record");
      if (keys_.bytes_mode()) reachable += block_bytes(index_common::record_bytes(rec.size()));
      std::size_t value_bytes = 0;
      if (!values_.record_size(optimistic_read(l->kv[sl][1]), &value_bytes))
        return bad("slot " + std::to_string(sl) + " has a bad value record");
      if (value_bytes != 0) reachable += block_bytes(value_bytes);
      if (get_fp(l, sl) != keys_.fingerprint(kw))
        return bad("slot " + std::to_string(sl) + ": fingerprint does not match the key");
      ks.push_back(keys_.key_bytes(kw));
    }
  }
  if (Status s = index_common::check_key_order(p, chain); !s.ok()) return s;
  if (Status s = index_common::check_reachable(p, reachable); !s.ok()) return s;
  return index_common::check_inner_against_chain(
      p, inner_, chain, [&](std::uint64_t a, std::uint64_t b) { return keys_.separator_less(a, b); },
      [&](std::uint64_t sep) { return keys_.separator_bytes(sep); });
}

template <unsigned N>
std::string FPTree<N>::describe_inner() const {
  std::ostringstream os;
  os << "height " << inner_.height() << "\n";
  const Status s = inner_.verify(
      [&](std::uint64_t a, std::uint64_t b) { return keys_.separator_less(a, b); },
      [&](std::uint64_t leaf, const std::uint64_t* lo, const std::uint64_t* hi) {
        os << leaf << " [" << (lo != nullptr ? keys_.separator_bytes(*lo) : "-inf") << ", "
           << (hi != nullptr ? keys_.separator_bytes(*hi) : "+inf") << ")\n";
        return Status::Ok();
      });
  if (!s.ok()) os << "error " << s.to_string() << "\n";
  return os.str();
}

template <unsigned N>
Footprint FPTree<N>::footprint() const {
  return index_common::hybrid_footprint(*pool_, inner_, *versions_, seps_);
}

// Every operation persisted its own steps: closing only marks the clean shutdown.
template <unsigned N>
Status FPTree<N>::close() {
  epochs_.drain();
  if (std::exchange(closed_, true)) return Status::Ok();
  // The counts let the next open see a chain that lost leaves (one read-only walk here).
  std::uint64_t records = 0, leaves = 0;
  std::vector<std::uint64_t> offs;
  if (index_common::walk_leaf_chain(*pool_, head_, sizeof(LeafT), 256,
                                    [&](std::uint64_t off) { return link_off(leaf_at(off)->next); },
                                    &offs)
          .ok()) {
    leaves = offs.size();
    for (const std::uint64_t off : offs)
      records += static_cast<std::uint64_t>(std::popcount(leaf_at(off)->bitmap & LeafT::kFullMask));
  } else {
    records = leaves = pm::kNoCount;
  }
  pool_->close_clean(records, leaves);
  return Status::Ok();
}

template class FPTree<8>;
template class FPTree<16>;
template class FPTree<32>;
template class FPTree<64>;

// --- registry entry ----------------------------------------------------------------------

namespace {

using Factory = Result<std::unique_ptr<Index>> (*)(std::unique_ptr<pm::Pool>, const Options&);
struct Instantiation {
  std::uint32_t entries;
  std::uint32_t leaf_bytes;  // Options::node_size and the layout id's node size
  Factory create;
  Factory recover;
};
template <unsigned N>
constexpr Instantiation instantiation() {
  return {N, sizeof(Leaf<N>), &FPTree<N>::create, &FPTree<N>::recover};
}
constexpr Instantiation kInstantiations[] = {instantiation<64>(), instantiation<8>(),
                                             instantiation<16>(), instantiation<32>()};

// node_size 0 selects the paper's 64 entries (the first row).
const Instantiation* for_node_size(std::uint32_t node_size) {
  for (const Instantiation& i : kInstantiations)
    if (node_size == i.leaf_bytes || node_size == 0) return &i;
  return nullptr;
}

// The layout id records the leaf size in bytes and, as the variant, the entries per leaf.
pm::Layout fptree_layout(const Options& o) {
  const Instantiation* i = for_node_size(o.node_size);
  return pm::Layout{"fptree", i != nullptr ? i->leaf_bytes : o.node_size, o.key_type,
                    i != nullptr ? i->entries : 0};
}

std::size_t fptree_pool_size(const Options& o) {
  std::size_t per_record = 48;  // a 64-entry leaf at ~70% fill, rounded up
  if (o.key_type == KeyType::bytes) per_record += 64 + o.max_key_size;
  if (o.max_value_size > 8) per_record += 64 + o.max_value_size;
  return std::max<std::size_t>(std::size_t{16} << 20, o.expected_records * per_record * 2);
}

Status fptree_validate(const Options& o) {
  const char* refused =
      for_node_size(o.node_size) == nullptr
          ? "fptree node_size must be 192, 320, 576 or 1152 (8..64 entries)"
      : !index_common::ValueCodec::valid_limit(o.max_value_size)
          ? "fptree max_value_size must be 8 (inline) or 9..65536 (out of line)"
      : o.key_type == KeyType::bytes && o.max_key_size > kMaxKeyBytes
          ? "fptree keys are limited to 8192 bytes"
          : nullptr;
  return refused != nullptr ? Status(Code::invalid_argument, refused) : Status::Ok();
}

// Options passed fptree_validate(): node_size names an instantiation.
Result<std::unique_ptr<Index>> fptree_create(std::unique_ptr<pm::Pool> pool, const Options& o) {
  return for_node_size(o.node_size)->create(std::move(pool), o);
}

Result<std::unique_ptr<Index>> fptree_recover(std::unique_ptr<pm::Pool> pool, const Options& o) {
  const pm::Layout& l = pool->info().layout;
  const Instantiation* i = l.node_size == 0 ? nullptr : for_node_size(l.node_size);
  if (i == nullptr || i->entries != l.variant)
    return pool->error(Code::corrupted, "fptree pool has an impossible leaf size");
  return i->recover(std::move(pool), o);
}

}  // namespace

IndexRegistry::Entry registry_entry() {
  return {"fptree",
          "FPTree: PM leaves with bitmap and fingerprints (8..64 entries), split/delete "
          "micro-logs, DRAM inner nodes",
          &fptree_layout, &fptree_validate, &fptree_pool_size, &fptree_create, &fptree_recover,
          {.architecture = "B+-tree; DRAM (inner) + PM (leaf)",
           .node_structure = "unsorted leaf (8-64 entries); bitmap; 1-byte fingerprints; "
                             "split and delete micro-logs",
           .concurrency = "optimistic locks (inner) + leaf locks (HTM in the paper)",
           .variable_keys = "pointer (PM key records)",
           .allocator = traits::kPmindexAllocator,
           .numa = "no",
           .recovery = "leaf-chain walk and inner-node rebuild, in parallel"}};
}

}  // namespace pmindex::fptree

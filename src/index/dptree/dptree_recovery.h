// DPTree recovery (PROTOCOL.md R1-R5), bulk load, verify() and the rest of dptree.h. Part of
// dptree_impl.h's templates.
#pragma once

#include <cstdio>

#include "index/common/close_counts.h"
#include "index/common/recovery_frame.h"
#include "index/dptree/dptree_impl.h"

namespace pmindex::dptree {

template <class P>
Result<std::unique_ptr<Index>> DPTree<P>::recover(std::unique_ptr<pm::Pool> pool,
                                                  const Options& o, Config config) {
  const std::uint32_t s = slots_for(pool->info().layout.node_size);
  if (s == 0) return pool->error(Code::corrupted, "dptree pool has an impossible node size");
  if (pool->info().layout.key_mode == KeyType::bytes) {
    // A header changed to byte keys: the root's layout stamp names that damage when it can.
    const Root* r = pool->root() == 0 ? nullptr : pool->checked<Root>(pool->root(), sizeof(Root), 8);
    if (r != nullptr && r->magic == kRootMagic)
      if (Status stamp = index_common::check_root_stamp(r->stamp, *pool); !stamp.ok()) return stamp;
    return pool->error(Code::corrupted, "dptree pool claims variable-length keys");
  }
  std::unique_ptr<DPTree> idx(new DPTree(std::move(pool), s, config));
  if (Status st = idx->check_leaf_words(); !st.ok()) return st;  // read nothing yet
  DPTree& t = *idx;
  pm::Pool& p = *t.pool_;
  const Status st = index_common::run_recovery(
      p, &t.recovery_, [&] { return t.init_root(o); },
      [&](std::uint64_t root_off) -> Status {
        Root* r = p.checked<Root>(root_off, sizeof(Root), 8);
        if (r != nullptr && r->magic == kRootMagicUntagged) {
          (void)p.allocator().finish_recovery();
          return p.error(Code::corrupted,
                         "dptree pool of format DPTREE01 (links without tags, written before "
                         "tagged links): not readable by this version; load its records into a "
                         "new pool with the version that wrote it");
        }
        if (r == nullptr || r->magic != kRootMagic) {
          (void)p.allocator().finish_recovery();
          return p.error(Code::corrupted, "dptree root object is missing or has a wrong magic");
        }
        if (Status stamp = index_common::check_root_stamp(r->stamp, p); !stamp.ok()) {
          (void)p.allocator().finish_recovery();
          return stamp;
        }
        if (r->slots != s || r->key_mode != static_cast<std::uint32_t>(p.info().layout.key_mode) ||
            r->max_key_size != 8 || r->max_value_size != 8 ||
            !valid_log_page_bytes(r->log_page_bytes)) {
          (void)p.allocator().finish_recovery();
          return p.error(Code::corrupted, "dptree root holds impossible sizes");
        }
        t.use_log_pages(r->log_page_bytes);
        t.root_ = r;
        if (p.allocator().mark_reachable(root_off, sizeof(Root)) != Code::ok)
          return p.allocator().finish_recovery();
        return t.rebuild();
      });
  if (!st.ok()) return st;
  idx->start_merger();
  return std::unique_ptr<Index>(std::move(idx));
}

// R1t / R2t, one tagged link (PROTOCOL.md, "Tagged links"): "" if `link`, read at `from`, is
// the end mark or names a nonzero offset; else what is wrong (`from()` names the word, built
// only for a refusal). A link of 0 is always damage.
template <class From>
std::string link_word_error(std::uint64_t link, From from) {
  if (index_common::link_tag(link) == index_common::kEndTag)
    return index_common::link_off(link) == 0
               ? std::string()
               : from() + " holds the end mark with offset " +
                     std::to_string(index_common::link_off(link)) + " (damaged)";
  if (index_common::link_off(link) == 0)
    return from() + " is " + std::to_string(link) + ": offset 0 without the end mark (damaged)";
  return {};
}

// R1: the chain of version gv from root.head[gv], read-only: every leaf in bounds and aligned,
// bounds strictly increasing (so no cycle), the last ~0; count = popcount, no bit >= S; every
// live slot's key in (previous bound, bound], in its probe window, with its fingerprint, and
// no key twice. Leaves are declared reachable. R1t: every link (head[gv], each meta[gv].next)
// is the end mark or names a leaf whose own tag (meta[gv].tag, a valid tag) it carries; the
// chain ends at the end mark only.
template <class P>
Status DPTree<P>::walk_chain(unsigned gv, std::vector<LeafPtr>* chain, std::uint64_t* records) {
  pm::Pool& p = *pool_;
  const std::uint64_t max_leaves = p.size() / leaf_bytes_;
  std::uint64_t prev_bound = 0;
  const std::uint32_t mask = slots_ - 1, w = window(slots_);
  std::uint64_t link = root_->head[gv];
  std::uint64_t from = 0;  // the leaf whose next `link` is, 0 = the root's head
  // Built only for a refusal.
  const auto from_name = [&] {
    return from == 0 ? "root head[" + std::to_string(gv) + "]"
                     : "next link of the leaf at offset " + std::to_string(from);
  };
  for (;;) {
    if constexpr (!P::kUncheckedLinks) {  // R1t
      if (std::string e = link_word_error(link, [&] { return "dptree " + from_name(); });
          !e.empty())
        return p.error(Code::corrupted, e);
    }
    const std::uint64_t off = index_common::link_off(link);
    if (off == 0) break;
    auto bad = [&](const std::string& what) {
      return p.error(Code::corrupted, "dptree leaf at offset " + std::to_string(off) + ": " + what);
    };
    if (p.checked<char>(off, leaf_bytes_, 64) == nullptr) return bad("out of bounds or misaligned");
    if (chain->size() >= max_leaves) return bad("more leaves than the pool can hold (a cycle?)");
    const LeafView v = view(off);
    const Meta m = *v.meta(gv);
    if constexpr (!P::kUncheckedLinks) {  // R1t
      if (!index_common::valid_tag(m.tag) || m.tag != index_common::link_tag(link))
        return bad("the link to it (the " + from_name() + ") carries tag " +
                   std::to_string(index_common::link_tag(link)) + " but its own tag is " +
                   std::to_string(m.tag) + " (a damaged link, or a damaged leaf)");
    }
    if (!chain->empty() && !(m.bound > prev_bound)) return bad("bound not above the previous leaf's");
    for (std::uint32_t b = slots_; b < 256; ++b)
      if (detail::test_bit(m.bitmap, b)) return bad("bitmap names a slot beyond the leaf");
    if (m.count != detail::popcount(m.bitmap)) return bad("count differs from the bitmap");
    auto l = std::make_shared<LeafInfo>();
    l->off = off;
    l->bound = m.bound;
    l->tag = m.tag;
    std::memcpy(l->bitmap, m.bitmap, sizeof(m.bitmap));
    for (std::uint32_t s = 0; s < slots_; ++s) {
      if (!detail::test_bit(m.bitmap, s)) continue;
      const std::uint64_t k = v.slot(s)->key;
      const std::uint64_t h = key_hash(k);
      if (k > m.bound || (!chain->empty() && k <= prev_bound)) return bad("key outside its range");
      if (v.fp()[s] != key_fp(h)) return bad("fingerprint differs from the key");
      if (((s - static_cast<std::uint32_t>(h)) & mask) >= w) return bad("slot outside the key's window");
    }
    sort_order(*l);
    for (std::size_t i = 1; i < l->order.size(); ++i)
      if (v.slot(l->order[i - 1])->key == v.slot(l->order[i])->key) return bad("key twice");
    if (p.allocator().mark_reachable(off, leaf_bytes_) != Code::ok)
      return bad("overlaps another block");
    *records += m.count;
    prev_bound = m.bound;
    chain->push_back(std::move(l));
    link = m.next;
    from = off;
  }
  if (chain->empty()) return p.error(Code::corrupted, "dptree chain is empty");
  if (prev_bound != ~std::uint64_t{0}) return p.error(Code::corrupted, "dptree last leaf's bound is not ~0");
  return Status::Ok();
}

template <class P>
struct DPTree<P>::LogScan {
  std::vector<std::uint64_t> pages;
  std::vector<LogRecord> replay;  // valid records above `covered`, in order
  std::uint32_t tail_slot = 0;
  std::uint64_t next_lsn = 0;     // sequence number of the first invalid (or next) record
};

// R2: the log from root.log_head, read-only: pages in bounds and aligned, first_lsn
// consecutive (so no cycle), the first page not above covered + 1; records replayed in order
// up to the first one whose validity word does not check (torn, or left from an earlier use).
// R2e: that first invalid record ends the log: no record after it in its page checks, and its
// page links no further page (the end mark). Writers are serialised and each record persists
// before the next is written, and a page is linked only once full, so a crash leaves invalid
// records only at the log's end; one mid-log is damage, refused rather than cut (the rest of
// the log would be lost silently).
// R2t: every link followed (log_head, each full page's next) is the end mark or names a page
// whose own tag (a valid tag) it carries; the tail page's next is never 0.
template <class P>
Status DPTree<P>::walk_log(std::uint64_t covered, LogScan* out) {
  pm::Pool& p = *pool_;
  out->next_lsn = covered + 1;
  std::uint64_t expect_first = 0;
  std::uint64_t link = root_->log_head;
  std::uint64_t from = 0;  // the page whose next `link` is, 0 = the root's log_head
  const auto from_name = [&] {
    return from == 0 ? std::string("root log_head")
                     : "next link of the log page at offset " + std::to_string(from);
  };
  for (;;) {
    if constexpr (!P::kUncheckedLinks) {  // R2t
      if (std::string e = link_word_error(link, [&] { return "dptree " + from_name(); });
          !e.empty())
        return p.error(Code::corrupted, e);
    }
    const std::uint64_t pg = index_common::link_off(link);
    if (pg == 0) break;
    auto bad = [&](const std::string& what) {
      return p.error(Code::corrupted, "dptree log page at offset " + std::to_string(pg) + ": " + what);
    };
    const auto* h = p.checked<LogPageHeader>(pg, log_page_bytes_, 64);
    if (h == nullptr) return bad("out of bounds or misaligned");
    if constexpr (!P::kUncheckedLinks) {  // R2t
      if (!index_common::valid_tag(h->tag) || h->tag != index_common::link_tag(link))
        return bad("the link to it (the " + from_name() + ") carries tag " +
                   std::to_string(index_common::link_tag(link)) + " but its own tag is " +
                   std::to_string(h->tag) + " (a damaged link, or a damaged page)");
    }
    if (out->pages.empty() ? h->first_lsn > covered + 1 || h->first_lsn == 0
                           : h->first_lsn != expect_first)
      return bad("sequence numbers do not continue the log");
    if (h->first_lsn + records_per_page_ > kMaxLsn) return bad("sequence number out of range");
    if (p.allocator().mark_reachable(pg, log_page_bytes_) != Code::ok) return bad("overlaps another block");
    out->pages.push_back(pg);
    const auto* recs = reinterpret_cast<const LogRecord*>(h + 1);
    std::uint32_t j = 0;
    for (; j < records_per_page_; ++j) {
      const LogRecord& r = recs[j];
      const std::uint64_t lsn = h->first_lsn + j;
      if (!record_checks(r, lsn)) break;
      if (lsn > covered) out->replay.push_back(r);
    }
    out->tail_slot = j;
    out->next_lsn = std::max(out->next_lsn, h->first_lsn + j);
    if (j < records_per_page_) {
      for (std::uint32_t k = j + 1; k < records_per_page_; ++k) {  // R2e
        if (record_checks(recs[k], h->first_lsn + k))
          return bad("record " + std::to_string(h->first_lsn + j) +
                     " does not check but a later one does (a damaged record mid-log)");
      }
      if constexpr (!P::kUncheckedLinks) {
        if (h->next == 0)  // R2t: L4 writes the end mark, so 0 here is damage too
          return bad("its next link is 0: offset 0 without the end mark (damaged)");
      }
      if (index_common::link_off(h->next) != 0)  // R2e
        return bad("record " + std::to_string(h->first_lsn + j) +
                   " does not check but the page links a further page (a damaged record "
                   "mid-log)");
      break;
    }
    expect_first = h->first_lsn + records_per_page_;
    link = h->next;
    from = pg;
  }
  return Status::Ok();
}

// R1-R2 read-only, then the allocator's reachability pass and commit_open; R3 repairs (a log
// wholly covered by the base tree is emptied, finishing M7); R4 the DRAM side: leaf infos, inner layer; R5 the valid
// records above `covered` replayed into a fresh buffer in log order.
template <class P>
Status DPTree<P>::rebuild() {
  pm::Pool& p = *pool_;
  const std::uint64_t state = root_->state;
  const unsigned gv = state_gv(state);
  const std::uint64_t covered = state_covered(state);
  if (covered >= kMaxLsn) {
    (void)p.allocator().finish_recovery();
    return p.error(Code::corrupted, "dptree root state names an impossible sequence number");
  }
  std::vector<LeafPtr> chain;
  std::uint64_t records = 0;
  LogScan log;
  Status s = walk_chain(gv, &chain, &records);
  // The base tree's records and leaves against the last clean close (the log is replayed
  // whole, so a damaged log shows in walk_log): a chain cut short is refused, pool unchanged.
  if (s.ok()) s = index_common::check_close_counts(p, "dptree", records, chain.size());
  if (s.ok()) s = walk_log(covered, &log);
  if (!s.ok()) {
    (void)p.allocator().finish_recovery();
    return s;
  }
  if (Status fs = p.allocator().finish_recovery(); !fs.ok()) return fs;
  p.commit_open();
  gv_ = gv;
  covered_ = covered;
  chain_ = std::move(chain);
  base_records_ = records;
  log_pages_ = std::move(log.pages);
  tail_slot_ = log.tail_slot;
  next_lsn_ = log.next_lsn;
  if (!log_pages_.empty() && log.replay.empty()) {  // R3: finish M7
    pm::publish(&root_->log_head, index_common::kChainEnd);
    pm::persist(&root_->log_head, 8);
    for (std::uint64_t off : log_pages_) p.allocator().deallocate(off, log_page_bytes_);
    log_pages_.clear();
    tail_slot_ = 0;
    next_lsn_ = covered + 1;
    ++recovery_.repaired;
  }
  rebuild_inner();  // R4
  reset_buffer();
  for (const LogRecord& r : log.replay)  // R5: counted below, so no blind put (U2) is left
    buffer_put(r.key, r.value, r.op == kOpDelete ? Kind::tombstone : Kind::put);
  (void)top_up_reserve(puts_);  // the log reserve, lost with the crash: best effort
  // Live records: the base's, corrected by the buffer (new keys, tombstones of base keys).
  std::int64_t live = static_cast<std::int64_t>(records);
  buffer_->for_each_from(0, [&](const BufEntry& e) {
    live += (e.tombstone ? 0 : 1) - (in_base(e.key) ? 1 : 0);
    return true;
  });
  recovery_.records = static_cast<std::uint64_t>(live);
  set_recovered_records(recovery_.records);  // size()
  recovery_.nodes = chain_.size() + log_pages_.size();
  return Status::Ok();
}

template <class P>
Status DPTree<P>::bulk_load(std::span<const KeyValue> sorted, double fill) {
  if (!(fill > 0.0 && fill <= 1.0))
    return Status(Code::invalid_argument, "fill factor must be in (0, 1]");
  std::unique_lock lock(mu_);
  if (base_records_ != 0 || buffer_->size() != 0 || middle_ != nullptr)
    return Status(Code::invalid_argument, "dptree bulk_load needs an empty index");
  std::vector<Record> recs;
  recs.reserve(sorted.size());
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    if (Code c = check(sorted[i].key, sorted[i].value); c != Code::ok)
      return Status(c, "bulk_load record " + std::to_string(i));
    if (i > 0 && !(sorted[i - 1].key < sorted[i].key))
      return Status(Code::invalid_argument, "bulk_load keys must be sorted and distinct");
    recs.emplace_back(word_of(sorted[i].key), value_of(sorted[i].value));
  }
  if (recs.empty()) return Status::Ok();
  const std::size_t per =
      std::max<std::size_t>(1, static_cast<std::size_t>(static_cast<double>(slots_) * fill));
  std::vector<LeafPtr> next;
  for (std::size_t i = 0; i < recs.size();) {
    Code code = Code::ok;
    LeafPtr l = build_leaf(recs, &i, per, ~std::uint64_t{0}, &code, stats_);
    if (l == nullptr) {
      for (const LeafPtr& f : next) pool_->allocator().deallocate(f->off, leaf_bytes_);
      return pool_->error(code, "bulk_load: no space for the leaves");
    }
    next.push_back(std::move(l));
  }
  std::vector<std::uint64_t> replaced;
  for (const LeafPtr& l : chain_) replaced.push_back(l->off);
  commit(std::move(next), replaced, static_cast<std::int64_t>(recs.size()), next_lsn_ - 1);
  count_loaded(recs.size());  // size()
  return Status::Ok();
}

// verify()'s steps (quiescent: under the index lock, no merge running).
template <class P>
Status DPTree<P>::verify_error(const std::string& what) const {
  return pool_->error(Code::corrupted, "verify: " + what);
}

// Whether a link word differs from the expected one (kUncheckedLinks: its offset only).
template <class P>
bool DPTree<P>::link_differs(std::uint64_t have, std::uint64_t want) {
  return P::kUncheckedLinks ? index_common::link_off(have) != index_common::link_off(want)
                            : have != want;
}

// R1t's check (PROTOCOL.md, "Tagged links"): the link to chain leaf i is the DRAM chain's
// leaf's tagged link (its offset and own tag); past the last one, the end mark.
template <class P>
std::uint64_t DPTree<P>::chain_link(std::size_t i) const {
  return i < chain_.size() ? index_common::make_link(chain_[i]->off, chain_[i]->tag)
                           : index_common::kChainEnd;
}

// Chain leaf i against its DRAM info: tags and links, metadata, order array, and every live
// key in the leaf's range and found by its own probe. Its keys are appended to `keys`.
template <class P>
Status DPTree<P>::verify_leaf(std::size_t i, std::uint64_t prev_bound,
                              index_common::ChainKeys& keys) const {
  const pm::Pool& p = *pool_;
  const LeafInfo& l = *chain_[i];
  const std::uint64_t off = l.off;
  if (p.checked<char>(off, leaf_bytes_, 64) == nullptr) return verify_error("leaf out of bounds");
  const LeafView v = view(off);
  const Meta& m = *v.meta(gv_);
  const auto leaf_bad = [&](const std::string& what) { return index_common::leaf_error(p, off, what); };
  if (!P::kUncheckedLinks && (m.tag != l.tag || !index_common::valid_tag(m.tag)))
    return leaf_bad("own tag " + std::to_string(m.tag) + " differs from the DRAM chain's (" +
                    std::to_string(l.tag) + ")");
  if (link_differs(m.next, chain_link(i + 1)))
    return leaf_bad("next link " + std::to_string(m.next) + " is not the tagged link to " +
                    (i + 1 < chain_.size() ? "chain leaf " + std::to_string(i + 1)
                                           : std::string("the end mark")) +
                    " (the DRAM chain's)");
  if (std::memcmp(m.bitmap, l.bitmap, sizeof(l.bitmap)) != 0 || m.bound != l.bound)
    return leaf_bad("meta[gv] differs from the DRAM leaf info");
  if (m.count != detail::popcount(m.bitmap)) return leaf_bad("count differs");
  if (i > 0 && !(m.bound > prev_bound)) return leaf_bad("bounds not increasing");
  if (l.index != i) return leaf_bad("wrong chain index");
  if (l.order.size() != m.count) return leaf_bad("order array size");
  keys.leaves.push_back(reinterpret_cast<std::uint64_t>(&l));
  keys.keys.emplace_back();
  for (std::size_t j = 0; j < l.order.size(); ++j) {
    const std::uint32_t s = l.order[j];
    const std::uint64_t k = v.slot(s)->key;
    if (!detail::test_bit(m.bitmap, s)) return leaf_bad("order names a free slot");
    if (j > 0 && !(v.slot(l.order[j - 1])->key < k)) return leaf_bad("order array not sorted");
    if (k > m.bound || (i > 0 && k <= prev_bound)) return leaf_bad("key outside the leaf's range");
    if (v.fp()[s] != key_fp(key_hash(k)) || slot_of(l, k) != static_cast<int>(s))
      return leaf_bad("key not found by its probe (fingerprint or window)");
    keys.keys.back().push_back(encode_u64(k));
  }
  return Status::Ok();
}

// The base tree's current chain from the root's head: every leaf (verify_leaf), the bounds
// ending at ~0, the record count, key order across leaves. Adds the leaves' bytes.
template <class P>
Status DPTree<P>::verify_chain(std::uint64_t* reachable) const {
  if (chain_.empty() || link_differs(root_->head[gv_], chain_link(0)))
    return verify_error("root head[" + std::to_string(gv_) + "] (" +
                        std::to_string(root_->head[gv_]) +
                        ") is not the tagged link to the DRAM chain's first leaf");
  index_common::ChainKeys keys;
  std::uint64_t records = 0, prev_bound = 0;
  for (std::size_t i = 0; i < chain_.size(); ++i) {
    if (Status s = verify_leaf(i, prev_bound, keys); !s.ok()) return s;
    const Meta& m = *view(chain_[i]->off).meta(gv_);
    records += m.count;
    prev_bound = m.bound;
    *reachable += index_common::block_bytes(leaf_bytes_);
  }
  if (prev_bound != ~std::uint64_t{0}) return verify_error("last bound is not ~0");
  if (records != base_records_) return verify_error("base record count differs");
  return index_common::check_key_order(*pool_, keys);
}

// The DRAM inner layer: every leaf word names a chain leaf, with the fences of its bounds.
template <class P>
Status DPTree<P>::verify_inner() const {
  return inner_.verify(
      [](std::uint64_t a, std::uint64_t b) { return a < b; },
      [&](std::uint64_t lw, const std::uint64_t* lo, const std::uint64_t* hi) {
        const std::size_t i = word_index(lw);
        if (i >= chain_.size() || chain_[i]->off != word_off(lw))
          return verify_error("inner layer names a leaf outside the chain");
        const LeafInfo* l = chain_[i].get();
        const std::uint64_t want_lo = l->index == 0 ? 0 : chain_[l->index - 1]->bound + 1;
        if ((lo == nullptr) != (l->index == 0) || (lo != nullptr && *lo != want_lo) ||
            (hi != nullptr && *hi != l->bound + 1))
          return verify_error("inner fences differ from the leaf bounds");
        return Status::Ok();
      });
}

// The log: the DRAM page list is the PM one (R2t: every link the tagged link to the next
// page, whose own tag is valid, the last one the end mark), records valid up to the tail.
// Adds the pages' bytes.
template <class P>
Status DPTree<P>::verify_log(std::uint64_t* reachable) const {
  const pm::Pool& p = *pool_;
  const auto page_link = [&](std::size_t i) {
    return i < log_pages_.size()
               ? index_common::make_link(log_pages_[i], p.at<LogPageHeader>(log_pages_[i])->tag)
               : index_common::kChainEnd;
  };
  for (std::size_t i = 0; i < log_pages_.size(); ++i)
    if (!P::kUncheckedLinks && !index_common::valid_tag(p.at<LogPageHeader>(log_pages_[i])->tag))
      return verify_error("log page " + std::to_string(i) + " has no valid own tag");
  if (link_differs(root_->log_head, page_link(0)))
    return verify_error("root log_head (" + std::to_string(root_->log_head) +
                        ") is not the tagged link to the DRAM log's first page");
  for (std::size_t i = 0; i < log_pages_.size(); ++i) {
    const std::uint64_t pg = log_pages_[i];
    const auto* h = p.at<LogPageHeader>(pg);
    if (link_differs(h->next, page_link(i + 1)))
      return verify_error("log page " + std::to_string(i) + " (offset " + std::to_string(pg) +
                          "): next link " + std::to_string(h->next) +
                          " is not the tagged link to " +
                          (i + 1 < log_pages_.size() ? "log page " + std::to_string(i + 1)
                                                     : std::string("the end mark")));
    const auto* recs = reinterpret_cast<const LogRecord*>(h + 1);
    const std::uint32_t n = i + 1 == log_pages_.size() ? tail_slot_ : records_per_page_;
    for (std::uint32_t j = 0; j < n; ++j)
      if (recs[j].validity != validity_word(recs[j].key, recs[j].value, recs[j].op, h->first_lsn + j))
        return verify_error("log record " + std::to_string(h->first_lsn + j) + " does not check");
    if (i + 1 == log_pages_.size() && h->first_lsn + n != next_lsn_)
      return verify_error("log tail differs from the next sequence number");
    *reachable += index_common::block_bytes(log_page_bytes_);
  }
  return Status::Ok();
}

template <class P>
Status DPTree<P>::verify() const {
  // A running merge holds fresh leaves no root reaches yet: verify() waits for it to end.
  std::shared_lock lock(mu_);
  wait_for(lock, [&] { return !merging_; });
  if (state_gv(root_->state) != gv_ || state_covered(root_->state) != covered_)
    return verify_error("root state differs from the index's version");
  std::uint64_t reachable = index_common::block_bytes(sizeof(Root));
  if (Status s = verify_chain(&reachable); !s.ok()) return s;
  if (Status s = verify_inner(); !s.ok()) return s;
  if (Status s = verify_log(&reachable); !s.ok()) return s;
  reachable += reserve_.size() * index_common::block_bytes(log_page_bytes_);  // held back, DRAM
  for (const auto& d : deferred_) reachable += index_common::block_bytes(d.second);  // to free
  if (Status s = buffer_->verify(*pool_); !s.ok()) return s;
  return index_common::check_reachable(*pool_, reachable);
}

template <class P>
Footprint DPTree<P>::footprint() const {
  std::shared_lock lock(mu_);
  const auto st = pool_->allocator().stats();
  Footprint f;
  f.pm_bytes = st.bytes_in_use;
  f.pm_reserved = st.bytes_reserved;
  f.dram_bytes = inner_arena_.bytes_in_use() + buffer_->dram_bytes() + bloom_.dram_bytes() +
                 chain_.size() * (sizeof(LeafInfo) + slots_);
  if (middle_ != nullptr) f.dram_bytes += middle_->dram_bytes() + middle_bloom_.dram_bytes();
  return f;
}

// The buffer stays in the log: the next open replays it (no merge at close, so close is
// cheap and a crash and a clean close recover the same way).
template <class P>
Status DPTree<P>::close() {
  stop_merger();  // the running merge ends first; writes after close merge synchronously
  std::unique_lock lock(mu_);
  if (!closed_) {
    if (config_.print_stats) print_stats();  // Options::dptree.stats (pmbench --dptree_stats)
    release_reserve();  // free either way (DRAM-held), but a clean close leaves no block held
    // The base tree's counts, from the counters merges keep (verify checks them against PM).
    pool_->close_clean(base_records_, chain_.size());
    closed_ = true;
  }
  return Status::Ok();
}

// MergeStats on stderr (Options::dptree.stats): at close, or when the index is dropped without
// close (a crash's way; pmbench's temporary pools end so).
template <class P>
void DPTree<P>::print_stats() const {
  const MergeStats& m = stats_;
  std::fprintf(stderr,
               "dptree: merge %s, %llu merges (%llu in the background, %llu failed, %llu "
               "partial; leaves %llu created, %llu dropped, %llu folded; %llu blind upserts "
               "found new), writers blocked by a running merge %llu times, %.3f ms in total\n",
               config_.background ? "background" : "synchronous",
               static_cast<unsigned long long>(m.merges),
               static_cast<unsigned long long>(m.background_merges),
               static_cast<unsigned long long>(m.failed_merges),
               static_cast<unsigned long long>(m.partial_merges),
               static_cast<unsigned long long>(m.leaves_created),
               static_cast<unsigned long long>(m.leaves_dropped),
               static_cast<unsigned long long>(m.leaves_folded),
               static_cast<unsigned long long>(m.blind_new),
               static_cast<unsigned long long>(m.writer_blocks),
               static_cast<double>(m.writer_blocked_ns) / 1e6);
}

template <class P>
MergeStats DPTree<P>::merge_stats() const {
  std::shared_lock lock(mu_);
  return stats_;
}

template <class P>
std::size_t DPTree<P>::buffered() const {
  std::shared_lock lock(mu_);
  return buffer_->size() + (middle_ != nullptr ? middle_->size() : 0);
}

template <class P>
std::size_t DPTree<P>::base_leaves() const {
  std::shared_lock lock(mu_);
  return chain_.size();
}

template <class P>
void DPTree<P>::corrupt_for_testing(int what) {
  Lock lock(mu_);
  wait_for(lock, [&] { return !merging_; });  // a running merge would replace the damage
  for (const LeafPtr& l : chain_) {
    if (l->order.size() < 2) continue;
    if (what == 0) {
      Slot* a = view(l->off).slot(l->order[0]);
      Slot* b = view(l->off).slot(l->order[1]);
      const std::uint64_t k = a->key;
      pm::publish(&a->key, b->key);
      pm::publish(&b->key, k);
    } else if (what == 1) {
      detail::clear_bit(l->bitmap, l->order[0]);
    }
    break;
  }
  if (what == 2 && !log_pages_.empty() && (log_pages_.size() > 1 || tail_slot_ > 0)) {
    auto* r = pool_->at<LogRecord>(log_pages_[0] + 64);
    pm::publish(&r->validity, r->validity ^ 1);
  }
  if (what == 3) buffer_->miscount_blind_for_testing();
}

}  // namespace pmindex::dptree

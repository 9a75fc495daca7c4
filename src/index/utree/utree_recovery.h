// uTree recovery (PROTOCOL.md R0..R4), bulk load and verify(). Part of utree_impl.h's
// templates (tests instantiate known-bad policies).
#pragma once

#include <atomic>
#include <chrono>
#include <thread>

#include "index/common/close_counts.h"
#include "index/common/recovery_frame.h"
#include "index/utree/utree_impl.h"

namespace pmindex::utree {

namespace detail {
// R1t's refusals name where the failing link lives: root.head (offset 0) or a node's next.
inline std::string link_origin(std::uint64_t from) {
  return from == 0 ? std::string("root head") : "offset " + std::to_string(from);
}
}  // namespace detail

template <class P>
Result<std::unique_ptr<Index>> UTree<P>::recover(std::unique_ptr<pm::Pool> pool,
                                                 const Options& o) {
  const std::uint32_t ns = pool->info().layout.node_size;
  if (ns < kMinNodeSize || ns > kMaxNodeSize || ns % 64 != 0)
    return pool->error(Code::corrupted, "utree pool has an impossible node size");
  if (pool->size() > kMaxPoolBytes)
    return pool->error(Code::corrupted, "utree pool is larger than 64 GiB");
  std::unique_ptr<UTree> idx(new UTree(std::move(pool), ns));
  UTree& t = *idx;
  pm::Pool& p = *t.pool_;
  const Status s = index_common::run_recovery(
      p, &t.recovery_, [&] { return t.init_root(o); },  // crash before U0: nothing reachable
      [&](std::uint64_t root_off) -> Status {
        Root* r = p.checked<Root>(root_off, sizeof(Root), 8);
        if (r != nullptr && r->magic == kRootMagicUntagged)
          return p.error(Code::corrupted,
                         "utree root is of format UTREE001 (list links without tags, before "
                         "pmindex adopted tagged links): load the records into a new pool");
        if (r == nullptr || r->magic != kRootMagic)
          return p.error(Code::corrupted, "utree root object is missing or has a wrong magic");
        if (Status st = index_common::check_root_stamp(r->stamp, p); !st.ok()) return st;
        const bool bytes = p.info().layout.key_mode == KeyType::bytes;
        if (r->node_size != ns ||
            r->key_mode != static_cast<std::uint32_t>(p.info().layout.key_mode) ||
            (bytes ? r->max_key_size > kMaxKeyBytes : r->max_key_size != 8) ||
            !index_common::ValueCodec::valid_limit(r->max_value_size))
          return p.error(Code::corrupted, "utree root holds impossible sizes");
        t.root_ = r;
        t.configure(*r);
        if (p.allocator().mark_reachable(root_off, sizeof(Root)) != Code::ok)
          return p.allocator().finish_recovery();
        return t.rebuild(std::max(1u, o.recovery_threads));
      });
  if (!s.ok()) return s;
  idx->set_recovered_records(t.recovery_.records);  // rebuild() counted the list's entries
  return std::unique_ptr<Index>(std::move(idx));
}

// One stretch of the list for one recovery thread: from `start` (included) up to, not
// including, the node `stop` (the next hint; 0 = the end of the list).
template <class P>
struct UTree<P>::Segment {
  NodeOff start = 0;
  NodeOff stop = 0;
  // Segment 0: root.head, the link that names start (R1t checks it). A hint segment's start
  // is checked by the segment before, whose walk reaches it through a link (its stop).
  std::optional<std::uint64_t> in;
  // (key word, offset | flags): bit 0 the node is marked, bit 1 its next word is dirty.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> nodes;
  bool reached_stop = false;  // the walk arrived at `stop` through links
  std::string error;          // the first problem met; matters only if the segment is used
};

// R0: the hint block, never trusted: a block outside the heap or with an impossible count
// gives no hints; each hint must be an in-heap, aligned offset (others are dropped).
template <class P>
std::vector<typename UTree<P>::NodeOff> UTree<P>::read_hints(std::uint64_t* raw) const {
  const pm::Pool& p = *pool_;
  std::vector<NodeOff> out;
  *raw = 0;
  const std::uint64_t at = root_->hints;
  const auto* count = p.checked<std::uint64_t>(at, 16, 8);
  if (at == 0 || count == nullptr || *count > p.size() / kNodeAlign ||
      !p.in_heap(at, hint_block_bytes(*count)))
    return out;
  const HintBlock* b = p.at<HintBlock>(at);
  *raw = b->count;
  for (std::uint64_t i = 0; i < b->count; ++i) {
    const NodeOff h = b->node[i];
    if (p.checked<ListNode>(h, node_bytes_, kNodeAlign) != nullptr) out.push_back(h);
  }
  return out;
}

// R1 for one segment: only reads PM (threads walk segments in parallel). Every offset bounds-
// and alignment-checked, keys strictly increasing (no cycle), key records checked against the
// prefix. R1t: every link followed carries the tag of the node it reaches (the stop included),
// and only the end mark ends the list.
template <class P>
void UTree<P>::walk_segment(Segment& seg, NodeOff stop) const {
  const pm::Pool& p = *pool_;
  const std::uint64_t limit = p.size() / kNodeAlign;
  std::string_view prev_key;
  std::uint64_t prev_word = 0;
  std::optional<std::uint64_t> in = seg.in;  // the link word that led to off
  NodeOff from = 0;                          // the node holding `in` (0: root.head)
  auto fail = [&](NodeOff at, const std::string& what) {
    seg.error = (at == 0 ? std::string("utree root head") : "utree list node at offset " +
                                                               std::to_string(at)) + ": " + what;
  };
  for (NodeOff off = seg.start;;) {
    if (off == 0) {
      if (!P::kUncheckedLinks && in.has_value() && link_word(*in) != kListEnd)
        return fail(from, "its link names offset 0 without the end mark (a zeroed link)");
      seg.reached_stop = stop == 0;
      return;
    }
    const ListNode* n = p.checked<ListNode>(off, node_bytes_, kNodeAlign);
    if (n == nullptr) return fail(off, "out of bounds or misaligned");
    if (!P::kUncheckedLinks && in.has_value() && link_tag(*in) != tag_of(n))
      return fail(off, "the link to it (from " + detail::link_origin(from) +
                           ") carries another node's tag: a redirected link or a damaged node");
    if (off == stop) {
      seg.reached_stop = true;
      return;
    }
    if (seg.nodes.size() > limit) return fail(off, "more nodes than the pool can hold");
    const std::uint64_t next = n->next;
    if ((next & kFlagMask & ~(kMarkBit | kDirtyBit)) != 0) return fail(off, "bad link flags");
    if (bytes_) {
      std::string_view key;
      if (!index_common::read_record(p, n->key_record, keys_.max_key(), &key))
        return fail(off, "bad key record");
      if (detail::prefix_word(key) != n->key)
        return fail(off, "key prefix differs from its record");
      if (!seg.nodes.empty() && !(prev_key < key))
        return fail(off, "keys out of order (or a cycle)");
      prev_key = key;
    } else if (!seg.nodes.empty() && !(prev_word < n->key)) {
      return fail(off, "keys out of order (or a cycle)");
    }
    prev_word = n->key;
    seg.nodes.emplace_back(n->key, off | ((next & kMarkBit) != 0 ? 1 : 0) |
                                       ((next & kDirtyBit) != 0 ? 2 : 0));
    in = next;
    from = off;
    off = link_target(next);
  }
}

// R1 (marking): the live nodes of a used segment and their records; marked nodes stay
// unreachable. Integer keys with inline values need only the offset the walk recorded, so the
// node is not read again (one PM miss per record saved on the serial marking path).
template <class P>
Status UTree<P>::mark_segment(const Segment& seg) const {
  pm::Pool& p = *pool_;
  const bool records = bytes_ || !values_.inline_values();
  for (const auto& [word, tagged] : seg.nodes) {
    if ((tagged & 1) != 0) continue;
    const NodeOff off = link_target(tagged);
    bool ok = p.allocator().mark_reachable(off, node_bytes_) == Code::ok;
    if (ok && records) {
      const ListNode* n = node_at(off);
      ok = (!bytes_ || index_common::mark_record(p, n->key_record, keys_.max_key()) == Code::ok) &&
           values_.mark(n->value) == Code::ok;
    }
    if (!ok)
      return p.error(Code::corrupted, "utree list node at offset " + std::to_string(off) +
                                          ": node or record overlaps another block, or a bad "
                                          "value record");
  }
  return Status::Ok();
}

// R1 (marking) for the counted segments, then the allocator's finish_recovery. One thread:
// the allocator takes one mutex per mark, so marking from several threads only contends;
// rebuild() runs this beside the DRAM build instead.
template <class P>
Status UTree<P>::mark_all(const std::vector<Segment>& segs, std::size_t used) {
  for (std::size_t i = 0; i < used; ++i) {
    if (Status m = mark_segment(segs[i]); !m.ok()) {
      (void)pool_->allocator().finish_recovery();
      return m;
    }
  }
  return pool_->allocator().finish_recovery();
}

// Runs fn(i) for i in [0, n) on up to `threads` threads.
template <class Fn>
unsigned run_parallel(std::size_t n, unsigned threads, Fn fn) {
  const unsigned t = static_cast<unsigned>(std::min<std::size_t>(threads, n));
  if (t <= 1) {
    for (std::size_t i = 0; i < n; ++i) fn(i);
    return 1;
  }
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> pool;
  for (unsigned w = 0; w < t; ++w)
    pool.emplace_back([&] {
      for (std::size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) fn(i);
    });
  for (auto& th : pool) th.join();
  return t;
}

// The counted chain (R1): segment 0, then each next one while the previous reached its start
// through links. Returns how many count; *error if a counted segment met damage.
template <class P>
std::size_t UTree<P>::count_segments(std::vector<Segment>& segs, Status* error) {
  std::size_t used = 0;
  for (; used < segs.size(); ++used) {
    const Segment& s = segs[used];
    if (!s.error.empty()) {
      *error = pool_->error(Code::corrupted, s.error);
      return used;
    }
    if (used > 0 && !segs[used - 1].nodes.empty() && !s.nodes.empty()) {
      const NodeOff a = link_target(segs[used - 1].nodes.back().second);
      const NodeOff b = link_target(s.nodes.front().second);
      if (!(node_key(a) < node_key(b))) {
        *error = pool_->error(Code::corrupted,
                              "utree list keys out of order at offset " + std::to_string(b));
        return used;
      }
    }
    if (!s.reached_stop || s.stop == 0) return used + 1;
  }
  return used;
}

// R3 for one counted segment (DRAM only, so it may run before the allocator has finished):
// its live nodes into a run of fresh leaves filled to per_leaf, chained within the run, each
// leaf's separator computed here. Also what R2 needs to skip segments with nothing to repair.
template <class P>
struct UTree<P>::LeafRun {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> items;  // (separator, leaf)
  Leaf* last = nullptr;
  std::uint64_t live = 0;
  NodeOff last_live = 0;
  bool flagged = false;  // a marked node or a dirty link in the segment
};

template <class P>
void UTree<P>::fill_run(const Segment& seg, std::size_t per_leaf, LeafRun* run) {
  Leaf* leaf = nullptr;
  for (const auto& [word, tagged] : seg.nodes) {
    if ((tagged & 3) != 0) run->flagged = true;
    if ((tagged & 1) != 0) continue;
    const NodeOff off = link_target(tagged);
    if (leaf == nullptr || leaf->h.count == per_leaf) {
      Leaf* next = new_leaf(false);
      if (next == nullptr) index_common::fatal("utree", "no DRAM for the array layer");
      if (leaf != nullptr) {
        leaf->h.next = reinterpret_cast<std::uint64_t>(next);
        next->h.prev = reinterpret_cast<std::uint64_t>(leaf);
      }
      leaf = next;
      run->items.emplace_back(separator_for(word, off), reinterpret_cast<std::uint64_t>(leaf));
    }
    leaf->keys()[leaf->h.count] = word;
    leaf->nodes()[leaf->h.count] = node_index(off);
    ++leaf->h.count;
    ++run->live;
    run->last_live = off;
  }
  run->last = leaf;
}

// R3 (end): the runs' leaves chained in list order, the first leaf's separator dropped (the
// leftmost leaf covers everything below), the inner levels bulk-built.
template <class P>
void UTree<P>::build_from_runs(std::vector<LeafRun>& runs, unsigned threads) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> items;
  Leaf* prev = nullptr;
  for (LeafRun& r : runs) {
    if (r.items.empty()) continue;
    Leaf* first = leaf_of(r.items.front().second);
    if (prev != nullptr) {
      prev->h.next = reinterpret_cast<std::uint64_t>(first);
      first->h.prev = reinterpret_cast<std::uint64_t>(prev);
    }
    prev = r.last;
    items.insert(items.end(), r.items.begin(), r.items.end());
    std::vector<std::pair<std::uint64_t, std::uint64_t>>().swap(r.items);
  }
  if (items.empty()) {
    Leaf* leaf = new_leaf(false);
    if (leaf == nullptr) index_common::fatal("utree", "no DRAM for the array layer");
    items.emplace_back(0, reinterpret_cast<std::uint64_t>(leaf));
  }
  first_leaf_ = leaf_of(items.front().second);
  items.front().first = 0;
  if (items.size() == 1) {
    inner_.init_single(items[0].second);
  } else {
    inner_.bulk_build(items, 0.9, threads);
  }
}

// R2: links around marked nodes and dirty bits cleaned, from the walk's flags (in DRAM). A
// segment without flags, entered with nothing pending, only moves the last live node on.
template <class P>
void UTree<P>::repair_links(std::vector<Segment>& segs, const std::vector<LeafRun>& runs,
                            std::uint64_t head) {
  NodeOff prev_live = 0;
  bool relink = (head & kDirtyBit) != 0;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    recovery_.nodes += segs[i].nodes.size();
    if (!relink && !runs[i].flagged) {
      if (runs[i].live != 0) prev_live = runs[i].last_live;
      continue;
    }
    for (const auto& [word, tagged] : segs[i].nodes) {
      const NodeOff off = link_target(tagged);
      if ((tagged & 1) != 0) {
        relink = true;
        continue;
      }
      if (relink) {
        pm::publish(link_of(prev_live), link_to(off));  // R1t: tagged
        pm::persist(link_of(prev_live), 8);
        ++recovery_.repaired;
      }
      relink = (tagged & 2) != 0;
      prev_live = off;
    }
  }
  if (relink) {
    pm::publish(link_of(prev_live), kListEnd);
    pm::persist(link_of(prev_live), 8);
    ++recovery_.repaired;
  }
}

// R1: walk the list from root.head without trusting it, in segments between skip hints (R0)
// walked in parallel. A segment counts only if the previous counted segment reached its start
// through links (segment 0 starts at root.head), so damaged or stale hints cost time, never
// correctness. Every live node and its records are declared reachable; marked nodes (a remove
// between D1 and D3) are not. This pass only reads PM: a refused pool stays unchanged.
// R3 runs beside R1's marking: one thread marks and finishes the allocator while the others
// fill DRAM leaves per segment and build the inner levels (DRAM only; thrown away with the
// index if the pool is refused).
// R2: repairs after commit_open: links around marked nodes, dirty bits cleaned.
// R4: fresh skip hints.
template <class P>
Status UTree<P>::rebuild(unsigned threads) {
  pm::Pool& p = *pool_;
  const std::uint64_t head = root_->head;
  if ((head & kMarkBit) != 0 || (head & kFlagMask & ~kDirtyBit) != 0) {
    (void)p.allocator().finish_recovery();
    return p.error(Code::corrupted, "utree root head link has impossible flag bits");
  }
  std::uint64_t raw_hints = 0;
  const std::vector<NodeOff> hints = read_hints(&raw_hints);
  std::vector<Segment> segs(hints.size() + 1);
  for (std::size_t i = 0; i < segs.size(); ++i) {
    segs[i].start = i == 0 ? link_target(head) : hints[i - 1];
    segs[i].stop = i < hints.size() ? hints[i] : 0;
    if (i == 0) segs[i].in = head;
  }
  recovery_.threads =
      run_parallel(segs.size(), threads, [&](std::size_t i) { walk_segment(segs[i], segs[i].stop); });
  Status chain = Status::Ok();
  const std::size_t used = count_segments(segs, &chain);
  if (!chain.ok()) {
    (void)p.allocator().finish_recovery();
    return chain;
  }
  hint_stats_ = {raw_hints, used, raw_hints - (used - 1)};
  const std::size_t per_leaf =
      std::max<std::size_t>(1, std::min<std::size_t>(cap_, static_cast<std::size_t>(cap_ * 0.9)));
  std::vector<LeafRun> runs(used);
  auto build = [&](unsigned t) {
    run_parallel(used, t, [&](std::size_t i) { fill_run(segs[i], per_leaf, &runs[i]); });
    build_from_runs(runs, t);  // R3
  };
  Status marked = Status::Ok();
  if (threads > 1) {
    std::thread marker([&] { marked = mark_all(segs, used); });  // R1 marking
    build(threads - 1);
    marker.join();
  } else {
    marked = mark_all(segs, used);
    if (marked.ok()) build(1);
  }
  if (!marked.ok()) return marked;  // mark_all finished the allocator either way
  // The walked list against the last clean close's counts, before anything is written.
  if (Status cs = check_counts(segs, used); !cs.ok()) return cs;
  p.commit_open();
  repair_links(segs, runs, head);  // R2
  std::uint64_t records = 0;
  for (const LeafRun& r : runs) records += r.live;
  recovery_.records = records;
  std::vector<Segment>().swap(segs);
  write_hints(hint_picks());  // R4
  return Status::Ok();
}

// The walked list against the last clean close's counts (live nodes are the records; marked
// ones count as nodes only): a list cut short after a clean close is refused, pool unchanged.
template <class P>
Status UTree<P>::check_counts(const std::vector<Segment>& segs, std::size_t used) const {
  std::uint64_t records = 0, nodes = 0;
  for (std::size_t i = 0; i < used; ++i) {
    nodes += segs[i].nodes.size();
    for (const auto& n : segs[i].nodes) records += (n.second & 1) == 0 ? 1 : 0;
  }
  return index_common::check_close_counts(*pool_, "utree", records, nodes);
}

// Live and all nodes on the PM list, read-only (close, quiescent); kNoCount if the list fails
// its bounded walk.
template <class P>
void UTree<P>::count_list(std::uint64_t* records, std::uint64_t* nodes) const {
  const pm::Pool& p = *pool_;
  *records = *nodes = 0;
  for (NodeOff off = link_target(root_->head); off != 0;) {
    const ListNode* n = p.checked<ListNode>(off, node_bytes_, kNodeAlign);
    if (n == nullptr || *nodes > p.size() / kNodeAlign) {
      *records = *nodes = pm::kNoCount;
      return;
    }
    *records += (n->next & kMarkBit) == 0 ? 1 : 0;
    ++*nodes;
    off = link_target(n->next);
  }
}

// R4: a fresh hint block, persisted, then published with one 8-byte store; the block it
// replaces is freed (at recovery it was never marked reachable, so it is free already).
template <class P>
void UTree<P>::write_hints(const std::vector<NodeOff>& picks) {
  pm::Pool& p = *pool_;
  std::uint64_t off = 0;
  if (!picks.empty()) {
    Code code = Code::ok;
    off = p.allocator().allocate(hint_block_bytes(picks.size()), &code);
    if (off != 0) {  // pool full: no hints (they are only hints)
      HintBlock* b = p.at<HintBlock>(off);
      pm::store(&b->count, std::uint64_t{picks.size()});
      pm::store(&b->stride, hint_stride_);
      pm::copy(b->node, picks.data(), 8 * picks.size());
      pm::persist(b, hint_block_bytes(picks.size()));
    }
  }
  pm::publish(&root_->hints, off);
  pm::persist(&root_->hints, 8);
  if (hint_bytes_ != 0) p.allocator().deallocate(hint_block_, hint_bytes_);
  hint_block_ = off;
  hint_bytes_ = off != 0 ? hint_block_bytes(picks.size()) : 0;
}

// Leaves filled to `fill` of their capacity, chained, and the inner levels bulk-built.
template <class P>
void UTree<P>::build_dram(const std::vector<std::pair<std::uint64_t, NodeOff>>& entries,
                          double fill) {
  const std::size_t per_leaf =
      std::max<std::size_t>(1, std::min<std::size_t>(cap_, static_cast<std::size_t>(cap_ * fill)));
  std::vector<std::pair<std::uint64_t, std::uint64_t>> items;
  Leaf* leaf = first_leaf_ != nullptr ? first_leaf_ : new_leaf(false);
  if (leaf == nullptr) index_common::fatal("utree", "no DRAM for the array layer");
  first_leaf_ = leaf;
  items.emplace_back(0, reinterpret_cast<std::uint64_t>(leaf));
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (leaf->h.count == per_leaf) {
      Leaf* next = new_leaf(false);
      if (next == nullptr) index_common::fatal("utree", "no DRAM for the array layer");
      leaf->h.next = reinterpret_cast<std::uint64_t>(next);
      next->h.prev = reinterpret_cast<std::uint64_t>(leaf);
      leaf = next;
      items.emplace_back(separator_for(entries[i].first, entries[i].second),
                         reinterpret_cast<std::uint64_t>(leaf));
    }
    leaf->keys()[leaf->h.count] = entries[i].first;
    leaf->nodes()[leaf->h.count] = node_index(entries[i].second);
    ++leaf->h.count;
  }
  if (items.size() == 1) {
    inner_.init_single(items[0].second);
  } else {
    inner_.bulk_build(items, 0.9, 1);
  }
}

template <class P>
Status UTree<P>::bulk_load(std::span<const KeyValue> sorted, double fill) {
  if (!(fill > 0.0 && fill <= 1.0))
    return Status(Code::invalid_argument, "fill factor must be in (0, 1]");
  if (link_target(root_->head) != 0 || first_leaf_->h.count != 0)
    return Status(Code::invalid_argument, "utree bulk_load needs an empty index");
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    if (Code c = keys_.check(sorted[i].key); c != Code::ok) return Status(c, "bulk_load key");
    if (Code c = values_.check(sorted[i].value); c != Code::ok) return Status(c, "bulk_load value");
    if (i > 0 && !(sorted[i - 1].key < sorted[i].key))
      return Status(Code::invalid_argument, "bulk_load keys must be sorted and distinct");
  }
  if (sorted.empty()) return Status::Ok();
  std::vector<std::pair<std::uint64_t, NodeOff>> entries;
  entries.reserve(sorted.size());
  for (const KeyValue& kv : sorted) {
    Code code = Code::ok;
    const Probe p = probe(kv.key);
    const NodeOff node = make_node(p, kv.value, &code);  // U1 (unreachable until U5)
    if (node == 0) {
      for (const auto& e : entries) free_node_now(e.second);
      return pool_->error(code, "bulk_load: no space for the records");
    }
    entries.emplace_back(p.word, node);
  }
  for (std::size_t i = 0; i < entries.size(); ++i)
    write_next(entries[i].second,
               i + 1 < entries.size() ? link_to(entries[i + 1].second) : kListEnd);  // R1t
  pm::publish(&root_->head, link_to(entries[0].second));  // U5: the whole list at once
  pm::persist(&root_->head, 8);
  build_dram(entries, fill);
  this->count_loaded(sorted.size());
  return Status::Ok();
}

// The list: in bounds, strictly increasing, no flag bits, records valid, every link tagged
// with the node it names and the list ended by the end mark (R1t); collects the nodes in order
// and adds their allocator bytes to *reachable.
template <class P>
Status UTree<P>::verify_list(std::vector<NodeOff>* nodes, std::uint64_t* reachable) const {
  const pm::Pool& p = *pool_;
  using index_common::block_bytes;
  auto bad = [&](NodeOff at, const std::string& what) {
    return p.error(Code::corrupted,
                   "verify: list node at offset " + std::to_string(at) + ": " + what);
  };
  const std::uint64_t head = detail::load(root_->head);
  if ((head & kFlagMask) != 0) return bad(0, "root head has flag bits");
  std::string prev;
  NodeOff from = 0;
  for (std::uint64_t in = head;;) {
    const NodeOff off = link_target(in);
    if (off == 0) {
      if (!P::kUncheckedLinks && in != kListEnd)
        return bad(from, "its link names offset 0 without the end mark");
      break;
    }
    const ListNode* n = p.checked<ListNode>(off, node_bytes_, kNodeAlign);
    if (n == nullptr) return bad(off, "out of bounds or misaligned");
    if (!P::kUncheckedLinks && link_tag(in) != tag_of(n))
      return bad(off, "the link to it (from " + detail::link_origin(from) +
                          ") carries another node's tag");
    const std::uint64_t next = detail::load(n->next);
    if ((next & kFlagMask) != 0) return bad(off, "mark or dirty bit left on a live link");
    std::string key;
    if (bytes_) {
      std::string_view stored;
      if (!index_common::read_record(p, n->key_record, keys_.max_key(), &stored))
        return bad(off, "bad key record");
      if (detail::prefix_word(stored) != n->key) return bad(off, "prefix differs from the key");
      key.assign(stored);
      *reachable += block_bytes(index_common::record_bytes(stored.size()));
    } else {
      key = encode_u64(n->key);
    }
    if (!nodes->empty() && !(prev < key)) return bad(off, "keys out of order (or a cycle)");
    std::size_t vbytes = 0;
    if (!values_.record_size(n->value, &vbytes)) return bad(off, "bad value record");
    *reachable += (vbytes != 0 ? block_bytes(vbytes) : 0) + block_bytes(node_bytes_);
    nodes->push_back(off);
    prev = std::move(key);
    in = next;
    from = off;
  }
  return Status::Ok();
}

template <class P>
Status UTree<P>::verify() const {
  epochs_.drain();  // quiescent: retired nodes are free before reachability is counted
  const pm::Pool& p = *pool_;
  std::vector<NodeOff> list;
  std::uint64_t reachable = index_common::block_bytes(sizeof(Root));
  if (hint_bytes_ != 0) reachable += index_common::block_bytes(hint_bytes_);
  if (Status s = verify_list(&list, &reachable); !s.ok()) return s;
  index_common::ChainKeys chain;
  std::size_t j = 0;
  const Leaf* prev = nullptr;
  for (const Leaf* l = first_leaf_; l != nullptr; l = leaf_of(l->h.next)) {
    const std::uint64_t lw = reinterpret_cast<std::uint64_t>(l);
    if (prev_hint(l) != prev) return index_common::leaf_error(p, lw, "prev hint is not the left neighbour");
    if (sync::OptimisticLock::isLocked(l->h.lock.peek())) return index_common::leaf_error(p, lw, "left locked");
    if (l->h.count > cap_) return index_common::leaf_error(p, lw, "count above capacity");
    if (l->h.count == 0 && l != first_leaf_)
      return index_common::leaf_error(p, lw, "an empty leaf other than the first (L1)");
    chain.leaves.push_back(lw);
    chain.keys.emplace_back();
    for (unsigned i = 0; i < l->h.count; ++i, ++j) {
      const NodeOff off = node_offset(l->nodes()[i]);
      if (j >= list.size() || list[j] != off)
        return index_common::leaf_error(p, lw, "entry " + std::to_string(i) + " is not the list's next node");
      if (l->keys()[i] != node_at(off)->key)
        return index_common::leaf_error(p, lw, "entry " + std::to_string(i) + " key word differs from its node");
      chain.keys.back().push_back(node_key(off));
    }
    prev = l;
  }
  if (j != list.size()) return p.error(Code::corrupted, "verify: the list has nodes no leaf holds");
  if (Status s = index_common::check_key_order(p, chain); !s.ok()) return s;
  if (Status s = index_common::check_reachable(p, reachable); !s.ok()) return s;
  return index_common::check_inner_against_chain(
      p, inner_, chain,
      [&](std::uint64_t a, std::uint64_t b) { return keys_.separator_less(a, b); },
      [&](std::uint64_t sep) { return keys_.separator_bytes(sep); });
}

template <class P>
Footprint UTree<P>::footprint() const {
  const auto st = pool_->allocator().stats();
  Footprint f;
  f.pm_bytes = st.bytes_in_use;
  f.pm_reserved = st.bytes_reserved;
  f.dram_bytes = arena_.bytes_in_use() + seps_.dram_bytes();
  return f;
}

template <class P>
Status UTree<P>::close() {
  if (!closed_) {
    epochs_.drain();
    refresh_hints_for_testing();  // R4: hints for the next open, from the DRAM leaves
    // Every operation persisted its own steps; the counts let the next open see a list that
    // lost nodes (one read-only walk here).
    std::uint64_t records = 0, nodes = 0;
    count_list(&records, &nodes);
    pool_->close_clean(records, nodes);
    closed_ = true;
  }
  return Status::Ok();
}

template <class P>
void UTree<P>::refresh_hints_for_testing() {
  write_hints(hint_picks());
}

// Every hint_stride_-th live node (1-based) from the DRAM leaves: a leaf whose entries do not
// reach the next multiple is skipped by its count alone.
template <class P>
std::vector<typename UTree<P>::NodeOff> UTree<P>::hint_picks() const {
  std::vector<NodeOff> picks;
  std::uint64_t seen = 0;  // entries in the leaves before l
  for (const Leaf* l = first_leaf_; l != nullptr; l = leaf_of(l->h.next)) {
    const std::uint64_t end = seen + l->h.count;
    for (std::uint64_t k = (seen / hint_stride_ + 1) * hint_stride_; k <= end; k += hint_stride_)
      picks.push_back(node_offset(l->nodes()[k - seen - 1]));
    seen = end;
  }
  return picks;
}

template <class P>
std::vector<std::string> UTree<P>::list_keys_for_testing() const {
  std::vector<std::string> out;
  for (NodeOff off = link_target(root_->head); off != 0; off = link_target(node_at(off)->next))
    out.push_back(node_key(off));
  return out;
}

template <class P>
void UTree<P>::corrupt_for_testing(int what) {
  const NodeOff a = link_target(root_->head);
  const NodeOff b = a != 0 ? link_target(node_at(a)->next) : 0;
  if (what == 0 && b != 0) {
    const std::uint64_t ka = node_at(a)->key;
    pm::publish(&node_at(a)->key, node_at(b)->key);
    pm::publish(&node_at(b)->key, ka);
  } else if (what == 1 && first_leaf_->h.count >= 2) {
    first_leaf_->nodes()[0] = first_leaf_->nodes()[1];
  } else if (what == 2) {
    pm::publish(&root_->head, root_->head | kDirtyBit);
  } else if (what == 3 && first_leaf_->h.next != 0) {
    leaf_of(first_leaf_->h.next)->h.count = 0;  // a remove that left its emptied leaf in (L1)
  } else if (what == 4 && a != 0) {
    pm::publish(&node_at(a)->next, std::uint64_t{0});  // a zeroed link (R1t)
  } else if (what == 5 && b != 0) {  // root.head past the first node, its tag left (R1t)
    pm::publish(&root_->head, make_link(b, link_tag(root_->head)));
  }
}

}  // namespace pmindex::utree

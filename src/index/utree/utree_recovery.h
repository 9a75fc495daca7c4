// uTree recovery (PROTOCOL.md R1..R4), bulk load and verify(). Part of utree_impl.h's
// templates (tests instantiate known-bad policies).
#pragma once

#include <chrono>

#include "index/common/recovery_frame.h"
#include "index/utree/utree_impl.h"

namespace pmindex::utree {

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
        if (r == nullptr || r->magic != kRootMagic)
          return p.error(Code::corrupted, "utree root object is missing or has a wrong magic");
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
  return std::unique_ptr<Index>(std::move(idx));
}

// R1: walk the list from root.head without trusting it: every offset bounds- and
// alignment-checked, keys strictly increasing (which also rules out a cycle), records checked;
// every live node and its records declared reachable. Marked nodes (a remove between D1 and
// D3) are left unreachable. Pass 1 only reads PM, so a refused pool stays unchanged.
// R2: repairs after commit_open: links around marked nodes, dirty bits cleaned.
// R3: the DRAM leaves and inner levels built bottom-up from the live nodes.
template <class P>
Status UTree<P>::rebuild(unsigned threads) {
  pm::Pool& p = *pool_;
  std::vector<std::pair<std::uint64_t, NodeOff>> entries;
  std::vector<std::pair<NodeOff, NodeOff>> repairs;  // (link owner, new target)
  auto fail = [&](NodeOff at, const std::string& what) {
    (void)p.allocator().finish_recovery();
    return p.error(Code::corrupted, "utree list node at offset " + std::to_string(at) + ": " + what);
  };
  const std::uint64_t head = root_->head;
  if ((head & kMarkBit) != 0 || (head & kFlagMask & ~kDirtyBit) != 0)
    return fail(0, "root head link has impossible flag bits");
  NodeOff prev_live = 0;
  bool relink = (head & kDirtyBit) != 0;
  std::uint64_t prev_word = 0;
  std::string prev_key;
  bool first = true;
  for (NodeOff off = link_target(head); off != 0;) {
    const ListNode* n = p.checked<ListNode>(off, node_bytes_, kNodeAlign);
    if (n == nullptr) return fail(off, "out of bounds or misaligned");
    const std::uint64_t next = n->next;
    if ((next & kFlagMask & ~(kMarkBit | kDirtyBit)) != 0) return fail(off, "bad link flags");
    std::string_view key;
    if (bytes_) {
      if (!index_common::read_record(p, n->key_record, keys_.max_key(), &key))
        return fail(off, "bad key record");
      if (detail::prefix_word(key) != n->key) return fail(off, "key prefix differs from its record");
      if (!first && !(prev_key < key)) return fail(off, "keys out of order (or a cycle)");
      prev_key.assign(key);
    } else if (!first && !(prev_word < n->key)) {
      return fail(off, "keys out of order (or a cycle)");
    }
    prev_word = n->key;
    first = false;
    ++recovery_.nodes;
    if ((next & kMarkBit) != 0) {
      relink = true;  // R2: the live link before it must skip it
    } else {
      if (p.allocator().mark_reachable(off, node_bytes_) != Code::ok ||
          (bytes_ && index_common::mark_record(p, n->key_record, keys_.max_key()) != Code::ok) ||
          values_.mark(n->value) != Code::ok)
        return fail(off, "node or record overlaps another block, or a bad value record");
      if (relink) repairs.emplace_back(prev_live, off);
      relink = (next & kDirtyBit) != 0;
      entries.emplace_back(n->key, off);
      prev_live = off;
    }
    off = link_target(next);
  }
  if (relink) repairs.emplace_back(prev_live, 0);
  if (Status fs = p.allocator().finish_recovery(); !fs.ok()) return fs;
  p.commit_open();
  for (const auto& [owner, target] : repairs) {  // R2
    std::uint64_t* link = link_of(owner);
    pm::publish(link, target);
    pm::persist(link, sizeof *link);
    ++recovery_.repaired;
  }
  recovery_.records = entries.size();
  build_dram(entries, 0.9);  // R3
  recovery_.threads = threads;
  return Status::Ok();
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
    write_next(entries[i].second, i + 1 < entries.size() ? entries[i + 1].second : 0);
  pm::publish(&root_->head, entries[0].second);  // U5: the whole list at once
  pm::persist(&root_->head, 8);
  build_dram(entries, fill);
  return Status::Ok();
}

// The list: in bounds, strictly increasing, no flag bits, records valid; collects the nodes
// in order and adds their allocator bytes to *reachable.
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
  for (NodeOff off = head; off != 0;) {
    const ListNode* n = p.checked<ListNode>(off, node_bytes_, kNodeAlign);
    if (n == nullptr) return bad(off, "out of bounds or misaligned");
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
    off = link_target(next);
  }
  return Status::Ok();
}

template <class P>
Status UTree<P>::verify() const {
  epochs_.drain();  // quiescent: retired nodes are free before reachability is counted
  const pm::Pool& p = *pool_;
  std::vector<NodeOff> list;
  std::uint64_t reachable = index_common::block_bytes(sizeof(Root));
  if (Status s = verify_list(&list, &reachable); !s.ok()) return s;
  index_common::ChainKeys chain;
  std::size_t j = 0;
  const Leaf* prev = nullptr;
  for (const Leaf* l = first_leaf_; l != nullptr; l = leaf_of(l->h.next)) {
    const std::uint64_t lw = reinterpret_cast<std::uint64_t>(l);
    if (prev_hint(l) != prev) return index_common::leaf_error(p, lw, "prev hint is not the left neighbour");
    if (sync::OptimisticLock::isLocked(l->h.lock.peek())) return index_common::leaf_error(p, lw, "left locked");
    if (l->h.count > cap_) return index_common::leaf_error(p, lw, "count above capacity");
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
    pool_->close_clean();  // every operation persisted its own steps
    closed_ = true;
  }
  return Status::Ok();
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
  }
}

}  // namespace pmindex::utree

// NBTree creation, recovery (scan the key-value layer, rebuild the DRAM layer; steps C*, X*),
// bulk load, verify() and footprint. See PROTOCOL.md.
#include <algorithm>
#include <chrono>

#include "index/common/close_counts.h"
#include "index/common/prefetch.h"
#include "index/nbtree/nbtree.h"

namespace pmindex::nbtree {

namespace {
constexpr std::uint64_t kMaxKey = kNoHigh;

std::uint32_t node_size_of(const Options& o) {
  return o.node_size != 0 ? o.node_size : kDefaultNodeSize;
}
bool valid_node_size(std::uint32_t n) {
  return n >= kMinNodeSize && n <= kMaxNodeSize && n % 64 == 0;
}
std::size_t block_align(std::uint32_t node_size) { return node_size >= 256 ? 256 : 64; }
}  // namespace

pm::Layout NBTree::layout_for(const Options& o) {
  return pm::Layout{"nbtree", node_size_of(o), o.key_type, 0};
}

std::size_t NBTree::default_pool_size(const Options& o) {
  // About 16 B per record in half-full 1 KiB leaves, plus out-of-line values, key records
  // (bytes mode: 8 B header + the key, class-rounded) and slack.
  const std::size_t per_record = 64 + (o.max_value_size > 8 ? o.max_value_size + 64 : 0) +
                                 (o.key_type == KeyType::bytes ? o.max_key_size + 64 : 0);
  return std::max<std::size_t>(std::size_t{16} << 20, o.expected_records * per_record);
}

Status NBTree::validate(const Options& o) {
  if (o.key_type == KeyType::bytes && o.max_key_size > kMaxKeyBytes)
    return Status(Code::invalid_argument, "nbtree keys are limited to 8192 bytes");
  if (!valid_node_size(node_size_of(o)))
    return Status(Code::invalid_argument, "nbtree node_size must be 64..1024, a multiple of 64");
  if (o.max_value_size > kMaxValueSize)
    return Status(Code::invalid_argument, "nbtree values are limited to 4096 B");
  return Status::Ok();
}

Result<std::unique_ptr<Index>> NBTree::create(std::unique_ptr<pm::Pool> pool, const Options& o) {
  const std::uint32_t ns = node_size_of(o);
  std::unique_ptr<NBTree> idx(new NBTree(std::move(pool), ns, std::max(8u, o.max_value_size),
                                         o.max_key_size));
  if (Status s = idx->init_root(); !s.ok()) return s;
  idx->recovery_.created = true;
  return std::unique_ptr<Index>(std::move(idx));
}

// C1-C4: the first block is zeroed and persisted, the root object written and persisted with
// head pointing at it, then the root is published in the pool header.
Status NBTree::init_root() {
  pm::Pool& p = *pool_;
  Code code = Code::ok;
  Leaf* first = new_leaf(first_low_, kMaxKey, &code);  // C1: zeroed block
  if (first == nullptr) return p.error(code, "no space for the first nbtree leaf");
  pm::store(&block(first)->next, index_common::kChainEnd);
  pm::persist(block(first), node_size_);
  const std::uint64_t off = p.allocator().allocate(sizeof(Root), &code);
  if (off == 0) return p.error(code, "no space for the nbtree root");
  Root* r = p.at<Root>(off);
  Root init{};
  init.magic = kRootMagic;
  init.head = link_to(first);
  init.node_size = node_size_;
  init.max_value_size = max_value_;
  init.max_key_size = bytes_ ? keys_.max_key() : 0;
  init.stamp = index_common::make_root_stamp(p.info().layout);
  pm::copy(r, &init, sizeof init);  // C2
  pm::persist(r, sizeof init);      // C3
  p.set_root(off);                  // C4
  root_ = r;
  head_.store(first, std::memory_order_release);
  build_inner_from_leaves({first});
  return Status::Ok();
}

Result<std::unique_ptr<Index>> NBTree::recover(std::unique_ptr<pm::Pool> pool, const Options& o) {
  const auto start = std::chrono::steady_clock::now();
  const std::uint32_t ns = pool->info().layout.node_size;
  if (!valid_node_size(ns)) return pool->error(Code::corrupted, "nbtree layout has a bad node size");
  pm::Pool& p = *pool;
  const std::uint64_t root_off = p.root();
  Root* r = root_off != 0 ? p.checked<Root>(root_off, sizeof(Root), 64) : nullptr;
  const bool bytes = p.info().layout.key_mode == KeyType::bytes;
  if (r != nullptr && r->magic == kRootMagicUntagged) {
    return p.error(Code::corrupted,
                   "nbtree root is of format BNTREE02 (links without tags, before pmindex "
                   "adopted tagged links): load the records into a new pool");
  }
  if (root_off != 0 && (r == nullptr || r->magic != kRootMagic || r->node_size != ns ||
                        r->max_value_size > kMaxValueSize || r->max_value_size < 8 ||
                        (bytes && r->max_key_size > kMaxKeyBytes))) {
    return p.error(Code::corrupted, "nbtree root object is missing or inconsistent");
  }
  if (r != nullptr) {
    if (Status s = index_common::check_root_stamp(r->stamp, p); !s.ok()) return s;
  }
  const std::uint32_t max_value = r != nullptr ? r->max_value_size : std::max(8u, o.max_value_size);
  const std::uint32_t max_key = r != nullptr ? r->max_key_size : o.max_key_size;
  std::unique_ptr<NBTree> idx(new NBTree(std::move(pool), ns, max_value, max_key));
  pm::Pool& q = *idx->pool_;
  idx->recovery_.clean_shutdown = q.was_clean();
  idx->recovery_.warning = q.open_warning();
  q.allocator().begin_recovery(/*start_now=*/false);
  if (r == nullptr) {
    // Crash before C4: nothing was reachable.
    if (Status s = q.allocator().finish_recovery(); !s.ok()) return s;
    q.commit_open();
    if (Status s = idx->init_root(); !s.ok()) return s;
  } else {
    idx->root_ = r;
    if (q.allocator().mark_reachable(root_off, sizeof(Root)) != Code::ok)
      return q.allocator().finish_recovery();
    if (Status s = idx->rebuild(); !s.ok()) {
      (void)q.allocator().finish_recovery();
      return s;
    }
    if (Status s = q.allocator().finish_recovery(); !s.ok()) return s;
    q.commit_open();
  }
  idx->recovery_.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  idx->set_recovered_records(idx->recovery_.records);  // rebuild() counted root and leaves
  return std::unique_ptr<Index>(std::move(idx));
}

// A value word's out-of-line record (if any), checked and marked reachable (X1, X3).
Status NBTree::mark_value_record(std::uint64_t word, std::uint64_t where) {
  pm::Pool& p = *pool_;
  const std::uint64_t pl = payload_of(word);
  if ((pl & kOutOfLine) == 0) return Status::Ok();
  const std::uint64_t off = pl & ~kOutOfLine;
  // 16 B: a record of up to 24 value bytes is a 16 or 32 B block, not a whole line.
  const auto* rec = p.checked<ValueRecord>(off, sizeof(ValueRecord), pm::Allocator::kMinBlock);
  if (rec == nullptr || rec->length > max_value_ ||
      !p.in_heap(off, sizeof(ValueRecord) + rec->length)) {
    return p.error(Code::corrupted, "nbtree value record at " + std::to_string(off) +
                                        " (from " + std::to_string(where) + ") is invalid");
  }
  if (p.allocator().mark_reachable(off, sizeof(ValueRecord) + rec->length) != Code::ok)
    return p.error(Code::corrupted, "nbtree value record marked twice or misplaced");
  return Status::Ok();
}

// One block's live entries as rebuild decoded them: their key range and slots.
struct NBTree::BlockKeys {
  std::uint64_t mn = kMaxKey, mx = 0;
  std::string_view mn_bytes, mx_bytes;  // bytes mode (views into PM records)
  int live = 0, last = -1;
  std::uint64_t bitmap = 0;
};

// X3: block `off`'s entries e[0 .. cap) into the fresh DRAM leaf, each key checked (bytes
// mode: its record's bounds and length), live only once in the block (a repeat is queued in
// *repairs to be cleared), its value and key records marked. Returns what is wrong, or "".
std::string NBTree::load_block_entries(std::uint64_t off, const Entry* e, Leaf* leaf,
                                       BlockKeys* keys, Repairs* repairs) {
  pm::Pool& p = *pool_;
  BlockKeys& k = *keys;
  for (int i = 0; i < cap_; ++i) {
    const std::uint64_t word = e[i].key;
    if (word == 0) continue;
    Probe kp;
    if (bytes_) {
      if (!index_common::read_record(p, word, keys_.max_key(), &kp.bytes))
        return "nbtree key record at " + std::to_string(word) + " (from " + std::to_string(off) +
               ") is invalid";
      kp.fp = index_common::fingerprint_bytes(kp.bytes);
    } else {
      kp.word = word;
      kp.fp = fingerprint(word);
    }
    // A key may be live only once in a block; I2 guarantees it, a damaged pool may not.
    // find_slot looks among the slots accepted so far (fingerprints first, like a lookup).
    if (find_slot(leaf, kp, k.bitmap) >= 0) {
      repairs->push_back({const_cast<std::uint64_t*>(&e[i].key), 0});
      continue;
    }
    if (Status s = mark_value_record(e[i].value, off); !s.ok()) return s.message();
    if (bytes_ && index_common::mark_record(p, word, keys_.max_key()) != Code::ok)
      return "nbtree key record marked twice or misplaced";
    k.bitmap |= std::uint64_t{1} << i;
    leaf->keys[i].store(word, std::memory_order_relaxed);
    // The leaf is private until X6 publishes it: a plain read-modify-write, not set_fp's
    // fetch_or (one locked instruction per record is a measurable share of recovery).
    auto& fw = leaf->fpw[i >> 3];
    fw.store(fw.load(std::memory_order_relaxed) | (std::uint64_t{kp.fp} << ((i & 7) * 8)),
             std::memory_order_relaxed);
    if (bytes_) {
      if (k.live == 0 || kp.bytes < k.mn_bytes) k.mn_bytes = kp.bytes;
      if (k.live == 0 || kp.bytes > k.mx_bytes) k.mx_bytes = kp.bytes;
    } else {
      k.mn = std::min(k.mn, word);
      k.mx = std::max(k.mx, word);
    }
    ++k.live;
    k.last = i;
  }
  return "";
}

// rebuild after a complete walk: the close counts compared (every block walked, empty ones
// too, as close counts them) before any repair, so a chain cut short after a clean close is
// refused with the pool unchanged; then the queued repairs, a fresh first leaf if X4 left none,
// and the inner nodes (X6).
Status NBTree::finish_rebuild(std::vector<Leaf*>& leaves, const Repairs& repairs,
                              std::size_t walked) {
  pm::Pool& p = *pool_;
  if (Status s = index_common::check_close_counts(p, "nbtree", recovery_.records, walked);
      !s.ok()) {
    for (Leaf* l : leaves) drop_dram(l);
    return s;
  }
  for (const auto& [word, value] : repairs) {
    pm::publish(word, value);
    pm::persist(word, sizeof(std::uint64_t));
  }
  recovery_.repaired += repairs.size();
  if (leaves.empty()) {
    // X4 left nothing (or the chain was empty): start with one fresh leaf.
    Code code = Code::ok;
    Leaf* first = new_leaf(first_low_, kMaxKey, &code);
    if (first == nullptr) return p.error(code, "no space for the first nbtree leaf");
    pm::store(&block(first)->next, index_common::kChainEnd);
    pm::persist(block(first), node_size_);
    pm::publish(&root_->head, link_to(first));
    pm::persist(&root_->head, sizeof(std::uint64_t));
    if (p.allocator().mark_reachable(first->data_off, node_size_) != Code::ok)
      return p.error(Code::corrupted, "nbtree: fresh first block overlaps a marked block");
    leaves.push_back(first);
  }
  leaves.back()->high = kMaxKey;
  head_.store(leaves.front(), std::memory_order_release);
  build_inner_from_leaves(leaves);  // X6
  return Status::Ok();
}

// X1-X6: walk the key-value layer without trusting it (every offset bounds- and alignment-
// checked, a visited set against cycles, keys strictly increasing from block to block), mark
// every reachable block and record, and rebuild the metadata layer and the inner nodes.
Status NBTree::rebuild() {
  pm::Pool& p = *pool_;
  auto& alloc = p.allocator();
  // Key 0's side record (X1).
  if (root_->zero_present > 1) return p.error(Code::corrupted, "nbtree root zero_present is not 0/1");
  if (root_->zero_present == 1) {
    if (Status s = mark_value_record(root_->zero_value, 0); !s.ok()) return s;
    ++recovery_.records;
  }
  std::vector<Leaf*> leaves;
  // X3/X4 repairs are applied only once the whole walk has succeeded, so a pool refused at
  // recovery is left byte-for-byte unchanged.
  Repairs repairs;
  const std::size_t align = block_align(node_size_);
  // X2's cycle check: one bit per possible block position (pool size / alignment).
  std::vector<std::uint64_t> visited(p.size() / align / 64 + 1, 0);
  std::size_t walked = 0;
  std::uint64_t* link = &root_->head;
  std::uint64_t word = root_->head;  // a link word: offset and tag (common/chain_tag.h)
  std::uint64_t prev_max = 0;
  std::string_view prev_max_bytes;  // bytes mode (views into PM records)
  auto fail = [&](const std::string& what) {
    for (Leaf* l : leaves) drop_dram(l);
    return p.error(Code::corrupted, what);
  };
  while (word != index_common::kChainEnd) {
    const std::uint64_t off = index_common::link_off(word);
    if (word == 0) return fail("nbtree block chain ends without its end mark (a zeroed link)");
    auto* hdr = p.checked<BlockHeader>(off, node_size_, align);  // X2
    if (hdr == nullptr) return fail("nbtree block offset " + std::to_string(off) + " is invalid");
    // X2t: the link carries the tag of the block it names, after any end (a link damaged or
    // redirected to another valid block does not, but for 1 in 65,534).
    if (!index_common::valid_tag(hdr->tag) || index_common::link_tag(word) != hdr->tag)
      return fail("nbtree: the link to the block at offset " + std::to_string(off) +
                  " does not carry the tag of the block it names (a damaged or redirected link)");
    std::uint64_t& seen = visited[off / align / 64];
    const std::uint64_t bit = std::uint64_t{1} << (off / align % 64);
    if ((seen & bit) != 0) return fail("nbtree block chain has a cycle");  // X2
    seen |= bit;
    ++walked;
    // The chain is in split order, not address order: start loading the next block's lines
    // while this one is decoded (recovery time is this walk's cache misses).
    const std::uint64_t next_off = index_common::link_off(hdr->next);
    if (const auto* nx = p.checked<BlockHeader>(next_off, node_size_, align); nx != nullptr)
      index_common::prefetch_lines(nx, node_size_);
    auto* leaf = make_dram<Leaf>();
    leaf->data_off = off;
    BlockKeys k;
    const std::string bad =
        load_block_entries(off, reinterpret_cast<const Entry*>(hdr + 1), leaf, &k, &repairs);
    const std::uint64_t next_word = hdr->next;
    if (bad.empty() && k.live == 0 && !(leaves.empty() && next_word == index_common::kChainEnd)) {
      // X4: an empty block carries no range; unlink it (it is not marked, so it is freed).
      repairs.push_back({link, next_word});
      drop_dram(leaf);
      word = next_word;
      continue;
    }
    std::string why = bad;
    if (why.empty() && k.live > 0 && !leaves.empty() &&
        (bytes_ ? k.mn_bytes <= prev_max_bytes : k.mn <= prev_max))
      why = "nbtree blocks are out of key order at offset " + std::to_string(off);
    if (why.empty() && alloc.mark_reachable(off, node_size_) != Code::ok)
      why = "nbtree block marked twice or misplaced";
    if (!why.empty()) {
      drop_dram(leaf);  // not in `leaves` yet
      return fail(why);
    }
    for (int i = 0; i <= k.last; ++i) leaf->state[i].store(Leaf::kDone, std::memory_order_relaxed);
    leaf->num.store(static_cast<std::uint32_t>(k.last + 1), std::memory_order_relaxed);
    leaf->bitmap.store(k.bitmap, std::memory_order_relaxed);
    // X5: ranges from the blocks' smallest keys (bytes mode: new DRAM bounds)
    leaf->low = leaves.empty() ? first_low_ : make_bound(k.mn_bytes, k.mn);
    if (!leaves.empty()) {
      leaves.back()->high = high_before(leaf->low);
      leaves.back()->next.store(leaf, std::memory_order_relaxed);
    }
    if (k.live > 0) {
      prev_max = k.mx;
      prev_max_bytes = k.mx_bytes;
    }
    recovery_.records += static_cast<std::uint64_t>(k.live);
    ++recovery_.nodes;
    leaves.push_back(leaf);
    link = &hdr->next;
    word = next_word;
    if (walked > p.size() / node_size_) return fail("nbtree block chain is too long");
  }
  return finish_rebuild(leaves, repairs, walked);
}

// One input record of bulk_load, checked and encoded.
struct NBTree::BulkRecord {
  Probe p;  // bytes mode: views the caller's key
  std::uint64_t key, word;  // key word (bytes mode: a K1 record), value word
};

// B1-B4: sorted input becomes full blocks written and persisted back to front (each block's
// next is known when it is written), then one publish of root.head switches the empty tree to
// the loaded one; the old empty block is freed.
Status NBTree::bulk_load(std::span<const KeyValue> sorted, double fill) {
  if (!(fill > 0.0 && fill <= 1.0))
    return Status(Code::invalid_argument, "fill factor must be in (0, 1]");
  Leaf* head = head_.load(std::memory_order_acquire);
  if (head->next.load(std::memory_order_acquire) != nullptr ||
      (head->bitmap.load(std::memory_order_acquire) & ~Leaf::kSmoBit) != 0 ||
      head->num.load(std::memory_order_relaxed) != 0 || root_->zero_present != 0) {
    return pool_->error(Code::invalid_argument, "nbtree bulk_load needs an empty index");
  }
  std::vector<BulkRecord> recs;
  if (Status s = encode_bulk(sorted, &recs); !s.ok()) return s;
  std::size_t begin = 0;
  if (!bytes_ && !recs.empty() && recs[0].key == 0) {
    (void)zero_insert(recs[0].word);
    recs[0].word = 0;  // published in the root: not free_bulk()'s to free
    begin = 1;
  }
  std::vector<Leaf*> leaves;
  if (Status s = fill_bulk_leaves(recs, begin, fill, &leaves); !s.ok()) {
    free_bulk(recs);
    count_loaded(begin);  // key 0, if any, stays in the root
    return s;
  }
  count_loaded(sorted.size());  // every record is in from here on (key 0 in the root)
  if (!leaves.empty()) publish_bulk(leaves, head);
  return Status::Ok();
}

// Checks the input (keys valid, sorted, distinct) and encodes it: value words, and in bytes
// mode each key's K1 record, written before B1 stores its word. On an error nothing is left.
Status NBTree::encode_bulk(std::span<const KeyValue> sorted, std::vector<BulkRecord>* recs) {
  recs->reserve(sorted.size());
  auto fail = [&](Code c, const char* what) {
    free_bulk(*recs);
    recs->clear();
    return Status(c, what);
  };
  for (const KeyValue& kv : sorted) {
    BulkRecord r;
    if (Code c = make_probe(kv.key, &r.p); c != Code::ok) return fail(c, "bulk_load: bad key");
    if (!recs->empty() &&
        (bytes_ ? r.p.bytes <= recs->back().p.bytes : r.p.word <= recs->back().p.word)) {
      return fail(Code::invalid_argument, "bulk_load: input not sorted and distinct");
    }
    if (Code c = encode_value(kv.value, &r.word); c != Code::ok) return fail(c, "bulk_load: value");
    Code c = Code::ok;
    r.key = bytes_ ? new_key_record(kv.key, &c) : r.p.word;  // K1
    if (c != Code::ok) {
      free_value(r.word);
      return fail(c, "bulk_load: key record");
    }
    recs->push_back(r);
  }
  return Status::Ok();
}

// Frees what encode_bulk wrote (nothing of it was published).
void NBTree::free_bulk(const std::vector<BulkRecord>& recs) {
  for (const BulkRecord& r : recs) {
    free_value(r.word);
    if (bytes_) {
      std::lock_guard<sync::SpinLock> lock(alloc_mu_);
      index_common::free_record(*pool_, r.key);
    }
  }
}

// B1: recs[begin..] into new blocks of fill * capacity entries, DRAM leaves linked in order
// (PM links are B2's). On pool_full every block made here is freed and leaves is empty.
Status NBTree::fill_bulk_leaves(const std::vector<BulkRecord>& recs, std::size_t begin,
                                double fill, std::vector<Leaf*>* leaves) {
  const int per = std::max(1, static_cast<int>(fill * cap_));
  Code code = Code::ok;
  for (std::size_t i = begin; i < recs.size(); i += per) {
    const std::size_t end = std::min(recs.size(), i + per);
    const std::uint64_t low =
        leaves->empty() ? first_low_ : make_bound(recs[i].p.bytes, recs[i].key);
    Leaf* l = new_leaf(low, kMaxKey, &code);
    if (l == nullptr) {
      for (Leaf* x : *leaves) {
        pm_free(x->data_off, node_size_);
        drop_dram(x);
      }
      leaves->clear();
      return pool_->error(code, "bulk_load: pool full");
    }
    Entry* e = entries(l);
    std::uint64_t bitmap = 0;
    for (std::size_t j = i; j < end; ++j) {
      const int s = static_cast<int>(j - i);
      pm::store(&e[s], Entry{recs[j].key, recs[j].word});  // B1
      l->keys[s].store(recs[j].key, std::memory_order_relaxed);
      l->set_fp(s, recs[j].p.fp);
      l->state[s].store(Leaf::kDone, std::memory_order_relaxed);
      bitmap |= std::uint64_t{1} << s;
    }
    l->bitmap.store(bitmap, std::memory_order_relaxed);
    l->num.store(static_cast<std::uint32_t>(end - i), std::memory_order_relaxed);
    if (!leaves->empty()) {
      leaves->back()->high = high_before(l->low);
      leaves->back()->next.store(l, std::memory_order_relaxed);
    }
    leaves->push_back(l);
  }
  return Status::Ok();
}

// B2-B4: the blocks' next offsets written and each block persisted back to front, one publish
// of root.head, then the old empty head block freed and the DRAM inner layer built.
void NBTree::publish_bulk(const std::vector<Leaf*>& leaves, Leaf* old_head) {
  for (std::size_t i = leaves.size(); i-- > 0;) {  // B2: back to front
    Leaf* l = leaves[i];
    pm::store(&block(l)->next, link_to(i + 1 < leaves.size() ? leaves[i + 1] : nullptr));
    pm::persist(block(l), node_size_);
  }
  pm::publish(&root_->head, link_to(leaves[0]));  // B3: one switch
  pm::persist(&root_->head, sizeof(std::uint64_t));
  pm_free(old_head->data_off, node_size_);  // B4
  drop_dram(old_head);
  head_.store(leaves[0], std::memory_order_release);
  std::lock_guard<sync::SpinLock> lock(inner_mu_);
  build_inner_from_leaves(leaves);
}

// --- verify ---------------------------------------------------------------------------------------

Status NBTree::verify_leaf(const Leaf* leaf, std::uint64_t* live) const {
  const pm::Pool& p = *pool_;
  const std::uint64_t b = leaf->bitmap.load(std::memory_order_acquire);
  if ((b & Leaf::kSmoBit) != 0 || leaf->copy_ptr.load(std::memory_order_acquire) != nullptr ||
      leaf->flag.load(std::memory_order_acquire) != 0) {
    return p.error(Code::corrupted, "verify: leaf with an SMO in progress on a quiescent tree");
  }
  const std::uint32_t num = leaf->num.load(std::memory_order_relaxed);
  const int limit = std::min<int>(static_cast<int>(num), cap_);
  if (limit < 64 && (b >> limit) != 0)
    return p.error(Code::corrupted, "verify: committed bit at or above num/capacity");
  if (p.checked<BlockHeader>(leaf->data_off, node_size_, block_align(node_size_)) == nullptr)
    return p.error(Code::corrupted, "verify: leaf block offset out of bounds");
  const Entry* e = entries(leaf);
  std::vector<std::uint64_t> keys;
  std::vector<std::string_view> byte_keys;  // bytes mode
  for (std::uint64_t bits = b; bits != 0; bits &= bits - 1) {
    const int i = __builtin_ctzll(bits);
    const std::uint64_t k = e[i].key;
    if (k == 0) continue;
    Probe kp;
    if (bytes_) {
      if (!index_common::read_record(p, k, keys_.max_key(), &kp.bytes))
        return p.error(Code::corrupted, "verify: key record " + std::to_string(k) + " unreadable");
      kp.fp = index_common::fingerprint_bytes(kp.bytes);
    } else {
      kp.word = k;
      kp.fp = fingerprint(k);
    }
    auto shown = [&] { return bytes_ ? "record " + std::to_string(k) : std::to_string(k); };
    if (!in_range(leaf, kp))  // memcmp order in bytes mode
      return p.error(Code::corrupted, "verify: key " + shown() + " outside its leaf");
    if (leaf->fp(i) != kp.fp)
      return p.error(Code::corrupted, "verify: fingerprint does not match key " + shown());
    if (leaf->keys[i].load(std::memory_order_relaxed) != k)
      return p.error(Code::corrupted, "verify: announced key differs from the PM key");
    const std::uint64_t pl = payload_of(e[i].value);
    if ((pl & kOutOfLine) != 0 &&
        p.checked<ValueRecord>(pl & ~kOutOfLine, sizeof(ValueRecord), pm::Allocator::kMinBlock) ==
            nullptr)
      return p.error(Code::corrupted, "verify: value record offset out of bounds");
    if (bytes_) byte_keys.push_back(kp.bytes);
    else keys.push_back(k);
  }
  std::sort(keys.begin(), keys.end());
  std::sort(byte_keys.begin(), byte_keys.end());
  if (std::adjacent_find(keys.begin(), keys.end()) != keys.end() ||
      std::adjacent_find(byte_keys.begin(), byte_keys.end()) != byte_keys.end())
    return p.error(Code::corrupted, "verify: a key is live twice in one leaf");
  *live += keys.size() + byte_keys.size();
  return Status::Ok();
}

Status NBTree::verify_inner(const Inner* node, std::uint64_t low, std::uint64_t high,
                           std::vector<const Leaf*>* leaves) const {
  const pm::Pool& p = *pool_;
  const int n = node->count.load(std::memory_order_relaxed);
  if (n < 1 || n > fanout_) return p.error(Code::corrupted, "verify: inner node count out of range");
  if ((node->version.load(std::memory_order_relaxed) & 1) != 0)
    return p.error(Code::corrupted, "verify: inner node left locked");
  if (!bound_eq(node->keys[0].load(std::memory_order_relaxed), low) ||
      !bound_eq(node->high.load(std::memory_order_relaxed), high))
    return p.error(Code::corrupted, "verify: inner node range differs from its parent's entry");
  for (int i = 0; i < n; ++i) {
    const std::uint64_t lo = node->keys[i].load(std::memory_order_relaxed);
    const std::uint64_t hi =
        i + 1 < n ? high_before(node->keys[i + 1].load(std::memory_order_relaxed)) : high;
    if (i + 1 < n && !bound_less(lo, node->keys[i + 1].load(std::memory_order_relaxed)))
      return p.error(Code::corrupted, "verify: inner keys not strictly increasing");
    void* c = node->children[i].load(std::memory_order_relaxed);
    if (c == nullptr) return p.error(Code::corrupted, "verify: null child");
    if (node->level == 1) {
      const auto* l = static_cast<const Leaf*>(c);
      if (!bound_eq(l->low, lo) || !bound_eq(l->high, hi))
        return p.error(Code::corrupted, "verify: leaf range differs from its parent's entry");
      leaves->push_back(l);
    } else {
      const auto* in = static_cast<const Inner*>(c);
      if (in->level != node->level - 1) return p.error(Code::corrupted, "verify: level mismatch");
      if (Status s = verify_inner(in, lo, hi, leaves); !s.ok()) return s;
    }
  }
  return Status::Ok();
}

Status NBTree::verify() const {
  const pm::Pool& p = *pool_;
  if (root_->zero_present > 1) return p.error(Code::corrupted, "verify: zero_present not 0/1");
  std::vector<const Leaf*> chain;
  const Leaf* l = head_.load(std::memory_order_acquire);
  std::uint64_t pm_link = root_->head;
  std::uint64_t expect_low = first_low_;
  std::uint64_t live = 0;
  const std::size_t bound = p.size() / node_size_ + 1;
  while (l != nullptr) {
    if (chain.size() > bound) return p.error(Code::corrupted, "verify: leaf chain has a cycle");
    if (!index_common::valid_tag(block(l)->tag) || pm_link != link_to(l))
      return p.error(Code::corrupted, "verify: PM links (offset, tag) differ from the leaf chain");
    const bool nonempty = bytes_ ? l->high == kMaxKey || bound_less(l->low, l->high)
                                 : l->high >= l->low;
    if (!bound_eq(l->low, expect_low) || !nonempty)
      return p.error(Code::corrupted, "verify: leaf ranges do not tile the key space");
    if (Status s = verify_leaf(l, &live); !s.ok()) return s;
    chain.push_back(l);
    pm_link = block(l)->next;
    const Leaf* next = l->next.load(std::memory_order_acquire);
    if (next == nullptr) {
      if (l->high != kMaxKey) return p.error(Code::corrupted, "verify: last leaf does not end at max");
      if (pm_link != index_common::kChainEnd)
        return p.error(Code::corrupted, "verify: PM chain does not end with the last leaf");
    } else {
      expect_low = bytes_ ? l->high : l->high + 1;  // bytes: high is exclusive
    }
    l = next;
  }
  if (chain.empty()) return p.error(Code::corrupted, "verify: no leaves");
  std::vector<const Leaf*> from_inner;
  const Inner* root = root_node_.load(std::memory_order_acquire);
  if (root->sibling.load(std::memory_order_relaxed) != nullptr)
    return p.error(Code::corrupted, "verify: root has a sibling");
  if (Status s = verify_inner(root, first_low_, kMaxKey, &from_inner); !s.ok()) return s;
  if (from_inner != chain)
    return p.error(Code::corrupted, "verify: inner nodes reach other leaves than the chain");
  return Status::Ok();
}

// --- misc -----------------------------------------------------------------------------------------

Footprint NBTree::footprint() const {
  Footprint f;
  const auto s = pool_->allocator().stats();
  f.pm_bytes = s.bytes_in_use;
  f.pm_reserved = s.bytes_reserved;
  // Leaf metadata and inner nodes (dram_; replaced leaves count until the epoch frees them).
  f.dram_bytes = dram_.bytes_in_use() + (bytes_ ? seps_.dram_bytes() : 0);
  return f;
}

std::size_t NBTree::leaf_count() const {
  auto guard = epochs_.pin();  // the chain may change (and old leaves be freed) meanwhile
  std::size_t n = 0;
  // untag: a leaf frozen by an SMO in flight (S9) carries the frozen bit in its next word.
  for (const Leaf* l = head_.load(std::memory_order_acquire); l != nullptr;
       l = Leaf::untag(l->next.load(std::memory_order_acquire))) {
    ++n;
  }
  return n;
}

Leaf* NBTree::leaf_for_testing(std::uint64_t key) const { return find_leaf(probe_of_word(key)); }

bool NBTree::peek_for_testing(const Leaf* leaf, std::uint64_t key, std::uint64_t* word) const {
  const Entry* e = entries(leaf);
  const std::uint64_t b = leaf->bitmap.load(std::memory_order_acquire) & ~Leaf::kSmoBit;
  for (std::uint64_t bits = b; bits != 0; bits &= bits - 1) {
    const int i = __builtin_ctzll(bits);
    if (pm::load_acquire(&e[i].key) == key) {
      *word = pm::load_acquire(&e[i].value);
      return true;
    }
  }
  return false;
}

void NBTree::corrupt_for_testing(int what) {
  Leaf* l = head_.load(std::memory_order_acquire);
  switch (what) {
    case 0: {  // a wrong fingerprint on the first committed slot
      const std::uint64_t b = l->bitmap.load(std::memory_order_relaxed);
      if (b == 0) return;
      const int i = __builtin_ctzll(b);
      l->fpw[i >> 3].fetch_xor(std::uint64_t{1} << ((i & 7) * 8), std::memory_order_relaxed);
      break;
    }
    case 1:  // a leaf range that no longer matches its parent
      ++l->high;
      break;
    case 2:  // the PM chain skips a block
      pm::publish(&root_->head, block(l)->next);
      break;
    case 3: {  // bytes mode: the second leaf's low bound (a DRAM separator) raised to "\xff..."
      const Leaf* n = Leaf::untag(l->next.load(std::memory_order_relaxed));
      if (!bytes_ || n == nullptr) return;
      const std::string_view v = index_common::SeparatorStore::view(n->low);
      if (!v.empty()) const_cast<char&>(v[0]) = '\xff';
      break;
    }
    default:
      break;
  }
}

void NBTree::count_chain(std::uint64_t* records, std::uint64_t* blocks) const {
  const pm::Pool& p = *pool_;
  *records = root_->zero_present == 1 ? 1 : 0;
  *blocks = 0;
  for (std::uint64_t word = root_->head; word != index_common::kChainEnd;) {
    const auto* hdr =
        p.checked<BlockHeader>(index_common::link_off(word), node_size_, block_align(node_size_));
    if (hdr == nullptr || *blocks > p.size() / node_size_) {
      *records = *blocks = pm::kNoCount;
      return;
    }
    const Entry* e = reinterpret_cast<const Entry*>(hdr + 1);
    for (int i = 0; i < cap_; ++i) *records += e[i].key != 0 ? 1 : 0;
    ++*blocks;
    word = hdr->next;
  }
}

Status NBTree::close() {
  if (!closed_) {
    epochs_.drain();
    // The counts let the next open see a chain that lost blocks (one read-only walk here).
    std::uint64_t records = 0, blocks = 0;
    count_chain(&records, &blocks);
    pool_->close_clean(records, blocks);
    closed_ = true;
  }
  return Status::Ok();
}

}  // namespace pmindex::nbtree

// DPTree operations, log, merge (dptree.h). Recovery and verify(): dptree_recovery.h. Templates
// over the protocol policy: tests instantiate known-bad variants.
#pragma once

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <mutex>

#include "index/common/hybrid_checks.h"
#include "index/common/prefetch.h"
#include "index/dptree/dptree.h"

namespace pmindex::dptree {

namespace detail {
inline bool test_bit(const std::uint64_t* bm, std::uint32_t i) { return (bm[i / 64] >> (i % 64) & 1) != 0; }
inline void set_bit(std::uint64_t* bm, std::uint32_t i) { bm[i / 64] |= std::uint64_t{1} << (i % 64); }
inline void clear_bit(std::uint64_t* bm, std::uint32_t i) { bm[i / 64] &= ~(std::uint64_t{1} << (i % 64)); }
inline std::uint64_t popcount(const std::uint64_t* bm) {
  return std::popcount(bm[0]) + std::popcount(bm[1]) + std::popcount(bm[2]) + std::popcount(bm[3]);
}
// The lines of one leaf a merge step wrote (a fingerprint byte and a slot per record, many
// to a line), each flushed once, in address order. A leaf starts on a line (its block is
// 256-B aligned in a line-aligned pool) and spans at most 128 lines.
class LeafLines {
 public:
  explicit LeafLines(const char* leaf) : leaf_(leaf) {}
  void add(const void* p) {
    const auto i = static_cast<std::size_t>(static_cast<const char*>(p) - leaf_) / 64;
    bits_[i / 64] |= std::uint64_t{1} << (i % 64);
  }
  void flush() {
    for (std::size_t w = 0; w < 2; ++w)
      for (std::uint64_t b = bits_[w]; b != 0; b &= b - 1)
        pm::flush(leaf_ + 64 * (64 * w + static_cast<std::size_t>(std::countr_zero(b))), 1);
    bits_[0] = bits_[1] = 0;
  }

 private:
  const char* leaf_;
  std::uint64_t bits_[2] = {0, 0};
};
static_assert(leaf_bytes(kMaxSlots) <= 128 * 64);

// A record's fingerprint and slot stored (M1, M1b, M2, P3), their lines noted for the flush.
inline void write_slot(const LeafView& v, LeafLines& lines, std::uint32_t s, const Slot& rec) {
  pm::store(&v.fp()[s], key_fp(key_hash(rec.key)));
  pm::store(v.slot(s), rec);
  lines.add(&v.fp()[s]);
  lines.add(v.slot(s));
}
}  // namespace detail

template <class P>
DPTree<P>::DPTree(std::unique_ptr<pm::Pool> pool, std::uint32_t slots, Config config)
    : pool_(std::move(pool)), slots_(slots), leaf_bytes_(leaf_bytes(slots)),
      off_bits_(off_bits_for(pool_->size())), config_(config), inner_(kInnerKeys, inner_arena_) {
  keys_.configure(pool_.get(), pool_->info().layout.key_mode, 8);
}

template <class P>
Result<std::unique_ptr<Index>> DPTree<P>::create(std::unique_ptr<pm::Pool> pool,
                                                 const Options& o, Config config) {
  const std::uint32_t s = o.node_size == 0 ? kDefaultSlots : slots_for(o.node_size);
  std::unique_ptr<DPTree> idx(new DPTree(std::move(pool), s, config));
  if (Status st = idx->check_leaf_words(); !st.ok()) return st;
  if (Status st = idx->init_root(o); !st.ok()) return st;
  idx->start_merger();
  return std::unique_ptr<Index>(std::move(idx));
}

// C1: the root object and one empty leaf (bound ~0, its own tag in both metadata versions, its
// next the end mark) as chain 0, persisted; head[0] the leaf's tagged link, log_head the end
// mark (an empty log); then the root published (pool.set_root: one persisted 8-byte store).
// A crash before it leaves nothing.
template <class P>
Status DPTree<P>::init_root(const Options& o) {
  pm::Pool& p = *pool_;
  Code code = Code::ok;
  use_log_pages(log_page_bytes_for(slots_));
  const std::uint64_t off = p.allocator().allocate(sizeof(Root), &code);
  const std::uint64_t leaf = off != 0 ? p.allocator().allocate(leaf_bytes_, &code) : 0;
  if (leaf == 0) {
    if (off != 0) p.allocator().deallocate(off, sizeof(Root));
    return p.error(code, "dptree: no space for the root object");
  }
  const LeafView v = view(leaf);
  const std::uint64_t tag = tags_.next();
  pm::zero(v.meta(0), 128);
  pm::store(&v.meta(0)->bound, ~std::uint64_t{0});
  pm::store(&v.meta(0)->next, index_common::kChainEnd);
  pm::store(&v.meta(0)->tag, tag);
  pm::store(&v.meta(1)->tag, tag);
  pm::persist(v.meta(0), 128);
  Root* r = p.at<Root>(off);
  pm::zero(r, sizeof(Root));
  pm::store(&r->magic, kRootMagic);
  pm::store(&r->state, state_word(0, 0));
  pm::store(&r->head[0], index_common::make_link(leaf, tag));
  pm::store(&r->log_head, index_common::kChainEnd);
  pm::store(&r->slots, slots_);
  pm::store(&r->key_mode, static_cast<std::uint32_t>(p.info().layout.key_mode));
  pm::store(&r->max_key_size, std::uint32_t{8});
  pm::store(&r->max_value_size, std::uint32_t{o.max_value_size});
  pm::store(&r->log_page_bytes, static_cast<std::uint32_t>(log_page_bytes_));
  pm::store(&r->stamp, index_common::make_root_stamp(p.info().layout));
  pm::persist(r, sizeof(Root));
  p.set_root(off);  // C1: published
  root_ = r;
  auto l = std::make_shared<LeafInfo>();
  l->off = leaf;
  l->bound = ~std::uint64_t{0};
  l->tag = tag;
  chain_ = {l};
  rebuild_inner();
  reset_buffer();
  return Status::Ok();
}

// --- keys, values ----------------------------------------------------------------------------

template <class P>
Code DPTree<P>::check(std::string_view key, std::string_view value) const {
  if (Code c = keys_.check(key); c != Code::ok) return c;
  if (value.size() > 8) return Code::value_too_large;
  if (value.size() != 8) return Code::invalid_argument;
  return Code::ok;
}

template <class P>
std::uint64_t DPTree<P>::word_of(std::string_view key) {
  std::uint64_t w = 0;
  for (std::size_t i = 0; i < 8; ++i)
    w = w << 8 | (i < key.size() ? static_cast<unsigned char>(key[i]) : 0);
  return w;
}

template <class P>
std::uint64_t DPTree<P>::value_of(std::string_view v) {
  std::uint64_t x;
  std::memcpy(&x, v.data(), 8);
  return x;
}

// --- base tree -------------------------------------------------------------------------------

template <class P>
unsigned DPTree<P>::off_bits_for(std::size_t pool_size) {
  return static_cast<unsigned>(std::bit_width((pool_size - 1) >> 8));  // offsets < pool_size
}

// leaf_word's two fields must fit one word for every leaf the pool can hold: true up to 1 TiB
// for any leaf size (offsets / 256 in 32 bits, fewer than 2^32 leaves), beyond it for larger
// leaves. A larger pool is refused before anything is read or written.
template <class P>
Status DPTree<P>::check_leaf_words() const {
  const std::uint64_t max_leaves = pool_->size() / leaf_bytes_;
  const unsigned index_bits = std::min(32u, 64 - off_bits_);
  if (max_leaves >> index_bits != 0)
    return pool_->error(Code::invalid_argument,
                        "dptree: a pool of " + std::to_string(pool_->size()) +
                            " bytes could hold more leaves of " + std::to_string(leaf_bytes_) +
                            " bytes than its inner layer can name (use a smaller pool or larger "
                            "leaves)");
  return Status::Ok();
}

template <class P>
std::uint64_t DPTree<P>::leaf_word_for(std::uint64_t k) const {
  auto token = [](std::uint64_t) -> std::optional<std::uint64_t> { return 0; };
  return inner_.descend<kInnerKeys>(index_common::WordProbe{k}, token).first;
}

// Probes the key's window: bitmap and fingerprint first, so a miss reads one or two
// fingerprint lines and no slot.
template <class P>
int DPTree<P>::window_slot(const LeafView& v, const std::uint64_t* bitmap,
                           std::uint64_t k) const {
  const std::uint64_t h = key_hash(k);
  const std::uint8_t fp = key_fp(h);
  const std::uint32_t mask = slots_ - 1, w = window(slots_);
  for (std::uint32_t i = 0; i < w; ++i) {
    const std::uint32_t s = (static_cast<std::uint32_t>(h) + i) & mask;
    if (detail::test_bit(bitmap, s) && v.fp()[s] == fp && v.slot(s)->key == k)
      return static_cast<int>(s);
  }
  return -1;
}

template <class P>
void DPTree<P>::request(std::uint64_t off, std::uint64_t k) const {
  const LeafView v = view(off);
  const auto home = static_cast<std::uint32_t>(key_hash(k)) & (slots_ - 1);
  index_common::prefetch_lines(v.meta(gv_), 64);
  index_common::prefetch_lines(v.fp() + home, 64);
  index_common::prefetch_lines(v.slot(home), 64);
}

template <class P>
std::uint64_t DPTree<P>::requested_leaf(std::uint64_t k) const {
  const std::uint64_t off = word_off(leaf_word_for(k));
  request(off, k);
  return off;
}

template <class P>
void DPTree<P>::sort_order(LeafInfo& l) const {
  const LeafView v = view(l.off);
  l.order.clear();
  for (std::uint32_t s = 0; s < slots_; ++s)
    if (detail::test_bit(l.bitmap, s)) l.order.push_back(static_cast<std::uint8_t>(s));
  std::sort(l.order.begin(), l.order.end(), [&](std::uint8_t a, std::uint8_t b) {
    return v.slot(a)->key < v.slot(b)->key;
  });
}

// The inner layer over the chain: leaf i covers keys >= bound[i-1] + 1.
template <class P>
void DPTree<P>::rebuild_inner() {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> items;
  items.reserve(chain_.size());
  for (std::size_t i = 0; i < chain_.size(); ++i) {
    chain_[i]->index = static_cast<std::uint32_t>(i);
    items.emplace_back(i == 0 ? 0 : chain_[i - 1]->bound + 1, leaf_word(*chain_[i]));
  }
  if (items.size() == 1) {
    inner_.init_single(items[0].second);
  } else {
    inner_.bulk_build(items, 0.9, 1);
  }
}

// M2: a fresh leaf holding recs[*i..] (at most `per`; fewer if a key finds its window full),
// slots and fingerprints written and flushed. Its bound is its last key, or `last_bound` if it
// takes the last record. Unreachable until the flip (M5); a crash leaves it to the allocator.
template <class P>
typename DPTree<P>::LeafPtr DPTree<P>::build_leaf(const std::vector<Record>& recs,
                                                  std::size_t* i, std::size_t per,
                                                  std::uint64_t last_bound, Code* code,
                                                  MergeStats& tally) {
  const std::uint64_t off = pm_alloc(leaf_bytes_, code);
  if (off == 0) return nullptr;
  auto l = std::make_shared<LeafInfo>();
  l->off = off;
  l->tag = tags_.next();  // written with meta[nv] (M3), before the flip links the leaf
  const LeafView v = view(off);
  const std::uint32_t mask = slots_ - 1, w = window(slots_);
  std::size_t placed = 0;
  detail::LeafLines lines(v.base);
  while (*i < recs.size() && placed < per) {
    const auto [k, val] = recs[*i];
    const std::uint64_t h = key_hash(k);
    std::uint32_t s = slots_;
    for (std::uint32_t j = 0; j < w && s == slots_; ++j) {
      const std::uint32_t c = (static_cast<std::uint32_t>(h) + j) & mask;
      if (!detail::test_bit(l->bitmap, c)) s = c;
    }
    if (s == slots_) break;  // window full: the next leaf takes it
    detail::set_bit(l->bitmap, s);
    detail::write_slot(v, lines, s, Slot{k, val});
    l->order.push_back(static_cast<std::uint8_t>(s));  // recs are in key order: so is this
    ++*i;
    ++placed;
  }
  lines.flush();  // M2
  l->bound = *i == recs.size() ? last_bound : recs[*i - 1].first;
  ++tally.leaves_created;
  return l;
}

// --- buffer and log --------------------------------------------------------------------------

template <class P>
void DPTree<P>::reset_buffer() {
  buffer_ = std::make_unique<BufferTree>();
  const std::size_t min = config_.min_buffer != 0 ? config_.min_buffer : slots_;
  capacity_ = std::max<std::size_t>(
      min, static_cast<std::size_t>(config_.merge_fraction * static_cast<double>(base_records_)));
  bloom_.reset(capacity_, config_.bloom_fp);
  puts_ = 0;
}

template <class P>
bool DPTree<P>::buffered_entry(std::uint64_t k, BufEntry* e) const {
  return bloom_.may_contain(k) && buffer_->find(k, e) != nullptr;
}

// The newest buffered entry for k: the front's, else the middle's (each behind its Bloom
// filter). Under mu_ (shared or exclusive); the middle is read-only while it exists.
template <class P>
bool DPTree<P>::buffered_any(std::uint64_t k, BufEntry* e) const {
  return buffered_entry(k, e) || buffered_middle(k, e);
}

template <class P>
bool DPTree<P>::buffered_middle(std::uint64_t k, BufEntry* e) const {
  return middle_ != nullptr && middle_bloom_.may_contain(k) && middle_->find(k, e) != nullptr;
}

template <class P>
bool DPTree<P>::live_below_front(std::uint64_t k) const {
  BufEntry m;
  if (buffered_middle(k, &m)) return !m.tombstone;
  return in_base(k);
}

template <class P>
Kind DPTree<P>::buffer_put(std::uint64_t k, std::uint64_t v, Kind kind) {
  const Kind prior = buffer_->put(k, v, kind);
  const bool was_live = prior == Kind::put || prior == Kind::blind;
  puts_ = puts_ + (kind == Kind::tombstone ? 0 : 1) - (was_live ? 1 : 0);
  bloom_.add(k);
  return prior;
}

// Holds back log pages until the reserve has `pages` (false: pool full). The pages are
// DRAM-held only: after a crash they are unreachable, hence free again.
template <class P>
bool DPTree<P>::top_up_pages(std::size_t pages) {
  while (reserve_.size() < pages) {
    Code code = Code::ok;
    const std::uint64_t off = pm_alloc(log_page_bytes_, &code);
    if (off == 0) return false;
    reserve_.push_back(off);
  }
  return true;
}

template <class P>
void DPTree<P>::release_reserve() {
  for (std::uint64_t off : reserve_) pm_free(off, log_page_bytes_);
  reserve_.clear();
}

// A write that adds a buffered record first makes sure a partial merge could re-log it: the
// reserve covers every live buffered record plus this one, else a full merge (which empties
// the buffer) is tried, else the write is refused before it is logged.
template <class P>
Code DPTree<P>::room_for_put() {
  if (top_up_reserve(live_puts() + 1)) return Code::ok;
  if (must_wait_for_merge()) return Code::pool_full;  // write_op waits, then runs it again
  if (buffer_->size() != 0 && merge_unless_stalled() == Code::ok && top_up_reserve(puts_ + 1))
    return Code::ok;
  return Code::pool_full;
}

// A synchronous merge, unless the last one failed for space and nothing was freed since and
// no tombstone logged (it would fail the same way, at O(base) cost: stall_).
template <class P>
Code DPTree<P>::merge_unless_stalled() {
  if (stall_.on && deletes_logged_ == stall_.deletes &&
      pool_->allocator().stats().bytes_in_use >= stall_.bytes_in_use)
    return Code::pool_full;
  const Code c = merge();
  stall_ = c == Code::pool_full
               ? Stall{true, pool_->allocator().stats().bytes_in_use, deletes_logged_}
               : Stall{};
  return c;
}

// L4-L5: a new last page: header (next = the end mark, first_lsn, its own tag) persisted, then
// linked (root.log_head for the first page, the previous page's next otherwise) with one
// persisted 8-byte store of the tagged link.
template <class P>
Code DPTree<P>::new_log_page(std::size_t keep) {
  Code code = Code::ok;
  std::uint64_t off = pm_alloc(log_page_bytes_, &code);
  if (off == 0 && reserve_.size() > keep) {  // P2's re-log (keep = 0), or a spare page
    off = reserve_.back();
    reserve_.pop_back();
  }
  if (off == 0) return code;
  LogPageHeader* h = pool_->at<LogPageHeader>(off);
  const std::uint64_t tag = tags_.next();
  pm::store(&h->next, index_common::kChainEnd);
  pm::store(&h->first_lsn, next_lsn_);
  pm::store(&h->tag, tag);
  pm::persist(h, sizeof(LogPageHeader));  // L4
  std::uint64_t* link = log_pages_.empty() ? &root_->log_head
                                           : &pool_->at<LogPageHeader>(log_pages_.back())->next;
  pm::publish(link, index_common::make_link(off, tag));  // L5
  pm::persist(link, 8);
  log_pages_.push_back(off);
  tail_slot_ = 0;
  return Code::ok;
}

// L1-L3: the record's words, then its validity word, then one persist of its line. The
// operation is durable when this returns ok. A full pool first tries a merge (which frees the
// log pages it covers), and if that cannot split, a partial merge (P1-P5: it frees them too).
template <class P>
Code DPTree<P>::log_append(std::uint64_t k, std::uint64_t v, std::uint64_t op) {
  if (log_pages_.empty() || tail_slot_ == records_per_page_) {
    // Reserve pages above what the buffer's live records (this one included) need are free
    // to take: a tombstone is never re-logged, so it may take the spare page too.
    auto keep = [&] {
      return op == kOpPut ? reserve_need(live_puts() + 1) : relog_pages(live_puts());
    };
    Code c = new_log_page(keep());
    if (c == Code::pool_full && must_wait_for_merge()) return c;  // write_op waits, re-runs
    if (c == Code::pool_full && buffer_->size() != 0) {
      // A partial merge is retried only after a record was logged since the last one: with
      // nothing new to apply it would free nothing, only re-log the buffer again.
      if (merge_unless_stalled() != Code::ok && next_lsn_ != partial_lsn_) {
        (void)merge_partial();
        partial_lsn_ = next_lsn_;
      }
      // A partial merge leaves the re-logged records' tail page, maybe with room: the next
      // record goes there (R2 wants every page but the last full).
      c = log_pages_.empty() || tail_slot_ == records_per_page_ ? new_log_page(keep()) : Code::ok;
    }
    if (c != Code::ok) return c;
  }
  append_record(k, v, op);
  return Code::ok;
}

// L1-L3 into the tail page, which has a free slot.
template <class P>
void DPTree<P>::append_record(std::uint64_t k, std::uint64_t v, std::uint64_t op) {
  if (next_lsn_ > kMaxLsn) index_common::fatal("dptree", "log sequence numbers exhausted");
  LogRecord* r = pool_->at<LogRecord>(log_pages_.back() + 64 * (1 + std::uint64_t{tail_slot_}));
  pm::store(&r->key, k);  // L1
  pm::store(&r->value, v);
  pm::store(&r->op, op);
  pm::publish(&r->validity, validity_word(k, v, op, next_lsn_));  // L2
  pm::persist(r, sizeof(LogRecord));                               // L3
  ++tail_slot_;
  ++next_lsn_;
}

// The buffer reached its capacity, or the log (every write since the last merge, rewrites of
// buffered keys included) four times it: repeated writes of fewer keys than the capacity would
// otherwise grow the log without bound. A full pool retries at a later write.
// Background mode: the front becomes the middle buffer and the merge thread is woken (B1),
// unless a merge still runs (the next write then waits: B5), or the last background merge
// failed (pool full), when the writer merges synchronously as in the first landing.
template <class P>
void DPTree<P>::maybe_merge() {
  if (!front_full() || merging_) return;
  if (background_ && !bg_failed_) {
    rotate();
  } else {
    (void)merge_unless_stalled();
  }
}

// The front's records since it began (since the middle's last LSN while a merge runs).
template <class P>
bool DPTree<P>::front_full() const {
  const std::uint64_t since = merging_ ? middle_lsn_ : covered_;
  return buffer_->size() >= capacity_ || next_lsn_ - 1 - since >= 4 * capacity_;
}

// --- background merge (PROTOCOL.md B1-B5) -----------------------------------------------------

// Every write runs under the exclusive lock through here. B5 (backpressure): a writer waits
// only when the front is full while the middle's merge still runs. A write whose pool is full
// needs a synchronous merge, which cannot run beside the background one: it returns early
// with retry_ set (before it logged anything), waits for the merge, and runs again.
template <class P>
template <class Fn>
Code DPTree<P>::write_op(Fn body) {
  Lock lock(mu_);
  auto wait = [&](auto until) {
    ++stats_.writer_blocks;  // counted before the wait: a test sees the writer blocked
    const auto t0 = std::chrono::steady_clock::now();
    wait_for(lock, until);
    stats_.writer_blocked_ns += static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
            .count());
  };
  for (;;) {
    if (merging_ && front_full()) wait([&] { return !merging_; });  // B5
    drain_deferred();
    const Code c = body();
    if (!retry_) return c;
    retry_ = false;
    wait([&] { return !merging_; });
  }
}

template <class P>
void DPTree<P>::free_block(std::uint64_t off, std::size_t bytes) {
  if (defer_frees_) {
    deferred_.emplace_back(off, bytes);
  } else {
    pm_free(off, bytes);
  }
}

// Under the exclusive lock, in a writer (or at close): the merge thread's freed blocks.
template <class P>
void DPTree<P>::drain_deferred() {
  for (const auto& [off, bytes] : deferred_) pm_free(off, bytes);
  deferred_.clear();
}

template <class P>
bool DPTree<P>::must_wait_for_merge() {
  if (!merging_) return false;
  retry_ = true;
  return true;
}

// B1 (DRAM only, under the exclusive lock): the full front buffer, its Bloom filter and its
// live-put count become the middle buffer, whose records are the log's LSNs up to middle_lsn_;
// a fresh front takes the next writes (their records follow in the same log). The merge
// thread is woken.
template <class P>
void DPTree<P>::rotate() {
  middle_ = std::move(buffer_);
  middle_bloom_ = std::move(bloom_);
  middle_puts_ = puts_;
  middle_lsn_ = next_lsn_ - 1;
  reset_buffer();
  merging_ = true;
  cv_.notify_all();
}

template <class P>
void DPTree<P>::merge_loop() {
  Lock lock(mu_);
  for (;;) {
    wait_for(lock, [&] { return stop_ || merging_; });
    if (merging_) {
      merge_middle(lock);
      continue;
    }
    return;  // stop_, and no merge pending
  }
}

// The merge thread's merge of the middle buffer. Called and returns with the lock held.
// B2 (lock released): M1-M3 exactly as the synchronous merge, over the middle's entries:
//   writes go only to slots free in meta[gv], to fresh leaves and to meta[nv], so readers
//   (shared lock) keep reading version gv beside it, and writers (exclusive lock) append to
//   the log and the front. No write touches the base tree while merging_ (B3: updates of base
//   keys go through the front), so the leaf records the merge copies cannot change.
// B4 (exclusive lock): M4-M5 with covered = middle_lsn_, the DRAM chain and inner layer
//   swapped, M6, then the log pages wholly <= covered freed with log_head moved to the page
//   holding covered + 1 (P5's trim); the middle buffer dropped. Readers wait for this swap
//   only. A full pool (M2) folds the middle back into the front (unrotate) and the writers
//   merge synchronously until one succeeds.
template <class P>
void DPTree<P>::merge_middle(Lock& lock) {
  const std::vector<BufEntry> entries = middle_->sorted();
  const std::uint64_t covered = middle_lsn_;
  const unsigned nv = 1 - gv_;
  lock.unlock();
  MergeStats tally;
  std::vector<LeafPtr> next;
  std::vector<std::uint64_t> replaced, abandoned;
  std::int64_t delta = 0;
  const Code c = merge_build(entries, &next, &replaced, &delta, tally, &abandoned);  // B2: M1, M2
  if (c == Code::ok && !P::kFlipBeforeMeta) write_meta(next, nv);        // B2: M3
  // The merge thread allocates nothing more in this merge: the leaf blocks its allocator
  // cache fetched beyond what the splits used go back to the central lists, where writers
  // (and their reclaim pass at a full pool) can reach them. Otherwise up to a batch of leaf
  // blocks per class would sit out of reach until the next merge, and at a full pool a
  // remove could be refused (test_pool_full in background mode).
  if (!P::kKeepMergeCache) pm_release_cache();
  lock.lock();
  held_ = true;  // tests: hold before the flip
  wait_for(lock, [&] { return !hold_ || stop_; });
  held_ = false;
  defer_frees_ = true;
  for (std::uint64_t off : abandoned) free_block(off, leaf_bytes_);
  if (c != Code::ok) {
    defer_frees_ = false;
    unrotate();
    bg_failed_ = true;
    ++stats_.failed_merges;
    cv_.notify_all();
    return;
  }
  flip(next, covered, /*meta_written=*/!P::kFlipBeforeMeta);  // B4: M4, M5
  install(std::move(next), replaced, delta, covered);       // M6, trim
  count_leaves(tally);
  ++stats_.background_merges;
  middle_.reset();
  middle_puts_ = 0;
  merging_ = false;
  while (reserve_.size() > reserve_need(puts_)) {  // the middle needs no re-log space now
    free_block(reserve_.back(), log_page_bytes_);
    reserve_.pop_back();
  }
  defer_frees_ = false;
  cv_.notify_all();
}

// A background merge that could not split (pool full): the middle's entries return to the
// front where the front has none for the key (the front's are newer). Their log records stay
// where they are, so the log still orders them before the front's. A blind put the front
// shadows is dropped (U2): if the front's entry is blind too, its count, settled later against
// the base alone, covers both; if the front's was counted (against the middle's put), the
// middle's is settled against the base now.
template <class P>
void DPTree<P>::unrotate() {
  middle_->for_each_from(0, [&](const BufEntry& m) {
    BufEntry f;
    if (buffer_->find(m.key, &f) == nullptr) {
      buffer_put(m.key, m.value, m.kind());
    } else if (m.blind && !f.blind && !in_base(m.key)) {
      ++settled_;
    }
    return true;
  });
  middle_.reset();
  middle_puts_ = 0;
  merging_ = false;
}

template <class P>
void DPTree<P>::start_merger() {
  if (!config_.background) return;
  background_ = true;
  if (!config_.external_merger) merger_ = std::thread([this] { merge_loop(); });
}

template <class P>
std::uint64_t DPTree<P>::pm_alloc(std::size_t bytes, Code* code) {
  if constexpr (pm::kTracing) {
    std::lock_guard<sync::SpinLock> guard(alloc_mu_);
    return pool_->allocator().allocate(bytes, code);
  } else {
    return pool_->allocator().allocate(bytes, code);
  }
}

template <class P>
void DPTree<P>::pm_free(std::uint64_t off, std::size_t bytes) {
  if constexpr (pm::kTracing) {
    std::lock_guard<sync::SpinLock> guard(alloc_mu_);
    pool_->allocator().deallocate(off, bytes);
  } else {
    pool_->allocator().deallocate(off, bytes);
  }
}

template <class P>
void DPTree<P>::pm_release_cache() {
  if constexpr (pm::kTracing) {
    std::lock_guard<sync::SpinLock> guard(alloc_mu_);
    pool_->allocator().release_thread_cache();
  } else {
    pool_->allocator().release_thread_cache();
  }
}

template <class P>
bool DPTree<P>::merge_step_for_testing() {
  Lock lock(mu_);
  if (!merging_ || merge_running_) return false;
  merge_running_ = true;  // one external merger at a time
  merge_middle(lock);
  merge_running_ = false;
  return true;
}

template <class P>
template <class L, class Pred>
void DPTree<P>::wait_for(L& lock, Pred pred) const {
  if constexpr (pm::kTracing) {
    // A scheduling point per round; the short sleep keeps an idle merge thread of a real
    // (unscheduled) run, e.g. the kill harness's children, from spinning a core.
    while (!pred()) {
      lock.unlock();
      pm::yield_point("dptree.wait");
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      lock.lock();
    }
  } else {
    cv_.wait(lock, pred);
  }
}

// The running merge finishes (a held one is let go); later writes merge synchronously.
template <class P>
void DPTree<P>::stop_merger() {
  {
    Lock lock(mu_);
    if (!merger_.joinable()) return;
    stop_ = true;
    hold_ = false;
    background_ = false;
    cv_.notify_all();
  }
  merger_.join();
  Lock lock(mu_);
  drain_deferred();
}

template <class P>
DPTree<P>::~DPTree() {
  stop_merger();
  if (config_.print_stats && !closed_) print_stats();  // dropped without close
}

template <class P>
void DPTree<P>::hold_merge_for_testing(bool hold) {
  Lock lock(mu_);
  hold_ = hold;
  cv_.notify_all();
}

template <class P>
bool DPTree<P>::merging() const {
  std::shared_lock lock(mu_);
  return merging_;
}

template <class P>
bool DPTree<P>::merge_held_for_testing() const {
  std::shared_lock lock(mu_);
  return held_ && hold_;
}

template <class P>
void DPTree<P>::wait_merge_for_testing() {
  Lock lock(mu_);
  wait_for(lock, [&] { return !merging_; });
}

template <class P>
std::size_t DPTree<P>::capacity() const {
  std::shared_lock lock(mu_);
  return capacity_;
}

// U2: the settled blind puts, and each buffered one whose key holds no record below it. A
// consistent cut: merges settle and drop the middle, and writers change the front, only under
// the exclusive lock.
template <class P>
std::int64_t DPTree<P>::deferred_records() const {
  std::shared_lock lock(mu_);
  std::int64_t n = settled_;
  if (buffer_->blind() != 0) {
    buffer_->for_each_from(0, [&](const BufEntry& e) {
      if (e.blind && !live_below_front(e.key)) ++n;
      return true;
    });
  }
  if (middle_ != nullptr && middle_->blind() != 0) {
    middle_->for_each_from(0, [&](const BufEntry& e) {
      if (e.blind && !in_base(e.key)) ++n;
      return true;
    });
  }
  return n;
}

// --- operations ------------------------------------------------------------------------------

template <class P>
Code DPTree<P>::find(std::string_view key, std::string* value) const {
  if (Code c = keys_.check(key); c != Code::ok) return c;
  const std::uint64_t k = word_of(key);
  std::shared_lock lock(mu_);
  const std::uint64_t off = requested_leaf(k);  // its misses overlap the buffers' probes
  BufEntry e;
  std::uint64_t v;
  if (buffered_any(k, &e)) {  // front, then middle: the newest entry wins
    if (e.tombstone) return Code::not_found;
    v = e.value;
  } else {
    const int s = probe(off, k);
    if (s < 0) return Code::not_found;
    v = view(off).slot(static_cast<std::uint32_t>(s))->value;
  }
  if (value != nullptr) value->assign(reinterpret_cast<const char*>(&v), 8);
  return Code::ok;
}

// Batched lookups (Index::find_many), under one shared lock as find (no writer runs beside
// it, so nothing read can change). The front buffer answers per key as in find (a Bloom probe,
// and for the few keys it admits the small DRAM buffer tree); the keys left for the base tree
// descend its DRAM inner layer together (InnerTree::descend_batch; each key's meta[gv] line is
// prefetched as its descent reaches it), then each key's window of fingerprints is
// prefetched, then the slots whose fingerprint matches, and probe answers from cache.
template <class P>
void DPTree<P>::find_batch(const std::string_view* keys, std::string* values, Code* codes,
                           std::size_t n) const {
  static_assert(kFindBatch <= index_common::InnerTree::kMaxBatch);
  std::uint64_t k[kFindBatch];
  std::uint8_t at[kFindBatch];  // batch position of the j-th key left for the base tree
  std::size_t base = 0;
  std::shared_lock lock(mu_);
  for (std::size_t i = 0; i < n; ++i) {
    codes[i] = keys_.check(keys[i]);
    if (codes[i] != Code::ok) continue;
    const std::uint64_t w = word_of(keys[i]);
    BufEntry e;
    if (buffered_any(w, &e)) {
      codes[i] = e.tombstone ? Code::not_found : Code::ok;
      if (!e.tombstone && values != nullptr)
        values[i].assign(reinterpret_cast<const char*>(&e.value), 8);
      continue;
    }
    k[base] = w;
    at[base++] = static_cast<std::uint8_t>(i);
  }
  if (base == 0) return;
  std::pair<std::uint64_t, std::uint64_t> found[kFindBatch];
  const unsigned gv = gv_;
  const std::uint64_t alone = inner_.descend_batch<kInnerKeys>(
      base, [&](std::size_t j) { return index_common::WordProbe{k[j]}; },
      [&](std::uint64_t w) { index_common::prefetch_lines(view(word_off(w)).meta(gv), 64); },
      [](std::uint64_t) -> std::optional<std::uint64_t> { return 0; }, found);
  std::uint64_t off[kFindBatch];
  const std::uint32_t mask = slots_ - 1, win = window(slots_);
  for (std::size_t j = 0; j < base; ++j) {
    off[j] = word_off((alone >> j & 1) != 0 ? leaf_word_for(k[j]) : found[j].first);
    const std::uint8_t* fp = view(off[j]).fp();
    const auto home = static_cast<std::uint32_t>(key_hash(k[j]));
    index_common::prefetch_lines(fp + (home & mask), 64);              // the window's first line
    index_common::prefetch_lines(fp + ((home + win - 1) & mask), 64);  // and its last (wrapping)
  }
  for (std::size_t j = 0; j < base; ++j) {  // probe's window walk, prefetching the matches
    const LeafView v = view(off[j]);
    const std::uint64_t* bitmap = v.meta(gv)->bitmap;
    const std::uint64_t h = key_hash(k[j]);
    const std::uint8_t fp = key_fp(h);
    for (std::uint32_t i = 0; i < win; ++i) {
      const std::uint32_t s = (static_cast<std::uint32_t>(h) + i) & mask;
      if (detail::test_bit(bitmap, s) && v.fp()[s] == fp)
        index_common::prefetch_lines(v.slot(s), 64);
    }
  }
  for (std::size_t j = 0; j < base; ++j) {
    const std::size_t i = at[j];
    const int s = probe(off[j], k[j]);
    codes[i] = s < 0 ? Code::not_found : Code::ok;
    if (s >= 0 && values != nullptr) {
      const std::uint64_t v = view(off[j]).slot(static_cast<std::uint32_t>(s))->value;
      values[i].assign(reinterpret_cast<const char*>(&v), 8);
    }
  }
}

template <class P>
Code DPTree<P>::insert(std::string_view key, std::string_view value) {
  if (Code c = check(key, value); c != Code::ok) return c;
  const std::uint64_t k = word_of(key), v = value_of(value);
  return write_op([&] {
    const std::uint64_t off = requested_leaf(k);
    BufEntry e;
    const bool in_buffer = buffered_any(k, &e);
    if (in_buffer ? !e.tombstone : probe(off, k) >= 0) return Code::already_present;
    if (Code c = room_for_put(); c != Code::ok) return c;
    if (Code c = log_append(k, v, kOpPut); c != Code::ok) return c;
    buffer_put(k, v, Kind::put);
    maybe_merge();
    return count_insert(Code::ok);  // size()
  });
}

// U1: a key only in the base tree is updated in place (one 8-byte store, persisted): no
// unmerged log record names it, so nothing replays over the new value. B3: not while a
// merge runs (the merge may carry a copy of the key's leaf, or the middle's older value, over
// it): then the update goes through the log and the front like a buffered one.
template <class P>
Code DPTree<P>::update(std::string_view key, std::string_view value) {
  if (Code c = check(key, value); c != Code::ok) return c;
  const std::uint64_t k = word_of(key), v = value_of(value);
  return write_op([&] {
    const std::uint64_t off = requested_leaf(k);
    BufEntry e;
    const bool in_buffer = P::kInPlaceDuringMerge ? buffered_entry(k, &e)  // known-bad (tests)
                                                  : buffered_any(k, &e);
    int s = -1;
    if (in_buffer) {
      if (e.tombstone) return Code::not_found;
    } else {
      s = probe(off, k);
      if (s < 0) return Code::not_found;
    }
    if (in_buffer || (merging_ && !P::kInPlaceDuringMerge)) {  // B3
      if (Code c = room_for_put(); c != Code::ok) return c;
      if (Code c = log_append(k, v, kOpPut); c != Code::ok) return c;
      buffer_put(k, v, Kind::put);  // over a blind put: stays blind
      maybe_merge();
      return Code::ok;
    }
    Slot* slot = view(off).slot(static_cast<std::uint32_t>(s));
    pm::publish(&slot->value, v);  // U1
    pm::persist(&slot->value, 8);
    return Code::ok;
  });
}

// U2: a blind put, as the original's upsert: logged and buffered without looking for the key
// below the buffer (no inner-layer descent, no base probe; no in-place update either). Whether
// it added a record is settled later (size()): the merge that places it knows (merge_leaf's
// `old`), a remove over it probes (remove), and deferred_records() probes the ones
// still buffered. Over a buffered entry the buffer knows: a tombstone's key was absent.
template <class P>
Code DPTree<P>::upsert(std::string_view key, std::string_view value) {
  if (Code c = check(key, value); c != Code::ok) return c;
  const std::uint64_t k = word_of(key), v = value_of(value);
  return write_op([&] {
    if (Code c = room_for_put(); c != Code::ok) return c;
    if (Code c = log_append(k, v, kOpPut); c != Code::ok) return c;
    const Kind prior = buffer_put(k, v, Kind::blind);
    maybe_merge();
    if (prior == Kind::tombstone) count_insert(Code::ok);  // size()
    return Code::ok;
  });
}

// D1: a tombstone through the log and the front buffer; the merge removes the key from the
// base (a tombstone in the front hides the middle's and the base's records meanwhile).
template <class P>
Code DPTree<P>::remove(std::string_view key) {
  if (Code c = keys_.check(key); c != Code::ok) return c;
  const std::uint64_t k = word_of(key);
  return write_op([&] {
    const std::uint64_t off = requested_leaf(k);
    BufEntry e;
    const bool in_front = buffered_entry(k, &e);
    const bool in_buffer = in_front || buffered_middle(k, &e);
    if (in_buffer ? e.tombstone : probe(off, k) < 0) return Code::not_found;
    if (Code c = log_append(k, 0, kOpDelete); c != Code::ok) return c;
    ++deletes_logged_;  // a merge may now free slots (room_for_put's stall ends)
    // U2: the tombstone replaces a blind put of the front: its count is settled first (a blind
    // put in the middle stays, and is settled with the middle).
    if (!P::kForgetBlindOnRemove && in_front && e.blind && !live_below_front(k)) ++settled_;
    buffer_put(k, 0, Kind::tombstone);
    maybe_merge();
    return count_remove(Code::ok);  // size()
  });
}

// Three sorted streams, front buffer, middle buffer (while a merge runs) and base: at each
// key the newest source wins (front, then middle, then base), tombstones are skipped, so no
// key is returned twice or with a stale value. Under the shared lock: no writer runs, and the
// merge thread writes only what version gv does not name.
template <class P>
std::size_t DPTree<P>::scan(std::string_view start, std::size_t max, ScanBuffer& out) const {
  out.clear();
  std::uint64_t k = word_of(start);
  if (start.size() > 8 && start.find_first_not_of('\0', 8) != std::string_view::npos) {
    if (k == ~std::uint64_t{0}) return 0;
    ++k;  // the smallest 8-byte key above a longer start
  }
  std::shared_lock lock(mu_);
  BufferTree::Cursor f = buffer_->cursor(k);
  BufferTree::Cursor m = middle_ != nullptr ? middle_->cursor(k) : BufferTree::Cursor{};
  const LeafInfo* l = leaf_for(k);
  std::size_t li = l->index, pos = 0;
  {
    const LeafView v = view(l->off);
    while (pos < l->order.size() && v.slot(l->order[pos])->key < k) ++pos;
  }
  auto emit = [&](std::uint64_t key, std::uint64_t val) {
    out.append(encode_u64(key), std::string_view(reinterpret_cast<const char*>(&val), 8));
  };
  while (out.size() < max) {
    // The next base record, if any.
    while (li < chain_.size() && pos == chain_[li]->order.size()) {
      ++li;
      pos = 0;
    }
    const bool have_base = li < chain_.size();
    const Slot* base = have_base ? view(chain_[li]->off).slot(chain_[li]->order[pos]) : nullptr;
    if (!have_base && !f.valid() && !m.valid()) break;
    std::uint64_t at = ~std::uint64_t{0};
    if (have_base) at = base->key;
    if (f.valid()) at = std::min(at, f.key());
    if (m.valid()) at = std::min(at, m.key());
    if constexpr (P::kOriginalScan) {  // known-bad (tests only): every source, tombstones too
      if (f.valid() && f.key() == at) emit(at, f.get().value), f.next();
      if (m.valid() && m.key() == at) emit(at, m.get().value), m.next();
      if (have_base && base->key == at) emit(at, base->value), ++pos;
      continue;
    }
    bool done = false;  // the newest source at `at` decided
    if (f.valid() && f.key() == at) {
      const BufEntry e = f.get();
      if (!e.tombstone) emit(at, e.value);
      done = true;
      f.next();
    }
    if (m.valid() && m.key() == at) {
      const BufEntry e = m.get();
      if (!done && !e.tombstone) emit(at, e.value);
      done = true;
      m.next();
    }
    if (have_base && base->key == at) {
      if (!done) emit(at, base->value);
      ++pos;
    }
  }
  return out.size();
}

// --- merge -------------------------------------------------------------------------------------

// A committed merge's leaf and blind-put counts into stats_ (a merge tallies them locally:
// one that fails frees the leaves it built and counts nothing).
template <class P>
void DPTree<P>::count_leaves(const MergeStats& tally) {
  stats_.leaves_created += tally.leaves_created;
  stats_.leaves_dropped += tally.leaves_dropped;
  stats_.leaves_folded += tally.leaves_folded;
  count_blind_new(tally.blind_new);
}

template <class P>
void DPTree<P>::count_blind_new(std::uint64_t n) {
  stats_.blind_new += n;
  settled_ += static_cast<std::int64_t>(n);  // U2: size()
}

template <class P>
Code DPTree<P>::merge_for_testing() {
  Lock lock(mu_);
  wait_for(lock, [&] { return !merging_; });
  return merge();
}

// A merge's in-place step for one put (merge_leaf, merge_partial): the first slot of the key's
// hash window that is free in `used`, marked there and in n's bitmap, the key's old slot
// (`old` >= 0) cleared from n's bitmap, *delta counting a new key. slots_ (nothing changed) if
// the window has no free slot.
template <class P>
std::uint32_t DPTree<P>::place_in_window(std::uint64_t key, int old, std::uint64_t* used,
                                         LeafInfo& n, std::int64_t* delta) const {
  const std::uint32_t mask = slots_ - 1, w = window(slots_);
  const std::uint64_t h = key_hash(key);
  std::uint32_t s = slots_;
  for (std::uint32_t j = 0; j < w && s == slots_; ++j) {
    const std::uint32_t c = (static_cast<std::uint32_t>(h) + j) & mask;
    if (!detail::test_bit(used, c)) s = c;
  }
  if (s == slots_) return s;
  detail::set_bit(used, s);
  detail::set_bit(n.bitmap, s);
  if (old >= 0) {
    detail::clear_bit(n.bitmap, static_cast<std::uint32_t>(old));
  } else {
    ++*delta;
  }
  return s;
}

// One leaf and the buffer entries in its range. In place if every new record finds a slot in
// its window that is free in meta[gv] (M1: free slots only, so the current version's records
// stay intact until the flip); otherwise the leaf's records and the entries are laid out in
// fresh leaves filled to 70 % (M2) and the old leaf is replaced after the flip (M6).
template <class P>
Code DPTree<P>::merge_leaf(const LeafPtr& l, const BufEntry* from, const BufEntry* to,
                           std::vector<LeafPtr>* next, std::vector<std::uint64_t>* replaced,
                           std::vector<std::uint64_t>* fresh, std::int64_t* delta,
                           MergeStats& tally) {
  const LeafView v = view(l->off);
  auto n = std::make_shared<LeafInfo>();
  n->off = l->off;
  n->bound = l->bound;
  n->tag = l->tag;
  n->index = l->index;
  std::memcpy(n->bitmap, l->bitmap, sizeof(n->bitmap));
  n->order.reserve(l->order.size() + static_cast<std::size_t>(to - from));
  std::uint64_t used[4];
  std::memcpy(used, l->bitmap, sizeof(used));
  std::vector<std::pair<std::uint32_t, Slot>> writes;
  std::int64_t d = 0;
  std::uint64_t blind_new = 0;  // U2: blind puts of keys the leaf does not hold
  bool fits = true;
  // The leaf's records (its sorted order) and the entries, both in key order, joined in one
  // pass: an entry's old slot is found without a probe, and the next version's order is
  // built as it goes (no sort).
  const std::vector<std::uint8_t>& live = l->order;
  std::size_t j = 0;
  const auto key_at = [&](std::size_t i) { return v.slot(live[i])->key; };
  for (const BufEntry* e = from; e != to; ++e) {
    for (; j < live.size() && key_at(j) < e->key; ++j) n->order.push_back(live[j]);
    int old = -1;
    if (j < live.size() && key_at(j) == e->key) old = live[j++];
    if (e->tombstone) {
      if (old >= 0) detail::clear_bit(n->bitmap, static_cast<std::uint32_t>(old)), --d;
      continue;
    }
    const std::uint32_t s = place_in_window(e->key, old, used, *n, &d);
    if (s == slots_) {
      fits = false;
      break;
    }
    writes.emplace_back(s, Slot{e->key, e->value});
    n->order.push_back(static_cast<std::uint8_t>(s));
    if (e->blind && old < 0) ++blind_new;
  }
  if (fits) {
    n->order.insert(n->order.end(), live.begin() + static_cast<std::ptrdiff_t>(j), live.end());
    detail::LeafLines lines(v.base);
    for (const auto& [s, rec] : writes) detail::write_slot(v, lines, s, rec);  // M1
    lines.flush();
    *delta += d;
    tally.blind_new += blind_new;
    next->push_back(std::move(n));
    return Code::ok;
  }
  // Split: the merged records in key order.
  std::vector<Record> recs;
  blind_new = 0;
  auto add_new = [&](const BufEntry& b) {  // an entry whose key the leaf does not hold
    if (b.tombstone) return;
    recs.emplace_back(b.key, b.value);
    if (b.blind) ++blind_new;
  };
  const BufEntry* e = from;
  for (std::uint8_t s : l->order) {
    const Slot* cur = v.slot(s);
    for (; e != to && e->key < cur->key; ++e) add_new(*e);
    if (e != to && e->key == cur->key) {
      if (!e->tombstone) recs.emplace_back(e->key, e->value);
      ++e;
    } else {
      recs.emplace_back(cur->key, cur->value);
    }
  }
  for (; e != to; ++e) add_new(*e);
  const std::size_t per = std::max<std::size_t>(1, slots_ * 7 / 10);
  for (std::size_t i = 0; i < recs.size();) {
    Code code = Code::ok;
    LeafPtr piece = build_leaf(recs, &i, per, l->bound, &code, tally);
    if (piece == nullptr) return code;
    fresh->push_back(piece->off);
    next->push_back(std::move(piece));
  }
  replaced->push_back(l->off);
  *delta += static_cast<std::int64_t>(recs.size()) -
            static_cast<std::int64_t>(detail::popcount(l->bitmap));
  tally.blind_new += blind_new;
  return Code::ok;
}

// M3: meta[nv] of EVERY leaf of the new chain, written and flushed wherever PM differs from
// it (a leaf the merge did not touch may hold a meta[nv] of two merges ago: the original's
// stale-metadata window under ADR). Every earlier merge step was persisted, so the cached
// line is what PM holds. The line carries the leaf's own tag and its tagged next link (the
// end mark for the last leaf): the tags cost no store of their own.
template <class P>
void DPTree<P>::write_meta(std::vector<LeafPtr>& next, unsigned nv) {
  for (std::size_t i = 0; i < next.size(); ++i) {
    Meta m{};
    std::memcpy(m.bitmap, next[i]->bitmap, sizeof(m.bitmap));
    m.bound = next[i]->bound;
    m.next = i + 1 < next.size() ? index_common::make_link(next[i + 1]->off, next[i + 1]->tag)
                                 : index_common::kChainEnd;
    m.count = detail::popcount(m.bitmap);
    m.tag = next[i]->tag;
    Meta* pm_meta = view(next[i]->off).meta(nv);
    if (std::memcmp(pm_meta, &m, sizeof(Meta)) == 0) continue;
    if constexpr (P::kSkipUnchangedMeta) {  // known-bad (tests only): the original's window
      if (std::memcmp(view(next[i]->off).meta(1 - nv)->bitmap, m.bitmap, sizeof(m.bitmap)) == 0)
        continue;
    }
    pm::copy(pm_meta, &m, sizeof(Meta));  // M3
    pm::flush(pm_meta, sizeof(Meta));
  }
}

// M3 (unless written already), M4, M5: the next version made current with `covered`.
template <class P>
void DPTree<P>::flip(std::vector<LeafPtr>& next, std::uint64_t covered, bool meta_written) {
  const unsigned nv = 1 - gv_;
  auto flip_bit = [&] {
    pm::publish(&root_->head[nv], index_common::make_link(next[0]->off, next[0]->tag));  // M4
    pm::flush(&root_->head[nv], 8);
    pm::fence();
    pm::publish(&root_->state, state_word(covered, nv));  // M5: commit
    pm::persist(&root_->state, 8);
  };
  if constexpr (P::kFlipBeforeMeta) {
    flip_bit();
    if (!meta_written) write_meta(next, nv);
    pm::fence();
  } else {
    if (!meta_written) write_meta(next, nv);
    flip_bit();
  }
}

// The DRAM side of a flip, M6 and M7 (P5's trim when records above `covered` stay).
template <class P>
void DPTree<P>::install(std::vector<LeafPtr> next, const std::vector<std::uint64_t>& replaced,
                        std::int64_t delta, std::uint64_t covered) {
  gv_ = 1 - gv_;
  covered_ = covered;
  base_records_ = static_cast<std::uint64_t>(static_cast<std::int64_t>(base_records_) + delta);
  chain_ = std::move(next);
  rebuild_inner();
  for (std::uint64_t off : replaced) free_block(off, leaf_bytes_);  // M6
  trim_log(covered);  // M7 (P5)
  ++stats_.merges;
}

// M3-M7 and the DRAM side of a synchronous merge or bulk load whose leaves are written (M1/M2).
template <class P>
void DPTree<P>::commit(std::vector<LeafPtr> next, const std::vector<std::uint64_t>& replaced,
                       std::int64_t delta, std::uint64_t covered) {
  flip(next, covered, /*meta_written=*/false);
  install(std::move(next), replaced, delta, covered);
  reset_buffer();
}

// M7: the log is covered up to `covered`: emptied with one persisted store and its pages
// freed. P5 (records above `covered` re-logged by a partial merge): log_head moves to the page
// holding covered + 1 (one persisted store; that page's first_lsn <= covered + 1, as R2 wants),
// and only the pages before it are freed.
template <class P>
void DPTree<P>::trim_log(std::uint64_t covered) {
  std::size_t keep = log_pages_.size();
  if (covered + 1 < next_lsn_) {
    keep = 0;
    while (pool_->at<LogPageHeader>(log_pages_[keep])->first_lsn + records_per_page_ <= covered + 1)
      ++keep;
  }
  if (keep == 0) return;
  // The kept page's own tag as L4 wrote it (or R2 checked it).
  const std::uint64_t head =
      keep < log_pages_.size()
          ? index_common::make_link(log_pages_[keep],
                                    pool_->at<LogPageHeader>(log_pages_[keep])->tag)
          : index_common::kChainEnd;
  pm::publish(&root_->log_head, head);
  pm::persist(&root_->log_head, 8);
  for (std::size_t i = 0; i < keep; ++i) free_block(log_pages_[i], log_page_bytes_);
  stats_.log_pages_freed += keep;
  log_pages_.erase(log_pages_.begin(), log_pages_.begin() + static_cast<std::ptrdiff_t>(keep));
  if (log_pages_.empty()) tail_slot_ = 0;
}

// M1/M2 for every leaf with entries in its range, emptied leaves unlinked (unless the last
// one left): the next chain. A full pool while splitting frees the fresh leaves and returns
// pool_full before anything is published.
template <class P>
Code DPTree<P>::merge_build(const std::vector<BufEntry>& entries, std::vector<LeafPtr>* next,
                            std::vector<std::uint64_t>* replaced, std::int64_t* delta,
                            MergeStats& tally, std::vector<std::uint64_t>* abandoned) {
  std::vector<std::uint64_t> fresh;
  std::size_t e = 0;
  for (std::size_t i = 0; i < chain_.size(); ++i) {
    const bool last = i + 1 == chain_.size();
    const std::size_t lo = e;
    while (e < entries.size() && (last || entries[e].key <= chain_[i]->bound)) ++e;
    if (lo == e) {
      next->push_back(chain_[i]);
      continue;
    }
    // merge_leaf reads every key of the leaf in key order, i.e. its slots at random: the next
    // leaf (the next one with entries, when the buffer spreads over the base) is requested
    // whole while this one merges, so its misses overlap this leaf's work.
    if (!last && e < entries.size())
      index_common::prefetch_lines(view(chain_[i + 1]->off).base, leaf_bytes_);
    if (Code c = merge_leaf(chain_[i], entries.data() + lo, entries.data() + e, next, replaced,
                            &fresh, delta, tally);
        c != Code::ok) {
      if (abandoned != nullptr) {
        abandoned->insert(abandoned->end(), fresh.begin(), fresh.end());
      } else {
        for (std::uint64_t off : fresh) pm_free(off, leaf_bytes_);
      }
      return c;
    }
  }
  drop_emptied(*next, replaced, tally);
  fold_sparse(*next, replaced, tally, /*full_pool=*/false);
  return Code::ok;
}

// The synchronous merge (run by the writer whose write filled the buffer, never beside a
// background merge): merge_build, then commit (M3-M7). A full pool while splitting abandons
// the merge before anything is published: the buffer and log stay, and a later write retries.
template <class P>
Code DPTree<P>::merge() {
  const std::vector<BufEntry> entries = buffer_->sorted();
  std::vector<LeafPtr> next;
  std::vector<std::uint64_t> replaced;
  std::int64_t delta = 0;
  MergeStats tally;  // counted only if the merge commits (a failed one's leaves are freed)
  if (Code c = merge_build(entries, &next, &replaced, &delta, tally); c != Code::ok) {
    ++stats_.failed_merges;
    return c;
  }
  count_leaves(tally);
  commit(std::move(next), replaced, delta, next_lsn_ - 1);
  release_reserve();  // an empty buffer needs no re-log space
  bg_failed_ = false;
  return Code::ok;
}

// Emptied leaves leave the chain; their range joins the next leaf (the last one's, the
// previous leaf, which then takes bound ~0).
template <class P>
void DPTree<P>::drop_emptied(std::vector<LeafPtr>& next, std::vector<std::uint64_t>* replaced,
                             MergeStats& tally) {
  std::vector<LeafPtr> kept;
  for (std::size_t i = 0; i < next.size(); ++i) {
    if (next[i]->order.empty() && next.size() - (i + 1) + kept.size() > 0) {
      replaced->push_back(next[i]->off);
      ++tally.leaves_dropped;
      continue;
    }
    kept.push_back(next[i]);
  }
  if (kept.back()->bound != ~std::uint64_t{0}) {
    auto last = std::make_shared<LeafInfo>(*kept.back());
    last->bound = ~std::uint64_t{0};
    kept.back() = last;
  }
  next = std::move(kept);
}

// M1b: sparse neighbours fold (issue 19: removes must make room for keys elsewhere). A leaf of
// the next chain that holds at most half its slots takes the records of its right neighbour
// when that one also holds at most half, both together at most 5/8 of the slots (below the
// 70 % a split fills to, so the next insert does not split the fold again), and one of the
// two lost records in this merge (so a split's small tail piece is not folded back in by the
// very next insert-only merge: that churn cost 28 % more PM lines per insert); the neighbour
// leaves the chain and its range joins the leaf's. Repeated, so a run of sparse leaves folds
// into its first. Allocates nothing: it runs in the partial merge of a full pool too, and
// there (`full_pool`) without the loss condition: space matters more than lines, and the
// refill after removing every key reached 87 % of the fill without it (test_pool_full).
template <class P>
void DPTree<P>::fold_sparse(std::vector<LeafPtr>& next, std::vector<std::uint64_t>* replaced,
                            MergeStats& tally, bool full_pool) {
  const std::size_t half = slots_ / 2, max = slots_ * 5 / 8;
  auto lost = [this](const LeafInfo& l) {  // fewer records than in the current version
    return l.index < chain_.size() && chain_[l.index]->off == l.off &&
           l.order.size() < chain_[l.index]->order.size();
  };
  std::vector<LeafPtr> kept;
  kept.reserve(next.size());
  for (LeafPtr& b : next) {
    if (!kept.empty()) {
      LeafPtr& a = kept.back();
      const std::size_t na = a->order.size(), nb = b->order.size();
      if (na <= half && nb <= half && na + nb <= max && (full_pool || lost(*a) || lost(*b))) {
        // Copy on write: `a` may be the current chain's LeafInfo, which readers use.
        auto folded = std::make_shared<LeafInfo>(*a);
        if (fold_into(*folded, *b)) {
          a = std::move(folded);
          replaced->push_back(b->off);  // M6: freed after the flip (unreachable before it)
          ++tally.leaves_folded;
          continue;
        }
      }
    }
    kept.push_back(std::move(b));
  }
  next = std::move(kept);
}

// M1b for one pair: b's records (its next version's slots, all persisted: M1/M2 flushed what
// this merge wrote) into slots of a that are free in a's next version AND in its current one
// (a slot this merge's removes cleared still holds a record of version gv until the flip),
// each in its hash window, written and flushed; a's bitmap and bound become the fold's.
// False, with nothing written to PM, if some record finds no slot (a's bitmap is then partly
// changed: the caller drops its copy).
template <class P>
bool DPTree<P>::fold_into(LeafInfo& a, const LeafInfo& b) {
  std::uint64_t used[4];
  std::memcpy(used, a.bitmap, sizeof(used));
  const bool current = a.index < chain_.size() && chain_[a.index]->off == a.off;
  if (current && !P::kFoldIntoCurrentSlots) {  // a fresh leaf (M2) has no current version
    for (int w = 0; w < 4; ++w) used[w] |= chain_[a.index]->bitmap[w];
  }
  const LeafView va = view(a.off), vb = view(b.off);
  std::vector<std::pair<std::uint32_t, std::uint8_t>> plan;  // (slot of a, slot of b)
  std::int64_t unused_delta = 0;
  for (std::uint8_t sb : b.order) {
    const std::uint32_t s = place_in_window(vb.slot(sb)->key, -1, used, a, &unused_delta);
    if (s == slots_) return false;
    plan.emplace_back(s, sb);
  }
  detail::LeafLines lines(va.base);
  for (const auto& [sa, sb] : plan) detail::write_slot(va, lines, sa, *vb.slot(sb));  // M1b
  lines.flush();
  a.bound = b.bound;
  // b's keys all follow a's: the fold's order is a's, then b's in b's order.
  for (const auto& [sa, sb] : plan) a.order.push_back(static_cast<std::uint8_t>(sa));
  return true;
}

template <class P>
Code DPTree<P>::merge_partial_for_testing() {
  Lock lock(mu_);
  wait_for(lock, [&] { return !merging_; });
  return merge_partial();
}

// The full pool's merge (PROTOCOL.md P1-P5), when a merge cannot allocate its splits' leaves:
// P1 plans every leaf in place (tombstones clear bits, puts take slots free in meta[gv]) and
// carries the puts that find no slot; P2 re-logs the carried records at the log's tail (pages
// from the reserve if the pool has none); P3 writes the planned slots (M1); then M3-M5 with
// covered = the last LSN before the re-log, P5 frees the log pages below it. Needs no leaf.
template <class P>
Code DPTree<P>::merge_partial() {
  const std::vector<BufEntry> entries = buffer_->sorted();
  const std::uint64_t covered = next_lsn_ - 1;
  std::vector<LeafPtr> next;
  std::vector<BufEntry> carried;
  std::vector<std::pair<std::uint64_t, Slot>> writes;  // (leaf offset, slot index in key)
  std::vector<std::uint32_t> at;
  std::int64_t delta = 0;
  std::uint64_t blind_new = 0;  // U2
  std::size_t e = 0;
  for (std::size_t i = 0; i < chain_.size(); ++i) {  // P1: DRAM only
    const LeafPtr& l = chain_[i];
    const bool last = i + 1 == chain_.size();
    const std::size_t lo = e;
    while (e < entries.size() && (last || entries[e].key <= l->bound)) ++e;
    if (lo == e) {
      next.push_back(l);
      continue;
    }
    auto n = std::make_shared<LeafInfo>(*l);
    std::uint64_t used[4];
    std::memcpy(used, l->bitmap, sizeof(used));
    for (std::size_t j = lo; j < e; ++j) {
      const BufEntry& b = entries[j];
      const int old = slot_of(*l, b.key);
      if (b.tombstone) {
        if (old >= 0) detail::clear_bit(n->bitmap, static_cast<std::uint32_t>(old)), --delta;
        continue;
      }
      const std::uint32_t s = place_in_window(b.key, old, used, *n, &delta);
      if (s == slots_) {  // no free slot: carried (an old slot of the key stays: the buffer wins)
        carried.push_back(b);
        continue;
      }
      writes.emplace_back(l->off, Slot{b.key, b.value});
      at.push_back(s);
      if (b.blind && old < 0) ++blind_new;
    }
    next.push_back(std::move(n));
  }
  // The re-log's pages must all be at hand before any is used: a re-log cut short would spend
  // the reserve on pages that a failed merge cannot give back.
  const std::size_t room = log_pages_.empty() ? 0 : records_per_page_ - tail_slot_;
  if (carried.size() > room && !top_up_pages(relog_pages(carried.size() - room))) {
    ++stats_.failed_merges;
    return Code::pool_full;
  }
  for (const BufEntry& b : carried) {  // P2: duplicates of acknowledged records, harmless
    if constexpr (P::kSkipRelog) break;  // known-bad (tests only)
    if (log_pages_.empty() || tail_slot_ == records_per_page_) {
      if (Code c = new_log_page(/*keep=*/0); c != Code::ok) {
        ++stats_.failed_merges;  // nothing of version gv changed; the buffer stays
        return c;
      }
    }
    append_record(b.key, b.value, kOpPut);
  }
  for (std::size_t j = 0; j < writes.size();) {  // P3 = M1, leaf by leaf (P1 wrote them so)
    const LeafView v = view(writes[j].first);
    detail::LeafLines lines(v.base);
    const std::uint64_t leaf = writes[j].first;
    for (; j < writes.size() && writes[j].first == leaf; ++j)
      detail::write_slot(v, lines, at[j], writes[j].second);
    lines.flush();
  }
  for (auto& n : next) sort_order(*n);
  std::vector<std::uint64_t> replaced;
  drop_emptied(next, &replaced, stats_);
  // M1b: at a full pool the only merges are partial ones (the buffer keeps puts that need a
  // split), so sparse leaves fold here too, and their blocks are free for the next split.
  fold_sparse(next, &replaced, stats_, /*full_pool=*/true);
  commit(std::move(next), replaced, delta, covered);  // M3-M6, P5
  // A carried blind put stays blind: the base still answers for its key as before.
  for (const BufEntry& b : carried) buffer_put(b.key, b.value, b.kind());
  count_blind_new(blind_new);
  ++stats_.partial_merges;
  stats_.relogged += carried.size();
  // From the pages P5 freed, first for the reserve: the buffer's records and the write that
  // ran this merge (if the write then finds no page, it is refused and nothing is lost).
  (void)top_up_reserve(puts_ + 1);
  return Code::ok;
}

}  // namespace pmindex::dptree

// DPTree (Zhou et al., PVLDB 13(4) 2019): a DRAM front buffer (B+-tree + Bloom filter) whose
// every write is first made durable in a PM write-ahead log, over a base tree of PM leaves
// (hashed slots, fingerprints, two metadata versions switched by one version bit in the root
// object) with a DRAM inner layer over the leaves' bounds. When the buffer reaches its
// capacity (a fraction of the base tree, 7 % by default) it becomes the read-only middle
// buffer and a merge thread folds it into the base tree while a fresh front takes the writes
// (Config::background, the default; PROTOCOL.md B1-B5), or the writer that filled it merges it
// synchronously (selectable; the crash simulator's mode, default in the tracing flavour).
// Persistence steps: PROTOCOL.md (cited in code as `// Xn:`); layouts: layout.h.
//
// Thread safety: every operation may run concurrently. Readers (find, scan) hold a shared
// lock, writers (insert, update, upsert, remove) an exclusive one, so writers are serialised.
// The merge thread works without the lock on what no reader or writer touches while it runs
// (the read-only middle buffer, slots free in the current version, fresh leaves, meta[nv]:
// B2-B3) and takes the exclusive lock only to commit (B4).
// Invariants (checked by verify()):
//   (1) the chain from root.head[gv] is in bounds, bounds strictly increase, the last is ~0;
//       every live slot's key lies in (previous bound, bound], in its probe window, with its
//       fingerprint; DRAM leaf infos equal meta[gv] of their leaves; every link (head[gv],
//       each next) is the tagged link to the next leaf's offset and own tag, the last the end
//       mark (PROTOCOL.md, "Tagged links");
//   (2) the inner layer's leaves are the chain's, each key inside its fences;
//   (3) the log from root.log_head (tagged links, the last the end mark) holds consecutive
//       valid records up to the DRAM tail, and
//       every record above `covered` is reflected in the buffers (middle up to middle_lsn_,
//       then front);
//   (4) the PM bytes reachable from the root, plus the log reserve's pages (held in DRAM so a
//       full pool's partial merge can re-log what it carries) and the blocks the merge thread
//       left for the next writer to free, equal the allocator's in use. verify() waits for a
//       running merge (its fresh leaves are not reachable yet).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <shared_mutex>
#include <condition_variable>
#include <thread>
#include <string>
#include <string_view>
#include <vector>

#include "index/common/inner_tree.h"
#include "index/common/key_codec.h"
#include "index/dptree/buffer_tree.h"
#include "index/dptree/layout.h"
#include "pmindex/index.h"
#include "pmindex/pm/allocator.h"
#include "pmindex/pm/dram_arena.h"
#include "pmindex/pm/persist.h"
#include "pmindex/sync/shared_spin_lock.h"
#include "pmindex/sync/spin_lock.h"

namespace pmindex::dptree {

// The production protocol. Tests instantiate DPTree with known-bad policies (a checker must be
// able to fail); the library never contains them.
struct Protocol {
  // Flip the version bit (M5) before the next metadata versions are written (M3): a crash
  // in between recovers a chain described by stale metadata.
  static constexpr bool kFlipBeforeMeta = false;
  // Skip M3 for leaves the merge did not change (the original's stale-meta[nv] window).
  static constexpr bool kSkipUnchangedMeta = false;
  // The original's scan: a key in both buffer and base is emitted twice (the second time with
  // the base's stale value) and tombstones are returned as records.
  static constexpr bool kOriginalScan = false;
  // The full pool's partial merge flips without re-logging the records it carries (P2): a
  // crash after the flip loses them.
  static constexpr bool kSkipRelog = false;
  // Background mode: update a base key in place (U1) while a merge runs, looking only at the
  // front buffer (the first landing's rule): the merge then carries the middle buffer's older
  // value, or a leaf copy read before the update, over it (the lost update; B3).
  static constexpr bool kInPlaceDuringMerge = false;
  // Background mode: the merge thread keeps the blocks its allocator cache fetched (the
  // previous landing's behaviour): at a full pool they are out of the writers' reach.
  static constexpr bool kKeepMergeCache = false;
  // The log reserve without its spare page for removes (the previous landing's): at a full
  // pool, a partial merge whose re-log ends exactly at a page boundary leaves no page for the
  // next remove's record.
  static constexpr bool kNoSpareLogPage = false;
  // A sparse leaf's fold (M1b) writes its neighbour's records into slots free in the leaf's
  // next version only, also taking slots that this merge's removes cleared but that the
  // current version still holds: a crash before the flip leaves those records overwritten.
  static constexpr bool kFoldIntoCurrentSlots = false;
  // Recovery (R1, R2) and verify() read every link as an offset only, without its tag (the
  // chains before tagged links): a link zeroed or redirected by damage after an unclean end
  // reads as a shorter chain or log (test_dptree_damage).
  static constexpr bool kUncheckedLinks = false;
  // A remove over a blind upsert in the front buffer (U2) does not settle the put's count
  // first: size() is one low for every new key so upserted and removed.
  static constexpr bool kForgetBlindOnRemove = false;
};

// The index lock. In the tracing flavour a reader-writer spin lock whose waits are scheduling
// points: the crash simulator's deterministic scheduler parks a thread at every PM event, also
// inside a critical section, so a waiter must hand the baton on instead of blocking in the
// kernel (docs/crash-simulator.md, "Multi-threaded simulation"). Other flavours use
// std::shared_mutex.
using IndexMutex = std::conditional_t<pm::kTracing, sync::SharedSpinLock, std::shared_mutex>;

// Tuning (the paper's defaults). The registry uses these; tests pass their own to create().
struct Config {
  double merge_fraction = 0.07;  // buffer capacity = max(min_buffer, fraction x base records)
  double bloom_fp = 0.05;        // the Bloom filter's false-positive target
  std::size_t min_buffer = 0;    // 0: the base leaf's slot count
  // true: a full front buffer becomes the read-only middle buffer and a merge thread folds it
  // into the base tree while writes go to a fresh front (PROTOCOL.md B1-B5; the paper's
  // design, the default). false: the writer that fills the buffer merges it synchronously (the
  // default in the tracing flavour: the single-threaded crash simulator enumerates its steps).
  // The registry takes it from Options::dptree.merge, else PMINDEX_DPTREE_MERGE=background|sync.
  bool background = !pm::kTracing;
  // Print MergeStats on stderr at close (Options::dptree.stats; pmbench --dptree_stats).
  bool print_stats = false;
  // Tests (the crash simulator's multi-threaded driver): background mode without the index's
  // own merge thread; the test runs the merges on a thread of its own with
  // merge_step_for_testing(), so the scheduler can interleave them with the writers.
  bool external_merger = false;
};

// Registry entry points.
pm::Layout layout_for(const Options& options);
Status validate(const Options& options);
std::size_t default_pool_size(const Options& options);
Result<std::unique_ptr<Index>> create(std::unique_ptr<pm::Pool> pool, const Options& options);
Result<std::unique_ptr<Index>> recover(std::unique_ptr<pm::Pool> pool, const Options& options);

// What merges did so far (tests' SMO tally, pmbench).
struct MergeStats {
  std::uint64_t merges = 0;
  std::uint64_t leaves_created = 0;  // by splits in committed merges (and bulk loads)
  std::uint64_t leaves_dropped = 0;  // emptied and unlinked
  std::uint64_t leaves_folded = 0;   // sparse, records moved into the left neighbour (M1b)
  std::uint64_t log_pages_freed = 0;
  std::uint64_t failed_merges = 0;   // pool full while splitting (retried later)
  std::uint64_t partial_merges = 0;  // pool full: merged in place, the rest re-logged (P1-P5)
  std::uint64_t relogged = 0;        // records those partial merges carried
  std::uint64_t background_merges = 0;  // merges run by the merge thread (of `merges`)
  std::uint64_t blind_new = 0;          // blind upserts a committed merge found new (U2)
  std::uint64_t writer_blocks = 0;      // writes that waited for a merge (front full again)
  std::uint64_t writer_blocked_ns = 0;  // the time they waited, summed over writers
};

template <class Policy = Protocol>
class DPTree final : public Index {
 public:
  static Result<std::unique_ptr<Index>> create(std::unique_ptr<pm::Pool> pool,
                                               const Options& options, Config config = {});
  static Result<std::unique_ptr<Index>> recover(std::unique_ptr<pm::Pool> pool,
                                                const Options& options, Config config = {});
  ~DPTree() override;

  std::string_view kind() const override { return "dptree"; }
  Code insert(std::string_view key, std::string_view value) override;
  Code update(std::string_view key, std::string_view value) override;
  Code upsert(std::string_view key, std::string_view value) override;
  Code find(std::string_view key, std::string* value) const override;
  Code remove(std::string_view key) override;
  std::size_t scan(std::string_view start, std::size_t max, ScanBuffer& out) const override;
  Status bulk_load(std::span<const KeyValue> sorted, double fill) override;
  Status verify() const override;
  RecoveryStats recovery_stats() const override { return recovery_; }
  Footprint footprint() const override;
  Status close() override;
  const pm::Pool& pool() const override { return *pool_; }

  MergeStats merge_stats() const;
  std::size_t buffered() const;
  std::size_t base_leaves() const;
  // Merges the buffer now (tests).
  Code merge_for_testing();
  // Runs the full pool's partial merge now (tests: crash images through P1-P5).
  Code merge_partial_for_testing();
  // Background mode (tests): hold the merge thread just before the flip (B3: its M1-M3 are
  // written), or let it go; whether a merge is running; wait until none is.
  void hold_merge_for_testing(bool hold);
  bool merging() const;
  bool merge_held_for_testing() const;  // the merge thread waits at the hold (M1-M3 done)
  void wait_merge_for_testing();
  // Config::external_merger: runs the pending background merge (B2-B4) on the calling thread
  // if there is one (true), else returns false at once.
  bool merge_step_for_testing();
  // The front buffer's capacity (tests fill it to a known point).
  std::size_t capacity() const;
  // Deliberate damage so a test can see verify() notice it: 0 swaps the keys of two live
  // slots of the first non-empty leaf, 1 clears a bit of a leaf's DRAM bitmap, 2 breaks the
  // validity word of the first log record, 3 miscounts the front buffer's blind puts.
  void corrupt_for_testing(int what);

 protected:
  // size()'s share of the blind upserts (U2): those settled so far, plus each buffered one
  // that is new below it (probed: O(buffered blind puts), under the shared lock).
  std::int64_t deferred_records() const override;

 private:
  // DRAM view of one base leaf of the current version.
  struct LeafInfo {
    std::uint64_t off = 0;
    std::uint64_t bound = 0;
    std::uint64_t bitmap[4] = {0, 0, 0, 0};
    std::uint64_t tag = 0;             // own tag (Meta::tag), fixed for the leaf's life
    std::uint32_t index = 0;           // position in chain_
    std::vector<std::uint8_t> order;   // live slots in key order
  };
  using LeafPtr = std::shared_ptr<LeafInfo>;
  using Record = std::pair<std::uint64_t, std::uint64_t>;  // key word, value

  DPTree(std::unique_ptr<pm::Pool> pool, std::uint32_t slots, Config config);
  Status init_root(const Options& o);
  Code check(std::string_view key, std::string_view value) const;
  static std::uint64_t word_of(std::string_view key);
  static std::uint64_t value_of(std::string_view v);

  // base tree
  LeafView view(std::uint64_t off) const { return LeafView{pool_->at<char>(off), slots_}; }
  // The inner layer's word for a leaf: its offset / 256 (leaf blocks are 256-B aligned) in
  // the low off_bits_ bits, its chain index above them. A point operation goes from the inner
  // layer straight to the PM leaf (probe), without first reading the leaf's DRAM info, whose
  // miss used to come before the leaf's lines could be requested.
  std::uint64_t leaf_word(const LeafInfo& l) const {
    return l.off >> 8 | std::uint64_t{l.index} << off_bits_;
  }
  std::uint64_t word_off(std::uint64_t w) const {
    return (w & ((std::uint64_t{1} << off_bits_) - 1)) << 8;
  }
  std::size_t word_index(std::uint64_t w) const { return static_cast<std::size_t>(w >> off_bits_); }
  static unsigned off_bits_for(std::size_t pool_size);
  Status check_leaf_words() const;  // the pool's offsets and leaf count fit a word
  std::uint64_t leaf_word_for(std::uint64_t k) const;  // the inner layer's descent
  const LeafInfo* leaf_for(std::uint64_t k) const {
    return chain_[word_index(leaf_word_for(k))].get();
  }
  // The key's slot in the leaf at v, -1 if absent: its window walked over `bitmap`.
  int window_slot(const LeafView& v, const std::uint64_t* bitmap, std::uint64_t k) const;
  // Over the leaf's DRAM bitmap (merges, recovery, verify).
  int slot_of(const LeafInfo& l, std::uint64_t k) const {
    return window_slot(view(l.off), l.bitmap, k);
  }
  // verify()'s steps (dptree_recovery.h).
  Status verify_error(const std::string& what) const;
  static bool link_differs(std::uint64_t have, std::uint64_t want);
  std::uint64_t chain_link(std::size_t i) const;
  Status verify_leaf(std::size_t i, std::uint64_t prev_bound, index_common::ChainKeys& keys) const;
  Status verify_chain(std::uint64_t* reachable) const;
  Status verify_inner() const;
  Status verify_log(std::uint64_t* reachable) const;
  // Whether the base tree's current version holds k (its leaf found through the inner layer).
  bool in_base(std::uint64_t k) const { return slot_of(*leaf_for(k), k) >= 0; }
  // Over meta[gv] in PM (the point operations, after requested_leaf or find_batch's
  // prefetches requested its lines).
  int probe(std::uint64_t off, std::uint64_t k) const {
    return window_slot(view(off), view(off).meta(gv_)->bitmap, k);
  }
  // meta[gv], the key's fingerprint line and its home slot's line, requested together.
  void request(std::uint64_t off, std::uint64_t k) const;
  // The key's leaf from the inner layer, its lines requested: called before the buffers are
  // probed, so the leaf's misses overlap theirs (the Bloom filter's, the buffer tree's).
  std::uint64_t requested_leaf(std::uint64_t k) const;
  void sort_order(LeafInfo& l) const;
  void rebuild_inner();
  // Places recs[*i..] into a fresh leaf (at most `per`), M2. nullptr if the pool is full.
  LeafPtr build_leaf(const std::vector<Record>& recs, std::size_t* i, std::size_t per,
                     std::uint64_t last_bound, Code* code, MergeStats& tally);

  // buffer and log
  bool buffered_entry(std::uint64_t k, BufEntry* e) const;  // front
  bool buffered_middle(std::uint64_t k, BufEntry* e) const;
  // Whether k holds a record below the front buffer (the middle's entry, else the base's):
  // what decides if a blind put in the front added one (U2).
  bool live_below_front(std::uint64_t k) const;
  // Index::find_many's group: the buffer per key, the base tree's descents together.
  void find_batch(const std::string_view* keys, std::string* values, Code* codes,
                  std::size_t n) const override;
  Code log_append(std::uint64_t k, std::uint64_t v, std::uint64_t op);
  void append_record(std::uint64_t k, std::uint64_t v, std::uint64_t op);
  Code new_log_page(std::size_t keep);  // reserve pages above `keep` may be used
  Kind buffer_put(std::uint64_t k, std::uint64_t v, Kind kind);  // the kind k had (absent: none)
  // The log reserve (PROTOCOL.md, "Full pool"): pages held back so a partial merge can always
  // re-log the buffered records it carries, plus one spare page for a remove's record: a
  // tombstone is never re-logged, but without the spare a partial merge whose re-log ends
  // exactly at a page boundary (the buffer then holds a multiple of a page's records: where
  // room_for_put stops a full pool) gives every page it frees back to the reserve, and no
  // remove could log again (the next partial merge waits for a new record).
  // The log's page size for a new pool (layout.h, "Log page"): a base leaf's allocator block,
  // at least kMinLogPageBytes.
  static std::size_t log_page_bytes_for(std::uint32_t slots) {
    const int cls = pm::Allocator::class_of(leaf_bytes(slots));
    return std::max(kMinLogPageBytes, pm::Allocator::class_size(cls));
  }
  void use_log_pages(std::size_t bytes) {
    log_page_bytes_ = bytes;
    records_per_page_ = records_per_page(bytes);
  }
  std::size_t relog_pages(std::size_t puts) const {
    return (puts + records_per_page_ - 1) / records_per_page_;
  }
  std::size_t reserve_need(std::size_t puts) const {
    return relog_pages(puts) + (Policy::kNoSpareLogPage ? 0 : 1);
  }
  bool top_up_reserve(std::size_t puts) { return top_up_pages(reserve_need(puts)); }
  bool top_up_pages(std::size_t pages);  // holds back at least `pages` (false: pool full)
  void release_reserve();
  Code room_for_put();
  Code merge_unless_stalled();
  void maybe_merge();
  void reset_buffer();
  bool front_full() const;
  std::size_t live_puts() const { return puts_ + (middle_ != nullptr ? middle_puts_ : 0); }
  // Background mode (PROTOCOL.md B1-B5).
  using Lock = std::unique_lock<IndexMutex>;
  // cv_.wait(lock, pred), or in the tracing flavour a loop that drops the lock at a
  // scheduling point until pred holds (see IndexMutex).
  template <class L, class Pred>
  void wait_for(L& lock, Pred pred) const;
  template <class Fn>
  Code write_op(Fn body);              // backpressure, then body; re-run if it must wait
  bool must_wait_for_merge();          // a synchronous merge is needed while one runs
  void rotate();                       // B1: front -> middle, a fresh front
  void merge_loop();                   // the merge thread
  void merge_middle(Lock& lock);       // B2-B4
  void unrotate();                     // a failed background merge: middle folded back
  void stop_merger();
  void start_merger();
  bool buffered_any(std::uint64_t k, BufEntry* e) const;  // front, then middle
  // The allocator calls of running operations and of the merge thread. In the tracing flavour
  // under one spin lock: the allocator holds its std::mutex across a traced store (the heap's
  // high-water mark), where the crash simulator's scheduler may park the holder; the merge
  // thread and a writer allocate concurrently, so the other must spin at a scheduling point
  // instead of blocking on that mutex (docs/crash-simulator.md, as NBTree does).
  std::uint64_t pm_alloc(std::size_t bytes, Code* code);
  void pm_free(std::uint64_t off, std::size_t bytes);
  void pm_release_cache();  // the calling thread's allocator cache to the central lists
  // Blocks the merge thread gives up are freed by the next writer (deferred_), so they go to
  // the writers' allocator caches, not the merge thread's (which no writer allocates from).
  void free_block(std::uint64_t off, std::size_t bytes);
  void drain_deferred();
  void print_stats() const;  // MergeStats on stderr (Config::print_stats: at close or drop)

  // merge
  Code merge();
  Code merge_partial();
  std::uint32_t place_in_window(std::uint64_t key, int old, std::uint64_t* used, LeafInfo& n,
                                std::int64_t* delta) const;
  void count_leaves(const MergeStats& tally);
  void count_blind_new(std::uint64_t n);  // U2: blind puts a committed merge found new
  void fold_sparse(std::vector<LeafPtr>& next, std::vector<std::uint64_t>* replaced,
                   MergeStats& tally, bool full_pool);
  bool fold_into(LeafInfo& a, const LeafInfo& b);
  void drop_emptied(std::vector<LeafPtr>& next, std::vector<std::uint64_t>* replaced,
                    MergeStats& tally);
  Code merge_leaf(const LeafPtr& l, const BufEntry* from, const BufEntry* to,
                  std::vector<LeafPtr>* next, std::vector<std::uint64_t>* replaced,
                  std::vector<std::uint64_t>* fresh, std::int64_t* delta, MergeStats& tally);
  // M1/M2 for every leaf with entries and the emptied leaves dropped: the next chain.
  // A failure leaves the fresh leaves in *abandoned (unpublished), or frees them if null.
  Code merge_build(const std::vector<BufEntry>& entries, std::vector<LeafPtr>* next,
                   std::vector<std::uint64_t>* replaced, std::int64_t* delta, MergeStats& tally,
                   std::vector<std::uint64_t>* abandoned = nullptr);
  // M3 (unless meta_written), M4-M5; the known-bad kFlipBeforeMeta writes M3 after M5.
  void flip(std::vector<LeafPtr>& next, std::uint64_t covered, bool meta_written);
  void install(std::vector<LeafPtr> next, const std::vector<std::uint64_t>& replaced,
               std::int64_t delta, std::uint64_t covered);
  void write_meta(std::vector<LeafPtr>& next, unsigned nv);
  void commit(std::vector<LeafPtr> next, const std::vector<std::uint64_t>& replaced,
              std::int64_t delta, std::uint64_t covered);
  void trim_log(std::uint64_t covered);

  // recovery
  Status rebuild();
  Status walk_chain(unsigned gv, std::vector<LeafPtr>* chain, std::uint64_t* records);
  struct LogScan;
  Status walk_log(std::uint64_t covered, LogScan* out);

  std::unique_ptr<pm::Pool> pool_;
  Root* root_ = nullptr;
  const std::uint32_t slots_;
  const std::size_t leaf_bytes_;
  const unsigned off_bits_;  // leaf_word: bits of the leaf offset / 256
  std::size_t log_page_bytes_ = 0;     // root.log_page_bytes (set at C1 or by recovery)
  std::uint32_t records_per_page_ = 0;  // records_per_page(log_page_bytes_)
  const Config config_;
  index_common::KeyCodec keys_;
  unsigned gv_ = 0;
  std::uint64_t covered_ = 0;
  std::vector<LeafPtr> chain_;
  std::uint64_t base_records_ = 0;
  pm::DramArena inner_arena_;
  index_common::InnerTree inner_;
  std::unique_ptr<BufferTree> buffer_;
  Bloom bloom_;
  std::size_t capacity_ = 0;
  std::vector<std::uint64_t> log_pages_;  // in log order; empty = empty log
  std::uint32_t tail_slot_ = 0;           // next record slot in the last page
  std::uint64_t next_lsn_ = 1;
  std::size_t puts_ = 0;                   // live (non-tombstone) buffer entries
  // Blind upserts found to be new records (U2: by merges, removes and unrotate), counted
  // here instead of per operation; deferred_records() adds the still buffered ones.
  std::int64_t settled_ = 0;
  std::vector<std::uint64_t> reserve_;     // log pages held back (DRAM only; free after a crash)
  std::uint64_t partial_lsn_ = 0;          // next_lsn_ after the last partial merge
  // A synchronous merge that failed for space, and what it saw: until a block is freed or a
  // tombstone logged (a merge's removes free slots), another one would fail the same way at
  // O(base) cost per write, so merge_unless_stalled skips it (PiBench's 5M puts into a full
  // 10M-key pool ran a failed merge each: minutes). Writers only.
  struct Stall {
    bool on = false;
    std::uint64_t bytes_in_use = 0;
    std::uint64_t deletes = 0;
  };
  Stall stall_;
  std::uint64_t deletes_logged_ = 0;       // tombstones logged in this run
  index_common::TagSource tags_;           // own tags of new leaves and log pages
  MergeStats stats_;
  RecoveryStats recovery_;
  mutable IndexMutex mu_;
  sync::SpinLock alloc_mu_;  // tracing flavour: see pm_alloc
  bool closed_ = false;
  // Background mode. Guarded by mu_ except where noted: the middle buffer (read-only while it
  // exists, i.e. while merging_), its Bloom filter, live puts and last LSN.
  bool background_ = false;
  std::unique_ptr<BufferTree> middle_;
  Bloom middle_bloom_;
  std::size_t middle_puts_ = 0;
  std::uint64_t middle_lsn_ = 0;
  bool merging_ = false;         // a middle buffer exists and the merge thread owns it
  bool merge_running_ = false;   // Config::external_merger: a merge_step_for_testing runs
  bool bg_failed_ = false;       // the last background merge failed: merge synchronously
  bool retry_ = false;           // a write must wait for the merge, then run again
  bool stop_ = false;
  bool hold_ = false;            // tests: the merge thread waits before the flip
  bool held_ = false;            // tests: ... and is waiting there
  bool defer_frees_ = false;     // free_block defers (the merge thread commits)
  std::vector<std::pair<std::uint64_t, std::size_t>> deferred_;  // blocks to free (offset, bytes)
  mutable std::condition_variable_any cv_;
  std::thread merger_;
};

}  // namespace pmindex::dptree

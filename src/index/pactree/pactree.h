// PACTree (Kim et al., SOSP'21): a doubly linked list of 64-slot PM data nodes (the data
// layer) under a trie of the nodes' anchor keys (the search layer: the shared ART core,
// src/index/common/art/, in DRAM (rebuilt from the anchors at open) or in the pool (checked
// and repaired at open), chosen at creation: Options::pactree.search_layer). Splits
// and merges are logged in a per-thread persistent SMO log before they change shared PM and reach the
// search layer in global sequence (LSN) order through the updater; lookups tolerate a lagging
// search layer by walking right along the list (the last mile). Layouts: layout.h; persistence
// steps: PROTOCOL.md (cited in code as `// Xn:`); README.md: design and what differs.
//
// Thread safety: every operation may run concurrently.
//   * Data nodes: a DRAM OptimisticLock per node (LeafVersions, keyed by pool offset). Readers
//     read node words with optimistic_read and validate the version; writers lock the node
//     whose range holds their key for the whole operation, split included; a merge also locks
//     the right neighbour (always left to right, so waits form no cycle). A merged-away node
//     is marked obsolete; a reader that meets it moves to its prev (the survivor).
//   * The search layer is art::Tree (its own OLC); it is changed only by the updater, which
//     applies logged SMOs one at a time in LSN order (Updater::apply_ready, holding the turn):
//     a background thread, or the pushing writer in the synchronous mode.
//   * Key records, out-of-line values and anchors leave through the epoch manager (K3);
//     every operation pins it while it holds an offset it read without a lock.
//   * Start-now recovery (PM search layer): the walk (R2, R3, R5, R6) runs on its own thread
//     or in the first caller that waits for it (walk_mu_, walk_cv_); writers wait for it
//     (writable()), readers check every node they touch while checking_ is set (R8).
//   * verify(), close() and the *_for_testing functions expect no concurrent operations.
// Invariants (checked by verify()):
//   (1) the list from root.head is in bounds and acyclic; the head alone has kFlagHead; anchors
//       strictly increase; prev names the previous node; every next link carries the tag of
//       the node it names and the last one is the end mark (PROTOCOL.md R2t);
//   (2) every valid slot's key k satisfies anchor <= k < next.anchor, keys are distinct, and
//       the slot's fingerprint is fingerprint(k);
//   (3) the search layer maps exactly the anchors of the non-head nodes to their nodes once
//       the updater is idle (every SMO log entry free; an anchor a full pool kept out of the
//       PM search layer may be missing); with it in PM, its blocks are in (4);
//   (4) the PM bytes reachable from the root equal the allocator's bytes in use;
//   (5) no log slot was reused before its entry was applied (PROTOCOL.md L3).
// verify() first waits for the background updater to apply what is queued; a held updater
// (tests) must be released first, or (3) fails.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>  // std::lock_guard
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "index/common/art/art_tree.h"
#include "index/common/key_codec.h"
#include "index/common/leaf_versions.h"
#include "index/common/value_codec.h"
#include "index/pactree/layout.h"
#include "pmindex/index.h"
#include "pmindex/pm/dram_arena.h"
#include "pmindex/sync/epoch.h"
#include "pmindex/sync/spin_lock.h"

namespace pmindex::pactree {

inline constexpr std::uint32_t kMaxKeyBytes = (art::kMaxKeyBytes - 1) / 2;  // search encoding

// Who applies logged SMOs to the search layer (README "Updater").
enum class UpdaterMode { synchronous, background, held };

class PacTree final : public Index {
 public:
  static pm::Layout layout_for(const Options& options);
  static Status validate(const Options& options);
  static std::size_t default_pool_size(const Options& options);
  static Result<std::unique_ptr<Index>> create(std::unique_ptr<pm::Pool> pool,
                                               const Options& options);
  static Result<std::unique_ptr<Index>> recover(std::unique_ptr<pm::Pool> pool,
                                                const Options& options);
  static IndexRegistry::Entry registry_entry();

  ~PacTree() override;
  std::string_view kind() const override { return "pactree"; }
  Code insert(std::string_view key, std::string_view value) override;
  Code update(std::string_view key, std::string_view value) override;
  Code find(std::string_view key, std::string* value) const override;
  Code remove(std::string_view key) override;
  std::size_t scan(std::string_view start, std::size_t max, ScanBuffer& out) const override;
  Status verify() const override;
  RecoveryStats recovery_stats() const override {
    std::lock_guard<std::mutex> lock(walk_mu_);  // the recovery walk fills records and nodes
    return recovery_;
  }
  Footprint footprint() const override;
  Status close() override;
  const pm::Pool& pool() const override { return *pool_; }

  // Tests and pmbench: splits done in this run, data nodes in the list (quiescent), last-mile
  // hops taken by lookups, SMO log entries not yet applied to the search layer.
  std::uint64_t splits() const { return splits_.load(std::memory_order_relaxed); }
  std::uint64_t merges() const { return merges_.load(std::memory_order_relaxed); }
  std::uint64_t node_count_for_testing() const;
  std::uint64_t last_mile_hops() const { return hops_.load(std::memory_order_relaxed); }
  std::size_t updater_pending() const;
  unsigned slots_per_node() const { return slots_; }
  // The updater's mode (README "Updater"). The default is background, synchronous in the
  // tracing flavour (the crash simulator enumerates its steps); Options::pactree.updater at
  // open overrides it. Expects no concurrent operation.
  void set_updater_mode(UpdaterMode m) { updater_.set_mode(m); }
  UpdaterMode updater_mode() const { return updater_.mode(); }
  std::size_t updater_max_pending() const { return updater_.max_pending(); }
  std::uint64_t updater_applied() const { return updater_.applied(); }
  std::uint64_t log_overwritten() const { return updater_.overwritten(); }
  // Deliberately broken behaviours of the original PACTree, honoured only in the tracing
  // flavour (compiled out elsewhere), so the deterministic tests show their checkers catch
  // them: restart from the jump node on a merged node (livelock while the search layer lags),
  // apply log entries as they arrive instead of in LSN order, reuse a log slot before its
  // entry is applied.
  struct Faults {
    bool restart_on_merged = false;
    bool apply_on_arrival = false;
    bool reuse_unapplied_log = false;
    // Start-now recovery: a reader that jumps to a merged node whose trie removal was owed
    // (R8) reads it as if it were in the list (its stale copies) instead of moving to the
    // survivor the log names.
    bool trust_owed_merged = false;
    // Start-now recovery: writers do not wait for the walk (R9), which then walks a list
    // they changed.
    bool write_before_walk = false;
  };
  void set_faults_for_testing(Faults f) {
    faults_ = f;
    updater_.apply_on_arrival = f.apply_on_arrival;
  }
  // Deliberate damage so a test sees verify() notice it: 0 swaps the first two keys of the
  // first node with two or more records, 1 drops a search-layer entry, 2 breaks a fingerprint,
  // 3 breaks the second node's prev hint, 4 leaves a log entry in use (never applied), 5 makes
  // a search-layer entry name the wrong node, 6 (PM search layer only) breaks the trie's top
  // node's type byte, 7 adds an entry for a key that is no node's anchor, 8 sets a bitmap bit
  // beyond the last node's slots (nodes of fewer than 64 slots), 9 gives the head's next link
  // another valid tag (its offset kept).
  void corrupt_for_testing(int what);
  // Where the search layer lives (Root::search_layer, fixed at creation).
  bool search_in_pm() const { return search_.in_pm(); }

  // Start-now recovery (PM search layer, PROTOCOL.md R7-R9): open returns after R1 and the
  // walk (R2, R3, R5, finish_recovery, R6) runs after it; readers answer meanwhile with every
  // node checked as they touch it, writers wait for it. Waits for the walk (running it here
  // if it was deferred) and returns its status: ok, or the damage it met. Ok at once for a
  // created pool and for the DRAM search layer (whose recovery blocks).
  Status wait_recovery_walk() const;
  // Whether readers still check every node they touch (the walk has not ended well).
  bool recovery_checking() const { return checking_.load(std::memory_order_acquire); }
  // At the last open (tests): log entries whose search-layer step was owed (R1), and among
  // them merged nodes a jump is redirected from (R7).
  std::size_t owed_at_open() const { return owed_.size(); }
  std::size_t merged_at_open() const { return merged_at_open_.size(); }
  bool opened_start_now() const { return started_now_; }  // R7 ran at this open
  // Where the walk runs: a thread started by open (the default outside the tracing
  // flavour), or deferred to the first caller that waits for it (a writer, verify(), close(),
  // wait_recovery_walk(); the tracing flavour's default, so the crash simulator traces the
  // walk on its thread and tests hold it as long as they like). Tests may choose; read at open.
  enum class WalkMode { automatic, thread, deferred };
  static void set_walk_mode_for_testing(WalkMode m) {
    walk_mode_for_testing_.store(m, std::memory_order_relaxed);  // relaxed: set before opens
  }
  // Known-bad (honoured only in the tracing flavour, compiled out elsewhere): the list walk
  // (R2t) and verify() read only a link's offset, as before tagged links, so a zeroed link
  // ends the list and a redirected one is followed. Read at open and by verify().
  static void set_ignore_link_tags_for_testing(bool on) {
    ignore_link_tags_for_testing_.store(on, std::memory_order_relaxed);  // relaxed: as above
  }

 private:
  using Probe = index_common::KeyCodec::Probe;
  // The search layer: the ART core in DRAM (rebuilt at every open) or in the pool (kept
  // across restarts), chosen at creation (Root::search_layer; README "Search layer").
  // visit(f) calls f with the tree in use; both instantiations share every call site.
  class Search {
   public:
    void make_dram(pm::DramArena* arena, std::uint32_t max_key) {
      pm_.reset();
      words_[0] = words_[1] = 0;
      dram_ = std::make_unique<art::Tree<art::DramPlacement>>(
          art::DramPlacement{arena}, &words_[0], &words_[1], 1, max_key);
    }
    // top: Root::search_top. The root lock word is volatile and stays in DRAM (words_[1]):
    // nothing of it needs to survive, and a lock from a crashed run can never be met.
    void make_pm(pm::Pool* pool, std::uint64_t* top, std::uint32_t run_tag, std::uint32_t max_key) {
      dram_.reset();
      words_[0] = words_[1] = 0;
      pm_ = std::make_unique<art::Tree<art::PmPlacement>>(art::PmPlacement{pool}, top,
                                                          &words_[1], run_tag, max_key);
    }
    bool in_pm() const { return pm_ != nullptr; }
    art::Tree<art::PmPlacement>* pm_tree() const { return pm_.get(); }
    template <class F>
    decltype(auto) visit(F&& f) const {
      return pm_ != nullptr ? f(*pm_) : f(*dram_);
    }

   private:
    std::uint64_t words_[2] = {0, 0};  // DRAM: the root child word and the root lock word
    std::unique_ptr<art::Tree<art::DramPlacement>> dram_;
    std::unique_ptr<art::Tree<art::PmPlacement>> pm_;
  };

  // A search-layer change waiting for its turn (LSN order).
  struct Pending {
    bool insert = true;
    std::string search_key;
    std::uint64_t node = 0;
    LogEntry* entry = nullptr;
    std::uint64_t anchor = 0;  // a merge's: the merged node's anchor word (freed at apply)
  };
  // Applies logged SMOs to the search layer in LSN order, one applier at a time (apply_mu_).
  // Synchronous: the writer that pushes an entry applies every entry whose turn has come, so
  // the point of application is fixed in the writer's code (the crash simulator enumerates
  // it). Background: a thread applies them while writers go on. Held (tests): entries wait
  // until a writer whose log ring is full helps, or the mode changes.
  class Updater {
   public:
    ~Updater() { stop(); }
    void reset(PacTree* owner, Search* tree, std::uint64_t next) {
      owner_ = owner;
      tree_ = tree;
      next_apply_ = next;
    }
    // Expects no concurrent operation. Leaving the background mode joins the thread.
    void set_mode(UpdaterMode m);
    UpdaterMode mode() const { return mode_; }
    void push(std::uint64_t lsn, Pending p);
    // Applies every queued entry whose turn has come, in LSN order. wait = false: returns at
    // once (false) if another applier holds the turn.
    bool apply_ready(bool wait);
    void stop();
    std::size_t pending() const;
    std::size_t max_pending() const { return max_pending_.load(std::memory_order_relaxed); }
    std::uint64_t applied() const { return applied_.load(std::memory_order_relaxed); }
    // Entries whose log slot held another LSN when they were applied: a slot reused before
    // its entry was applied (never, unless Faults::reuse_unapplied_log). verify() reports it.
    std::uint64_t overwritten() const { return overwritten_.load(std::memory_order_relaxed); }
    // Anchors the search layer could not take (PM search layer, pool full): verify() then
    // accepts them missing.
    std::uint64_t search_failed() const { return search_failed_.load(std::memory_order_relaxed); }
    bool apply_on_arrival = false;  // Faults (tracing flavour only)

   private:
    void run();
    void apply(std::uint64_t lsn, Pending& q);
    PacTree* owner_ = nullptr;
    Search* tree_ = nullptr;
    // Spin locks with scheduling points, not std::mutex: the crash simulator's scheduler may
    // park a holder at a PM event inside the critical section, and a waiter must then yield
    // rather than block in the kernel.
    mutable sync::SpinLock queue_mu_;
    std::map<std::uint64_t, Pending> waiting_;  // guarded by queue_mu_
    sync::SpinLock apply_mu_;                   // the turn to apply
    std::uint64_t next_apply_ = 1;              // guarded by apply_mu_
    UpdaterMode mode_ = UpdaterMode::synchronous;
    std::thread thread_;
    std::atomic<std::uint64_t> pushed_{0};  // the background thread sleeps on it
    std::atomic<bool> stop_{false};
    // Entries pushed and not yet applied (an entry being applied included): pending().
    std::atomic<std::size_t> unapplied_{0};
    std::atomic<std::size_t> max_pending_{0};
    std::atomic<std::uint64_t> applied_{0};
    std::atomic<std::uint64_t> overwritten_{0};
    std::atomic<std::uint64_t> search_failed_{0};
  };

  explicit PacTree(std::unique_ptr<pm::Pool> pool);
  Status init_root(const Options& o);
  // run_tag: the PM search layer's lock-word tag for this run (art::run_tag).
  void configure(Root* r, std::uint32_t run_tag);
  static UpdaterMode initial_updater_mode(const Options& o);

  // keys and nodes
  DataNode* node(std::uint64_t off) const { return pool_->at<DataNode>(off); }
  std::string key_of(std::uint64_t key_word) const { return keys_.key_bytes(key_word); }
  // The search layer's key for an anchor: its bytes in an order-reversing encoding, so the
  // trie's ascending scan from a key's encoding yields the greatest anchor <= the key.
  std::string search_key(std::string_view key) const;
  // anchor(node at off) <= p (the head's anchor is -inf).
  bool anchor_le(std::uint64_t off, const Probe& p) const;
  std::uint64_t jump_node(const Probe& p) const;
  // Index::find_many's group: find's steps for every key, pass by pass (pactree.cpp).
  void find_batch(const std::string_view* keys, std::string* values, Code* codes,
                  std::size_t n) const override;
  // find's jump and probe for p[0, n) with prefetches between passes; keys it cannot answer
  // from one validated visit of their jump node are set in the returned mask.
  std::uint64_t probe_batch(const Probe* p, std::size_t n, std::uint64_t* words,
                            Code* got) const;
  std::uint64_t fp_candidates(const DataNode* n, std::uint8_t fp, std::uint64_t bitmap) const;
  int find_slot(const DataNode* n, const Probe& p, std::uint64_t bitmap) const;
  // The node whose range holds p, locked; *version its locked word.
  std::uint64_t lock_node(const Probe& p) const;
  void unlock(std::uint64_t off) const;
  void retire_key(std::uint64_t key_word) const;
  void retire_value(std::uint64_t value_word) const;
  static void release_key(void* self, std::uint64_t word);
  static void release_value(void* self, std::uint64_t word);

  Code insert_once(std::string_view key, std::string_view value);
  Code update_once(std::string_view key, std::string_view value);
  void write_slot(DataNode* n, unsigned i, std::uint64_t key_word, std::uint64_t value_word,
                  std::uint8_t fp) const;
  // Splits the locked node at off (S1-S8); leaves it unlocked either way.
  Code split(std::uint64_t off);
  LogEntry* log_slot(Code* code);
  struct Merge {
    std::uint64_t lsn = 0;  // 0: no merge happened
    Pending change;
  };
  // Merges the right neighbour into the locked node at off when both are sparse (M1-M6).
  Merge maybe_merge(std::uint64_t off);
  static void release_node(void* self, std::uint64_t off);
  // The node to go on from when `off` turned out obsolete (merged away): its left neighbour,
  // which took over its range.
  std::uint64_t survivor_of(std::uint64_t off) const;
  // Where a lookup for p goes on from the obsolete node at off (survivor_of, or the jump node
  // under Faults::restart_on_merged).
  std::uint64_t after_merged(std::uint64_t off, const Probe& p) const;
  void print_stats() const;

  // recovery and verification (recovery.cpp)
  using Anchors = std::unordered_map<std::string, std::uint64_t>;  // search key -> live node
  using Records = std::vector<std::pair<std::string, std::uint64_t>>;
  // R1. With the PM search layer, entries whose SMO stands but whose search-layer step may
  // not have happened stay in use and are listed in *owed (freed at R6); with the DRAM one
  // (rebuilt) every entry is freed.
  Status repair_logs(Root* r, std::uint64_t* repaired, std::vector<LogEntry*>* owed);
  Status logged_anchor(const LogEntry& e, std::string* anchor) const;
  // R2-R4; *anchors (PM search layer only) receives every live node's search key.
  Status rebuild(Root* r, Anchors* anchors, std::uint64_t* records, std::uint64_t* nodes);
  // R5 (before finish_recovery): the PM search layer is walked and checked, and every block
  // of it marked; each record must name the live node of its anchor, others go to *stale.
  // A damaged trie marks nothing and is cut off.
  // Readers may be in the trie meanwhile (start-now): the full tree.verify is left out (it
  // expects a quiescent trie), and a cut-off trie waits a grace period of the trie's epochs
  // before finish_recovery may hand its blocks out again. *repaired counts a cut-off.
  Status adopt_pm_search(const Anchors& live, Records* stale, std::uint64_t* repaired);
  // R6 (after finish_recovery): stale records removed, missing anchors inserted (the logged
  // SMOs' owed steps among them), then the owed log entries freed.
  Status finish_pm_search(const Anchors& live, const Records& stale,
                          const std::vector<LogEntry*>& owed);
  // Start-now recovery (PM search layer): R7 at open (the owed merges' survivors), the walk
  // (R2, R3, R5, finish_recovery, R6) on a thread or deferred, and the readers' checks (R8).
  Status open_start_now(std::uint64_t root_off);
  void start_walk();
  Status run_walk();
  Code writable() const;
  Code seek_jump(const Probe& p, std::uint64_t* found) const;
  std::uint64_t checked_jump(const Probe& p) const;
  bool node_sound(std::uint64_t off) const;
  // Whether the link word names a node that carries its tag (R8; link not the end mark, its
  // offset already checked by node_sound of the node that holds it).
  bool link_names(std::uint64_t link) const;
  // Whether next's anchor lies beyond off's (off the head: always): the list's order, so a
  // checked walk along damaged links ends.
  bool anchor_above(std::uint64_t next, std::uint64_t off) const;
  [[gnu::noinline]] Code find_checked(std::string_view key, std::string* value) const;
  // Records and nodes on the PM list, read-only (close, quiescent); kNoCount if the list
  // fails its bounded walk.
  void count_list(std::uint64_t* records, std::uint64_t* nodes) const;
  Status check_node(std::uint64_t off, std::string_view lo, bool has_lo,
                    std::string* hi_out) const;
  // R2t: off's next link is the end mark or names, with a valid tag, the node that carries it.
  Status check_link(std::uint64_t off) const;
  Status verify_list(std::vector<std::uint64_t>* nodes, std::uint64_t* reachable) const;
  Status verify_search(const std::vector<std::uint64_t>& nodes, std::uint64_t* reachable) const;

  std::unique_ptr<pm::Pool> pool_;
  Root* root_ = nullptr;
  index_common::KeyCodec keys_;
  index_common::ValueCodec values_;
  bool bytes_ = false;
  std::uint32_t node_size_ = kDefaultNodeSize;
  std::uint32_t node_block_ = kDefaultNodeSize;
  unsigned slots_ = kMaxSlots;
  std::uint64_t full_ = ~std::uint64_t{0};
  std::unique_ptr<index_common::LeafVersions> versions_;
  index_common::TagSource tags_;  // fresh node tags (C1, S1)
  pm::DramArena arena_;  // the DRAM search layer's nodes and records
  Search search_;
  Updater updater_;
  Faults faults_;
  std::atomic<std::uint64_t> next_lsn_{1};
  std::unique_ptr<unsigned[]> log_cursor_;  // per thread slot: next ring entry (owner only)
  mutable std::atomic<std::uint64_t> splits_{0};
  mutable std::atomic<std::uint64_t> merges_{0};
  mutable std::atomic<std::uint64_t> hops_{0};
  mutable sync::EpochManager epochs_;
  RecoveryStats recovery_;  // guarded by walk_mu_ while the walk may run
  bool closed_ = false;
  bool print_stats_ = false;  // Options::pactree.stats
  // Start-now recovery (R7-R9). merged_at_open_: each merged node whose trie removal is owed
  // -> the live node that took over its range (the end of its survivor chain), read-only
  // after open. owed_: the log entries R6 frees.
  std::unordered_map<std::uint64_t, std::uint64_t> merged_at_open_;
  std::vector<LogEntry*> owed_;
  mutable std::mutex walk_mu_;
  mutable std::condition_variable walk_cv_;
  mutable bool walk_deferred_ = false;  // guarded by walk_mu_: nobody has started it yet
  bool started_now_ = false;            // set at open
  std::atomic<bool> walk_done_{true};
  std::atomic<bool> checking_{false};   // readers check what they touch (R8)
  std::atomic<bool> corrupted_{false};  // the walk met damage: writes answer corrupted
  Status walk_status_;                  // guarded by walk_mu_
  // Joined by verify() and close() (quiescent calls): the thread's exit hands its epoch
  // registrations over, which the epoch managers' drain() must not meet.
  mutable std::thread walker_;
  static std::atomic<WalkMode> walk_mode_for_testing_;
  static std::atomic<bool> ignore_link_tags_for_testing_;
};

}  // namespace pmindex::pactree

// PACTree: creation, recovery (R1-R4: SMO log repair, list walk, search-layer rebuild),
// verify() and the registry entry. Steps: PROTOCOL.md.
#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <unordered_set>

#include "index/common/close_counts.h"
#include "index/common/pm_record.h"
#include "index/common/traits.h"
#include "index/pactree/pactree.h"

namespace pmindex::pactree {

namespace {
std::uint32_t node_size_of(const Options& o) {
  return o.node_size == 0 ? kDefaultNodeSize : o.node_size;
}
bool valid_node_size(std::uint32_t ns) {
  return ns >= kHeaderBytes + kMinSlots * kSlotBytes && ns <= kDefaultNodeSize &&
         (ns - kHeaderBytes) % kSlotBytes == 0;
}
std::uint32_t max_key_of(const Options& o) {
  return o.key_type == KeyType::bytes ? o.max_key_size : 8;
}
std::size_t block_bytes(std::size_t request) {
  return pm::Allocator::class_size(pm::Allocator::class_of(request));
}
// Returns once every thread pinned in `em` at the call has unpinned: a retired marker is
// collected only then.
void grace_period(sync::EpochManager& em) {
  auto passed = std::make_shared<std::atomic<bool>>(false);
  em.retire([passed] { passed->store(true, std::memory_order_release); });
  while (!passed->load(std::memory_order_acquire)) {
    (void)em.collect();
    std::this_thread::yield();
  }
}
const char* search_name(std::uint32_t placement) { return placement == kSearchPm ? "pm" : "dram"; }
// The search layer's placement is the pool's (Root::search_layer): an explicit request for
// the other one is refused before anything is written.
Status check_search_choice(const Options& o, std::uint32_t pool_placement) {
  using S = PacTreeOptions::SearchLayer;
  if (o.pactree.search_layer == S::automatic) return Status::Ok();
  const std::uint32_t want = o.pactree.search_layer == S::pm ? kSearchPm : kSearchDram;
  if (want == pool_placement) return Status::Ok();
  return Status(Code::invalid_argument,
                std::string("pactree: the pool's search layer is in ") +
                    search_name(pool_placement) + " (chosen at creation); Options::pactree." +
                    "search_layer asks for " + search_name(want));
}
}  // namespace

pm::Layout PacTree::layout_for(const Options& o) {
  return pm::Layout{"pactree", node_size_of(o), o.key_type, 0};
}

Status PacTree::validate(const Options& o) {
  if (!valid_node_size(node_size_of(o)))
    return Status(Code::invalid_argument,
                  "pactree node_size must be 128 + 16 x slots with 2..64 slots (160..1152 B)");
  if (o.key_type == KeyType::bytes && o.max_key_size > kMaxKeyBytes)
    return Status(Code::invalid_argument,
                  "pactree keys are limited to " + std::to_string(kMaxKeyBytes) + " bytes");
  if (!index_common::ValueCodec::valid_limit(o.max_value_size))
    return Status(Code::invalid_argument, "pactree max_value_size must be in [8, 65536]");
  return Status::Ok();
}

std::size_t PacTree::default_pool_size(const Options& o) {
  // Nodes about 70% full after random inserts, plus key and value records; doubled for slack.
  const std::uint32_t ns = node_size_of(o);
  std::size_t per_record = 2 * block_of(ns) / std::max(1u, slots_of(ns));
  if (o.key_type == KeyType::bytes) per_record += 16 + o.max_key_size;
  if (o.max_value_size > 8) per_record += 16 + o.max_value_size;
  return std::max<std::size_t>(std::size_t{16} << 20, o.expected_records * per_record * 2);
}

void PacTree::configure(Root* r, std::uint32_t run_tag) {
  root_ = r;
  bytes_ = pool_->info().layout.key_mode == KeyType::bytes;
  keys_.configure(pool_.get(), pool_->info().layout.key_mode, r->max_key_size);
  values_.configure(pool_.get(), r->max_value_size);
  node_size_ = r->node_size;
  node_block_ = block_of(node_size_);
  slots_ = slots_of(node_size_);
  full_ = slots_ == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << slots_) - 1;
  versions_ = std::make_unique<index_common::LeafVersions>(pool_->size());
  const std::uint32_t search_max_key = bytes_ ? 2 * r->max_key_size + 1 : 8;
  if (r->search_layer == kSearchPm) {
    search_.make_pm(pool_.get(), &r->search_top, run_tag, search_max_key);
  } else {
    search_.make_dram(&arena_, search_max_key);
  }
  updater_.reset(this, &search_, next_lsn_.load(std::memory_order_relaxed));  // relaxed: no
  // operation runs yet
}

// The updater's mode at open: background, except in the tracing flavour (the crash simulator
// enumerates the synchronous mode's steps); Options::pactree.updater overrides.
UpdaterMode PacTree::initial_updater_mode(const Options& o) {
  switch (o.pactree.updater) {
    case PacTreeOptions::Updater::synchronous: return UpdaterMode::synchronous;
    case PacTreeOptions::Updater::background: return UpdaterMode::background;
    case PacTreeOptions::Updater::automatic: break;
  }
  return pm::kTracing ? UpdaterMode::synchronous : UpdaterMode::background;
}

// C1-C3: the head node, then the root object, each durable before it is named.
Status PacTree::init_root(const Options& o) {
  pm::Allocator& al = pool_->allocator();
  Code code = Code::ok;
  const std::uint32_t ns = node_size_of(o);
  const std::uint64_t head = al.allocate(block_of(ns), &code);
  const std::uint64_t root = head == 0 ? 0 : al.allocate(sizeof(Root), &code);
  if (root == 0) return pool_->error(code, "no space for the pactree root and head node");
  pm::zero(pool_->at<void>(head), kHeaderBytes);
  pm::store(&node(head)->h.flags, kFlagHead);
  pm::store(&node(head)->h.tag, tags_.next());
  pm::store(&node(head)->h.next, kChainEnd);  // the last node's link: the end mark
  pm::persist(pool_->at<void>(head), kHeaderBytes);  // C1: the empty head node
  Root* r = pool_->at<Root>(root);
  pm::zero(r, sizeof(Root));
  pm::store(&r->magic, kRootMagic);
  pm::store(&r->head, head);
  pm::store(&r->node_size, ns);
  pm::store(&r->max_key_size, max_key_of(o));
  pm::store(&r->max_value_size, o.max_value_size);
  pm::store(&r->log_ring, static_cast<std::uint32_t>(kLogRing));
  pm::store(&r->stamp, index_common::make_root_stamp(pool_->info().layout));
  pm::store(&r->search_layer, o.pactree.search_layer == PacTreeOptions::SearchLayer::pm
                                  ? kSearchPm : kSearchDram);  // search_top: 0, an empty trie
  pm::persist(r, sizeof(Root));  // C2
  pool_->set_root(root);         // C3: published in the pool header
  configure(r, art::run_tag(pool_->generation()));
  return Status::Ok();
}

Result<std::unique_ptr<Index>> PacTree::create(std::unique_ptr<pm::Pool> pool,
                                               const Options& o) {
  std::unique_ptr<PacTree> idx(new PacTree(std::move(pool)));
  idx->print_stats_ = o.pactree.stats;
  if (Status s = idx->init_root(o); !s.ok()) return s;
  idx->recovery_.created = true;
  idx->updater_.set_mode(initial_updater_mode(o));
  return std::unique_ptr<Index>(std::move(idx));
}

Result<std::unique_ptr<Index>> PacTree::recover(std::unique_ptr<pm::Pool> pool,
                                                const Options& o) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<PacTree> idx(new PacTree(std::move(pool)));
  idx->print_stats_ = o.pactree.stats;
  pm::Pool& p = *idx->pool_;
  idx->recovery_.clean_shutdown = p.was_clean();
  const std::uint64_t root_off = p.root();
  if (root_off == 0) {  // crashed before C3: nothing was reachable
    p.allocator().begin_recovery(/*start_now=*/false);
    if (Status s = p.allocator().finish_recovery(); !s.ok()) return s;
    p.commit_open();
    if (Status s = idx->init_root(o); !s.ok()) return s;
    idx->updater_.set_mode(initial_updater_mode(o));
    return std::unique_ptr<Index>(std::move(idx));
  }
  Root* r = p.checked<Root>(root_off, sizeof(Root), 64);
  if (r != nullptr && r->magic == kRootMagicUntagged)
    return p.error(Code::corrupted,
                   "pactree root is of format PACTREE1 (next links without tags, before pmindex "
                   "adopted tagged links): load the records into a new pool");
  if (r == nullptr || r->magic != kRootMagic)
    return p.error(Code::corrupted, "pactree root object is missing or has a wrong magic");
  if (Status s = index_common::check_root_stamp(r->stamp, p); !s.ok()) return s;
  const bool fixed = p.info().layout.key_mode != KeyType::bytes;
  if (r->node_size != p.info().layout.node_size || !valid_node_size(r->node_size) ||
      r->max_key_size > kMaxKeyBytes || (fixed && r->max_key_size != 8) ||
      !index_common::ValueCodec::valid_limit(r->max_value_size) || r->log_ring != kLogRing ||
      r->search_layer > kSearchPm || (r->search_layer == kSearchDram && r->search_top != 0))
    return p.error(Code::corrupted, "pactree root holds impossible sizes");
  // R2: the head never moves and is never freed; its flag (checked by R2 and R8) tells it from
  // any other node, so a head word moved to another node is refused there.
  if (p.checked<DataNode>(r->head, r->node_size, 256) == nullptr)
    return p.error(Code::corrupted, "pactree root's head node offset is out of bounds");
  if (Status s = check_search_choice(o, r->search_layer); !s.ok()) return s;  // pool unchanged
  // The PM search layer's lock tag: this open's generation (the one commit_open records, one
  // past the last open's) plus 16 random bits, so no lock word of an earlier run reads as
  // this run's.
  idx->configure(r, art::run_tag(p.generation()));
  if (r->search_layer == kSearchPm) {
    if (Status s = idx->open_start_now(root_off); !s.ok()) return s;
    idx->recovery_.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    idx->updater_.set_mode(initial_updater_mode(o));
    idx->start_walk();
    return std::unique_ptr<Index>(std::move(idx));
  }
  // The DRAM search layer: blocking recovery (R1-R4); there is no trie to answer from.
  p.allocator().begin_recovery(/*start_now=*/false);
  if (p.allocator().mark_reachable(root_off, sizeof(Root)) != Code::ok)
    return p.error(Code::corrupted, "pactree root object cannot be marked");
  std::vector<LogEntry*> owed;  // stays empty: every entry is freed at R1
  if (Status s = idx->repair_logs(r, &idx->recovery_.repaired, &owed); !s.ok()) return s;
  Anchors live;
  std::uint64_t records = 0, nodes = 0;
  if (Status s = idx->rebuild(r, &live, &records, &nodes); !s.ok()) return s;
  idx->recovery_.records = records;
  idx->recovery_.nodes = nodes;
  idx->set_recovered_records(records);  // size()
  // A list cut short after a clean close is refused (before finish_recovery frees anything).
  if (Status s = index_common::check_close_counts(p, "pactree", records, nodes); !s.ok())
    return s;
  if (Status s = p.allocator().finish_recovery(); !s.ok()) return s;
  p.commit_open();
  idx->recovery_.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  idx->updater_.set_mode(initial_updater_mode(o));
  return std::unique_ptr<Index>(std::move(idx));
}

// R7 (PM search layer): the work that must precede any answer, bounded by the log rings and
// the root, none of it proportional to the pool: the trie's top word is checked (a bad one is
// cut off, R5's repair done early), the allocator starts now (new blocks above the high-water
// mark), R1 runs on the logs (at most kLogRing entries per thread slot), the owed merges'
// survivors are resolved, and the open is committed. The walk follows (start_walk).
Status PacTree::open_start_now(std::uint64_t root_off) {
  pm::Pool& p = *pool_;
  recovery_.records_counted = false;  // the walk counts them after the open returned
  if (!search_.pm_tree()->check_top().empty()) {
    pm::publish(&root_->search_top, 0);
    pm::persist(&root_->search_top, 8);  // R7: a top word out of bounds is cut off (R5)
    ++recovery_.repaired;
  }
  p.allocator().begin_recovery(/*start_now=*/true);
  if (p.allocator().mark_reachable(root_off, sizeof(Root)) != Code::ok)
    return p.error(Code::corrupted, "pactree root object cannot be marked");
  if (Status s = repair_logs(root_, &recovery_.repaired, &owed_); !s.ok()) return s;  // R1
  // R7: each merged node whose trie removal is owed -> the live node that took over its
  // range. The log names the survivor (left) of every owed merge; a survivor merged later
  // (an owed merge of a higher LSN) is followed to its own survivor. The merged node's block
  // is never read: it was freed at an earlier open's finish_recovery if that open's R6 was cut
  // short, and may hold anything now.
  std::unordered_map<std::uint64_t, std::uint64_t> into;
  for (const LogEntry* e : owed_) {
    const std::uint64_t stage = stage_of(e->state);
    if (stage == kStageMergeDone || stage == kStageMergeLogged)
      into[link_off(e->right)] = link_off(e->left);  // offsets only: blocks are not read
  }
  for (const auto& [merged, left] : into) {
    std::uint64_t survivor = left;
    for (std::size_t hops = 0; into.count(survivor) != 0; ++hops) {
      if (hops > into.size())
        return p.error(Code::corrupted, "pactree SMO log: merges name each other in a cycle");
      survivor = into.at(survivor);
    }
    merged_at_open_[merged] = survivor;
  }
  p.commit_open();
  return Status::Ok();
}

void PacTree::start_walk() {
  WalkMode m = walk_mode_for_testing_.load(std::memory_order_relaxed);  // relaxed: set
  // before the open, on this thread
  if (m == WalkMode::automatic) m = pm::kTracing ? WalkMode::deferred : WalkMode::thread;
  started_now_ = true;
  checking_.store(true, std::memory_order_relaxed);    // relaxed: before any reader or the
  walk_done_.store(false, std::memory_order_relaxed);  // walker exists
  if (m == WalkMode::deferred) {  // size() counts from 0 until the walk ran: it must not
    walk_deferred_ = true;        // wait for a walk that only a waiter starts
    return;
  }
  recovered_records_pending();  // size() waits for the walk's count
  walker_ = std::thread([this] { (void)run_walk(); });
}

// R2, R3, R5, finish_recovery, R6 while readers answer (R8) and writers wait (R9). Because
// no writer runs beside it, its counts are exact (check_close_counts) and no block from
// before the restart is freed before it is marked. Damage anywhere stops it: finish_recovery
// is not called (unvisited blocks may be live), writes answer corrupted, verify() and close()
// return the error, and readers go on checking what they touch.
Status PacTree::run_walk() {
  pm::Pool& p = *pool_;
  Anchors live;
  Records stale;
  std::uint64_t records = 0, nodes = 0, repaired = 0;
  Status s = rebuild(root_, &live, &records, &nodes);  // R2, R3
  if (s.ok()) s = adopt_pm_search(live, &stale, &repaired);  // R5
  if (s.ok()) s = index_common::check_close_counts(p, "pactree", records, nodes);
  if (s.ok()) s = p.allocator().finish_recovery();
  if (s.ok()) s = finish_pm_search(live, stale, owed_);  // R6
  {
    std::lock_guard<std::mutex> lock(walk_mu_);
    recovery_.records = records;
    recovery_.nodes = nodes;
    recovery_.repaired += repaired;
    set_recovered_records(records);  // also after a failed walk: size() must not wait forever
    if (!s.ok()) corrupted_.store(true, std::memory_order_relaxed);  // relaxed: read after
    // walk_done_'s acquire
    walk_status_ = s;
    // release: a reader that sees checking_ false then sees R6's trie (no stale record left).
    if (s.ok()) checking_.store(false, std::memory_order_release);
    walk_done_.store(true, std::memory_order_release);  // pairs with writable()
  }
  walk_cv_.notify_all();
  return s;
}

Status PacTree::wait_recovery_walk() const {
  std::unique_lock<std::mutex> lock(walk_mu_);
  if (walk_deferred_) {  // nobody started it: the first caller runs it (WalkMode::deferred)
    walk_deferred_ = false;
    lock.unlock();
    // The walk repairs the pool (R3, R5, R6): recovery's work, owed by this open; the index
    // object itself is never const (opened non-const, callers hold a const view).
    (void)const_cast<PacTree*>(this)->run_walk();
    lock.lock();
  }
  walk_cv_.wait(lock, [&] { return walk_done_.load(std::memory_order_acquire); });
  return walk_status_;
}

// R9: writers wait for the walk (it must see the list no writer changes, and no block from
// before the restart may be freed before it is marked: allocator.h, start-now mode).
Code PacTree::writable() const {
  if constexpr (pm::kTracing) {
    if (faults_.write_before_walk) return Code::ok;  // Faults: no wait
  }
  if (!walk_done_.load(std::memory_order_acquire)) [[unlikely]]
    (void)wait_recovery_walk();
  return corrupted_.load(std::memory_order_relaxed) ? Code::corrupted : Code::ok;
}

// R1: every logged split is finished (linked: the moved records leave the old node) or
// forgotten (not linked: the new node and its anchor are unreachable and the allocator frees
// them); every logged merge is finished (unlinked) or undone. With the DRAM search layer
// (rebuilt from the list) every entry is then freed, so no stale entry is ever read again.
// With the PM search layer an SMO whose data-layer change stands owes its search-layer step
// (it may or may not have happened): the entry stays in use and goes to *owed, freed at R6
// once the trie matches the list. The step itself is not taken from the entry: a merged
// node's anchor record is unreachable, so freed at finish_recovery (and, after a crash
// during R6, perhaps reused); the list's anchors and the trie walk say what is owed.
Status PacTree::repair_logs(Root* r, std::uint64_t* repaired, std::vector<LogEntry*>* owed) {
  pm::Pool& p = *pool_;
  const bool pm_search = search_.in_pm();
  const std::size_t ring_bytes = kLogRing * sizeof(LogEntry);
  for (std::size_t t = 0; t < pm::kMaxThreadSlots; ++t) {
    const std::uint64_t block = r->logs[t];
    if (block == 0) continue;
    LogEntry* ring = p.checked<LogEntry>(block, ring_bytes, 64);
    if (ring == nullptr || p.allocator().mark_reachable(block, ring_bytes) != Code::ok)
      return p.error(Code::corrupted, "pactree SMO log block out of bounds");
    for (unsigned j = 0; j < kLogRing; ++j) {
      LogEntry& e = ring[j];
      const std::uint64_t stage = stage_of(e.state);
      if (e.state == 0) continue;
      if (stage != kStageSplitLogged && stage != kStageSplitDone &&
          stage != kStageMergeLogged && stage != kStageMergeDone)
        return p.error(Code::corrupted, "pactree SMO log entry in an unknown stage");
      DataNode* left = p.checked<DataNode>(link_off(e.left), node_size_, 256);
      DataNode* right = p.checked<DataNode>(link_off(e.right), node_size_, 256);
      if (left == nullptr || right == nullptr)
        return p.error(Code::corrupted, "pactree SMO log names a node out of bounds");
      const bool split = stage == kStageSplitLogged || stage == kStageSplitDone;
      // A split stands once S4 linked the new node; a merge once M4 unlinked the right one.
      bool stands = stage == kStageSplitDone || stage == kStageMergeDone;
      if (stage == kStageSplitLogged || stage == kStageMergeLogged) {
        // X was locked from before the entry was logged until its stage left *Logged, so it
        // is live and carries the tag logged with it (a Done entry's nodes are not read: an
        // earlier open's cut-short R6 may have let their blocks be reused).
        if (!valid_tag(link_tag(e.left)) || left->h.tag != link_tag(e.left))
          return p.error(Code::corrupted,
                         "pactree SMO log names a node that does not carry the logged tag");
        const bool linked = left->h.next == e.right;  // whole link words: S4 / before M4
        stands = split ? linked : !linked;
        if (linked) {  // S5 redone (split) or M3 undone (merge): the same bits leave X
          std::string anchor;
          if (Status s = logged_anchor(e, &anchor); !s.ok()) return s;
          std::uint64_t bits = left->h.bitmap & full_;
          for (std::uint64_t b = bits; b != 0; b &= b - 1) {
            const int i = std::countr_zero(b);
            if (key_of(left->slots[i].key) >= anchor) bits &= ~(std::uint64_t{1} << i);
          }
          pm::publish(&left->h.bitmap, bits);
          pm::persist(&left->h.bitmap, 8);  // R1: S5 redone / M3 undone
        }
        ++*repaired;
      }
      if (pm_search && stands) {
        owed->push_back(&e);
        continue;  // freed at R6, after its search-layer step
      }
      pm::publish(&e.state, 0);
      pm::persist(&e.state, 8);  // R1: the entry is free
    }
  }
  return Status::Ok();
}

// A log entry's anchor key, its record checked first (bytes keys: never trust PM).
Status PacTree::logged_anchor(const LogEntry& e, std::string* out) const {
  if (bytes_) {
    std::string_view stored;
    if (!index_common::read_record(*pool_, e.anchor, keys_.max_key(), &stored))
      return pool_->error(Code::corrupted, "pactree SMO log anchor record unreadable");
  }
  *out = key_of(e.anchor);
  return Status::Ok();
}

// Checks one node's records against [lo, its next node's anchor) and returns that anchor in
// *hi_out ("" for the last node); used by the recovery walk and verify().
Status PacTree::check_node(std::uint64_t off, std::string_view lo, bool has_lo,
                           std::string* hi_out) const {
  pm::Pool& p = *pool_;
  const DataNode* n = node(off);
  if (Status s = check_link(off); !s.ok()) return s;  // R2t
  const std::uint64_t next = link_off(n->h.next);
  std::string hi;
  if (next != 0) {
    const DataNode* nx = p.checked<DataNode>(next, node_size_, 256);
    if (nx == nullptr) return p.error(Code::corrupted, "pactree next link out of bounds");
    if (nx->h.flags != 0) return p.error(Code::corrupted, "pactree node after the head has flags");
    std::string_view stored;
    if (bytes_ && !index_common::read_record(p, nx->h.anchor, keys_.max_key(), &stored))
      return p.error(Code::corrupted, "pactree anchor record unreadable");
    hi = key_of(nx->h.anchor);
    if (has_lo && hi <= lo) return p.error(Code::corrupted, "pactree anchors out of order");
  }
  if ((n->h.bitmap & ~full_) != 0) return p.error(Code::corrupted, "pactree bitmap beyond slots");
  std::vector<std::string> keys;
  for (std::uint64_t b = n->h.bitmap; b != 0; b &= b - 1) {
    const int i = std::countr_zero(b);
    std::string_view stored;
    if (bytes_ && !index_common::read_record(p, n->slots[i].key, keys_.max_key(), &stored))
      return p.error(Code::corrupted, "pactree key record unreadable");
    std::string k = key_of(n->slots[i].key);
    if ((has_lo && k < lo) || (next != 0 && k >= hi))
      return p.error(Code::corrupted, "pactree key outside its node's range");
    keys.push_back(std::move(k));
  }
  std::sort(keys.begin(), keys.end());
  if (std::adjacent_find(keys.begin(), keys.end()) != keys.end())
    return p.error(Code::corrupted, "pactree duplicate key in a node");
  *hi_out = std::move(hi);
  return Status::Ok();
}

// R2t: the node's own tag is valid, and its next link is the end mark or names, with a valid
// tag, the node that carries that tag. After any end: a link zeroed, or redirected to another
// valid node, or naming a node whose header line was lost, is damage.
Status PacTree::check_link(std::uint64_t off) const {
  pm::Pool& p = *pool_;
  const DataNode* n = node(off);
  if constexpr (pm::kTracing) {
    // Known-bad: offsets only, as before tagged links (a zeroed link then ends the list).
    if (ignore_link_tags_for_testing_.load(std::memory_order_relaxed)) return Status::Ok();
  }
  const std::uint64_t link = n->h.next;
  // Built only for a refusal: recovery checks every node.
  const auto at = [off] {
    return "pactree: the next link of the node at offset " + std::to_string(off);
  };
  if (!valid_tag(n->h.tag))
    return p.error(Code::corrupted, "pactree: the node at offset " + std::to_string(off) +
                                        " has no valid tag (its header line was lost)");
  if (link == kChainEnd) return Status::Ok();
  if (link == 0) return p.error(Code::corrupted, at() + " is 0, not the end mark (a zeroed link)");
  const DataNode* nx = p.checked<DataNode>(link_off(link), node_size_, 256);
  if (nx == nullptr) return p.error(Code::corrupted, "pactree next link out of bounds");
  if (!valid_tag(link_tag(link)) || nx->h.tag != link_tag(link))
    return p.error(Code::corrupted, at() + " does not carry the tag of the node it names (a "
                                         "damaged or redirected link)");
  return Status::Ok();
}

// R2-R4: walk the list (bounds, cycles, order, every link's tag: R2t in check_node), mark
// every reachable block, repair prev hints and build the DRAM search layer from the anchors
// (the PM one: collect them for R5-R6).
Status PacTree::rebuild(Root* r, Anchors* anchors, std::uint64_t* records_out,
                        std::uint64_t* nodes_out) {
  const bool pm_search = search_.in_pm();
  pm::Pool& p = *pool_;
  pm::Allocator& al = p.allocator();
  std::unordered_set<std::uint64_t> seen;
  std::uint64_t prev = 0, off = r->head, records = 0;
  std::string lo;
  while (off != 0) {
    DataNode* n = p.checked<DataNode>(off, node_size_, 256);
    if (n == nullptr || !seen.insert(off).second)
      return p.error(Code::corrupted, "pactree list link out of bounds or cyclic");
    if ((prev == 0) != (n->h.flags == kFlagHead))
      return p.error(Code::corrupted, "pactree head flag misplaced");
    std::string hi;
    if (Status s = check_node(off, lo, prev != 0, &hi); !s.ok()) return s;
    if (al.mark_reachable(off, node_block_) != Code::ok)
      return p.error(Code::corrupted, "pactree node cannot be marked");
    if (prev != 0 && bytes_ && index_common::mark_record(p, n->h.anchor, keys_.max_key()) != Code::ok)
      return p.error(Code::corrupted, "pactree anchor record cannot be marked");
    for (std::uint64_t b = n->h.bitmap; b != 0; b &= b - 1) {
      const int i = std::countr_zero(b);
      if ((bytes_ && index_common::mark_record(p, n->slots[i].key, keys_.max_key()) != Code::ok) ||
          values_.mark(n->slots[i].value) != Code::ok)
        return p.error(Code::corrupted, "pactree record cannot be marked");
      ++records;
    }
    if (n->h.prev != prev) {
      pm::publish(&n->h.prev, prev);
      pm::persist(&n->h.prev, 8);  // R3: the prev hint repaired
    }
    if (prev != 0 && pm_search) {
      (*anchors)[search_key(lo)] = off;
    } else if (prev != 0 &&
               search_.visit([&](auto& t) { return t.insert(search_key(lo), off); }) != Code::ok) {
      return p.error(Code::corrupted, "pactree search layer rebuild failed");  // R4
    }
    prev = off;
    lo = std::move(hi);
    off = link_off(n->h.next);  // check_node: the end mark or a checked link
  }
  *records_out = records;
  *nodes_out = seen.size();
  return Status::Ok();
}

// R5 (in the start-now walk, readers in the trie meanwhile): the PM search layer is checked as
// the part index's recovery walk does (bounds, alignment, types, depth bounded by the key
// limit, no node reached twice), and its blocks are marked, all or none. The full check
// (tree.verify: records carry their path, keys in order) is left out: it expects a quiescent
// trie, and readers admit its nodes meanwhile (P10). A trie that misroutes costs readers time,
// not answers (R8), and verify() reports it. A
// record must name the live node of its anchor; any other (a merged node's anchor whose
// removal was owed, a damaged value) is listed in *stale. A damaged trie is cut off
// (search_top = 0, persisted) and none of its blocks is marked, so finish_recovery frees them
// and R6 builds the trie again from the anchors.
Status PacTree::adopt_pm_search(const Anchors& live, Records* stale, std::uint64_t* repaired) {
  pm::Pool& p = *pool_;
  art::Tree<art::PmPlacement>& tree = *search_.pm_tree();
  std::vector<std::pair<std::uint64_t, std::size_t>> blocks;
  std::unordered_set<std::uint64_t> nodes;
  std::string damage =
      tree.walk([&](std::uint64_t ref, std::size_t bytes, bool is_record, std::uint64_t value) {
        if (!is_record && !nodes.insert(ref).second) return false;  // reached twice
        blocks.emplace_back(ref, bytes);
        if (!is_record) return true;
        const auto* rec = p.at<const art::Record>(ref);  // bounds checked by the walk
        std::string key(rec->key(), rec->key_len);
        const auto it = live.find(key);
        if (it == live.end() || it->second != value) stale->emplace_back(std::move(key), value);
        return true;
      });
  if (!damage.empty()) {
    stale->clear();
    pm::publish(&root_->search_top, 0);
    pm::persist(&root_->search_top, 8);  // R5: the damaged trie is cut off, rebuilt at R6
    ++*repaired;
    // Readers may still be inside the old trie: its blocks are freed at finish_recovery, so
    // first every reader pinned now must have left (a grace period of the trie's epochs).
    grace_period(tree.epochs());
    return Status::Ok();
  }
  for (const auto& [ref, bytes] : blocks)
    if (p.allocator().mark_reachable(ref, bytes) != Code::ok)
      return p.error(Code::corrupted, "pactree search layer overlaps another block");
  return Status::Ok();
}

// R6 (the allocator recovered, so the trie may allocate): the stale records go (a removal
// takes only a record that still names the stale node), every live anchor the trie lacks or
// maps elsewhere is inserted or rewritten (P8), and only then are the owed entries freed.
// Each step is idempotent: a crash anywhere here leaves the entries in use, and R1-R6 run
// again to the same end, whether a step had happened once, twice or not at all.
Status PacTree::finish_pm_search(const Anchors& live, const Records& stale,
                                 const std::vector<LogEntry*>& owed) {
  art::Tree<art::PmPlacement>& tree = *search_.pm_tree();
  for (const auto& [key, node] : stale) {
    std::uint64_t v = 0, old = 0;
    if (tree.find(key, &v) == Code::ok && v == node) (void)tree.remove(key, &old);
  }
  for (const auto& [key, node] : live) {
    std::uint64_t v = 0, old = 0;
    const Code found = tree.find(key, &v);
    if (found == Code::ok && v == node) continue;
    const Code c = found == Code::ok ? tree.update(key, node, &old) : tree.insert(key, node);
    if (c != Code::ok)
      return pool_->error(c == Code::pool_full ? Code::pool_full : Code::corrupted,
                          "pactree: the PM search layer could not be recovered (" +
                              std::string(to_string(c)) + ")");
  }
  // Removed records and replaced nodes wait for the trie's epochs like any retired node
  // (readers may hold them; drain expects a quiescent trie, verify() drains).
  for (LogEntry* e : owed) {
    pm::publish(&e->state, 0);
    pm::persist(&e->state, 8);  // R6: the entry's search-layer step is done
  }
  return Status::Ok();
}

void PacTree::count_list(std::uint64_t* records, std::uint64_t* nodes) const {
  const pm::Pool& p = *pool_;
  *records = *nodes = 0;
  for (std::uint64_t off = root_->head; off != 0;) {
    const DataNode* n = p.checked<DataNode>(off, node_size_, 256);
    if (n == nullptr || *nodes > p.size() / node_size_) {
      *records = *nodes = pm::kNoCount;
      return;
    }
    *records += static_cast<std::uint64_t>(std::popcount(n->h.bitmap & full_));
    ++*nodes;
    off = link_off(n->h.next);
  }
}

// --- verify ---------------------------------------------------------------------------------

Status PacTree::verify_list(std::vector<std::uint64_t>* nodes, std::uint64_t* reachable) const {
  pm::Pool& p = *pool_;
  std::unordered_set<std::uint64_t> seen;
  std::uint64_t prev = 0, off = root_->head;
  std::string lo;
  *reachable = block_bytes(sizeof(Root));
  for (std::size_t t = 0; t < pm::kMaxThreadSlots; ++t) {
    const std::uint64_t block = root_->logs[t];
    if (block == 0) continue;
    *reachable += block_bytes(kLogRing * sizeof(LogEntry));
    for (unsigned j = 0; j < kLogRing; ++j)
      if (p.at<LogEntry>(block)[j].state != 0)
        return p.error(Code::corrupted, "pactree SMO log entry not applied on an idle index");
  }
  while (off != 0) {
    const DataNode* n = p.checked<DataNode>(off, node_size_, 256);
    if (n == nullptr || !seen.insert(off).second)
      return p.error(Code::corrupted, "pactree verify: list link out of bounds or cyclic");
    if ((prev == 0) != (n->h.flags == kFlagHead) || n->h.prev != prev)
      return p.error(Code::corrupted, "pactree verify: head flag or prev hint wrong");
    if (versions_->is_locked(off)) return p.error(Code::corrupted, "pactree verify: node locked");
    std::string hi;
    if (Status s = check_node(off, lo, prev != 0, &hi); !s.ok()) return s;
    *reachable += block_bytes(node_block_);
    if (prev != 0 && bytes_) *reachable += block_bytes(index_common::record_bytes(key_of(n->h.anchor).size()));
    const auto* fps = reinterpret_cast<const std::uint8_t*>(n->fp_words);
    for (std::uint64_t b = n->h.bitmap; b != 0; b &= b - 1) {
      const int i = std::countr_zero(b);
      if (fps[i] != keys_.fingerprint(n->slots[i].key))
        return p.error(Code::corrupted, "pactree verify: fingerprint does not match its key");
      std::size_t vbytes = 0;
      if (!values_.record_size(n->slots[i].value, &vbytes))
        return p.error(Code::corrupted, "pactree verify: value record unreadable");
      if (vbytes != 0) *reachable += block_bytes(vbytes);
      if (bytes_) *reachable += block_bytes(index_common::record_bytes(key_of(n->slots[i].key).size()));
    }
    nodes->push_back(off);
    prev = off;
    lo = std::move(hi);
    off = link_off(n->h.next);  // check_node: the end mark or a checked link
  }
  return Status::Ok();
}

// Invariant (3): the search layer maps the anchor of every non-head node to that node and
// holds nothing else (an anchor the PM search layer could not take for lack of space may be
// missing: a lag the last mile absorbs, counted by the updater). With the PM search layer its
// blocks are added to *reachable.
Status PacTree::verify_search(const std::vector<std::uint64_t>& nodes,
                              std::uint64_t* reachable) const {
  const bool pm_search = search_.in_pm();
  // A crash between a prefix split's two steps leaves a stale prefix in the PM trie until a
  // writer repairs it (part PROTOCOL.md P7): legal there.
  const std::string e = search_.visit(
      [&](auto& t) { return t.verify(nullptr, /*allow_stale=*/pm_search, nullptr, nullptr); });
  if (!e.empty()) return pool_->error(Code::corrupted, "pactree search layer: " + e);
  std::vector<std::pair<std::string, std::uint64_t>> entries;
  (void)search_.visit([&](auto& t) {
    return t.scan("", ~std::size_t{0}, [&](std::string_view k, std::uint64_t w) {
      entries.emplace_back(std::string(k), w);
    });
  });
  const bool lag_allowed = updater_.search_failed() != 0;
  if (entries.size() + 1 != nodes.size() && !(lag_allowed && entries.size() + 1 < nodes.size()))
    return pool_->error(Code::corrupted, "pactree search layer holds " +
                                             std::to_string(entries.size()) + " anchors for " +
                                             std::to_string(nodes.size()) + " nodes");
  std::unordered_map<std::uint64_t, std::size_t> live;  // node -> its position in the list
  for (std::size_t i = 1; i < nodes.size(); ++i) live[nodes[i]] = i;
  for (const auto& [key, off] : entries) {
    const auto it = live.find(off);
    if (it == live.end() || key != search_key(key_of(node(off)->h.anchor)))
      return pool_->error(Code::corrupted, "pactree search layer entry does not match its node");
  }
  if (pm_search) {
    const std::string w = search_.pm_tree()->walk(
        [&](std::uint64_t, std::size_t bytes, bool, std::uint64_t) {
          *reachable += block_bytes(bytes);
          return true;
        });
    if (!w.empty()) return pool_->error(Code::corrupted, "pactree search layer: " + w);
  }
  return Status::Ok();
}

Status PacTree::verify() const {
  if (Status s = wait_recovery_walk(); !s.ok()) return s;  // the start-now walk's damage
  if (walker_.joinable()) walker_.join();  // its exit hands epoch registrations over
  // The background thread applies what is queued (no operation runs, so nothing is pushed).
  while (updater_.mode() == UpdaterMode::background && updater_.pending() != 0)
    std::this_thread::yield();
  if (updater_.overwritten() != 0)
    return pool_->error(Code::corrupted, "pactree verify: " +
                                             std::to_string(updater_.overwritten()) +
                                             " SMO log entries overwritten before applied");
  epochs_.drain();  // retired records are freed, so the allocator's count is exact
  search_.visit([](auto& t) { t.epochs().drain(); });  // and the trie's retired nodes
  std::vector<std::uint64_t> nodes;
  std::uint64_t reachable = 0;
  if (Status s = verify_list(&nodes, &reachable); !s.ok()) return s;
  if (Status s = verify_search(nodes, &reachable); !s.ok()) return s;
  const std::uint64_t in_use = pool_->allocator().stats().bytes_in_use;
  if (in_use != reachable)
    return pool_->error(Code::corrupted, "pactree verify: " + std::to_string(in_use) +
                                             " PM bytes in use, " + std::to_string(reachable) +
                                             " reachable");
  return Status::Ok();
}

std::uint64_t PacTree::node_count_for_testing() const {
  std::uint64_t n = 0;
  for (std::uint64_t off = root_->head; off != 0; off = link_off(node(off)->h.next)) ++n;
  return n;
}

void PacTree::corrupt_for_testing(int what) {
  std::vector<DataNode*> full;  // nodes with a record
  for (std::uint64_t off = root_->head; off != 0; off = link_off(node(off)->h.next))
    if (node(off)->h.bitmap != 0) full.push_back(node(off));
  if (what == 1) {  // the last node's anchor leaves the search layer
    std::uint64_t last = root_->head;
    while (link_off(node(last)->h.next) != 0) last = link_off(node(last)->h.next);
    std::uint64_t old = 0;
    if (last != root_->head)
      (void)search_.visit([&](auto& t) {
        return t.remove(search_key(key_of(node(last)->h.anchor)), &old);
      });
    return;
  }
  if (what == 5) {  // the last node's anchor names the head node in the search layer
    std::uint64_t last = root_->head;
    while (link_off(node(last)->h.next) != 0) last = link_off(node(last)->h.next);
    std::uint64_t old = 0;
    if (last != root_->head)
      (void)search_.visit([&](auto& t) {
        return t.update(search_key(key_of(node(last)->h.anchor)), root_->head, &old);
      });
    return;
  }
  if (what == 7) {  // an entry for a key that is no node's anchor (just above the last one)
    std::uint64_t last = root_->head;
    while (link_off(node(last)->h.next) != 0) last = link_off(node(last)->h.next);
    if (last == root_->head) return;
    std::string k = key_of(node(last)->h.anchor);
    if (bytes_) {
      k.push_back('\0');
    } else {
      k = encode_u64(decode_u64(k) + 1);  // tests keep the last anchor below 2^64-1
    }
    (void)search_.visit([&](auto& t) { return t.insert(search_key(k), last); });
    return;
  }
  if (what == 8) {  // the last node's bitmap names a slot it does not have
    std::uint64_t last = root_->head;
    while (link_off(node(last)->h.next) != 0) last = link_off(node(last)->h.next);
    if (slots_ < 64) node(last)->h.bitmap |= std::uint64_t{1} << slots_;
    return;
  }
  if (what == 9) {  // the head's next link keeps its offset and gets another valid tag
    std::uint64_t& link = node(root_->head)->h.next;
    if (link != kChainEnd) link = make_link(link_off(link), link_tag(link) % (kEndTag - 1) + 1);
    return;
  }
  if (what == 6) {  // the PM search layer's top node gets an invalid type byte
    const std::uint64_t top = root_->search_top;
    if (search_.in_pm() && top != 0 && !art::is_record(top))
      pool_->at<art::NodeHeader>(art::target_of(top))->type = 0x7f;
    return;
  }
  if (what == 3) {  // the second node's prev hint names itself
    const std::uint64_t second = link_off(node(root_->head)->h.next);
    if (second != 0) node(second)->h.prev = second;
    return;
  }
  if (what == 4) {  // a log entry stays in use on an idle index (as if never applied)
    for (std::size_t t = 0; t < pm::kMaxThreadSlots; ++t)
      if (root_->logs[t] != 0) {
        pool_->at<LogEntry>(root_->logs[t])->state = (std::uint64_t{1} << 8) | kStageSplitDone;
        return;
      }
    return;
  }
  if (full.empty()) return;
  const int i = std::countr_zero(full[0]->h.bitmap);
  if (what == 0 && full.size() >= 2) {  // a key moves into another node's range
    const int j = std::countr_zero(full[1]->h.bitmap);
    std::swap(full[0]->slots[i].key, full[1]->slots[j].key);
    std::swap(full[0]->fp_words[i / 8], full[1]->fp_words[j / 8]);
  } else if (what == 2) {
    reinterpret_cast<std::uint8_t*>(full[0]->fp_words)[i] ^= 0x5a;
  }
}

IndexRegistry::Entry PacTree::registry_entry() {
  return {"pactree",
          "PACTree: trie search layer (ART core, DRAM or PM) over a doubly linked list of 64-slot PM "
          "data nodes, logged splits and merges applied in LSN order by a background updater",
          &PacTree::layout_for, &PacTree::validate, &PacTree::default_pool_size,
          &PacTree::create, &PacTree::recover,
          {.architecture = "trie over a linked list; DRAM or PM, chosen at creation (search "
                           "layer: ART of anchors) + PM (data layer)",
           .node_structure = "64-slot unsorted data nodes: bitmap, 1-byte fingerprints (SIMD), "
                             "8-byte key and value words inline; anchor key, next and prev",
           .concurrency = "optimistic node versions (DRAM) + node locks; search layer OLC; "
                          "splits logged per thread and applied in LSN order",
           .variable_keys = "pointer (PM key records)",
           .allocator = traits::kPmindexAllocator,
           .numa = "no (one pool and one updater per index object)",
           .recovery = "DRAM search layer: SMO log repair, list walk, trie rebuilt from the "
                       "anchors (blocking); PM search layer: instant (SMO log repair at open, "
                       "readers check nodes at first touch; background list and trie walk, "
                       "owed log entries re-applied; writers wait for it)"}};
}

}  // namespace pmindex::pactree

// Epoch-based reclamation: the out-of-line parts (registration, sealing, advancing,
// freeing). The protocol and its memory-order argument are in include/pmindex/sync/epoch.h.
#include "pmindex/sync/epoch.h"

#include <cstdio>
#include <cstdlib>
#include <unordered_set>
#include <utility>

namespace pmindex::sync {

namespace {

// The instance ids of the managers alive now. Thread exit hands a registration over only
// while its manager's id is in the set, under `mu`, which the manager's destructor also takes
// to leave the set; so the two never overlap, and a thread never touches a dead manager.
struct LiveManagers {
  std::mutex mu;
  std::uint64_t last_id = 0;             // guarded by mu
  std::unordered_set<std::uint64_t> ids;  // guarded by mu
};

// Never destroyed: threads may exit, and managers be destroyed, during static destruction.
LiveManagers& live_managers() {
  static LiveManagers* const live = new LiveManagers;
  return *live;
}

// Set (for good) when the calling thread's registrations have been handed over at its exit.
// A trivial type, so it stays usable in thread_local destructors that run later.
constinit thread_local bool tls_exited = false;

}  // namespace

constinit thread_local EpochManager::CacheSlot EpochManager::tls_cache_[kCacheSlots] = {};
constinit thread_local EpochManager::CacheSlot EpochManager::tls_last_ = {};

// One thread's registrations, one per manager it has pinned, searched on a cache miss; its
// destructor (thread exit) hands each one over to its manager if that is still alive.
struct EpochManager::ThreadRegistrations {
  struct Entry {
    std::uint64_t id;  // the manager's instance id: compared, never dereferenced
    EpochManager* manager;
    Record* record;
  };
  std::vector<Entry> entries;

  Record* find(std::uint64_t id) const {
    for (const Entry& e : entries) {
      if (e.id == id) return e.record;
    }
    return nullptr;
  }

  // Adds an entry, first dropping those of destroyed managers (their records are freed).
  void add(EpochManager* manager, Record* record) {
    {
      LiveManagers& live = live_managers();
      std::lock_guard<std::mutex> lock(live.mu);
      std::erase_if(entries, [&](const Entry& e) { return live.ids.count(e.id) == 0; });
    }
    entries.push_back(Entry{manager->id_, manager, record});
  }

  ~ThreadRegistrations() {
    tls_exited = true;
    for (CacheSlot& slot : tls_cache_) slot = CacheSlot{0, nullptr};
    tls_last_ = CacheSlot{0, nullptr};
    LiveManagers& live = live_managers();
    // Held across the hand-overs: a manager found live stays alive until they are done.
    std::lock_guard<std::mutex> lock(live.mu);
    for (const Entry& e : entries) {
      if (live.ids.count(e.id) != 0) e.manager->release_at_exit(e.record);
    }
  }
};

thread_local EpochManager::ThreadRegistrations EpochManager::tls_registrations_;

// --- lifetime -----------------------------------------------------------------------------------

std::uint64_t EpochManager::register_manager() {
  LiveManagers& live = live_managers();
  std::lock_guard<std::mutex> lock(live.mu);
  const std::uint64_t id = ++live.last_id;
  live.ids.insert(id);
  return id;
}

EpochManager::EpochManager() : id_(register_manager()) {}

EpochManager::~EpochManager() {
  {
    // From here on no exiting thread hands a record over to this manager (ThreadRegistrations);
    // one that was doing so has finished, and the mutex orders its writes before ours.
    LiveManagers& live = live_managers();
    std::lock_guard<std::mutex> lock(live.mu);
    live.ids.erase(id_);
  }
  // acquire (list walk and state): the record list is published with release; a state word
  // is only a diagnostic here, the happens-before comes from the caller (every use of the
  // manager happens before its destruction).
  for (Record* r = records_.load(std::memory_order_acquire); r != nullptr; r = r->next) {
    if (is_pinned(r->state.load(std::memory_order_acquire))) {
      contract_violation("destroyed while a Guard is still alive (a thread is pinned)");
    }
  }
  // Nobody is pinned and nobody uses the manager any more: every item may go, registered
  // threads' included, whatever its epoch.
  run_everything();
  Record* r = records_.load(std::memory_order_relaxed);
  while (r != nullptr) {
    Record* next = r->next;
    delete r;
    r = next;
  }
}

std::size_t EpochManager::run_everything() {
  std::size_t total = 0;
  // Deleters may retire more (into the calling thread's record, or the orphans): loop.
  for (;;) {
    std::size_t n = 0;
    for (Record* r = records_.load(std::memory_order_acquire); r != nullptr; r = r->next) {
      std::vector<Retired> ready = std::move(r->bag);
      r->bag = {};
      for (Batch& batch : r->limbo) {
        ready.insert(ready.end(), batch.items.begin(), batch.items.end());
      }
      r->limbo.clear();
      r->held = 0;
      const std::size_t ran = run(ready);
      r->freed.store(r->freed.load(std::memory_order_relaxed) + ran, std::memory_order_relaxed);
      n += ran;
    }
    n += free_orphans(0, /*everything=*/true);
    total += n;
    if (n == 0) return total;
  }
}

void EpochManager::contract_violation(const char* what) {
  std::fprintf(stderr, "pmindex::sync::EpochManager: contract violation: %s\n", what);
  std::abort();
}

EpochManager::Retired EpochManager::wrap_function(std::function<void()> fn) {
  auto* heap = new std::function<void()>(std::move(fn));
  return Retired{[](void* ctx, std::uint64_t) {
                   auto* f = static_cast<std::function<void()>*>(ctx);
                   (*f)();
                   delete f;
                 },
                 heap, 0};
}

// --- registration -------------------------------------------------------------------------------

EpochManager::Record* EpochManager::local_record() const {
  const CacheSlot& slot = tls_cache_[id_ % kCacheSlots];
  if (slot.id == id_) return slot.record;
  // After the thread's hand-over (a later thread_local destructor) the list is gone.
  return tls_exited ? nullptr : tls_registrations_.find(id_);
}

EpochManager::Record* EpochManager::claim_record() {
  // acquire (list walk): a published record's fields are initialised.
  for (Record* r = records_.load(std::memory_order_acquire); r != nullptr; r = r->next) {
    bool expected = false;
    // acquire on success: the previous owner's writes to the owner-only fields (released by
    // its store of false) happen before ours. relaxed pre-check and failure: nothing is used.
    if (!r->claimed.load(std::memory_order_relaxed) &&
        r->claimed.compare_exchange_strong(expected, true, std::memory_order_acquire,
                                           std::memory_order_relaxed)) {
      return r;
    }
  }
  auto* fresh = new Record(this);
  fresh->claimed.store(true, std::memory_order_relaxed);  // not yet visible to anyone
  Record* head = records_.load(std::memory_order_relaxed);
  do {
    fresh->next = head;
    // release: publishes the initialised record to list walkers.
  } while (!records_.compare_exchange_weak(head, fresh, std::memory_order_release,
                                           std::memory_order_relaxed));
  record_count_.fetch_add(1, std::memory_order_relaxed);
  return fresh;
}

EpochManager::Record* EpochManager::attach_slow() {
  // Another manager was pinned last: its cache entry, if any, becomes the last one.
  if (const CacheSlot& slot = tls_cache_[id_ % kCacheSlots]; slot.id == id_) {
    tls_last_ = slot;
    return slot.record;
  }
  Record* r = tls_exited ? nullptr : tls_registrations_.find(id_);
  if (r == nullptr) {
    r = claim_record();
    r->owner = std::this_thread::get_id();
    // A thread that pins from a thread_local destructor after its hand-over keeps the
    // record until the manager is destroyed (which runs its items): nothing is lost.
    if (!tls_exited) tls_registrations_.add(this, r);
  }
  tls_cache_[id_ % kCacheSlots] = CacheSlot{id_, r};
  tls_last_ = CacheSlot{id_, r};
  return r;
}

void EpochManager::hand_over(Record* record) {
  seal(record);
  if (!record->limbo.empty()) {
    std::lock_guard<std::mutex> lock(orphan_mu_);
    for (Batch& batch : record->limbo) orphans_.push_back(std::move(batch));
    publish_orphan_hint();
  }
  record->limbo.clear();
  record->held = 0;
  record->quiet_unpins = 0;
}

void EpochManager::release_at_exit(Record* record) {
  if (record->pin_depth != 0) contract_violation("a thread exited while pinned");
  // No deleter runs here (invariant (4)): the items go to the orphan list, freed by the next
  // collect of any thread, drain() or the destructor.
  hand_over(record);
  // release: the next owner (claim_record's acquire) and the destructor see this thread's
  // last writes to the record.
  record->claimed.store(false, std::memory_order_release);
}

std::size_t EpochManager::adopt_idle(const Record* except) {
  std::size_t adopted = 0;
  for (Record* r = records_.load(std::memory_order_acquire); r != nullptr; r = r->next) {
    // acquire: a state word is only a guard against misuse here (a pinned owner's fields
    // are left alone); the happens-before with an idle owner is drain()'s precondition.
    if (r == except || is_pinned(r->state.load(std::memory_order_acquire))) continue;
    if (r->held == 0) continue;
    hand_over(r);
    ++adopted;
  }
  return adopted;
}

EpochManager::Participant EpochManager::attach() { return Participant(this, attach_local()); }

bool EpochManager::pinned_here() const {
  const Record* r = local_record();
  return r != nullptr && r->pin_depth > 0;
}

// --- retiring -----------------------------------------------------------------------------------

void EpochManager::retire(void* ctx, Deleter fn, std::uint64_t arg) {
  if (Record* r = local_record()) {
    push_retired(r, Retired{fn, ctx, arg});
    return;
  }
  // An unattached thread (invariant (6)): into the unattached bag, under the mutex that its
  // sealer takes after this push (so this thread's unlink happens before that S1). The retire
  // that fills the bag collects, as push_retired does for an unpinned attached thread (an
  // unregistered thread is never pinned here). Before, each such item paid a heavy fence and
  // waited for another thread's collect: FPTree's leaves piled up to a full pool (issue 19).
  orphan_retired_.fetch_add(1, std::memory_order_relaxed);
  bool full = false;
  {
    std::lock_guard<std::mutex> lock(orphan_mu_);
    unattached_bag_.push_back(Retired{fn, ctx, arg});
    full = unattached_bag_.size() >= kBagCapacity;
    publish_orphan_hint();
  }
  if (full) collect_unattached();
}

std::vector<EpochManager::Retired> EpochManager::take_unattached() {
  std::lock_guard<std::mutex> lock(orphan_mu_);
  std::vector<Retired> items = std::move(unattached_bag_);
  unattached_bag_ = {};
  publish_orphan_hint();
  return items;
}

void EpochManager::seal_unattached(std::vector<Retired> items) {
  if (items.empty()) return;
  // S2. relaxed: the caller's heavy fence (S1), after take_unattached, orders it (epoch.h).
  const std::uint64_t tag = global_epoch_.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(orphan_mu_);
  orphans_.push_back(Batch{tag, std::move(items)});
  publish_orphan_hint();
}

void EpochManager::publish_orphan_hint() {
  orphan_hint_.store(orphans_.size() + (unattached_bag_.empty() ? 0 : 1),
                     std::memory_order_relaxed);
}

void EpochManager::retire(std::function<void()> fn) {
  const Retired item = wrap_function(std::move(fn));
  retire(item.ctx, item.fn, item.arg);
}

void EpochManager::seal(Record* record) {
  if (record->bag.empty()) return;
  // S1: the unlinks of the bag's items (all before their retire calls) are ordered before the
  // epoch read, against the readers' P2 (the heavy side of their light fence).
  AsymmetricFence::heavy();
  seal_fenced(record);
}

void EpochManager::seal_fenced(Record* record) {
  if (record->bag.empty()) return;
  // S2. relaxed: the caller's heavy fence (S1) orders it (epoch.h).
  const std::uint64_t tag = global_epoch_.load(std::memory_order_relaxed);
  if (!record->limbo.empty() && record->limbo.back().epoch == tag) {
    std::vector<Retired>& items = record->limbo.back().items;
    items.insert(items.end(), record->bag.begin(), record->bag.end());
    record->bag.clear();
  } else {
    record->limbo.push_back(Batch{tag, std::move(record->bag)});
    record->bag = {};
  }
}

// --- advancing and freeing ----------------------------------------------------------------------

bool EpochManager::try_advance() {
  pm::yield_point("epoch.advance");
  // A1. relaxed: the fence below orders it (epoch.h).
  const std::uint64_t e = global_epoch_.load(std::memory_order_relaxed);
  AsymmetricFence::heavy();  // A2, against the readers' P2
  return advance_fenced(e);
}

bool EpochManager::advance_fenced(std::uint64_t e) {
  // A3. acquire (list walk): records are published with release. acquire (state): a thread
  // seen unpinned, or pinned again, has its earlier pinned sections happen before this scan.
  for (Record* r = records_.load(std::memory_order_acquire); r != nullptr; r = r->next) {
    const std::uint64_t s = r->state.load(std::memory_order_acquire);
    if (is_pinned(s) && pinned_epoch(s) != e) return false;
  }
  // A4. seq_cst: the epoch stores must be in the single order S (the argument in epoch.h);
  // as an RMW it also continues the release sequence that carries A3's acquisitions to every
  // thread that later reads the epoch with acquire. On failure someone else advanced.
  global_epoch_.compare_exchange_strong(e, e + 1, std::memory_order_seq_cst,
                                        std::memory_order_relaxed);
  return true;
}

std::size_t EpochManager::run(std::vector<Retired>& items) {
  for (const Retired& item : items) item.fn(item.ctx, item.arg);
  return items.size();
}

std::size_t EpochManager::collect_record(Record* record) {
  // seal + try_advance with one heavy fence (a membarrier IPIs every other running thread of
  // the process, ~15 us on this VM): A1 reads E before it, S2 after it, so it is both the
  // S1 between the bag's unlinks and S2 and the A2 between A1 and A3 (epoch.h). A tag read
  // after A1 can only be newer, which frees the bag later, never earlier.
  // The unattached bag is sealed under the same fence (invariant (6)).
  pm::yield_point("epoch.advance");
  const std::uint64_t e = global_epoch_.load(std::memory_order_relaxed);  // A1
  std::vector<Retired> unattached = take_unattached();
  AsymmetricFence::heavy();                                                // S1 and A2
  seal_fenced(record);                                                     // S2
  seal_unattached(std::move(unattached));                                  // S2
  advance_fenced(e);                                                       // A3, A4
  // acquire: the deleters below run after every A3 that let the epoch reach this value.
  const std::uint64_t global = global_epoch_.load(std::memory_order_acquire);
  std::vector<Retired> ready;
  while (!record->limbo.empty() && record->limbo.front().epoch + 2 <= global) {
    std::vector<Retired>& items = record->limbo.front().items;
    if (ready.empty()) {
      ready = std::move(items);
    } else {
      ready.insert(ready.end(), items.begin(), items.end());
    }
    record->limbo.pop_front();
  }
  // Moved out first: a deleter may retire more items into this record.
  record->held -= ready.size();
  const std::size_t n = run(ready);
  record->freed.store(record->freed.load(std::memory_order_relaxed) + n,
                      std::memory_order_relaxed);
  return n + free_orphans(global, /*everything=*/false);
}

std::size_t EpochManager::collect_unattached() {
  // collect_record without a record: the unattached bag is the only one to seal.
  pm::yield_point("epoch.advance");
  const std::uint64_t e = global_epoch_.load(std::memory_order_relaxed);  // A1
  std::vector<Retired> unattached = take_unattached();
  AsymmetricFence::heavy();                // S1 and A2
  seal_unattached(std::move(unattached));  // S2
  advance_fenced(e);                       // A3, A4
  // acquire: as collect_record.
  return free_orphans(global_epoch_.load(std::memory_order_acquire), /*everything=*/false);
}

std::size_t EpochManager::free_orphans(std::uint64_t global, bool everything) {
  if (!everything && orphan_hint_.load(std::memory_order_relaxed) == 0) return 0;
  std::size_t total = 0;
  // Deleters may retire more orphans (an unattached thread's retire), hence the loop.
  for (;;) {
    std::vector<Retired> ready;
    {
      std::lock_guard<std::mutex> lock(orphan_mu_);
      if (everything) {  // the destructor: untagged items too
        ready = std::move(unattached_bag_);
        unattached_bag_ = {};
      }
      std::size_t kept = 0;
      for (std::size_t i = 0; i < orphans_.size(); ++i) {
        Batch& batch = orphans_[i];
        if (everything || batch.epoch + 2 <= global) {
          ready.insert(ready.end(), batch.items.begin(), batch.items.end());
        } else {
          // Not onto itself: a self-move-assigned vector is left empty (items lost).
          if (kept != i) orphans_[kept] = std::move(batch);
          ++kept;
        }
      }
      orphans_.resize(kept);
      publish_orphan_hint();
    }
    if (ready.empty()) return total;
    const std::size_t n = run(ready);
    orphan_freed_.fetch_add(n, std::memory_order_relaxed);
    total += n;
    if (!everything) return total;
  }
}

void EpochManager::after_unpin(Record* record) {
  if (record->bag.size() >= kBagCapacity || ++record->quiet_unpins >= kUnpinsPerCollect) {
    record->quiet_unpins = 0;
    collect_record(record);
  }
}

std::size_t EpochManager::collect() {
  if (Record* r = local_record()) return collect_record(r);
  return collect_unattached();
}

std::size_t EpochManager::drain() {
  adopt_idle(local_record());
  std::size_t total = 0;
  // Each round seals (the caller's bag and the unattached bag), advances twice (enough for
  // everything sealed so far when nobody is pinned) and frees what is safe. Deleters may
  // retire more, so go on while rounds free.
  for (;;) {
    Record* r = local_record();
    std::vector<Retired> unattached = take_unattached();
    AsymmetricFence::heavy();  // S1 for both bags
    if (r != nullptr) seal_fenced(r);
    seal_unattached(std::move(unattached));
    try_advance();
    try_advance();
    const std::size_t n = r != nullptr ? collect_record(r) : collect();
    total += n;
    if (n == 0) return total;
  }
}

EpochManager::Stats EpochManager::stats() const {
  Stats s;
  s.epoch = global_epoch_.load(std::memory_order_relaxed);
  s.retired = orphan_retired_.load(std::memory_order_relaxed);
  s.freed = orphan_freed_.load(std::memory_order_relaxed);
  s.records = record_count_.load(std::memory_order_relaxed);
  // relaxed throughout: a snapshot for statistics; exact once the threads are joined.
  for (Record* r = records_.load(std::memory_order_acquire); r != nullptr; r = r->next) {
    s.retired += r->retired.load(std::memory_order_relaxed);
    s.freed += r->freed.load(std::memory_order_relaxed);
    if (r->claimed.load(std::memory_order_relaxed)) ++s.attached;
  }
  return s;
}

}  // namespace pmindex::sync

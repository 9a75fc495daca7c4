// Epoch-based reclamation: the out-of-line parts (registration, sealing, advancing,
// freeing). The protocol and its memory-order argument are in include/pmindex/sync/epoch.h.
#include "pmindex/sync/epoch.h"

#include <cstdio>
#include <cstdlib>
#include <utility>

namespace pmindex::sync {

thread_local EpochManager::Record* EpochManager::tls_records_ = nullptr;

EpochManager::~EpochManager() {
  std::uint64_t attached = 0;
  // acquire: pairs with the release in detach_local, so the detached threads' hand-over to
  // the orphan list (and all they did before) happens before what follows.
  for (Record* r = records_.load(std::memory_order_acquire); r != nullptr; r = r->next) {
    if (r->claimed.load(std::memory_order_acquire)) ++attached;
  }
  if (attached != 0) {
    contract_violation("destroyed while a Participant or Guard is still alive");
  }
  // Nobody is attached, so nobody is pinned: every orphan may go, whatever its epoch.
  free_orphans(0, /*everything=*/true);
  Record* r = records_.load(std::memory_order_relaxed);
  while (r != nullptr) {
    Record* next = r->next;
    delete r;
    r = next;
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
  for (Record* r = tls_records_; r != nullptr; r = r->thread_next) {
    if (r->manager == this) return r;
  }
  return nullptr;
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

EpochManager::Record* EpochManager::attach_local() {
  Record* r = local_record();
  if (r == nullptr) {
    r = claim_record();
    r->owner = std::this_thread::get_id();
    r->thread_next = tls_records_;
    tls_records_ = r;
  }
  ++r->refs;
  return r;
}

void EpochManager::detach_local(Record* record) {
  if (record->owner != std::this_thread::get_id()) {
    contract_violation("a Participant or Guard was destroyed on another thread than its own");
  }
  assert(record->refs > 0);
  if (--record->refs != 0) return;
  if (record->pin_depth != 0) {
    contract_violation("the last Participant of a thread was detached while a Guard is alive");
  }
  for (Record** link = &tls_records_; *link != nullptr; link = &(*link)->thread_next) {
    if (*link == record) {
      *link = record->thread_next;
      break;
    }
  }
  record->thread_next = nullptr;

  // Free what is already safe, then hand the rest over (invariant (5)).
  collect_record(record);
  std::size_t handed = record->limbo.size();
  if (handed != 0) {
    std::lock_guard<std::mutex> lock(orphan_mu_);
    for (Batch& batch : record->limbo) orphans_.push_back(std::move(batch));
    orphan_hint_.store(orphans_.size(), std::memory_order_relaxed);
  }
  record->limbo.clear();
  record->quiet_unpins = 0;
  // release: the next owner (claim_record's acquire) and the destructor see this thread's
  // last writes to the record.
  record->claimed.store(false, std::memory_order_release);
}

EpochManager::Participant EpochManager::attach() { return Participant(this, attach_local()); }

EpochManager::Guard EpochManager::pin() { return Guard(this, attach_local(), true); }

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
  // An unattached thread: tag the item now (S1, S2 of the argument in epoch.h) and leave it
  // with the orphans.
  AsymmetricFence::heavy();
  const std::uint64_t tag = global_epoch_.load(std::memory_order_relaxed);
  orphan_retired_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(orphan_mu_);
  orphans_.push_back(Batch{tag, {Retired{fn, ctx, arg}}});
  orphan_hint_.store(orphans_.size(), std::memory_order_relaxed);
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
  pm::yield_point("epoch.advance");
  const std::uint64_t e = global_epoch_.load(std::memory_order_relaxed);  // A1
  AsymmetricFence::heavy();                                                // S1 and A2
  seal_fenced(record);                                                     // S2
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
  const std::size_t n = run(ready);
  record->freed.store(record->freed.load(std::memory_order_relaxed) + n,
                      std::memory_order_relaxed);
  return n + free_orphans(global, /*everything=*/false);
}

std::size_t EpochManager::free_orphans(std::uint64_t global, bool everything) {
  if (!everything && orphan_hint_.load(std::memory_order_relaxed) == 0) return 0;
  std::size_t total = 0;
  // Deleters may retire more orphans (an unattached thread's retire), hence the loop.
  for (;;) {
    std::vector<Retired> ready;
    {
      std::lock_guard<std::mutex> lock(orphan_mu_);
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
      orphan_hint_.store(kept, std::memory_order_relaxed);
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
  try_advance();
  return free_orphans(global_epoch_.load(std::memory_order_acquire), /*everything=*/false);
}

std::size_t EpochManager::drain() {
  std::size_t total = 0;
  // Each round seals, advances twice (enough for everything sealed so far when nobody is
  // pinned) and frees what is safe. Deleters may retire more, so go on while rounds free.
  for (;;) {
    Record* r = local_record();
    if (r != nullptr) seal(r);
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

/// \file
/// Epoch-based reclamation (EBR): frees an unlinked object once no thread can still be
/// reading it. One EpochManager per index instance. Process-wide state is only what finds a
/// thread's registrations: the set of live managers' ids and each thread's cache and list.
///
///   EpochManager epochs;                               // owned by the index
///   { auto g = epochs.pin();                           // around every operation; the first
///                                                      // pin of a thread registers it
///     Node* n = root.load(std::memory_order_acquire);  // safe to read until g is destroyed
///     ... unlink `old` from the structure ...
///     g.retire(pool, [](void* p, uint64_t off) { static_cast<Allocator*>(p)->deallocate(off); },
///              old_offset);
///   }
///
/// Scheme (three epochs). A global epoch E only grows. A pinned thread announces the epoch it
/// read when it pinned. try_advance() moves E to E+1 when every pinned thread announces E.
/// Retired items collect in the retiring thread's bag; when the bag is sealed (at each
/// collect, see kBagCapacity, and at hand-over) it is tagged with the current epoch e and joins
/// the thread's limbo list. A batch tagged e is freed once E >= e+2: every thread
/// that was pinned when the items were unlinked announced an epoch <= e, so the step
/// e+1 -> e+2 could only happen after it unpinned.
///
/// Why that holds in the C++ model (the proof needs a Dekker-style handshake, so each side
/// has a seq_cst fence; there is no way to express it with acquire/release alone):
///   reader  P1 state.store(e|pinned, release)  P2 fence(seq_cst)  P3 load of the structure
///   retire  U unlink (before retire())         S1 fence(seq_cst)  S2 tag = E.load(relaxed)
///   advance A1 g = E.load(relaxed)  A2 fence(seq_cst)  A3 state.load(acquire) of every thread
///           A4 E.compare_exchange(g, g+1, seq_cst)
/// P2 runs at every operation, S1 and A2 once per collect (at most one in kUnpinsPerCollect
/// unpins, and one fence serves as both: collect_record), so P2 is the light side of an
/// asymmetric fence and S1, A2 its heavy side (asymmetric_fence.h): a heavy() puts a full
/// barrier into every other running thread, which acts as a seq_cst fence at some point of its
/// program, and the argument below is about the relative order of P2 and S1 / A2 only, so it
/// holds for that point as it does for P2. (Where membarrier is unavailable, all three are
/// seq_cst fences.)
/// Suppose a reader's P3 saw the object (read the link before U). Then P2 precedes S1 in the
/// single total order S of seq_cst operations ([atomics.order]: P2 happens before P3, P3 is
/// coherence-ordered before U, U happens before S1). (i) The reader announced e <= tag: had
/// its pin read a store of tag+1 or later, that store would precede P2 and follow S1 in S (S2
/// read an older value): a cycle. (ii) The advance tag+1 -> tag+2 reads the reader's P1 or a
/// later store of its state: were A3's value older than P1, A2 would precede P2 in S, while
/// the store of tag+1 that A1 read follows S1 and precedes A2: again a cycle. So that advance
/// is refused until the reader unpins, and the batch (freed at E >= tag+2) outlives the read.
/// The walk of the record list is covered the same way: a thread's record is published (a
/// release CAS on the list head) before its first P1, so a walk whose head load missed it
/// would again put A2 before P2. A record reused by another thread (after its owner's exit,
/// claimed with acquire) is the same case: the new owner's P1 follows that claim.
/// Hand-overs keep the argument: a bag is sealed (S1, S2) by its owner, or by drain() adopting
/// an idle thread's items, whose unlinks happen before the drain by its precondition, or (the
/// unattached bag, below) by any thread's collect, which takes the bag under the mutex its
/// items were pushed under, after their unlinks; every way U happens before S1. The
/// destructor runs every item without epochs: no thread is pinned (checked) and no thread
/// uses the manager any more (its precondition).
/// The happens-before edge that makes the deleter's writes race-free (and that TSan checks;
/// g++ 12's TSan ignores fences, which here only decide *which* value A3 reads) is a chain
/// of release/acquire pairs: reader's accesses -> unpin (release) -> A3 (acquire) -> A4
/// (seq_cst RMW) -> the deleting thread's load of E (acquire) -> deleter.
///
/// Registration (the hot path). A thread registers with a manager once, at its first pin()
/// or attach(), and stays registered until it exits or the manager is destroyed; nobody pays
/// a register + unregister per operation. An attached thread finds its record through a
/// thread-local direct-mapped cache keyed by the manager's instance id (unique in the
/// process, so a new manager at a reused address never hits a stale entry), in front of
/// which sits a copy of the entry used last (tls_last_): pin() + unpin() is one id compare, a
/// depth count, one epoch load, two stores of the state word and a check for pending items,
/// with no atomic RMW and no thread-id call. On a miss (first use, or two managers sharing a
/// slot) the thread's list of registrations is searched.
///
/// Lifetime (issue 17: PiBench deletes a tree while its OpenMP pool threads live on).
///  - Thread exit: a thread_local destructor hands each registration's pending items to its
///    manager's orphan list (sealed, not run) and frees the record for reuse. It touches only
///    managers still in the process-wide set of live instance ids, checked and held under
///    that set's mutex, which the destructor also takes; so a thread that outlives a manager
///    exits without touching it.
///  - Manager destruction while registered threads are alive is allowed if none of them is
///    pinned and, as for any object, every use of the manager happens before the destructor
///    (threads joined, or synchronised with the destroying thread, e.g. by an OpenMP barrier).
///    The destructor then runs every pending item, its registered threads' included. A thread
///    pinned at that moment is a misuse the destructor reports (it aborts with a message).
///  - A thread that used a destroyed manager may go on to use other managers and exit
///    normally. Touching the destroyed manager itself (pin, retire, a Participant's or Guard's
///    pin or retire) is a documented misuse with undefined behaviour, like any use after
///    delete: for an index, every thread must be done with the tree before `delete tree`.
///
/// Thread safety: every member function of EpochManager may be called concurrently from any
/// thread, except drain() (see there) and the destructor. A Participant and a Guard belong to
/// the thread that created them: use and destroy them there only (checked by assert only, to
/// keep pin and unpin cheap). A Participant is only a handle on its thread's registration: it
/// may outlive the manager if it is not used after that (destroying it touches nothing).
///
/// Invariants:
///  (1) An object is retired only after it is unlinked, i.e. no new reader can reach it; the
///      unlink happens before the retire call (same thread, or synchronised with it).
///  (2) A thread touches shared objects only while pinned (holding a Guard), and keeps no
///      reference to them after its outermost Guard is destroyed.
///  (3) Each retired item's deleter runs exactly once: when E >= tag+2, or in drain() /
///      the destructor once nothing is pinned. Deleters must not throw; they may retire
///      further items, but must not otherwise call into this manager.
///  (4) Deleters run only outside pinned sections of the thread that runs them (at the
///      outermost unpin, in a retire() made while unpinned, collect(), drain() and the
///      destructor), so a deleter never runs while its thread holds a lock taken inside an
///      operation. (A thread's exit runs none: it only hands its items over.)
///  (5) A thread's records are per manager; when the thread exits, or drain() adopts an idle
///      thread's items, its bag and limbo move to the manager's orphan list, which any
///      thread's collect() frees when safe.
///  (6) A thread that retires without being registered (an index whose writers never pin:
///      FPTree with integer keys, PACTree's updater) puts its item into the manager's one
///      unattached bag under the orphan mutex: no fence, no registration. The thread whose
///      retire fills it seals it (S1, S2), tries to advance and frees the safe orphans, as an
///      attached thread does with its own bag; every collect() also seals it, so a pool_full
///      reclaim (index_common::reclaim_deferred) reaches items no full bag has sealed yet.
///      Such items never wait in an idle thread's bag, which only its owner may touch.
#pragma once

#include <atomic>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "pmindex/pm/persist.h"
#include "pmindex/sync/asymmetric_fence.h"

namespace pmindex::sync {

/// Epoch-based reclamation for one index (see the file comment): readers pin, writers retire
/// what they unlinked, and a retired object is freed once no pinned thread can still see it.
/// Thread-safe; a thread registers at its first pin.
class EpochManager {
 public:
  /// Frees one retired object: fn(ctx, arg). ctx is typically the object or its allocator, arg
  /// a pool offset or a size. Must not throw.
  using Deleter = void (*)(void* ctx, std::uint64_t arg);

  /// A thread collects (seals its bag, tries to advance, frees what is safe) when its bag
  /// holds kBagCapacity items and it is not pinned, or at an outermost unpin once the bag is
  /// that full or kUnpinsPerCollect unpins have passed with items pending.
  /// Large, because a collect costs one heavy fence (asymmetric_fence.h: a membarrier, ~15 us
  /// on this VM when another thread of the process is running): at most ~15 ns per operation
  /// even when every operation retires something.
  static constexpr std::size_t kBagCapacity = 1024;
  static constexpr std::uint32_t kUnpinsPerCollect = 1024;  ///< see kBagCapacity

  /// Counters for tests and reports (stats()).
  struct Stats {
    std::uint64_t epoch = 0;     ///< the global epoch
    std::uint64_t retired = 0;   ///< items passed to retire
    std::uint64_t freed = 0;     ///< deleters run
    std::uint64_t attached = 0;  ///< threads registered now
    std::uint64_t records = 0;   ///< per-thread records ever created (peak attached threads)
    std::uint64_t pending() const { return retired - freed; }  ///< retired, not yet freed
  };

  class Guard;
  class Participant;
  class FlatPin;

  EpochManager();
  /// Runs every pending deleter, those of registered threads that are still alive included
  /// (see "Lifetime" above). Aborts if a thread is pinned (a Guard is alive).
  ~EpochManager();
  EpochManager(const EpochManager&) = delete;
  EpochManager& operator=(const EpochManager&) = delete;

  /// Registers the calling thread if it is not yet, and returns a handle on its registration.
  /// Optional: pin() registers on its own; a Participant only saves the cache probe.
  [[nodiscard]] Participant attach();

  /// Pins the calling thread; nested pins are a counter increment. The first pin of a thread
  /// registers it (kept until the thread exits or the manager is destroyed).
  [[nodiscard]] Guard pin();

  /// pin() for a hot path that makes no call in its common case, so that the compiler can
  /// build it as a leaf function that saves no registers (issue 16: APEX's lookup). Pins only
  /// in the common case: this manager is the one the calling thread pinned last (the
  /// one-entry cache hits), the thread is not pinned already, and light() is a compiler
  /// barrier. Otherwise it changes nothing and returns an empty FlatPin: the caller takes its
  /// general path, which uses pin(). A non-empty FlatPin must be ended by unpin_flat on the
  /// same thread before that thread pins this manager again or retires anything; it is not
  /// RAII, so the code between the two must not throw or return early.
  [[nodiscard]] FlatPin try_pin_flat();
  /// Ends a FlatPin. True when the caller must still call after_unpin_flat (retired items
  /// pending, or orphans to free): that part is out of line, so the caller can make it a tail
  /// call of a cold exit.
  [[nodiscard]] bool unpin_flat(FlatPin pin);
  /// The rest of an unpin_flat that returned true: frees what is safe (out of line).
  void after_unpin_flat(FlatPin pin);

  /// Defers fn(ctx, arg) until no thread can see the object (invariant (1) first). Any thread,
  /// attached or not: an unattached thread's item joins the unattached bag (invariant (6)),
  /// and the retire that fills that bag collects, running deleters (invariant (4)).
  void retire(void* ctx, Deleter fn, std::uint64_t arg);
  /// The same for a closure (allocates; for rare retirements).
  void retire(std::function<void()> fn);
  /// Defers `delete object`.
  template <class T>
  void retire_delete(T* object) {
    retire(object, &delete_object<T>, 0);
  }

  /// Moves the global epoch on by one if every pinned thread has announced it. Returns whether
  /// they had (the epoch moved, by this call or a concurrent one).
  bool try_advance();
  /// Seals the calling thread's bag and the unattached bag, tries to advance, and runs the
  /// deleters that are safe: the calling thread's and the orphan list's. Returns how many ran.
  std::size_t collect();
  /// For shutdown, verification and tests, on a quiescent manager: no other thread runs an
  /// operation on it during the call (their uses happen before it, and it happens before
  /// their next ones). Adopts the pending items of every registered thread that is not
  /// pinned, advances as far as it can and frees everything that is then safe. Safe, but
  /// frees nothing that a pinned thread could still see, if a thread is pinned (its own items
  /// stay with it). Returns how many deleters ran.
  std::size_t drain();

  /// relaxed: a diagnostic snapshot.
  std::uint64_t epoch() const { return global_epoch_.load(std::memory_order_relaxed); }
  /// A snapshot; exact only when no thread is using the manager.
  Stats stats() const;
  /// Whether the calling thread holds a Guard of this manager (for assertions).
  bool pinned_here() const;

 private:
  struct Retired {
    Deleter fn;
    void* ctx;
    std::uint64_t arg;
  };
  struct Batch {
    std::uint64_t epoch;  ///< the global epoch read after its items were unlinked
    std::vector<Retired> items;
  };
  struct Record;
  struct ThreadRegistrations;  ///< epoch.cpp: a thread's registrations, handed over at its exit
  /// One entry of the thread-local cache: the record of manager `id` (0: empty).
  struct CacheSlot {
    std::uint64_t id;
    Record* record;
  };
  static constexpr std::size_t kCacheSlots = 8;

  static constexpr std::uint64_t kUnpinned = 0;
  static constexpr std::uint64_t pinned_word(std::uint64_t epoch) { return (epoch << 1) | 1; }
  static constexpr bool is_pinned(std::uint64_t word) { return (word & 1) != 0; }
  static constexpr std::uint64_t pinned_epoch(std::uint64_t word) { return word >> 1; }

  template <class T>
  static void delete_object(void* object, std::uint64_t /*unused*/) {
    delete static_cast<T*>(object);
  }
  static Retired wrap_function(std::function<void()> fn);
  [[noreturn]] static void contract_violation(const char* what);

  static std::uint64_t register_manager();  ///< a fresh instance id, entered as live
  Record* local_record() const;  ///< the calling thread's record for this manager, or nullptr
  Record* attach_local();        ///< the calling thread's record, registering it on first use
  Record* attach_slow();         ///< attach_local on a cache miss
  void hand_over(Record* record);      ///< seals the record's items and moves them to orphans
  void release_at_exit(Record* record);  ///< the owner's exit: hand_over, then unclaim
  std::size_t adopt_idle(const Record* except);  ///< drain: hand_over of unpinned others
  std::size_t run_everything();  ///< destructor: runs all items of every record and orphan
  Record* claim_record();
  void pin_record(Record* record);
  void unpin_record(Record* record);
  void push_retired(Record* record, Retired item);
  void after_unpin(Record* record);
  void seal(Record* record);
  void seal_fenced(Record* record);      ///< seal after the caller's heavy fence (S1)
  bool advance_fenced(std::uint64_t e);  ///< A3, A4 after A1 read e and the caller's A2
  std::size_t collect_record(Record* record);
  std::size_t collect_unattached();  ///< collect() of a thread not registered here
  std::vector<Retired> take_unattached();  ///< empties the unattached bag (before S1)
  void seal_unattached(std::vector<Retired> items);  ///< S2 for them, into the orphans
  void publish_orphan_hint();  ///< orphan_hint_ from the lists; caller holds orphan_mu_
  std::size_t free_orphans(std::uint64_t global, bool everything);
  static std::size_t run(std::vector<Retired>& items);

  /// Only grows. Modified only by try_advance's seq_cst CAS; see the argument above for the
  /// orders of its loads.
  std::atomic<std::uint64_t> global_epoch_{0};
  /// Push-only list of per-thread records (freed by the destructor). Published with a release
  /// CAS; walked with acquire loads; Record::next is immutable after publication.
  std::atomic<Record*> records_{nullptr};
  std::atomic<std::uint64_t> record_count_{0};  ///< relaxed: statistics

  /// Sealed items handed over (thread exit, drain) and sealed unattached bags.
  std::mutex orphan_mu_;
  std::vector<Batch> orphans_;                 ///< guarded by orphan_mu_
  /// Items of retire() calls from unregistered threads, not yet tagged (invariant (6)).
  std::vector<Retired> unattached_bag_;        ///< guarded by orphan_mu_
  /// relaxed: orphans_.size() plus one if unattached_bag_ holds items; a hint to skip the mutex.
  std::atomic<std::size_t> orphan_hint_{0};
  std::atomic<std::uint64_t> orphan_retired_{0};  ///< relaxed: statistics (unattached retires)
  std::atomic<std::uint64_t> orphan_freed_{0};    ///< relaxed: statistics

  /// The process-unique instance id (never 0), key of the thread-local cache and of the set
  /// of live managers (epoch.cpp).
  const std::uint64_t id_;

  /// The calling thread's cache, indexed by id_ % kCacheSlots. constinit: no dynamic
  /// initialisation, so other translation units access it directly, without a TLS wrapper
  /// call. Cleared at thread exit.
  static constinit thread_local CacheSlot tls_cache_[kCacheSlots];
  /// The entry of tls_cache_ used last (a copy), probed first by pin(): no index arithmetic.
  static constinit thread_local CacheSlot tls_last_;
  /// The calling thread's registrations (epoch.cpp), used on cache misses and at thread exit.
  static thread_local ThreadRegistrations tls_registrations_;
};

/// One thread's registration with one manager. alignas: the state word is read by every
/// advancing thread and written at every pin; keep other records' words off its line.
struct alignas(64) EpochManager::Record {
  explicit Record(EpochManager* owner_manager) : manager(owner_manager) {}

  /// Written by the owner at every outermost pin/unpin (release), read by try_advance
  /// (acquire): kUnpinned or pinned_word(epoch).
  std::atomic<std::uint64_t> state{kUnpinned};
  /// Whether a thread owns the record. Claimed by CAS false->true (acquire), released by a
  /// store of false (release): the owner-only fields below pass from one owner to the next.
  std::atomic<bool> claimed{false};
  /// Single writer (the owner), relaxed load + store; read by stats().
  std::atomic<std::uint64_t> retired{0};
  std::atomic<std::uint64_t> freed{0};
  EpochManager* const manager;
  Record* next = nullptr;  ///< registry link: set before publication, immutable afterwards

  /// Owner-only (and, while the owner is quiescent, drain() and the destructor: see there).
  std::uint32_t pin_depth = 0;    ///< live Guards
  std::uint32_t quiet_unpins = 0;
  std::size_t held = 0;           ///< items in bag and limbo: one test at unpin instead of two
  std::thread::id owner;          ///< for assertions
  std::vector<Retired> bag;       ///< retired, not yet tagged with an epoch
  std::deque<Batch> limbo;        ///< tagged, oldest first (tags never decrease)
};

/// A pin of the calling thread (EpochManager::pin): while it lives, nothing retired after it
/// was taken is freed. Movable within the thread, never shared between threads.
class EpochManager::Guard {
 public:
  /// Takes over `other`'s pin.
  Guard(Guard&& other) noexcept : manager_(other.manager_), record_(other.record_) {
    other.record_ = nullptr;
  }
  Guard& operator=(Guard&&) = delete;
  Guard(const Guard&) = delete;
  ~Guard() {
    if (record_ == nullptr) return;
    assert(record_->owner == std::this_thread::get_id());
    manager_->unpin_record(record_);
  }

  /// retire() without the thread-local lookup. Runs no deleter (invariant (4)).
  void retire(void* ctx, Deleter fn, std::uint64_t arg) {
    manager_->push_retired(record_, Retired{fn, ctx, arg});
  }
  /// retire() of a closure without the thread-local lookup.
  void retire(std::function<void()> fn) {
    manager_->push_retired(record_, wrap_function(std::move(fn)));
  }
  /// Defers `delete object`.
  template <class T>
  void retire_delete(T* object) {
    retire(object, &delete_object<T>, 0);
  }

 private:
  friend class EpochManager;
  friend class Participant;
  Guard(EpochManager* manager, Record* record) : manager_(manager), record_(record) {
    manager_->pin_record(record_);
  }

  EpochManager* manager_;
  Record* record_;
};

/// A pin taken by EpochManager::try_pin_flat: a plain handle (no destructor), ended by
/// unpin_flat. Empty when try_pin_flat declined.
class EpochManager::FlatPin {
 public:
  FlatPin() = default;
  /// Whether try_pin_flat pinned (false: it declined, and nothing is to be ended).
  explicit operator bool() const { return record_ != nullptr; }

 private:
  friend class EpochManager;
  explicit FlatPin(Record* record) : record_(record) {}
  Record* record_ = nullptr;
};

/// A handle on the calling thread's registration (EpochManager::attach). Optional: it saves
/// the cache probe of EpochManager::pin, nothing else. Dropping it (detach, destructor)
/// touches nothing: the registration stays until the thread exits or the manager goes.
class EpochManager::Participant {
 public:
  Participant() = default;  ///< no handle
  /// Takes over `other`'s handle.
  Participant(Participant&& other) noexcept
      : manager_(other.manager_), record_(other.record_) {
    other.record_ = nullptr;
  }
  /// Takes over `other`'s handle.
  Participant& operator=(Participant&& other) noexcept {
    manager_ = other.manager_;
    record_ = other.record_;
    if (this != &other) other.record_ = nullptr;
    return *this;
  }
  Participant(const Participant&) = delete;
  Participant& operator=(const Participant&) = delete;
  ~Participant() = default;

  /// EpochManager::pin() without the cache probe; requires attached().
  [[nodiscard]] Guard pin() {
    assert(record_ != nullptr);
    return Guard(manager_, record_);
  }
  /// EpochManager::retire() without the cache probe; requires attached().
  void retire(void* ctx, Deleter fn, std::uint64_t arg) {
    assert(record_ != nullptr);
    manager_->push_retired(record_, Retired{fn, ctx, arg});
  }
  bool attached() const { return record_ != nullptr; }  ///< holds a registration
  /// Drops the handle (the thread stays registered).
  void detach() { record_ = nullptr; }

 private:
  friend class EpochManager;
  Participant(EpochManager* manager, Record* record) : manager_(manager), record_(record) {}

  EpochManager* manager_ = nullptr;
  Record* record_ = nullptr;
};

// --- hot paths ---------------------------------------------------------------------------------

inline EpochManager::Record* EpochManager::attach_local() {
  // The manager this thread pinned last: one compare at a fixed TLS address (issue 16; an
  // index's operations pin one manager). Ids are never reused, so a stale entry never hits.
  if (tls_last_.id == id_) [[likely]] return tls_last_.record;
  return attach_slow();
}

inline EpochManager::Guard EpochManager::pin() { return Guard(this, attach_local()); }

inline void EpochManager::pin_record(Record* record) {
  if (record->pin_depth++ != 0) return;  ///< nested: already announced
  pm::yield_point("epoch.pin");
  // relaxed: a stale epoch pins us at an older epoch, which only holds reclamation back.
  const std::uint64_t e = global_epoch_.load(std::memory_order_relaxed);
  // release (P1): an advancing thread that reads this word also sees everything this thread
  // did in its earlier pinned sections (C++20 release sequences no longer include later plain
  // stores, so the unpin's release alone would not carry over to this store).
  record->state.store(pinned_word(e), std::memory_order_release);
  // P2: the announcement is visible before we read the structure (StoreLoad). The light side
  // of an asymmetric fence: its heavy side is in seal (S1) and try_advance (A2).
  AsymmetricFence::light();
}

inline EpochManager::FlatPin EpochManager::try_pin_flat() {
  // relaxed: as light(); a false read sends this caller its general way, which fences.
  if (tls_last_.id != id_ || !AsymmetricFence::light_skips_fence()) [[unlikely]] return {};
  Record* record = tls_last_.record;
  if (record->pin_depth != 0) [[unlikely]] return {};  // nested: the general path counts it
  record->pin_depth = 1;
  pm::yield_point("epoch.pin");
  // As pin_record: relaxed epoch (P0), release announcement (P1), then P2, which is light()'s
  // compiler barrier: the flag read above said heavy() reaches this thread by membarrier, and
  // the decision never changes once made (asymmetric_fence.h).
  const std::uint64_t e = global_epoch_.load(std::memory_order_relaxed);
  record->state.store(pinned_word(e), std::memory_order_release);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  return FlatPin(record);
}

inline bool EpochManager::unpin_flat(FlatPin pin) {
  Record* record = pin.record_;
  assert(record != nullptr && record->pin_depth == 1);
  record->pin_depth = 0;
  pm::yield_point("epoch.unpin");
  // release: as unpin_record.
  record->state.store(kUnpinned, std::memory_order_release);
  // relaxed hint: as unpin_record.
  return (record->held | orphan_hint_.load(std::memory_order_relaxed)) != 0;
}

inline void EpochManager::after_unpin_flat(FlatPin pin) { after_unpin(pin.record_); }

inline void EpochManager::unpin_record(Record* record) {
  assert(record->pin_depth > 0);
  if (--record->pin_depth != 0) return;
  pm::yield_point("epoch.unpin");
  // release: everything read while pinned happens before an advancing thread that sees us
  // unpinned, and so before the deleters that run after the epoch moves on.
  record->state.store(kUnpinned, std::memory_order_release);
  // One test for both (no short-circuit branch): own items pending, or orphans to free.
  // relaxed hint: a stale zero only delays the orphans to a later unpin or collect.
  if ((record->held | orphan_hint_.load(std::memory_order_relaxed)) != 0) {
    after_unpin(record);
  }
}

inline void EpochManager::push_retired(Record* record, Retired item) {
  record->bag.push_back(item);
  ++record->held;
  record->retired.store(record->retired.load(std::memory_order_relaxed) + 1,
                        std::memory_order_relaxed);
  if (record->pin_depth == 0 && record->bag.size() >= kBagCapacity) collect_record(record);
}

}  // namespace pmindex::sync

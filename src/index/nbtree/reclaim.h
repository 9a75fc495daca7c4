// A small epoch-based reclaimer for NBTree's replaced leaves, SMO descriptors and out-of-line
// value records. It offers the verbs of sync::EpochManager (branch sync-utils: pin(),
// retire(), drain()) so the tree can switch to the shared one when that branch lands; until
// then this stays inside src/index/nbtree/.
//
// Scheme: a global epoch E only grows. pin() announces E in the thread's slot (seq_cst store,
// then the thread reads the tree). retire() tags an item with E read after a seq_cst fence
// (the unlink happened before). try_advance() moves E to E+1 only when every pinned slot
// announces E. An item tagged e is freed once E >= e + 2: every thread that could have seen it
// was pinned at an epoch <= e and must have unpinned for E to pass e + 1.
//
// Thread safety: pin/retire/collect from any thread; drain() only when no thread is pinned.
// Invariants: (1) an item is retired only after it is unreachable for new readers;
// (2) a thread touches tree memory only while pinned; (3) pins do not nest.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "pmindex/pm/thread_slot.h"

namespace pmindex::nbtree {

class Reclaimer {
 public:
  class Guard {
   public:
    explicit Guard(Reclaimer* r) : r_(r), slot_(pm::this_thread_slot()) { r_->enter(slot_); }
    ~Guard() { r_->leave(slot_); }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    Reclaimer* r_;
    std::size_t slot_;
  };

  Reclaimer() = default;
  ~Reclaimer() { drain(); }
  Reclaimer(const Reclaimer&) = delete;
  Reclaimer& operator=(const Reclaimer&) = delete;

  [[nodiscard]] Guard pin() { return Guard(this); }

  void retire(std::function<void()> fn) {
    // seq_cst fence: orders the caller's unlink before the epoch read (see the header).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    std::vector<Item> ready;
    {
      std::lock_guard<std::mutex> lock(mu_);
      limbo_.push_back({std::move(fn), epoch_.load(std::memory_order_seq_cst)});
      if (limbo_.size() % 16 == 0) {
        try_advance();
        take_ready(&ready, false);
      }
    }
    for (Item& it : ready) it.fn();
  }

  // Frees everything. Only when no thread is pinned (close, destructor, tests).
  void drain() {
    std::vector<Item> ready;
    {
      std::lock_guard<std::mutex> lock(mu_);
      take_ready(&ready, true);
    }
    for (Item& it : ready) it.fn();
  }

  std::size_t pending() const {
    std::lock_guard<std::mutex> lock(mu_);
    return limbo_.size();
  }

 private:
  struct Item {
    std::function<void()> fn;
    std::uint64_t epoch;
  };
  struct alignas(64) Slot {
    std::atomic<std::uint64_t> word{0};  // 0 = not pinned, else (epoch << 1) | 1
  };

  void enter(std::size_t slot) {
    const std::uint64_t e = epoch_.load(std::memory_order_seq_cst);
    // seq_cst: the announcement is ordered before every read of the tree that follows.
    slots_[slot].word.store((e << 1) | 1, std::memory_order_seq_cst);
  }
  void leave(std::size_t slot) {
    // release: the thread's reads of tree memory happen before a later free.
    slots_[slot].word.store(0, std::memory_order_release);
  }
  // Under mu_.
  void try_advance() {
    const std::uint64_t e = epoch_.load(std::memory_order_seq_cst);
    for (const Slot& s : slots_) {
      const std::uint64_t w = s.word.load(std::memory_order_acquire);
      if ((w & 1) != 0 && (w >> 1) != e) return;
    }
    std::uint64_t expected = e;
    epoch_.compare_exchange_strong(expected, e + 1, std::memory_order_seq_cst);
  }
  void take_ready(std::vector<Item>* out, bool everything) {
    const std::uint64_t e = epoch_.load(std::memory_order_acquire);
    std::size_t keep = 0;
    for (std::size_t i = 0; i < limbo_.size(); ++i) {
      if (everything || limbo_[i].epoch + 2 <= e) {
        out->push_back(std::move(limbo_[i]));
      } else {
        limbo_[keep++] = std::move(limbo_[i]);
      }
    }
    limbo_.resize(keep);
  }

  std::atomic<std::uint64_t> epoch_{2};
  Slot slots_[pm::kMaxThreadSlots];
  mutable std::mutex mu_;
  std::vector<Item> limbo_;
};

}  // namespace pmindex::nbtree

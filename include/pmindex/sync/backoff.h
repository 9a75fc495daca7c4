/// \file
/// Exponential backoff for the spin loops of the sync primitives (optimistic_lock.h,
/// spin_lock.h).
///
/// Each spin() call is one wait between two looks at a shared word: a scheduling point for the
/// crash simulator's deterministic scheduler (pm::yield_point, a no-op outside the tracing
/// flavour), then 1, 2, 4, ... kMaxPauses `pause` instructions. Once the cap is reached every
/// further call also gives up the CPU (std::this_thread::yield): when there are more runnable
/// threads than cores (tests, CI, shared machines) the thread we wait for may be preempted, and
/// spinning on would burn our whole time slice without letting it finish.
///
/// Thread safety: a SpinBackoff is a local variable of one spinning thread; it shares nothing.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <string_view>
#include <thread>

#include "pmindex/pm/persist.h"

namespace pmindex::sync {

/// Exponential backoff for spin loops: pauses doubling up to kMaxPauses, then yields the CPU.
/// One per waiting loop (a local); not shared between threads.
class SpinBackoff {
 public:
  /// 64 pauses are a few microseconds on current x86 cores (a pause is ~40-140 cycles).
  static constexpr std::uint32_t kMaxPauses = 64;

  /// One wait step; `tag` names the scheduling point for the crash simulator's scheduler.
  void spin(std::string_view tag) {
    pm::yield_point(tag);
    for (std::uint32_t i = 0; i < pauses_; ++i) _mm_pause();
    if (pauses_ < kMaxPauses) {
      pauses_ *= 2;
    } else {
      std::this_thread::yield();
    }
  }

 private:
  std::uint32_t pauses_ = 1;
};

}  // namespace pmindex::sync

/// \file
/// A deterministic scheduler for multi-threaded crash simulation: two or three simulated
/// threads run one at a time and hand a baton to a seeded-random runnable thread at every
/// scheduling point, so an interleaving is a pure function of the seed.
///
/// Scheduling points are the tracer's events from simulated threads: every traced PM store,
/// flush and fence, and every pm::yield_point(tag) (atomic operations on shared DRAM state,
/// test hooks, spin-loop iterations). Code under the scheduler must not block outside a
/// scheduling point: a std::mutex held across a yield deadlocks the baton. Locks must spin and
/// call pm::yield_point in the spin loop; a thread that blocks anyway is reported (the process
/// aborts after `stall_seconds` without progress, naming the thread).
///
/// Thread safety: run() is called from one (non-simulated) thread; yield() only from the
/// simulated thread that holds the baton.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <random>
#include <vector>

namespace pmindex::crash {

/// The crash simulator's deterministic thread scheduler: simulated threads run one at a time
/// and hand a baton to a seeded-random runnable thread at every scheduling point, so a seed
/// replays one interleaving exactly (docs/crash-simulator.md).
class Scheduler {
 public:
  /// `seed` picks the interleaving; a thread that holds the baton for `stall_seconds` without
  /// reaching a scheduling point is reported as a hang.
  explicit Scheduler(std::uint64_t seed, unsigned stall_seconds = 60);
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  /// Runs bodies[i] on simulated thread i until every body has returned.
  void run(const std::vector<std::function<void()>>& bodies);
  /// A scheduling point: hands the baton to a seeded-random runnable thread (possibly the
  /// caller) and returns when the caller holds it again. A no-op outside a simulated thread.
  void yield();

  /// The calling thread's simulated index, or -1 if it is not one of this scheduler's threads.
  int sim_index() const;
  /// Which thread ran after each scheduling point (for reproducibility tests and reports).
  const std::vector<std::uint8_t>& schedule() const { return schedule_; }

 private:
  void wait_for_turn(std::unique_lock<std::mutex>& lock, int me);
  void pass_baton(int me, bool me_runnable);

  std::mt19937_64 rng_;
  const unsigned stall_seconds_;
  std::mutex mu_;
  std::condition_variable cv_;
  int turn_ = -1;
  std::vector<bool> done_;
  std::vector<std::uint8_t> schedule_;
  std::uint64_t steps_ = 0;
};

}  // namespace pmindex::crash

// The deterministic baton scheduler (include/pmindex/crash/scheduler.h).
#include "pmindex/crash/scheduler.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace pmindex::crash {

namespace {
// Which scheduler and simulated index the calling thread belongs to.
thread_local const Scheduler* t_owner = nullptr;
thread_local int t_index = -1;
}  // namespace

Scheduler::Scheduler(std::uint64_t seed, unsigned stall_seconds)
    : rng_(seed), stall_seconds_(stall_seconds) {}

int Scheduler::sim_index() const { return t_owner == this ? t_index : -1; }

void Scheduler::wait_for_turn(std::unique_lock<std::mutex>& lock, int me) {
  std::uint64_t seen = steps_;
  auto last_progress = std::chrono::steady_clock::now();
  while (turn_ != me) {
    cv_.wait_for(lock, std::chrono::milliseconds(200));
    if (steps_ != seen) {
      seen = steps_;
      last_progress = std::chrono::steady_clock::now();
    } else if (std::chrono::steady_clock::now() - last_progress >
               std::chrono::seconds(stall_seconds_)) {
      std::fprintf(stderr,
                   "[crash scheduler] no progress for %u s: simulated thread %d holds the baton "
                   "but is blocked outside a scheduling point (a std::mutex or a blocking call?)\n",
                   stall_seconds_, turn_);
      std::abort();
    }
  }
}

// Caller holds mu_. Picks the next thread among the runnable ones (seeded) and wakes it.
void Scheduler::pass_baton(int me, bool me_runnable) {
  std::vector<int> runnable;
  for (std::size_t i = 0; i < done_.size(); ++i)
    if (!done_[i] && (me_runnable || static_cast<int>(i) != me)) runnable.push_back(static_cast<int>(i));
  ++steps_;
  if (runnable.empty()) {
    turn_ = -1;
  } else {
    turn_ = runnable[rng_() % runnable.size()];
    schedule_.push_back(static_cast<std::uint8_t>(turn_));
  }
  cv_.notify_all();
}

void Scheduler::yield() {
  const int me = sim_index();
  if (me < 0) return;
  std::unique_lock<std::mutex> lock(mu_);
  pass_baton(me, /*me_runnable=*/true);
  wait_for_turn(lock, me);
}

void Scheduler::run(const std::vector<std::function<void()>>& bodies) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_.assign(bodies.size(), false);
    schedule_.clear();
    turn_ = bodies.empty() ? -1 : static_cast<int>(rng_() % bodies.size());
    if (turn_ >= 0) schedule_.push_back(static_cast<std::uint8_t>(turn_));
  }
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < bodies.size(); ++i) {
    threads.emplace_back([this, i, &bodies] {
      t_owner = this;
      t_index = static_cast<int>(i);
      {
        std::unique_lock<std::mutex> lock(mu_);
        wait_for_turn(lock, static_cast<int>(i));
      }
      bodies[i]();
      std::lock_guard<std::mutex> lock(mu_);
      done_[i] = true;
      pass_baton(static_cast<int>(i), /*me_runnable=*/false);
      t_owner = nullptr;
      t_index = -1;
    });
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace pmindex::crash

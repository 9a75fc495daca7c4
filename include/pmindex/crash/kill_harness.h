/// \file
/// The kill -9 harness every index reuses (process crashes on a /dev/shm pool).
///
/// Each cycle forks a child that opens the pool (Index::open: recovery), runs seeded
/// operations on `writers` threads (2 by default; each owns the keys k with (k-1) % writers
/// equal to its number, so each key's history is one thread's program order) and records every
/// acknowledged operation in shared memory (MAP_SHARED anonymous, written after the operation
/// returns). The parent kills the child with SIGKILL
///   * at a random time, or
///   * deterministically at the k-th persistence-API call (store, flush or fence): in the
///     tracing flavour the child installs a TraceSink that raise(SIGKILL)s itself; some of
///     these kills land inside the child's own recovery (sink installed before the open).
/// Then the parent reopens the pool, recovers, verify()s and compares with the oracle: every
/// acknowledged operation is durable, each writer's one in flight is fully present or absent
/// (judged per writer's keys). The state that matched becomes the next cycle's oracle.
///
///   crash::KillConfig cfg = crash::KillConfig::from_env(30);
///   cfg.options.kind = "reflist";
///   cfg.options.path = dir.file("kill.pool");
///   crash::KillReport r = crash::run_kill_cycles(cfg);
///   EXPECT_TRUE(r.ok()) << r.to_string();
///
/// Unlike a simulated power failure, a killed process loses nothing already stored (the page
/// cache keeps it): this harness finds protocol bugs that do not need lost cache lines
/// (recovery of half-done operations, recovery that crashes, locks left held, leaks, a crash
/// during recovery), not missing flushes. docs/crash-simulator.md.
///
/// Thread safety: call from a single-threaded process state (no other threads running), since
/// it forks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "pmindex/index.h"

namespace pmindex::crash {

/// What run_kill_cycles does: which index, how many cycles, where the kills land.
struct KillConfig {
  /// kind, path (created afresh), pool_size, node_size, persistence
  Options options;
  std::uint64_t seed = 20261122;         ///< seeds the operations and the kill points
  std::size_t cycles = 30;               ///< child processes started and killed
  std::size_t max_ops_per_cycle = 20000; ///< a child that is never killed stops here (all writers)
  std::uint64_t key_space = 64;          ///< keys 1..key_space
  /// Writer threads in the child (1..kMaxWriters), each on its own share of the keys.
  unsigned writers = 2;
  static constexpr unsigned kMaxWriters = 4;  ///< the shared log's capacity
  unsigned max_kill_delay_us = 20000;    ///< random-time kills: uniform in [0, this)
  std::uint64_t max_kill_event = 3000;   ///< event kills: k uniform in [1, this]
  /// A quarter of the event kills count from before the child's Index::open, with k uniform in
  /// [1, this]: set it to about the number of persistence calls the index's open and recovery
  /// make (reflist: 4, the pool's commit_open), so the kill lands inside recovery.
  std::uint64_t max_open_event = 4;
  unsigned child_timeout_s = 120;        ///< a child still alive after this is a hang: failure
  /// Fault injection for the harness's own tests (a checker must be able to fail): called with
  /// the pool path after each child died, before the parent reopens it.
  std::function<void(const std::string& path)> tamper_pool;

  /// cycles from PMINDEX_KILL_CYCLES (default_cycles otherwise), seed from PMINDEX_KILL_SEED.
  static KillConfig from_env(std::size_t default_cycles);
};

/// What run_kill_cycles found: counts, and one line per lost or invented operation.
struct KillReport {
  std::size_t cycles = 0;                ///< cycles run
  std::size_t random_kills = 0;          ///< kills at a random time
  std::size_t event_kills = 0;           ///< kills at the k-th persistence call
  std::size_t kills_in_recovery = 0;     ///< kills that landed before the child's open returned
  std::size_t finished_unkilled = 0;     ///< the child ran all its operations first
  std::size_t acknowledged = 0;          ///< operations acknowledged over all cycles
  /// Acknowledged operations per writer thread (every writer must have run).
  std::vector<std::size_t> acknowledged_by_writer;
  std::size_t in_flight_present = 0;     ///< in-flight writes found applied after recovery
  std::size_t in_flight_absent = 0;      ///< in-flight writes found not applied
  std::vector<std::string> failures;     ///< each names seed, cycle and kill point

  /// True when no acknowledged operation was lost.
  bool ok() const { return failures.empty(); }
  /// A summary line and the failures, for test output.
  std::string to_string() const;
};

/// Runs `config.cycles` cycles: a child process opens (recovers) the pool, checks what it finds
/// against the parent's record of acknowledged operations, runs seeded operations reporting
/// each acknowledgement through a pipe, and is killed with SIGKILL at a random time or at a
/// chosen persistence event. Blocking; forks; call from a single-threaded test process.
KillReport run_kill_cycles(const KillConfig& config);

}  // namespace pmindex::crash

/// \file
/// The generic crash driver every index plugs into through its IndexRegistry entry:
///
///   create pool (anonymous, small) -> op 0 creates the index -> seeded operations
///   (insert/update/upsert/remove/find/scan over a small key space) with crash points
///   -> for each chosen image: Pool::open_image on a private copy, the entry's recover(),
///   verify(), compare with a std::map oracle (every completed operation present; the one in
///   flight fully present or absent; an update leaves the old or the new value), then run more
///   operations on the recovered index, verify and compare again.
///
///   crash::IndexCrashConfig cfg;
///   cfg.options.kind = "lbtree";
///   cfg.options.node_size = 256;
///   auto opt = crash::ExploreOptions::from_env("lbtree.adr", pm::Mode::adr);
///   crash::ExploreReport r = crash::run_index_crash(cfg, opt);
///   EXPECT_TRUE(r.ok()) << r.to_string();
///
/// Keys are KeyType::u64 (8-byte big-endian), values 8 bytes, unique per operation so an image
/// shows which write it holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "pmindex/crash/explorer.h"
#include "pmindex/index.h"

namespace pmindex::crash {

/// The single-threaded driver's configuration (see the file comment); fields have defaults that
/// suit a CI-sized run.
struct IndexCrashConfig {
  Options options;                      ///< kind, node_size, ...; persistence comes from the mode
  std::size_t pool_size = 256 * 1024;   ///< <= 1 MiB keeps image copies cheap
  std::size_t ops = 0;                  ///< 0: derived from the image budget
  std::uint64_t key_space = 24;         ///< small, so updates and removes hit present keys
  std::size_t ops_after_recovery = 6;   ///< run on every recovered image
  std::size_t scan_length = 8;          ///< records per scan in the workload
  /// Fill then drain (0: off): every write of the workload (insert, update, upsert, remove)
  /// before this op inserts, and every op from it on touches the keys in a seeded random order
  /// (each once per key_space ops) and every write removes (finds and scans stay), so
  /// structures first grow and then shrink together (roart's merges). The ops after recovery
  /// stay the mixed workload.
  std::size_t drain_from = 0;
  /// Crash during recovery (opt-in): for one in `recovery_crash_every` checked images (seeded),
  /// the image's recovery and the operations after it run traced in a nested exploration, and up
  /// to `recovery_crash_images` images of a crash inside them are recovered and checked in turn
  /// (the in-flight choice of the first recovery may go either way). 0 = off.
  std::size_t recovery_crash_images = 0;
  std::size_t recovery_crash_every = 8;  ///< one nested exploration per this many images
  /// Fault injection for the driver's own tests (a checker must be able to fail): called on
  /// every image copy before it is opened.
  std::function<void(std::span<char> image)> tamper_image;
  /// Called on the live index after op 0 (create) and after every workload op i of the explored
  /// run (never in nested explorations, never on a recovered image), so a test can tally the
  /// SMOs its workload ran (tests/index/common/crash_kit.h SmoTally). Must not write PM.
  std::function<void(const Index& index, std::size_t op)> observe;
  /// An index's background work run as one more simulated thread (after the `threads`
  /// operation threads, under the same scheduler), e.g. DPTree's merges with
  /// dptree::Config::external_merger. Called once with the live index and a function that
  /// says whether every operation thread has finished (the last one's verify() included); it
  /// must return soon after that turns true, and wait only at scheduling points.
  std::function<void(Index& index, const std::function<bool()>& ops_done)> background;
};

/// The multi-threaded driver's configuration (docs/crash-simulator.md, "Multi-threaded index
/// driver").
///
/// `threads` simulated threads run seeded operations (insert / update / remove / find over keys
/// 1..key_space, values unique per operation) on one live index under the deterministic
/// scheduler (seeded by options.seed), which may switch threads at every traced PM event and
/// pm::yield_point. Every invocation and response is recorded with a logical clock. At each crash
/// point (eADR: after every store; ADR: every image the line-mode rules give) the image is
/// recovered, verified and judged per key for durable linearizability: the value the image
/// holds was written by an operation that was invoked and did not fail; no operation that
/// completed after that write returned was lost (a write, a delete, or a read that observed
/// another state); a key is absent only if some delete could be linearised after every
/// completed write of it and every read that observed it present. Operations in flight may be
/// either way. Then a few operations run on the recovered index.
struct ConcurrentCrashConfig {
  Options options;                     ///< kind, node_size, ...; persistence comes from the mode
  std::size_t pool_size = 512 * 1024;  ///< the run's anonymous pool (its images are copied)
  std::size_t threads = 2;             ///< 2 or 3
  std::size_t ops_per_thread = 16;     ///< seeded operations each simulated thread runs
  std::uint64_t key_space = 12;        ///< keys 1..key_space (small: threads meet on keys)
  std::size_t preload = 6;             ///< keys 1..preload inserted at setup (no crash points)
  /// Called on the live index right after it is created (before the preload), e.g. to switch
  /// on an index's known-bad test variant.
  std::function<void(Index&)> prepare;
  /// Builds the live index instead of the registry entry's create (e.g. a known-bad template
  /// instantiation that exists only in a test); images are still recovered by the entry.
  std::function<Result<std::unique_ptr<Index>>(std::unique_ptr<pm::Pool>, const Options&)> create;
  /// Called on the live index with op 0 after the preload, then during the run by each
  /// simulated thread right after one of its operations returns, with op = the number of
  /// operations returned so far (all threads), and once more with kObserveEnd when the last
  /// thread has finished (after its verify()), so a test can tally the SMOs the schedule ran,
  /// also those a later one undid (tests/index/common/crash_kit.h SmoTally). One call at a time;
  /// the other threads may be inside their operations, so it must read only what a concurrent
  /// reader may (counters, an epoch-pinned walk), must not write PM and must not wait for a
  /// lock the index's operations hold.
  std::function<void(const Index& index, std::size_t op)> observe;
  /// An index's background work run as one more simulated thread (after the `threads`
  /// operation threads, under the same scheduler), e.g. DPTree's merges with
  /// dptree::Config::external_merger. Called once with the live index and a function that
  /// says whether every operation thread has finished (the last one's verify() included); it
  /// must return soon after that turns true, and wait only at scheduling points.
  std::function<void(Index& index, const std::function<bool()>& ops_done)> background;
};

/// The `op` of ConcurrentCrashConfig::observe's last call, after the last thread's verify().
inline constexpr std::size_t kObserveEnd = ~std::size_t{0};

/// Runs `config.threads` simulated threads under the deterministic scheduler (seeded by
/// options.seed) and checks every crash image for durable linearizability (see above).
ExploreReport run_index_crash_concurrent(const ConcurrentCrashConfig& config,
                                         const ExploreOptions& options);

/// Builds the scenario for `config` (ops seeded by options.seed) and explores it.
ExploreReport run_index_crash(const IndexCrashConfig& config, const ExploreOptions& options);

/// Number of operations run_index_crash uses when config.ops is 0.
std::size_t default_crash_ops(std::size_t images_budget);

}  // namespace pmindex::crash

/// \file
/// The crash explorer: runs a Scenario (a sequence of operations on a pool) under the Tracer,
/// and at every crash point checks a budgeted, deduplicated set of crash images with the
/// scenario's own recovery and oracle. docs/crash-simulator.md describes how images are chosen
/// and how to replay a failure.
///
///   crash::ExploreOptions opt = crash::ExploreOptions::from_env("reflist.adr", pm::Mode::adr);
///   crash::ExploreReport r = crash::explore(scenario, opt);
///   EXPECT_TRUE(r.ok()) << r.to_string();   // failures carry replay tokens
///
/// Thread safety: explore() runs the scenario's operations on the calling thread and its image
/// checks on one private worker thread, one at a time (never concurrently with an operation).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pmindex/crash/tracer.h"
#include "pmindex/pm/persist.h"
#include "pmindex/status.h"

namespace pmindex::crash {

/// The memory a scenario's pool occupies (traced region and image size).
struct Region {
  char* base = nullptr;   ///< first byte of the pool
  std::size_t size = 0;   ///< bytes
  /// The region already holds a pool image, all of it durable (a nested exploration of a crash
  /// during recovery starts from a crash image), rather than fresh zeroed memory.
  bool preloaded = false;
};

/// What the explorer drives. A scenario must be deterministic: setup() followed by the same
/// operations must produce the same trace every time (the explorer runs it twice: once to
/// plan the image budget, once to check; a replay runs it once more).
class Scenario {
 public:
  virtual ~Scenario() = default;
  /// Discards any previous state and creates a fresh pool in fresh zeroed memory (anonymous
  /// pool). Its pm:: stores are traced (without crash points). Runs on the traced thread.
  virtual Result<Region> setup() = 0;
  /// Operations the scenario runs after setup (crash points are raised inside them).
  virtual std::size_t op_count() const = 0;
  /// Runs operation i (traced, with crash points). Returns an error if the live structure
  /// misbehaves (wrong result code, failed verify, ...).
  virtual Status run_op(std::size_t i) = 0;
  /// Checks one crash image (a private copy the check may modify) taken at `at`: recover,
  /// verify, compare with the oracle (every operation before at.op present; at.op present or
  /// absent, or present if at.completed), then continue operating. `salt` seeds any
  /// randomness of the check. Runs on the explorer's worker thread.
  virtual Status check_image(std::span<char> image, const CrashPoint& at,
                             std::uint64_t salt) = 0;
  /// Releases the pool (called after the run, on the traced thread).
  virtual void teardown() {}
  /// Images checked by nested explorations the checks ran (crash during recovery), if any.
  virtual std::size_t inner_images_checked() const { return 0; }
};

/// Multi-threaded scenarios (docs/crash-simulator.md, "Multi-threaded simulation").
class OpContext {
 public:
  virtual ~OpContext() = default;
  /// Called by a simulated thread right after each of its operations returns: a crash point at
  /// which that operation counts as completed.
  virtual void op_returned() = 0;
  /// Reports that the live run misbehaved (a wrong result).
  virtual void fail(const Status& status) = 0;
};

/// Two or three threads run under the deterministic Scheduler (seeded from the explore seed):
/// they switch at every traced PM event and pm::yield_point. Crash points are numbered by the
/// count of operations returned so far (CrashPoint::op), over all threads. The scenario records
/// its own history (invocations, responses, values its reads returned) and judges each image
/// against it: durable linearizability (every completed operation and every value a returned
/// read observed survives; operations in flight either way).
class ConcurrentScenario {
 public:
  virtual ~ConcurrentScenario() = default;
  virtual Result<Region> setup() = 0;  ///< fresh pool; on the exploring thread
  virtual std::size_t threads() const = 0;  ///< simulated threads (2 or 3)
  /// The body of simulated thread `thread`: its operations, each followed by
  /// context.op_returned().
  virtual void run_thread(std::size_t thread, OpContext& context) = 0;
  /// On the explorer's worker thread, while every simulated thread is parked.
  virtual Status check_image(std::span<char> image, const CrashPoint& at,
                             std::uint64_t salt) = 0;
  virtual void teardown() {}  ///< releases the pool after the run
};

/// A failure's coordinates: enough to re-check exactly that image.
struct ReplayToken {
  std::string label;                     ///< the configuration (ExploreOptions::label)
  std::uint64_t seed = 0;                ///< the run's seed
  std::size_t op = 0;                    ///< the operation in flight
  std::size_t point = 0;                 ///< crash point within the operation
  std::vector<std::uint32_t> choice;     ///< prefix length per pending lane

  /// "<label>/<seed>/<op>/<point>/<c0.c1...>" ("-" for an empty choice vector).
  std::string to_string() const;
  /// The inverse of to_string(); nullopt for anything malformed.
  static std::optional<ReplayToken> parse(std::string_view text);
};

/// How the explorer picks and checks crash images.
struct ExploreOptions {
  std::string label;                   ///< names the configuration in tokens ("reflist.adr")
  pm::Mode mode = pm::Mode::adr;       ///< adr: line-granular write-back; eadr: store order
  std::uint64_t seed = 1;              ///< the scenario's seed, recorded in tokens
  std::size_t images_budget = 1000;    ///< images checked per run; 0 = no limit
  std::size_t exhaustive_limit = 128;  ///< enumerate every combination up to this many
  std::size_t pair_cap = 32;           ///< lane pairs sampled per crash point beyond that
  std::size_t random_images = 8;       ///< seeded random choice vectors per crash point
  std::size_t max_failures = 3;        ///< stop checking after this many
  bool check_bypass = true;            ///< compare live memory at operation boundaries
  std::optional<ReplayToken> replay;   ///< check only this image

  /// Reads PMINDEX_CRASH_IMAGES (budget), PMINDEX_CRASH_SEED (seed; default_seed otherwise)
  /// and PMINDEX_CRASH_REPLAY (a token; only applies when its label matches `label`).
  static ExploreOptions from_env(std::string label, pm::Mode mode,
                                 std::uint64_t default_seed = 20261122,
                                 std::size_t default_images = 1000);
};

/// One failed check.
struct Failure {
  std::string message;   ///< what the check found
  ReplayToken token;     ///< where: PMINDEX_CRASH_REPLAY=`TOKEN` re-checks only this image
  /// False for failures of the live run (a bypassing store, a wrong result, setup): they
  /// involve no image; rerunning with the same seed reproduces them.
  bool image = true;
};

/// What an exploration did and found.
struct ExploreReport {
  std::size_t ops = 0;                ///< operations run
  std::size_t crash_points = 0;       ///< crash points raised
  std::size_t candidate_images = 0;   ///< distinct images the candidate rules produced
  std::size_t images_checked = 0;     ///< images recovered and checked
  bool replay_skipped = false;        ///< a replay token for another label was set
  std::size_t schedule_steps = 0;     ///< concurrent runs: scheduling decisions taken
  std::size_t inner_images = 0;       ///< images of nested explorations (crash during recovery)
  std::vector<Failure> failures;      ///< up to ExploreOptions::max_failures

  bool ok() const { return failures.empty(); }  ///< no check failed
  std::string to_string() const;      ///< summary plus every failure with its replay command

  /// Whether the run checked what its budget promised: at least 90% of a non-zero budget, or
  /// every distinct candidate image (the explored space was exhausted before the budget).
  /// Anything else (a workload too small for its budget) is short_of_budget, which the test
  /// kit (tests/index/common/crash_kit.h) fails.
  enum class Coverage {
    budget_reached,   ///< at least kBudgetShare of the budget checked
    exhausted,        ///< every distinct candidate image checked
    short_of_budget,  ///< neither: the workload offers too few images for the budget
  };
  static constexpr double kBudgetShare = 0.9;  ///< share of the budget that counts as reached
  /// This report's coverage against `options.images_budget` (see Coverage).
  Coverage coverage(const ExploreOptions& options) const;
  /// "budget reached: 987 of 1000 images", "exhausted: all 412 candidate images",
  /// "SHORT: 51 of 1000 images (1200 candidates)".
  std::string coverage_text(const ExploreOptions& options) const;
};

/// Runs the scenario under the tracer and checks the crash images the candidate rules give at
/// every crash point, up to the budget (docs/crash-simulator.md). Blocking; one at a time per
/// process (the tracer is the process's sink).
ExploreReport explore(Scenario& scenario, const ExploreOptions& options);
/// The same for a multi-threaded scenario; the seed also drives the schedule.
ExploreReport explore_concurrent(ConcurrentScenario& scenario, const ExploreOptions& options);

/// The candidate choice vectors for pending lanes of the given lengths, in priority order:
/// every combination when there are at most `exhaustive_limit`; otherwise nothing persisted,
/// everything persisted, each lane alone, all but each lane, a capped sample of lane pairs,
/// and `random_images` seeded random vectors. Not deduplicated (the explorer does that).
std::vector<std::vector<std::uint32_t>> candidate_choices(std::span<const std::uint32_t> lengths,
                                                          const ExploreOptions& options,
                                                          std::uint64_t rng_seed);

}  // namespace pmindex::crash

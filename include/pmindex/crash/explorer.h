// The crash explorer: runs a Scenario (a sequence of operations on a pool) under the Tracer,
// and at every crash point checks a budgeted, deduplicated set of crash images with the
// scenario's own recovery and oracle. docs/crash-simulator.md describes how images are chosen
// and how to replay a failure.
//
//   crash::ExploreOptions opt = crash::ExploreOptions::from_env("reflist.adr", pm::Mode::adr);
//   crash::ExploreReport r = crash::explore(scenario, opt);
//   EXPECT_TRUE(r.ok()) << r.to_string();   // failures carry replay tokens
//
// Thread safety: explore() runs the scenario's operations on the calling thread and its image
// checks on one private worker thread, one at a time (never concurrently with an operation).
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

// The memory a scenario's pool occupies (traced region and image size).
struct Region {
  char* base = nullptr;
  std::size_t size = 0;
};

// What the explorer drives. A scenario must be deterministic: setup() followed by the same
// operations must produce the same trace every time (the explorer runs it twice: once to
// plan the image budget, once to check; a replay runs it once more).
class Scenario {
 public:
  virtual ~Scenario() = default;
  // Discards any previous state and creates a fresh pool in fresh zeroed memory (anonymous
  // pool). Its pm:: stores are traced (without crash points). Runs on the traced thread.
  virtual Result<Region> setup() = 0;
  virtual std::size_t op_count() const = 0;
  // Runs operation i (traced, with crash points). Returns an error if the live structure
  // misbehaves (wrong result code, failed verify, ...).
  virtual Status run_op(std::size_t i) = 0;
  // Checks one crash image (a private copy the check may modify) taken at `at`: recover,
  // verify, compare with the oracle (every operation before at.op present; at.op present or
  // absent, or present if at.completed), then continue operating. `salt` seeds any
  // randomness of the check. Runs on the explorer's worker thread.
  virtual Status check_image(std::span<char> image, const CrashPoint& at,
                             std::uint64_t salt) = 0;
  // Releases the pool (called after the run, on the traced thread).
  virtual void teardown() {}
};

// A failure's coordinates: enough to re-check exactly that image.
struct ReplayToken {
  std::string label;
  std::uint64_t seed = 0;
  std::size_t op = 0;
  std::size_t point = 0;                 // crash point within the operation
  std::vector<std::uint32_t> choice;     // prefix length per pending lane

  // "<label>/<seed>/<op>/<point>/<c0.c1...>" ("-" for an empty choice vector).
  std::string to_string() const;
  static std::optional<ReplayToken> parse(std::string_view text);
};

struct ExploreOptions {
  std::string label;                   // names the configuration in tokens ("reflist.adr")
  pm::Mode mode = pm::Mode::adr;
  std::uint64_t seed = 1;              // the scenario's seed, recorded in tokens
  std::size_t images_budget = 1000;    // images checked per run; 0 = no limit
  std::size_t exhaustive_limit = 128;  // enumerate every combination up to this many
  std::size_t pair_cap = 32;           // lane pairs sampled per crash point beyond that
  std::size_t random_images = 8;       // seeded random choice vectors per crash point
  std::size_t max_failures = 3;        // stop checking after this many
  bool check_bypass = true;            // compare live memory at operation boundaries
  std::optional<ReplayToken> replay;   // check only this image

  // Reads PMINDEX_CRASH_IMAGES (budget), PMINDEX_CRASH_SEED (seed; default_seed otherwise)
  // and PMINDEX_CRASH_REPLAY (a token; only applies when its label matches `label`).
  static ExploreOptions from_env(std::string label, pm::Mode mode,
                                 std::uint64_t default_seed = 20261122,
                                 std::size_t default_images = 1000);
};

struct Failure {
  std::string message;
  ReplayToken token;
};

struct ExploreReport {
  std::size_t ops = 0;
  std::size_t crash_points = 0;
  std::size_t candidate_images = 0;   // distinct images the candidate rules produced
  std::size_t images_checked = 0;
  bool replay_skipped = false;        // a replay token for another label was set
  std::vector<Failure> failures;

  bool ok() const { return failures.empty(); }
  std::string to_string() const;      // summary plus every failure with its replay command
};

ExploreReport explore(Scenario& scenario, const ExploreOptions& options);

// The candidate choice vectors for pending lanes of the given lengths, in priority order:
// every combination when there are at most `exhaustive_limit`; otherwise nothing persisted,
// everything persisted, each lane alone, all but each lane, a capped sample of lane pairs,
// and `random_images` seeded random vectors. Not deduplicated (the explorer does that).
std::vector<std::vector<std::uint32_t>> candidate_choices(std::span<const std::uint32_t> lengths,
                                                          const ExploreOptions& options,
                                                          std::uint64_t rng_seed);

}  // namespace pmindex::crash

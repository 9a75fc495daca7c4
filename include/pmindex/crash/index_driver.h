// The generic crash driver every index plugs into through its IndexRegistry entry:
//
//   create pool (anonymous, small) -> op 0 creates the index -> seeded operations
//   (insert/update/upsert/remove/find/scan over a small key space) with crash points
//   -> for each chosen image: Pool::open_image on a private copy, the entry's recover(),
//   verify(), compare with a std::map oracle (every completed operation present; the one in
//   flight fully present or absent; an update leaves the old or the new value), then run more
//   operations on the recovered index, verify and compare again.
//
//   crash::IndexCrashConfig cfg;
//   cfg.options.kind = "lbtree";
//   cfg.options.node_size = 256;
//   auto opt = crash::ExploreOptions::from_env("lbtree.adr", pm::Mode::adr);
//   crash::ExploreReport r = crash::run_index_crash(cfg, opt);
//   EXPECT_TRUE(r.ok()) << r.to_string();
//
// Keys are KeyType::u64 (8-byte big-endian), values 8 bytes, unique per operation so an image
// shows which write it holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "pmindex/crash/explorer.h"
#include "pmindex/index.h"

namespace pmindex::crash {

struct IndexCrashConfig {
  Options options;                      // kind, node_size, ...; persistence comes from the mode
  std::size_t pool_size = 256 * 1024;   // <= 1 MiB keeps image copies cheap
  std::size_t ops = 0;                  // 0: derived from the image budget
  std::uint64_t key_space = 24;         // small, so updates and removes hit present keys
  std::size_t ops_after_recovery = 6;   // run on every recovered image
  std::size_t scan_length = 8;
  // Crash during recovery (opt-in): for one in `recovery_crash_every` checked images (seeded),
  // the image's recovery and the operations after it run traced in a nested exploration, and up
  // to `recovery_crash_images` images of a crash inside them are recovered and checked in turn
  // (the in-flight choice of the first recovery may go either way). 0 = off.
  std::size_t recovery_crash_images = 0;
  std::size_t recovery_crash_every = 8;
  // Fault injection for the driver's own tests (a checker must be able to fail): called on
  // every image copy before it is opened.
  std::function<void(std::span<char> image)> tamper_image;
};

// Builds the scenario for `config` (ops seeded by options.seed) and explores it.
ExploreReport run_index_crash(const IndexCrashConfig& config, const ExploreOptions& options);

// Number of operations run_index_crash uses when config.ops is 0.
std::size_t default_crash_ops(std::size_t images_budget);

}  // namespace pmindex::crash

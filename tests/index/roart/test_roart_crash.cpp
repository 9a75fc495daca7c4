// roart under the crash simulator (adr and eadr). Key spaces chosen for what they exercise:
// 24 keys fit one array (it grows 8 -> 16 -> 32 slots and shrinks back); 400 keys split full
// 64-slot arrays again and again (A4-A8: intent, separator into the trie, the array's name
// moved), with grows and shrinks of the halves; 4,000 keys are sparse (splits at several trie
// depths; the oracle looks up the whole key space after every image, so it stays small). Recovery after every image meets the state each step leaves, splits interrupted
// after their commit (A5) included, which the first touch finishes (R6). Sized by
// PMINDEX_CRASH_IMAGES (about 1,000 per run in CI; the `long` variant runs 10,000); a failure
// prints a replay token: PMINDEX_CRASH_REPLAY='roart.adr/<seed>/<op>/<point>/<choice>'.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>

#include "index/common/crash_kit.h"
#include "index/roart/roart.h"
#include "pmindex/crash/index_driver.h"

namespace pmindex::crash {
namespace {

IndexCrashConfig roart_config(std::uint64_t key_space) {
  IndexCrashConfig cfg;
  cfg.options.kind = "roart";
  cfg.options.key_type = KeyType::u64;
  cfg.pool_size = 1024 * 1024;
  cfg.key_space = key_space;
  return cfg;
}

crash_kit::SmoTally::Levels roart_levels(const Index& idx) {
  const auto& r = static_cast<const roart::Roart&>(idx);
  return {{"splits", r.splits()}, {"grows", r.grows()}, {"shrinks", r.shrinks()}};
}

void run(pm::Mode mode, std::uint64_t key_space, const std::string& name,
         std::vector<std::string> smos, double share = 1.0) {
  IndexCrashConfig cfg = roart_config(key_space);
  const std::string label = name + "." + std::string(pm::to_string(mode));
  ExploreOptions opt = ExploreOptions::from_env(label, mode);
  if (!opt.replay && share < 1.0)
    opt.images_budget = std::max<std::size_t>(100, static_cast<std::size_t>(opt.images_budget * share));
  const std::size_t ops = default_crash_ops(opt.images_budget) * (mode == pm::Mode::eadr ? 3 : 2) / 2;
  cfg.ops = std::max<std::size_t>(key_space > 100 ? 400 : 120, ops);
  crash_kit::SmoTally tally(&roart_levels);
  cfg.observe = tally.observer();
  const std::uint64_t finished = roart::Roart::finished_splits_total();
  const ExploreReport r = run_index_crash(cfg, opt);
  if (r.replay_skipped) GTEST_SKIP() << "PMINDEX_CRASH_REPLAY names another configuration";
  const bool splits = std::find(smos.begin(), smos.end(), "splits+") != smos.end();
  crash_kit::expect_explored(r, opt, {.smos = std::move(smos)}, &tally);
  const std::uint64_t cut = roart::Roart::finished_splits_total() - finished;
  std::cout << label << ": " << cut << " recovered images finished a split cut after A5 (R6)\n";
  // The suites that split must also have recovered images cut inside a split (A5-A8).
  if (splits && !opt.replay) {
    EXPECT_GT(cut, 0u) << "no image crashed inside a split";
  }
}

TEST(CrashRoart, AdrOneArray) { run(pm::Mode::adr, 24, "roart_small", {"grows+"}, 0.5); }
TEST(CrashRoart, AdrSplits) { run(pm::Mode::adr, 400, "roart", {"splits+", "grows+"}); }
TEST(CrashRoart, EadrSplits) { run(pm::Mode::eadr, 400, "roart", {"splits+", "grows+"}); }
TEST(CrashRoart, AdrSparse) { run(pm::Mode::adr, 4000, "roart_sparse", {"splits+"}, 0.5); }

// The driver's oracle must be able to fail on roart too: a forged "root never published"
// state makes recovery build an empty index, which loses acknowledged records.
TEST(CrashRoart, DriverCatchesLostRecords) {
  IndexCrashConfig cfg = roart_config(400);
  cfg.ops = 60;
  cfg.tamper_image = [](std::span<char> image) {
    pm::HeaderState st{};
    if (!pm::image_state(image.data(), &st)) return;
    st.root = 0;
    st.flags = pm::kStateBuilding;
    pm::set_image_state(image.data(), st);
  };
  ExploreOptions opt;
  opt.label = "roart.tampered";
  opt.images_budget = 100;
  const ExploreReport r = run_index_crash(cfg, opt);
  ASSERT_FALSE(r.ok());
}

}  // namespace
}  // namespace pmindex::crash

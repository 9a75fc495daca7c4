// Two-thread stress of mixed insert/update/remove/find/scan on PACTree against per-thread
// oracles (tests/index/common/hybrid_stress.h): thread t owns the keys with key % 2 == t, so
// both threads write the same data nodes, split them while the other reads and walks the
// last mile, and apply each other's log entries in LSN order. Time-boxed by
// PMINDEX_STRESS_SECONDS (default 2), half with the background updater, half synchronous,
// each half split between the search layer in DRAM and in PM. Run under TSan (cmake --preset
// tsan) for the race check.
#include <gtest/gtest.h>

#include <cstdlib>

#include "index/common/hybrid_stress.h"
#include "index/pactree/layout.h"

namespace pmindex {
namespace {

void run_stress(unsigned slots, KeyType kt, double seconds, PacTreeOptions::Updater mode,
                PacTreeOptions::SearchLayer search) {
  Options o;
  o.kind = "pactree";
  o.pactree.updater = mode;
  o.pactree.search_layer = search;
  o.pool_size = 64 << 20;
  o.node_size = pactree::kHeaderBytes + slots * pactree::kSlotBytes;
  o.key_type = kt;
  o.max_key_size = 8;
  const std::string label =
      "pactree " + std::to_string(slots) + " slots" + (kt == KeyType::bytes ? " bytes" : "") +
      (search == PacTreeOptions::SearchLayer::pm ? " pm search" : "");
  hybrid_test::run_two_thread_stress(
      o, 4000, seconds,
      hybrid_test::StressMix{.insert = 2, .update = 1, .remove = 1, .find = 1, .scan = 1}, 2207,
      label);
}

// Both updater modes (Options::pactree.updater): the background thread applies the log while
// both writers run; synchronous, the writers apply it.
void run_all(PacTreeOptions::Updater mode, double t) {
  for (const auto search : {PacTreeOptions::SearchLayer::dram, PacTreeOptions::SearchLayer::pm}) {
    run_stress(4, KeyType::u64, t / 6, mode, search);
    run_stress(64, KeyType::u64, t / 6, mode, search);
    run_stress(4, KeyType::bytes, t / 6, mode, search);
  }
}

TEST(PacTreeStress, TwoThreadsAgainstOracleBackgroundUpdater) {
  run_all(PacTreeOptions::Updater::background, hybrid_test::stress_seconds() / 2);
}
TEST(PacTreeStress, TwoThreadsAgainstOracleSynchronousUpdater) {
  run_all(PacTreeOptions::Updater::synchronous, hybrid_test::stress_seconds() / 2);
}

}  // namespace
}  // namespace pmindex

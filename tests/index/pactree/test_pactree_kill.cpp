// PACTree under the kill -9 harness (/dev/shm pool): PMINDEX_KILL_CYCLES cycles (about 30 in CI,
// hundreds in `long`), half killed at a random time, half at the k-th persistence call (some
// inside recovery), with the harness's 2 writer threads and acknowledgement log. Data nodes of
// 4 slots (a split every few inserts) and 64 slots. Scaffolding: hybrid_test_support.h.
#include <gtest/gtest.h>

#include "index/common/hybrid_test_support.h"
#include "index/pactree/layout.h"

namespace pmindex::crash {
namespace {

void run(unsigned slots, pm::Mode mode, const std::string& suffix = "",
         PacTreeOptions::Updater updater = PacTreeOptions::Updater::automatic) {
  hybrid_test::run_kill("pactree", pactree::kHeaderBytes + slots * pactree::kSlotBytes, mode,
                        "pactree" + std::to_string(slots) + "." + std::string(pm::to_string(mode)) +
                            suffix,
                        200, PacTreeOptions{.updater = updater});
}

// The forked child opens with the harness's Options: background (the default) and sync.
TEST(KillPacTree, Slots4Adr) { run(4, pm::Mode::adr); }
TEST(KillPacTree, Slots64Adr) { run(64, pm::Mode::adr); }
TEST(KillPacTree, Slots4AdrSynchronousUpdater) {
  run(4, pm::Mode::adr, ".sync", PacTreeOptions::Updater::synchronous);
}

}  // namespace
}  // namespace pmindex::crash

// PACTree under the kill -9 harness (/dev/shm pool): PMINDEX_KILL_CYCLES cycles (about 30 in CI,
// hundreds in `long`), half killed at a random time, half at the k-th persistence call (some
// inside recovery), with the harness's 2 writer threads and acknowledgement log. Data nodes of
// 4 slots (a split every few inserts) and 64 slots. Scaffolding: hybrid_test_support.h.
#include <gtest/gtest.h>

#include <cstdlib>

#include "index/common/hybrid_test_support.h"
#include "index/pactree/layout.h"

namespace pmindex::crash {
namespace {

void run(unsigned slots, pm::Mode mode, const std::string& suffix = "") {
  hybrid_test::run_kill("pactree", pactree::kHeaderBytes + slots * pactree::kSlotBytes, mode,
                        "pactree" + std::to_string(slots) + "." + std::string(pm::to_string(mode)) +
                            suffix);
}

// The killed child inherits PMINDEX_PACTREE_UPDATER: background (the default) and sync.
TEST(KillPacTree, Slots4Adr) { run(4, pm::Mode::adr); }
TEST(KillPacTree, Slots64Adr) { run(64, pm::Mode::adr); }
TEST(KillPacTree, Slots4AdrSynchronousUpdater) {
  ::setenv("PMINDEX_PACTREE_UPDATER", "sync", 1);
  run(4, pm::Mode::adr, ".sync");
  ::unsetenv("PMINDEX_PACTREE_UPDATER");
}

}  // namespace
}  // namespace pmindex::crash

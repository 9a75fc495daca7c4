// PACTree under the kill -9 harness (/dev/shm pool): PMINDEX_KILL_CYCLES cycles (about 30 in CI,
// hundreds in `long`), half killed at a random time, half at the k-th persistence call (some
// inside recovery), with the harness's 2 writer threads and acknowledgement log. Data nodes of
// 4 slots (a split every few inserts) and 64 slots; with the PM search layer, also with the
// start-now walk on its own thread. Scaffolding: hybrid_test_support.h.
#include <gtest/gtest.h>

#include "index/common/hybrid_test_support.h"
#include "index/pactree/pactree.h"

namespace pmindex::crash {
namespace {

using Search = PacTreeOptions::SearchLayer;

void run(unsigned slots, pm::Mode mode, const std::string& suffix = "",
         PacTreeOptions::Updater updater = PacTreeOptions::Updater::automatic,
         Search search = Search::dram) {
  hybrid_test::run_kill("pactree", pactree::kHeaderBytes + slots * pactree::kSlotBytes, mode,
                        "pactree" + std::to_string(slots) + "." + std::string(pm::to_string(mode)) +
                            suffix + (search == Search::pm ? ".pmsearch" : ""),
                        200, PacTreeOptions{.updater = updater, .search_layer = search});
}

// The forked child opens with the harness's Options: background (the default) and sync, with
// the search layer in DRAM and in PM (suffix /dram, /pm).
class KillPacTree : public ::testing::TestWithParam<Search> {};
std::string search_name(const ::testing::TestParamInfo<Search>& i) {
  return i.param == Search::pm ? "pm" : "dram";
}
TEST_P(KillPacTree, Slots4Adr) { run(4, pm::Mode::adr, "", PacTreeOptions::Updater::automatic, GetParam()); }
TEST_P(KillPacTree, Slots4AdrSynchronousUpdater) {
  run(4, pm::Mode::adr, ".sync", PacTreeOptions::Updater::synchronous, GetParam());
}
INSTANTIATE_TEST_SUITE_P(Search, KillPacTree, ::testing::Values(Search::dram, Search::pm),
                         search_name);
TEST(KillPacTreeDram, Slots64Adr) { run(64, pm::Mode::adr); }
// The PM search layer's start-now walk on its own thread (this flavour defers it to the first
// writer by default; the forked child inherits the choice), so kills land while it runs
// beside the writers' wait and the readers.
TEST(KillPacTreePm, Slots4AdrWalkThread) {
  pactree::PacTree::set_walk_mode_for_testing(pactree::PacTree::WalkMode::thread);
  run(4, pm::Mode::adr, ".walkthread", PacTreeOptions::Updater::automatic, Search::pm);
  pactree::PacTree::set_walk_mode_for_testing(pactree::PacTree::WalkMode::automatic);
}

}  // namespace
}  // namespace pmindex::crash

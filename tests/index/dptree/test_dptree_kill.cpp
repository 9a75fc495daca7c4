// DPTree under the kill -9 harness (/dev/shm pool): PMINDEX_KILL_CYCLES cycles (about 30 in CI,
// hundreds in `long`), half killed at a random time, half at the k-th persistence call (some
// inside recovery), with the harness's two writer threads and acknowledgement log. Base leaves
// of 8 slots (a merge every 8 writes) and 256 (the default: merges rarer, the log longer).
#include <gtest/gtest.h>

#include <cstdlib>

#include "index/common/hybrid_test_support.h"
#include "index/dptree/layout.h"

namespace pmindex::crash {
namespace {

void run(std::uint32_t slots, pm::Mode mode) {
  hybrid_test::run_kill("dptree", static_cast<std::uint32_t>(dptree::leaf_bytes(slots)), mode,
                        "dptree" + std::to_string(slots) + "." + std::string(pm::to_string(mode)));
}

TEST(KillDPTree, Slots8Adr) { run(8, pm::Mode::adr); }
TEST(KillDPTree, Slots256Adr) { run(256, pm::Mode::adr); }

// The background merge (PMINDEX_DPTREE_MERGE, inherited by the harness's children): kills
// land beside the merge thread's M1-M3, its flip and its log trim, and inside recovery.
TEST(KillDPTree, Slots8AdrBackground) {
  setenv("PMINDEX_DPTREE_MERGE", "background", 1);
  run(8, pm::Mode::adr);
  unsetenv("PMINDEX_DPTREE_MERGE");
}

// The harness catches a planted loss: the first log record's validity word broken after
// each kill (acknowledged buffered writes vanish).
TEST(KillDPTree, HarnessCatchesLostLogRecords) {
  Options o;
  o.kind = "dptree";
  o.node_size = static_cast<std::uint32_t>(dptree::leaf_bytes(256));
  hybrid_test::expect_kill_catches(
      o,
      [](std::span<char> image) {
        const std::uint64_t page =
            hybrid_test::head_leaf(image, offsetof(dptree::Root, log_head), 4096);
        if (page != 0) image[page + 64 + 56] ^= 1;
      },
      "dptree");
}

}  // namespace
}  // namespace pmindex::crash

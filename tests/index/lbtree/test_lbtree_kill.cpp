// LB+-Tree under the kill -9 harness (/dev/shm pool): PMINDEX_KILL_CYCLES cycles (about 30 in
// CI, hundreds in `long`), half killed at a random time, half at the k-th persistence call
// (some inside recovery). Leaves of 256 B and 1 KiB; key space 200 so splits and leaf
// removals happen across cycles. Scaffolding: tests/index/common/hybrid_test_support.h.
#include <gtest/gtest.h>

#include "index/common/hybrid_test_support.h"

namespace pmindex::crash {
namespace {

void run(std::uint32_t node_size, pm::Mode mode) {
  hybrid_test::run_kill("lbtree", node_size, mode,
                        "lbtree" + std::to_string(node_size) + "." + std::string(pm::to_string(mode)));
}

TEST(KillLBTree, Leaf256Adr) { run(256, pm::Mode::adr); }
TEST(KillLBTree, Leaf1024Adr) { run(1024, pm::Mode::adr); }

}  // namespace
}  // namespace pmindex::crash

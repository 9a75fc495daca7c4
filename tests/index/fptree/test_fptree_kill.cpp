// FPTree under the kill -9 harness (/dev/shm pool): PMINDEX_KILL_CYCLES cycles (about 30 in CI,
// hundreds in `long`), half killed at a random time, half at the k-th persistence call (some
// inside recovery). 8-entry leaves and a key space of 200, so splits (split micro-log) and
// leaf removals (delete micro-log) happen across cycles; also the paper's 64-entry leaves.
// Scaffolding: tests/index/common/hybrid_test_support.h.
#include <gtest/gtest.h>

#include "index/common/hybrid_test_support.h"
#include "index/fptree/layout.h"

namespace pmindex::crash {
namespace {

void run(std::uint32_t node_size, pm::Mode mode) {
  hybrid_test::run_kill("fptree", node_size, mode,
                        "fptree" + std::to_string(node_size) + "." + std::string(pm::to_string(mode)));
}

TEST(KillFPTree, Leaf8Adr) { run(sizeof(fptree::Leaf<8>), pm::Mode::adr); }
TEST(KillFPTree, Leaf64Adr) { run(sizeof(fptree::Leaf<64>), pm::Mode::adr); }

}  // namespace
}  // namespace pmindex::crash

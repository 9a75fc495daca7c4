// uTree under the kill -9 harness (/dev/shm pool): PMINDEX_KILL_CYCLES cycles (about 30 in CI,
// hundreds in `long`), half killed at a random time, half at the k-th persistence call (some
// inside recovery), with the harness's writer threads and acknowledgement log. DRAM leaves of
// 64 B and 512 B; key space 200. Scaffolding: tests/index/common/hybrid_test_support.h.
#include <gtest/gtest.h>

#include "index/common/hybrid_test_support.h"

namespace pmindex::crash {
namespace {

void run(std::uint32_t node_size, pm::Mode mode) {
  hybrid_test::run_kill("utree", node_size, mode,
                        "utree" + std::to_string(node_size) + "." + std::string(pm::to_string(mode)));
}

TEST(KillUTree, Leaf64Adr) { run(64, pm::Mode::adr); }
TEST(KillUTree, Leaf512Adr) { run(512, pm::Mode::adr); }

}  // namespace
}  // namespace pmindex::crash

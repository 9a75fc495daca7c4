// LB+-Tree under the crash simulator through its IndexRegistry entry (generic driver), ADR and
// eADR, leaves of 256 B (m = 1) and multi-256 B (m = 2, 4). The small key space makes every
// path happen within a few operations: good-case inserts, entry moving, splits with the key
// going left and right, deletes that empty and unlink a leaf, 8-byte in-place updates.
// Sized by PMINDEX_CRASH_IMAGES (about 1,000 per mode in CI; `long` runs 10,000), seeded by
// PMINDEX_CRASH_SEED. Replay a failure with the printed token:
//   PMINDEX_CRASH_REPLAY='lbtree256.adr/<seed>/<op>/<point>/<choice>' ./test_lbtree_crash
// Scaffolding shared with FPTree: tests/index/common/hybrid_test_support.h.
#include <gtest/gtest.h>

#include <cstring>

#include "index/common/hybrid_test_support.h"

namespace pmindex::crash {
namespace {

// The crash run only means something if its workload reaches the interesting paths: the kit
// fails a run whose explored workload split no leaf (the PM footprint never grew). The random
// mix rarely empties a leaf; test_lbtree_crash_phased covers removal.
void run(std::uint32_t node_size, std::uint64_t key_space, pm::Mode mode, std::size_t ops) {
  hybrid_test::RegistryCrashRun r;
  r.options.kind = "lbtree";
  r.options.node_size = node_size;
  r.options.key_type = KeyType::u64;
  r.key_space = key_space;
  r.mode = mode;
  r.min_ops = ops;
  r.label = "lbtree" + std::to_string(node_size) + "." + std::string(pm::to_string(mode));
  r.smos = {"pm_bytes+"};  // leaf splits (8-byte keys and values are inline)
  hybrid_test::run_registry_crash(r);
}

TEST(CrashLBTree, Leaf256Adr) { run(256, 60, pm::Mode::adr, 200); }
TEST(CrashLBTree, Leaf256Eadr) { run(256, 60, pm::Mode::eadr, 200); }
TEST(CrashLBTree, Leaf512Adr) { run(512, 120, pm::Mode::adr, 300); }
TEST(CrashLBTree, Leaf512Eadr) { run(512, 120, pm::Mode::eadr, 300); }
TEST(CrashLBTree, Leaf1024Adr) { run(1024, 200, pm::Mode::adr, 500); }
TEST(CrashLBTree, Leaf1024Eadr) { run(1024, 200, pm::Mode::eadr, 500); }

// An lbtree-specific loss that the crash driver and the kill harness must both catch: clearing
// the head leaf's bitmap drops records that completed operations wrote.
TEST(CrashLBTree, DriverAndKillHarnessCatchLostRecords) {
  Options o;
  o.kind = "lbtree";
  o.node_size = 256;
  hybrid_test::expect_checkers_catch(o, [](std::span<char> image) {
    if (const std::uint64_t head = hybrid_test::head_leaf(image, 8, 256)) {
      image[head] = 0;                                              // bitmap bits 0-7
      image[head + 1] = static_cast<char>(image[head + 1] & 0xC0);  // bits 8-13
    }
  }, "lbtree");
}

}  // namespace
}  // namespace pmindex::crash

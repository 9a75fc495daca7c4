// NBTree under the crash simulator (single thread), in adr and eadr modes: every persistence
// point of insert, update, delete, the SMO phases (tiny leaves: capacity 7, so the driver's
// key space splits leaves often) and recovery itself. Sized by PMINDEX_CRASH_IMAGES, seeded by
// PMINDEX_CRASH_SEED; u64 keys and variable-length keys (KeyType::bytes: K1-K3 key records
// in every insert, delete and SMO); a failure prints a replay token:
//   PMINDEX_CRASH_REPLAY='nbtree.adr/<seed>/<op>/<point>/<choice>' ./test_nbtree_crash
#include <gtest/gtest.h>

#include <cstring>
#include <iostream>

#include "pmindex/crash/index_driver.h"
#include "index/common/crash_kit.h"
#include "index/common/hybrid_test_support.h"
#include "index/nbtree/nbtree.h"

namespace pmindex::crash {
namespace {

// NBTree's leaf count on the live index: "leaves+" is a leaf split.
crash_kit::SmoTally::Levels leaf_levels(const Index& idx) {
  return {{"leaves", dynamic_cast<const nbtree::NBTree&>(idx).leaf_count()}};
}

// The kit's registry crash run; it fails a run whose workload split no leaf.
void run(pm::Mode mode, std::uint32_t node_size, KeyType kt = KeyType::u64) {
  hybrid_test::RegistryCrashRun r;
  r.options.kind = "nbtree";
  r.options.key_type = kt;  // bytes: the driver's 8-byte keys go through PM key records
  r.options.max_key_size = 8;
  r.options.node_size = node_size;
  r.pool_size = 512 * 1024;
  r.mode = mode;
  r.label = "nbtree." + std::string(pm::to_string(mode)) + "." + std::to_string(node_size) +
            (kt == KeyType::bytes ? ".bytes" : "");
  r.smos = {"leaves+"};
  r.probe = leaf_levels;
  hybrid_test::run_registry_crash(r);
}

TEST(CrashNBTree, AdrSmallLeaves) { run(pm::Mode::adr, 128); }
TEST(CrashNBTree, EadrSmallLeaves) { run(pm::Mode::eadr, 128); }
TEST(CrashNBTree, AdrTinyLeaves) { run(pm::Mode::adr, 64); }
TEST(CrashNBTree, AdrSmallLeavesBytesKeys) { run(pm::Mode::adr, 128, KeyType::bytes); }
TEST(CrashNBTree, EadrSmallLeavesBytesKeys) { run(pm::Mode::eadr, 128, KeyType::bytes); }

// An nbtree-specific loss that the crash driver and the kill harness must both catch: zeroing
// the head leaf's entries (a zero key word is a free slot) drops records that completed
// operations wrote (128-byte leaves).
TEST(CrashNBTree, DriverAndKillHarnessCatchLostRecords) {
  Options o;
  o.kind = "nbtree";
  o.node_size = 128;
  hybrid_test::expect_checkers_catch(o, [](std::span<char> image) {
    if (const std::uint64_t head = hybrid_test::head_leaf(image, offsetof(nbtree::Root, head), 128))
      std::memset(image.data() + head + sizeof(nbtree::BlockHeader), 0,
                  128 - sizeof(nbtree::BlockHeader));
  }, "nbtree");
}

}  // namespace
}  // namespace pmindex::crash

// LB+-Tree under the crash simulator with a designed workload that walks every persistence
// path in order (PROTOCOL.md): ascending inserts (good case, entry moving, splits with the key
// going right), descending inserts between them (entry moving, splits with the key going left),
// 8-byte in-place updates, then deletes of a contiguous range (leaves empty and are unlinked:
// U1-U4); a second scenario starts with a bulk load (B1-B4). ADR and eADR, m = 1, 2, 4.
// Each image: recover through the registry, verify(), compare with the oracle (completed ops
// present, the op in flight all or nothing), then keep operating and check again.
// Sized by PMINDEX_CRASH_IMAGES, replayable with the printed token. The scenario frame is
// shared with FPTree: hybrid_test::ScriptedScenario (tests/index/common/hybrid_test_support.h).
#include <gtest/gtest.h>

#include "index/common/hybrid_test_support.h"

namespace pmindex::crash {
namespace {

void run(std::uint32_t node_size, pm::Mode mode, bool bulk) {
  Options o;
  o.kind = "lbtree";
  o.node_size = node_size;
  o.persistence = mode;
  o.pool_size = 512 * 1024;
  const std::uint64_t s = 14 * (node_size / 256);  // slots per leaf
  std::vector<std::uint64_t> bulk_keys;
  std::vector<WorkOp> ops;
  std::uint64_t v = 1000;
  if (bulk) {
    for (std::uint64_t k = 2; k <= 4 * s; k += 2) bulk_keys.push_back(k);
    for (std::uint64_t k = 1; k < s; k += 2) ops.push_back({OpKind::insert, k, ++v});
    for (std::uint64_t k = 2; k <= s; k += 4) ops.push_back({OpKind::remove, k, 0});
  } else {
    for (std::uint64_t k = 2; k <= 4 * s; k += 2) ops.push_back({OpKind::insert, k, ++v});
    for (std::uint64_t k = 4 * s - 1; k >= 1 && k < 4 * s; k -= 2)
      ops.push_back({OpKind::insert, k, ++v});
    for (std::uint64_t k = 3; k <= 4 * s; k += 7) ops.push_back({OpKind::update, k, ++v});
    for (std::uint64_t k = 2 * s; k >= 1; --k) ops.push_back({OpKind::remove, k, 0});
    ops.push_back({OpKind::scan, 1, 0});
  }
  hybrid_test::ScriptedScenario scenario(o, 4 * s, std::move(ops), std::move(bulk_keys), 0.7);
  const std::string label = std::string(bulk ? "lbtree_bulk" : "lbtree_phased") +
                            std::to_string(node_size) + "." + std::string(pm::to_string(mode));
  hybrid_test::run_scripted(scenario, label, mode, {.splits = true, .removals = !bulk});
}

TEST(CrashLBTreePhased, Leaf256Adr) { run(256, pm::Mode::adr, false); }
TEST(CrashLBTreePhased, Leaf256Eadr) { run(256, pm::Mode::eadr, false); }
TEST(CrashLBTreePhased, Leaf512Adr) { run(512, pm::Mode::adr, false); }
TEST(CrashLBTreePhased, Leaf512Eadr) { run(512, pm::Mode::eadr, false); }
TEST(CrashLBTreePhased, Leaf1024Adr) { run(1024, pm::Mode::adr, false); }
TEST(CrashLBTreePhased, Leaf1024Eadr) { run(1024, pm::Mode::eadr, false); }
TEST(CrashLBTreePhased, BulkLoad256Adr) { run(256, pm::Mode::adr, true); }
TEST(CrashLBTreePhased, BulkLoad1024Adr) { run(1024, pm::Mode::adr, true); }
TEST(CrashLBTreePhased, BulkLoad256Eadr) { run(256, pm::Mode::eadr, true); }

}  // namespace
}  // namespace pmindex::crash

// LB+-Tree under the crash simulator through its IndexRegistry entry (generic driver), ADR and
// eADR, leaves of 256 B (m = 1) and multi-256 B (m = 2, 4). The small key space makes every
// path happen within a few operations: good-case inserts, entry moving, splits with the key
// going left and right, deletes that empty and unlink a leaf, 8-byte in-place updates.
// Sized by PMINDEX_CRASH_IMAGES (about 1,000 per mode in CI; `long` runs 10,000), seeded by
// PMINDEX_CRASH_SEED. Replay a failure with the printed token:
//   PMINDEX_CRASH_REPLAY='lbtree256.adr/<seed>/<op>/<point>/<choice>' ./test_lbtree_crash
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <iostream>

#include "crash/workload.h"
#include "pmindex/crash/index_driver.h"

namespace pmindex::crash {
namespace {

// The crash run only means something if its workload reaches the interesting paths: replay
// the same operations on a plain index and count leaf splits (PM bytes in use grow by exactly
// one leaf block). The random mix rarely empties a leaf; LBTreeScenario below covers removal.
void expect_structural_changes(std::uint32_t node_size, std::uint64_t key_space, std::size_t n,
                               std::uint64_t seed) {
  Options o;
  o.kind = "lbtree";
  o.node_size = node_size;
  o.pool_size = 1 << 20;
  o.persistence = pm::Mode::dram;
  auto r = Index::open(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  auto idx = std::move(r).value();
  Oracle oracle;
  std::size_t splits = 0, removals = 0;
  std::uint64_t before = idx->footprint().pm_bytes;
  for (const WorkOp& op : make_workload(seed, n, key_space)) {
    ASSERT_TRUE(apply_checked(*idx, op, oracle, 8).ok());
    const std::uint64_t now = idx->footprint().pm_bytes;
    if (now == before + node_size) ++splits;
    if (now + node_size == before) ++removals;
    before = now;
  }
  std::cout << "workload: " << n << " ops, " << splits << " splits, " << removals
            << " leaf removals\n";
  EXPECT_GT(splits, 0u);
}

void run(std::uint32_t node_size, std::uint64_t key_space, pm::Mode mode, std::size_t ops = 0) {
  IndexCrashConfig cfg;
  cfg.options.kind = "lbtree";
  cfg.options.node_size = node_size;
  cfg.options.key_type = KeyType::u64;
  cfg.key_space = key_space;
  const std::string label =
      "lbtree" + std::to_string(node_size) + "." + std::string(pm::to_string(mode));
  const ExploreOptions opt = ExploreOptions::from_env(label, mode);
  // At least `ops` (so leaves split); more when the image budget is larger (the long suite).
  cfg.ops = std::max(ops, default_crash_ops(opt.images_budget));
  ops = cfg.ops;
  if (!opt.replay) {
    expect_structural_changes(node_size, key_space, ops, opt.seed);
  }
  const ExploreReport r = run_index_crash(cfg, opt);
  std::cout << label << " seed " << opt.seed << ": " << r.to_string() << "\n";
  if (r.replay_skipped) GTEST_SKIP() << "PMINDEX_CRASH_REPLAY names another configuration";
  EXPECT_TRUE(r.ok()) << r.to_string();
  if (!opt.replay) {
    EXPECT_GT(r.images_checked, std::min<std::size_t>(opt.images_budget, 100) / 2);
  }
}

TEST(CrashLBTree, Leaf256Adr) { run(256, 60, pm::Mode::adr, 200); }
TEST(CrashLBTree, Leaf256Eadr) { run(256, 60, pm::Mode::eadr, 200); }
TEST(CrashLBTree, Leaf512Adr) { run(512, 120, pm::Mode::adr, 300); }
TEST(CrashLBTree, Leaf512Eadr) { run(512, 120, pm::Mode::eadr, 300); }
TEST(CrashLBTree, Leaf1024Adr) { run(1024, 200, pm::Mode::adr, 500); }
TEST(CrashLBTree, Leaf1024Eadr) { run(1024, 200, pm::Mode::eadr, 500); }

// The driver must catch an lbtree-specific loss: clearing the head leaf's bitmap in every image
// drops records that completed operations wrote.
TEST(CrashLBTree, DriverCatchesLostRecords) {
  IndexCrashConfig cfg;
  cfg.options.kind = "lbtree";
  cfg.options.node_size = 256;
  cfg.ops = 40;
  cfg.tamper_image = [](std::span<char> image) {
    std::uint64_t root = 0, head = 0;
    std::memcpy(&root, image.data() + offsetof(pm::PoolHeader, root), 8);
    if (root == 0 || root + 16 > image.size()) return;
    std::memcpy(&head, image.data() + root + 8, 8);
    if (head == 0 || head + 256 > image.size()) return;
    image[head] = 0;                                            // bitmap bits 0-7
    image[head + 1] = static_cast<char>(image[head + 1] & 0xC0);  // bits 8-13
  };
  ExploreOptions opt;
  opt.label = "lbtree.tampered";
  opt.images_budget = 200;
  const ExploreReport r = run_index_crash(cfg, opt);
  ASSERT_FALSE(r.ok());
}

}  // namespace
}  // namespace pmindex::crash

// FPTree under the crash simulator, ADR and eADR.
//  * CrashFPTree.*: the generic registry driver (random insert/update/upsert/remove mix over a
//    small key space) with 8- and 16-entry leaves, u64 and variable-length (bytes) keys;
//    sized by PMINDEX_CRASH_IMAGES (about 1,000 per mode in CI, 10,000 in `long`); one run
//    also crashes inside recovery (the driver's nested exploration).
//  * CrashFPTreeSteps.*: a designed sequence that walks each persistence path of PROTOCOL.md
//    in order: inserts into free slots (I1-I4), a split of a full leaf (S1-S8), out-of-place
//    updates (U1-U4) including one in a full leaf (split first), deletes that empty a leaf
//    and unlink it with the delete micro-log (D1-D6). The split and removal ops are checked
//    with NO image budget, so every crash point of both micro-logs is recovered and checked.
// Each image: recover through the registry, verify(), compare with the oracle (completed ops
// present, the op in flight all or nothing), keep operating, check again.
// Replay: PMINDEX_CRASH_REPLAY='<printed token>' ./test_fptree_crash
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <optional>

#include "crash/workload.h"
#include "index/fptree/fptree.h"
#include "pmindex/crash/explorer.h"
#include "pmindex/crash/index_driver.h"

namespace pmindex::crash {
namespace {

constexpr std::uint32_t kLeaf8 = sizeof(fptree::Leaf<8>);
constexpr std::uint32_t kLeaf16 = sizeof(fptree::Leaf<16>);

void run_driver(std::uint32_t node_size, std::uint64_t key_space, pm::Mode mode, std::size_t ops,
                KeyType kt = KeyType::u64, std::size_t recovery_crash_images = 0) {
  IndexCrashConfig cfg;
  cfg.recovery_crash_images = recovery_crash_images;
  cfg.options.kind = "fptree";
  cfg.options.node_size = node_size;
  cfg.options.key_type = kt;
  cfg.options.max_key_size = 16;
  cfg.key_space = key_space;
  const std::string label = "fptree" + std::to_string(node_size) +
                            (kt == KeyType::bytes ? "bytes" : "") +
                            (recovery_crash_images > 0 ? "rec." : ".") + std::string(pm::to_string(mode));
  const ExploreOptions opt = ExploreOptions::from_env(label, mode);
  // At least `ops` (so leaves split and empty); more for a larger budget (the long suite), so
  // that eADR, with fewer distinct images per op, still reaches the budget.
  cfg.ops = std::max(ops, default_crash_ops(opt.images_budget));
  const ExploreReport r = run_index_crash(cfg, opt);
  std::cout << label << " seed " << opt.seed << ": " << r.to_string() << "\n";
  if (r.replay_skipped) GTEST_SKIP() << "PMINDEX_CRASH_REPLAY names another configuration";
  EXPECT_TRUE(r.ok()) << r.to_string();
  if (!opt.replay) {
    EXPECT_GT(r.images_checked, std::min<std::size_t>(opt.images_budget, 100) / 2);
  }
}

TEST(CrashFPTree, Leaf8Adr) { run_driver(kLeaf8, 40, pm::Mode::adr, 200); }
TEST(CrashFPTree, Leaf8Eadr) { run_driver(kLeaf8, 40, pm::Mode::eadr, 200); }
TEST(CrashFPTree, Leaf16Adr) { run_driver(kLeaf16, 80, pm::Mode::adr, 300); }
TEST(CrashFPTree, Leaf16Eadr) { run_driver(kLeaf16, 80, pm::Mode::eadr, 300); }
// Variable-length key mode: keys are PM records (K1-K3) referenced from the slots.
TEST(CrashFPTree, Leaf8BytesKeysAdr) { run_driver(kLeaf8, 40, pm::Mode::adr, 200, KeyType::bytes); }
TEST(CrashFPTree, Leaf8BytesKeysEadr) { run_driver(kLeaf8, 40, pm::Mode::eadr, 200, KeyType::bytes); }

// Crashes inside recovery (its repair pass re-links split and removed leaves, clears logs and
// lock words, unlinks empty leaves): for one in 8 checked images, images of a crash during its
// recovery are recovered and checked in turn.
TEST(CrashFPTree, CrashDuringRecoveryAdr) { run_driver(kLeaf8, 40, pm::Mode::adr, 200, KeyType::u64, 16); }

// The driver must catch an fptree-specific loss: clearing the head leaf's bitmap in every
// image drops records that completed operations wrote.
TEST(CrashFPTree, DriverCatchesLostRecords) {
  IndexCrashConfig cfg;
  cfg.options.kind = "fptree";
  cfg.options.node_size = kLeaf8;
  cfg.ops = 40;
  cfg.tamper_image = [](std::span<char> image) {
    std::uint64_t root = 0, head = 0;
    std::memcpy(&root, image.data() + offsetof(pm::PoolHeader, root), 8);
    if (root == 0 || root + 16 > image.size()) return;
    std::memcpy(&head, image.data() + root + offsetof(fptree::Root, head), 8);
    if (head == 0 || head + 8 > image.size()) return;
    std::memset(image.data() + head, 0, 8);
  };
  ExploreOptions opt;
  opt.label = "fptree.tampered";
  opt.images_budget = 200;
  EXPECT_FALSE(run_index_crash(cfg, opt).ok());
}

// The designed sequence (8-entry leaves). Op 0 creates the index.
class FPTreeSteps final : public Scenario {
 public:
  explicit FPTreeSteps(pm::Mode mode) : mode_(mode) {
    options_.kind = "fptree";
    options_.node_size = kLeaf8;
    options_.persistence = mode;
    options_.pool_size = 256 * 1024;
    entry_ = IndexRegistry::find("fptree");
    std::uint64_t v = 500;
    for (std::uint64_t k = 1; k <= 8; ++k) ops_.push_back({OpKind::insert, k * 2, ++v});  // full
    split_op_ = ops_.size() + 1;
    ops_.push_back({OpKind::insert, 9, ++v});                                 // S1-S8, then I1-I4
    ops_.push_back({OpKind::update, 4, ++v});                                 // U1-U4
    for (std::uint64_t k = 3; k <= 7; k += 2) ops_.push_back({OpKind::insert, k, ++v});
    full_update_op_ = ops_.size() + 1;
    ops_.push_back({OpKind::update, 2, ++v});                                 // full: split, U1-U4
    for (std::uint64_t k = 17; k >= 10; --k) ops_.push_back({OpKind::remove, k, 0});
    removal_op_ = ops_.size();                                                // last remove
    ops_.push_back({OpKind::scan, 1, 0});
  }

  Result<Region> setup() override {
    index_.reset();
    oracle_.clear();
    pm::PoolOptions po;
    po.size = options_.pool_size;
    po.mode = mode_;
    po.layout = entry_->layout(options_);
    auto pool = pm::Pool::create(po);
    if (!pool.ok()) return pool.status();
    pool_ = std::move(pool).value();
    return Region{pool_->base(), pool_->size()};
  }
  std::size_t op_count() const override { return 1 + ops_.size(); }

  Status run_op(std::size_t i) override {
    if (i == 0) {
      auto idx = entry_->create(std::move(pool_), options_);
      if (!idx.ok()) return idx.status();
      index_ = std::move(idx).value();
      return index_->verify();
    }
    const std::uint64_t before = index_->footprint().pm_bytes;
    if (Status s = apply_checked(*index_, ops_[i - 1], oracle_, 8); !s.ok()) return s;
    const std::uint64_t after = index_->footprint().pm_bytes;
    if (after > before && (i == split_op_ || i == full_update_op_)) ++splits_;
    if (after < before && i == removal_op_) ++removals_;
    return index_->verify();
  }

  Status check_image(std::span<char> image, const CrashPoint& at, std::uint64_t salt) override {
    auto pool = pm::Pool::open_image(image.data(), image.size(), mode_, entry_->layout(options_),
                                     "crash image");
    if (!pool.ok()) return Status(pool.status().code(), "image does not open: " + pool.status().message());
    auto rec = entry_->recover(std::move(pool).value(), options_);
    if (!rec.ok()) return Status(rec.status().code(), "recovery failed: " + rec.status().message());
    std::unique_ptr<Index> idx = std::move(rec).value();
    if (Status s = idx->verify(); !s.ok()) return Status(s.code(), "verify after recovery: " + s.message());
    std::optional<Oracle> after;
    if (!at.completed && at.op > 0) {
      after = oracle_;
      apply_to_oracle(ops_[at.op - 1], *after);
    }
    Oracle state;
    if (Status s = match_contents(*idx, kKeySpace, oracle_, after ? &*after : nullptr, &state); !s.ok())
      return s;
    for (const WorkOp& op : make_workload(salt, 6, kKeySpace))
      if (Status s = apply_checked(*idx, op, state, 8); !s.ok())
        return Status(s.code(), "after recovery: " + s.message());
    if (Status s = idx->verify(); !s.ok()) return Status(s.code(), "verify after more ops: " + s.message());
    return match_contents(*idx, kKeySpace, state, nullptr, nullptr);
  }

  void teardown() override {
    index_.reset();
    pool_.reset();
  }

  std::size_t splits() const { return splits_; }
  std::size_t removals() const { return removals_; }

 private:
  static constexpr std::uint64_t kKeySpace = 20;
  pm::Mode mode_;
  Options options_;
  const IndexRegistry::Entry* entry_ = nullptr;
  std::vector<WorkOp> ops_;
  std::size_t split_op_ = 0, full_update_op_ = 0, removal_op_ = 0;
  std::unique_ptr<pm::Pool> pool_;
  std::unique_ptr<Index> index_;
  Oracle oracle_;
  std::size_t splits_ = 0, removals_ = 0;
};

void run_steps(pm::Mode mode) {
  FPTreeSteps scenario(mode);
  const std::string label = "fptree_steps." + std::string(pm::to_string(mode));
  ExploreOptions opt = ExploreOptions::from_env(label, mode);
  opt.images_budget = 0;  // every crash point, every candidate image: the whole sequence
  const ExploreReport r = explore(scenario, opt);
  std::cout << label << ": " << r.to_string() << " (" << scenario.splits() << " splits, "
            << scenario.removals() << " leaf removals over the runs)\n";
  if (r.replay_skipped) GTEST_SKIP() << "PMINDEX_CRASH_REPLAY names another configuration";
  EXPECT_TRUE(r.ok()) << r.to_string();
  if (!opt.replay) {
    EXPECT_GT(scenario.splits(), 0u);
    EXPECT_GT(scenario.removals(), 0u);
    EXPECT_GT(r.crash_points, 50u);
  }
}

TEST(CrashFPTreeSteps, EveryPointAdr) { run_steps(pm::Mode::adr); }
TEST(CrashFPTreeSteps, EveryPointEadr) { run_steps(pm::Mode::eadr); }

}  // namespace
}  // namespace pmindex::crash

// DPTree under the crash simulator, ADR and eADR. Base leaves of 8 and 16 slots make the
// synchronous merge run every 8 (16) buffered writes inside the writer that fills the buffer,
// so crash images fall in every merge step (M1 free-slot writes, M2 fresh leaves, M3 next
// metadata versions, M4 head, M5 the flip, M6 leaf frees, M7 log reset), before and after the
// flip, and in every log append (L1-L5). Sized by PMINDEX_CRASH_IMAGES (about 1,000 per mode in
// CI; `long` runs 10,000). Replay a failure with the printed token:
//   PMINDEX_CRASH_REPLAY='dptree8.adr/<seed>/<op>/<point>/<choice>' ./test_dptree_crash
// Known-bad variants (test-only policies) must be caught: flipping the version bit before the
// next metadata versions are persisted, and the original's skipped metadata of unchanged leaves.
#include <gtest/gtest.h>

#include <optional>

#include "crash/workload.h"
#include "index/common/hybrid_test_support.h"
#include "index/dptree/dptree_recovery.h"

namespace pmindex::crash {
namespace {

crash_kit::SmoTally::Levels dp_levels(const Index& idx) {
  const auto* t = dynamic_cast<const dptree::DPTree<>*>(&idx);
  if (t == nullptr) return {};
  const dptree::MergeStats m = t->merge_stats();
  return {{"merges", m.merges},
          {"leaves", t->base_leaves()},
          {"log_pages_freed", m.log_pages_freed},
          {"folded", m.leaves_folded}};
}

void run(std::uint32_t slots, pm::Mode mode) {
  hybrid_test::RegistryCrashRun r;
  r.options.kind = "dptree";
  r.options.node_size = static_cast<std::uint32_t>(dptree::leaf_bytes(slots));
  r.key_space = 40;
  r.mode = mode;
  r.min_ops = 240;
  r.recovery_crash_images = 40;  // crashes inside recovery's repairs (R3)
  r.label = "dptree" + std::to_string(slots) + "." + std::string(pm::to_string(mode));
  r.probe = dp_levels;
  r.smos = {"merges+", "leaves+", "log_pages_freed+"};  // leaves-: DrainScripted
  hybrid_test::run_registry_crash(r);
}

TEST(CrashDPTree, Slots8Adr) { run(8, pm::Mode::adr); }
TEST(CrashDPTree, Slots8Eadr) { run(8, pm::Mode::eadr); }
TEST(CrashDPTree, Slots16Adr) { run(16, pm::Mode::adr); }
TEST(CrashDPTree, Slots16Eadr) { run(16, pm::Mode::eadr); }

// A random workload on a DPTree<Policy> built by the test (the registry builds only the
// production protocol); images are recovered by the registry entry, as in production.
template <class Policy>
class PolicyScenario final : public Scenario {
 public:
  PolicyScenario(Options o, std::vector<WorkOp> ops)
      : options_(std::move(o)), ops_(std::move(ops)) {
    entry_ = IndexRegistry::find("dptree");
  }
  Result<Region> setup() override {
    index_.reset();
    oracle_.clear();
    pm::PoolOptions po;
    po.size = 256 * 1024;
    po.mode = options_.persistence;
    po.layout = entry_->layout(options_);
    auto pool = pm::Pool::create(po);
    if (!pool.ok()) return pool.status();
    pool_ = std::move(pool).value();
    return Region{pool_->base(), pool_->size()};
  }
  std::size_t op_count() const override { return 1 + ops_.size(); }
  Status run_op(std::size_t i) override {
    if (i == 0) {
      dptree::Config config;
      config.background = false;  // merges at deterministic points, in the writer
      auto idx = dptree::DPTree<Policy>::create(std::move(pool_), options_, config);
      if (!idx.ok()) return idx.status();
      index_ = std::move(idx).value();
      return Status::Ok();
    }
    if (Status s = apply_checked(*index_, ops_[i - 1], oracle_, 8); !s.ok()) return s;
    return index_->verify();
  }
  Status check_image(std::span<char> image, const CrashPoint& at, std::uint64_t) override {
    auto pool = pm::Pool::open_image(image.data(), image.size(), options_.persistence,
                                     entry_->layout(options_), "crash image");
    if (!pool.ok()) return pool.status();
    auto rec = entry_->recover(std::move(pool).value(), options_);
    if (!rec.ok()) return Status(rec.status().code(), "recovery failed: " + rec.status().message());
    if (Status s = (*rec)->verify(); !s.ok()) return s;
    std::optional<Oracle> after;
    if (!at.completed && at.op > 0) {
      after = oracle_;
      apply_to_oracle(ops_[at.op - 1], *after);
    }
    return match_contents(**rec, kKeySpace, oracle_, after ? &*after : nullptr, nullptr);
  }
  void teardown() override {
    index_.reset();
    pool_.reset();
  }

 private:
  // Enough keys for several leaves, so some leaves sit out a merge right after one that
  // changed them (where a skipped meta[nv] is stale).
  static constexpr std::uint64_t kKeySpace = 160;
  Options options_;
  std::vector<WorkOp> ops_;
  const IndexRegistry::Entry* entry_ = nullptr;
  std::unique_ptr<pm::Pool> pool_;
  std::unique_ptr<Index> index_;
  Oracle oracle_;
};

// The policy scenarios' exploration: 600 images (crash_kit::expect_explored holds a clean run
// to 90% of them, or to every candidate image).
ExploreOptions policy_options(pm::Mode mode, const std::string& label) {
  ExploreOptions opt;
  opt.label = label;
  opt.mode = mode;
  opt.images_budget = 600;
  return opt;
}

// A random workload of 240 operations over 160 keys, or `script`.
template <class Policy>
ExploreReport explore_policy(pm::Mode mode, const std::string& label,
                             std::vector<WorkOp> script = {}) {
  Options o;
  o.kind = "dptree";
  o.node_size = static_cast<std::uint32_t>(dptree::leaf_bytes(8));
  o.persistence = mode;
  if (script.empty()) script = make_workload(7, 240, 160);
  PolicyScenario<Policy> sc(o, std::move(script));
  return explore(sc, policy_options(mode, label));
}

struct FlipBeforeMeta : dptree::Protocol {
  static constexpr bool kFlipBeforeMeta = true;
};
struct SkipUnchangedMeta : dptree::Protocol {
  static constexpr bool kSkipUnchangedMeta = true;
};
struct FoldIntoCurrentSlots : dptree::Protocol {
  static constexpr bool kFoldIntoCurrentSlots = true;
};

// The same scenario passes with the production protocol (so the failures below are the
// policies', not the scenario's).
TEST(CrashDPTree, PolicyScenarioPassesWithProtocol) {
  for (pm::Mode mode : {pm::Mode::adr, pm::Mode::eadr}) {
    const ExploreReport r = explore_policy<dptree::Protocol>(mode, "dptree.protocol");
    crash_kit::expect_explored(r, policy_options(mode, "dptree.protocol"));
  }
}

TEST(CrashDPTree, CatchesFlipBeforeMetadata) {
  for (pm::Mode mode : {pm::Mode::adr, pm::Mode::eadr}) {
    const ExploreReport r = explore_policy<FlipBeforeMeta>(mode, "dptree.flip_first");
    EXPECT_FALSE(r.ok()) << "the crash suite missed a flip before M3 (" << pm::to_string(mode) << ")";
  }
}

TEST(CrashDPTree, CatchesSkippedMetadataOfUnchangedLeaves) {
  const ExploreReport r = explore_policy<SkipUnchangedMeta>(pm::Mode::adr, "dptree.skip_meta");
  EXPECT_FALSE(r.ok()) << "the crash suite missed stale meta[nv] of unchanged leaves";
}

// Sparse leaves folding into their left neighbours (M1b): the shared sparse-merge script
// (ascending inserts, every other key removed, then every fourth) over 8-slot leaves; every
// image of every merge checked, and some merge must have folded a leaf.
void run_folds(pm::Mode mode) {
  Options o;
  o.kind = "dptree";
  o.node_size = static_cast<std::uint32_t>(dptree::leaf_bytes(8));
  o.pool_size = 256 * 1024;
  o.persistence = mode;
  hybrid_test::ScriptedScenario sc(o, 4 * 8 + 1, hybrid_test::sparse_merge_script(8));
  crash_kit::SmoTally tally(dp_levels);
  sc.set_observer(tally.observer());
  hybrid_test::run_scripted(sc, "dptree.folds." + std::string(pm::to_string(mode)), mode,
                            {.splits = true, .removals = true, .smos = {"folded+"}}, {}, &tally);
}

TEST(CrashDPTree, SparseFoldsAdr) { run_folds(pm::Mode::adr); }
TEST(CrashDPTree, SparseFoldsEadr) { run_folds(pm::Mode::eadr); }

// The known-bad fold (into slots the current version still holds) must be caught in both
// modes: a crash before the flip shows the overwritten slots in the current version. The same
// scenario passes with the production protocol.
TEST(CrashDPTree, CatchesFoldIntoCurrentSlots) {
  for (pm::Mode mode : {pm::Mode::adr, pm::Mode::eadr}) {
    const ExploreReport good = explore_policy<dptree::Protocol>(
        mode, "dptree.fold_protocol", hybrid_test::sparse_merge_script(8));
    crash_kit::expect_explored(good, policy_options(mode, "dptree.fold_protocol"));
    const ExploreReport r = explore_policy<FoldIntoCurrentSlots>(
        mode, "dptree.fold_current", hybrid_test::sparse_merge_script(8));
    EXPECT_FALSE(r.ok()) << "the crash suite missed a fold into current slots ("
                         << pm::to_string(mode) << ")";
  }
}

// Leaves emptied and unlinked by merges (and the chain's last leaf taking bound ~0): fill,
// drain, refill, every image of every merge checked against the oracle.
TEST(CrashDPTree, DrainScripted) {
  for (pm::Mode mode : {pm::Mode::adr, pm::Mode::eadr}) {
    Options o;
    o.kind = "dptree";
    o.node_size = static_cast<std::uint32_t>(dptree::leaf_bytes(8));
    o.pool_size = 256 * 1024;
    o.persistence = mode;
    std::vector<WorkOp> script;
    for (std::uint64_t k = 1; k <= 32; ++k) script.push_back({OpKind::insert, k, k * 11});
    for (std::uint64_t k = 1; k <= 32; ++k) script.push_back({OpKind::remove, k, 0});
    for (std::uint64_t k = 1; k <= 16; ++k) script.push_back({OpKind::upsert, k * 2, k});
    hybrid_test::ScriptedScenario sc(o, 40, script);
    hybrid_test::run_scripted(sc, "dptree.drain." + std::string(pm::to_string(mode)), mode,
                              {.splits = true, .removals = true});
  }
}

// The driver catches a planted loss: the first log record's validity word broken in every
// image (acknowledged buffered writes vanish).
TEST(CrashDPTree, DriverCatchesLostLogRecords) {
  Options o;
  o.kind = "dptree";
  o.node_size = static_cast<std::uint32_t>(dptree::leaf_bytes(8));
  hybrid_test::expect_driver_catches(
      o, 40,
      [](std::span<char> image) {
        const std::uint64_t page =
            hybrid_test::head_leaf(image, offsetof(dptree::Root, log_head), 4096);
        if (page != 0) image[page + 64 + 56] ^= 1;
      },
      "dptree.tampered");
}

// The full pool's partial merge (PROTOCOL.md P1-P5) under crash images: a large buffer (no
// merge runs by itself) of inserts, updates and removes over 8-slot leaves, then the partial
// merge run directly: puts that find no free slot are carried and re-logged above the new
// `covered`, the log trimmed to them. Images in P2's re-log, P3's slot writes, the flip and P5
// must recover the oracle's contents (the records are acknowledged before the merge starts).
template <class Policy>
class PartialMergeScenario final : public Scenario {
 public:
  explicit PartialMergeScenario(pm::Mode mode) : mode_(mode) {
    entry_ = IndexRegistry::find("dptree");
    options_.kind = "dptree";
    options_.node_size = static_cast<std::uint32_t>(dptree::leaf_bytes(8));
    options_.persistence = mode;
    // Round 1 fills leaves (a full merge), round 2 buffers more than their free slots hold.
    for (int round = 0; round < 3; ++round) {
      for (std::uint64_t k = 0; k < 48; ++k) {
        const std::uint64_t key = (k * 37 + static_cast<std::uint64_t>(round) * 11) % 96;
        const OpKind kind = round == 2 && k % 3 == 0 ? OpKind::remove : OpKind::upsert;
        steps_.push_back({0, {kind, key, key * 10 + static_cast<std::uint64_t>(round)}});
      }
      steps_.push_back({round == 0 ? 2 : 1, {}});
    }
  }
  Result<Region> setup() override {
    index_.reset();
    oracle_.clear();
    pm::PoolOptions po;
    po.size = 256 * 1024;
    po.mode = mode_;
    po.layout = entry_->layout(options_);
    auto pool = pm::Pool::create(po);
    if (!pool.ok()) return pool.status();
    pool_ = std::move(pool).value();
    return Region{pool_->base(), pool_->size()};
  }
  std::size_t op_count() const override { return 1 + steps_.size(); }
  Status run_op(std::size_t i) override {
    if (i == 0) {
      dptree::Config config;
      config.min_buffer = 1000;  // merges only where the script says
      config.background = false;
      auto idx = dptree::DPTree<Policy>::create(std::move(pool_), options_, config);
      if (!idx.ok()) return idx.status();
      index_ = std::move(idx).value();
      return Status::Ok();
    }
    const Step& st = steps_[i - 1];
    auto* t = dynamic_cast<dptree::DPTree<Policy>*>(index_.get());
    if (st.merge == 0) {
      if (Status s = apply_checked(*index_, st.op, oracle_, 8); !s.ok()) return s;
    } else {
      const std::uint64_t before = t->merge_stats().relogged;
      const Code c = st.merge == 1 ? t->merge_partial_for_testing() : t->merge_for_testing();
      if (c != Code::ok) return Status(c, "merge refused");
      if (st.merge == 1 && t->merge_stats().relogged == before)
        return Status(Code::corrupted, "the partial merge carried nothing: the scenario is weak");
    }
    return index_->verify();
  }
  Status check_image(std::span<char> image, const CrashPoint& at, std::uint64_t) override {
    auto pool = pm::Pool::open_image(image.data(), image.size(), mode_, entry_->layout(options_),
                                     "crash image");
    if (!pool.ok()) return pool.status();
    auto rec = entry_->recover(std::move(pool).value(), options_);
    if (!rec.ok()) return Status(rec.status().code(), "recovery failed: " + rec.status().message());
    if (Status s = (*rec)->verify(); !s.ok()) return s;
    std::optional<Oracle> after;
    if (!at.completed && at.op > 0 && steps_[at.op - 1].merge == 0) {
      after = oracle_;
      apply_to_oracle(steps_[at.op - 1].op, *after);
    }
    return match_contents(**rec, 96, oracle_, after ? &*after : nullptr, nullptr);
  }
  void teardown() override {
    index_.reset();
    pool_.reset();
  }

 private:
  struct Step {
    int merge = 0;  // 0: the op; 1: the partial merge; 2: a full merge
    WorkOp op;
  };
  pm::Mode mode_;
  Options options_;
  std::vector<Step> steps_;
  const IndexRegistry::Entry* entry_ = nullptr;
  std::unique_ptr<pm::Pool> pool_;
  std::unique_ptr<Index> index_;
  Oracle oracle_;
};

template <class Policy>
ExploreReport explore_partial(pm::Mode mode, const std::string& label) {
  PartialMergeScenario<Policy> sc(mode);
  return explore(sc, policy_options(mode, label));
}

struct SkipRelog : dptree::Protocol {
  static constexpr bool kSkipRelog = true;
};

TEST(CrashDPTree, PartialMergeRecovers) {
  for (pm::Mode mode : {pm::Mode::adr, pm::Mode::eadr}) {
    const std::string label = "dptree.partial." + std::string(pm::to_string(mode));
    const ExploreReport r = explore_partial<dptree::Protocol>(mode, label);
    crash_kit::expect_explored(r, policy_options(mode, label));
  }
}

TEST(CrashDPTree, CatchesPartialMergeWithoutRelog) {
  const ExploreReport r = explore_partial<SkipRelog>(pm::Mode::adr, "dptree.skip_relog");
  EXPECT_FALSE(r.ok()) << "the crash suite missed carried records that were not re-logged";
}

}  // namespace
}  // namespace pmindex::crash

// Crash / kill test scaffolding shared by the hybrid (DRAM-inner / PM-leaf) indexes' tests
// (LB+-Tree, FPTree; any index in the IndexRegistry works):
//  * run_registry_crash: the generic registry driver (random insert/update/upsert/remove mix
//    over a small key space) under the crash simulator, sized by PMINDEX_CRASH_IMAGES; the
//    kit's expect_explored checks the SMOs the run names (seen on the live index while it was
//    explored) and, when it crashes inside recovery, that nested images were checked.
//  * ScriptedScenario + run_scripted: a designed op list (optionally after a bulk load) that
//    walks an index's persistence paths in order; every image is recovered through the
//    registry, verify()ed, compared with the oracle (completed ops present, the op in flight
//    all or nothing), operated on further and checked again. It counts the ops that grew
//    (leaf splits) and shrank (leaf removals) the PM footprint, so a test can insist that its
//    script reached those paths.
//  * expect_driver_catches: the driver must fail on an image that a tamper function damages.
//  * run_kill: the kill -9 harness on a /dev/shm pool (PMINDEX_KILL_CYCLES).
//  * expect_kill_catches: the kill harness must fail on a pool file a tamper function damages.
//  * forget_root: a tamper every index's checkers must catch (the pool's root forgotten).
// Replay any crash failure with PMINDEX_CRASH_REPLAY='<printed token>'.
//
// Thread safety: test code, single-threaded.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <iostream>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "crash/workload.h"
#include "index/common/chain_tag.h"
#include "pmindex/crash/explorer.h"
#include "pmindex/crash/index_driver.h"
#include "pmindex/crash/kill_harness.h"
#include "pmindex/index.h"
#include "pmindex/pm/layout.h"
#include "support/temp_dir.h"
#include "index/common/crash_kit.h"

namespace pmindex::crash::hybrid_test {

struct RegistryCrashRun {
  Options options;                     // kind, node_size, key_type, max_key_size
  std::size_t pool_size = 256 * 1024;  // the run's anonymous pool (<= 1 MiB: cheap images)
  std::uint64_t key_space = 24;
  pm::Mode mode = pm::Mode::adr;
  std::size_t min_ops = 0;             // at least this many (so leaves split and empty)
  std::size_t recovery_crash_images = 0;
  std::string label;                   // replay label, e.g. "lbtree256.adr"
  // SMOs the run must have made (crash_kit::SmoTally names over `probe`'s levels), e.g.
  // {"pm_bytes+"}: leaves split while the crash points were explored.
  std::vector<std::string> smos;
  crash_kit::SmoTally::Probe probe = crash_kit::footprint_levels;
};

// At least `min_ops`, more for a larger image budget (the long suite), so that eADR, with
// fewer distinct images per op, still reaches the budget.
inline void run_registry_crash(const RegistryCrashRun& run) {
  IndexCrashConfig cfg;
  cfg.options = run.options;
  cfg.pool_size = run.pool_size;
  cfg.key_space = run.key_space;
  cfg.recovery_crash_images = run.recovery_crash_images;
  const ExploreOptions opt = ExploreOptions::from_env(run.label, run.mode);
  cfg.ops = std::max(run.min_ops, default_crash_ops(opt.images_budget));
  const crash_kit::SmoTally tally(run.probe);
  cfg.observe = tally.observer();
  const ExploreReport r = run_index_crash(cfg, opt);
  if (r.replay_skipped) GTEST_SKIP() << "PMINDEX_CRASH_REPLAY names another configuration";
  crash_kit::expect_explored(
      r, opt, {.recovery_crashes = run.recovery_crash_images > 0, .smos = run.smos}, &tally);
}

// The driver must catch a loss that `tamper` causes in every image.
inline void expect_driver_catches(const Options& options, std::size_t ops,
                                  std::function<void(std::span<char>)> tamper,
                                  const std::string& label) {
  IndexCrashConfig cfg;
  cfg.options = options;
  cfg.ops = ops;
  cfg.tamper_image = std::move(tamper);
  ExploreOptions opt;
  opt.label = label;
  opt.images_budget = 200;
  EXPECT_FALSE(run_index_crash(cfg, opt).ok());
}

// A designed op list. Op 0 creates the index; with bulk keys, op 1 bulk-loads them (value of
// key k: k * 7); then the script.
class ScriptedScenario final : public Scenario {
 public:
  ScriptedScenario(Options options, std::uint64_t key_space, std::vector<WorkOp> script,
                   std::vector<std::uint64_t> bulk_keys = {}, double bulk_fill = 0.7)
      : options_(std::move(options)), key_space_(key_space), ops_(std::move(script)),
        bulk_keys_(std::move(bulk_keys)), bulk_fill_(bulk_fill) {
    entry_ = IndexRegistry::find(options_.kind);
  }

  Result<Region> setup() override {
    index_.reset();
    pool_.reset();
    oracle_.clear();
    pm::PoolOptions po;
    po.size = options_.pool_size;
    po.mode = options_.persistence;
    po.layout = entry_->layout(options_);
    auto pool = pm::Pool::create(po);
    if (!pool.ok()) return pool.status();
    pool_ = std::move(pool).value();
    return Region{pool_->base(), pool_->size()};
  }

  std::size_t op_count() const override { return first_script_op() + ops_.size(); }

  Status run_op(std::size_t i) override {
    if (i == 0) {
      auto idx = entry_->create(std::move(pool_), options_);
      if (!idx.ok()) return idx.status();
      index_ = std::move(idx).value();
      if (prepare_) prepare_(*index_);
      if (observe_) observe_(*index_, 0);
      return index_->verify();
    }
    const std::uint64_t before = index_->footprint().pm_bytes;
    if (is_bulk(i)) {
      std::vector<std::string> keys, values;
      for (std::uint64_t k : bulk_keys_) {
        keys.push_back(encode_u64(k));
        values.push_back(encode_u64(k * 7));
      }
      std::vector<KeyValue> kvs;
      for (std::size_t j = 0; j < keys.size(); ++j) kvs.push_back({keys[j], values[j]});
      if (Status s = index_->bulk_load(kvs, bulk_fill_); !s.ok()) return s;
      apply_bulk(oracle_);
    } else if (Status s = apply_checked(*index_, ops_[i - first_script_op()], oracle_, 8);
               !s.ok()) {
      return s;
    }
    // verify() first: on a quiescent index it also frees what epochs retired (a removed
    // leaf's block), so the footprint below shows the removal.
    Status verified = index_->verify();
    const std::uint64_t after = index_->footprint().pm_bytes;
    if (after > before && !is_bulk(i)) ++splits_;
    if (after < before) ++removals_;
    if (observe_) observe_(*index_, i);
    return verified;
  }
  // Called with the live index after every op (crash_kit::SmoTally::observer()).
  void set_observer(std::function<void(const Index&, std::size_t)> observe) {
    observe_ = std::move(observe);
  }

  // Called with the live index right after it is created, before the script runs (a test-only
  // fault of a known-bad variant); recovered images do not get it.
  void set_prepare(std::function<void(Index&)> prepare) { prepare_ = std::move(prepare); }

  // Start-now recovery: each recovered image is queried (the oracle comparison) before the
  // first verify(), so lookups and scans run before a deferred recovery walk; `recovered` is
  // called with the index right after recovery (it may check the walk has not run yet).
  void set_query_before_verify(std::function<Status(Index&)> recovered) {
    query_first_ = true;
    recovered_ = std::move(recovered);
  }

  Status check_image(std::span<char> image, const CrashPoint& at, std::uint64_t salt) override {
    auto pool = pm::Pool::open_image(image.data(), image.size(), options_.persistence,
                                     entry_->layout(options_), "crash image");
    if (!pool.ok())
      return Status(pool.status().code(), "image does not open: " + pool.status().message());
    auto rec = entry_->recover(std::move(pool).value(), options_);
    if (!rec.ok()) return Status(rec.status().code(), "recovery failed: " + rec.status().message());
    std::unique_ptr<Index> idx = std::move(rec).value();
    if (recovered_) {
      if (Status s = recovered_(*idx); !s.ok()) return s;
    }
    if (Status s = query_first_ ? Status::Ok() : idx->verify(); !s.ok())
      return Status(s.code(), "verify after recovery: " + s.message());
    std::optional<Oracle> after;
    if (!at.completed && at.op > 0) {
      after = oracle_;
      if (is_bulk(at.op)) {
        apply_bulk(*after);
      } else {
        apply_to_oracle(ops_[at.op - first_script_op()], *after);
      }
    }
    Oracle state;
    if (Status s = match_contents(*idx, key_space_, oracle_, after ? &*after : nullptr, &state);
        !s.ok())
      return Status(s.code(), (query_first_ ? "queried before verify: " : "") + s.message());
    if (Status s = query_first_ ? idx->verify() : Status::Ok(); !s.ok())
      return Status(s.code(), "verify after the queries: " + s.message());
    const std::vector<WorkOp> more = make_workload(salt, 6, key_space_);
    for (std::size_t k = 0; k < more.size(); ++k)
      if (Status s = apply_checked(*idx, more[k], state, 8); !s.ok())
        return Status(s.code(), "after recovery, op " + std::to_string(k) + ": " + s.message());
    if (Status s = idx->verify(); !s.ok())
      return Status(s.code(), "verify after more ops: " + s.message());
    return match_contents(*idx, key_space_, state, nullptr, nullptr);
  }

  void teardown() override {
    index_.reset();
    pool_.reset();
  }

  std::size_t splits() const { return splits_; }
  std::size_t removals() const { return removals_; }

 private:
  std::size_t first_script_op() const { return bulk_keys_.empty() ? 1 : 2; }
  bool is_bulk(std::size_t i) const { return !bulk_keys_.empty() && i == 1; }
  void apply_bulk(Oracle& o) const {
    for (std::uint64_t k : bulk_keys_) o[encode_u64(k)] = encode_u64(k * 7);
  }

  Options options_;
  std::uint64_t key_space_;
  std::vector<WorkOp> ops_;
  std::vector<std::uint64_t> bulk_keys_;
  double bulk_fill_;
  const IndexRegistry::Entry* entry_ = nullptr;
  std::unique_ptr<pm::Pool> pool_;
  std::unique_ptr<Index> index_;
  Oracle oracle_;
  std::size_t splits_ = 0, removals_ = 0;
  std::function<void(const Index&, std::size_t)> observe_;
  std::function<void(Index&)> prepare_;
  bool query_first_ = false;
  std::function<Status(Index&)> recovered_;
};

struct ScriptedExpect {
  bool splits = true;
  bool removals = true;
  std::size_t min_crash_points = 0;
  std::vector<std::string> smos = {};  // SMOs the script must run (with a SmoTally observing it)
};

// A script that makes sparse leaves merge (LB+-Tree J1-J6, FPTree J1-J7): 4s ascending
// inserts leave leaves about half full (a split keeps the lower half and the next keys go
// right); removing every other key leaves each at about a quarter, at or below the merge
// trigger, so its left neighbour (already thinned or merged) takes its entries when they fit;
// removing every fourth key thins the merged leaves further (more merges, and empty-leaf
// unlinks); a scan ends it.
inline std::vector<WorkOp> sparse_merge_script(std::uint64_t s) {
  std::vector<WorkOp> ops;
  std::uint64_t v = 1000;
  for (std::uint64_t k = 1; k <= 4 * s; ++k) ops.push_back({OpKind::insert, k, ++v});
  for (std::uint64_t k = 1; k <= 4 * s; k += 2) ops.push_back({OpKind::remove, k, 0});
  for (std::uint64_t k = 4; k <= 4 * s; k += 4) ops.push_back({OpKind::remove, k, 0});
  ops.push_back({OpKind::scan, 1, 0});
  return ops;
}

// Explores `scenario`; images_budget 0 means every crash point and candidate image.
inline void run_scripted(ScriptedScenario& scenario, const std::string& label, pm::Mode mode,
                         ScriptedExpect expect, std::optional<std::size_t> images_budget = {},
                         const crash_kit::SmoTally* tally = nullptr) {
  ExploreOptions opt = ExploreOptions::from_env(label, mode);
  if (images_budget) opt.images_budget = *images_budget;
  const ExploreReport r = explore(scenario, opt);
  std::cout << label << ": " << scenario.splits() << " splits, " << scenario.removals()
            << " leaf removals over the runs\n";
  if (r.replay_skipped) GTEST_SKIP() << "PMINDEX_CRASH_REPLAY names another configuration";
  crash_kit::expect_explored(
      r, opt,
      {.min_crash_points = std::max<std::size_t>(1, expect.min_crash_points), .smos = expect.smos},
      tally);
  if (!opt.replay) {
    if (expect.splits) { EXPECT_GT(scenario.splits(), 0u); }
    if (expect.removals) { EXPECT_GT(scenario.removals(), 0u); }
  }
}

// A known-bad variant's scripted run (the fault set by the scenario's prepare hook) must fail
// the crash suite: explores until the first failure and expects one. The images are sampled,
// and CI's seed changes with every revision, so a fault with a narrow window may be missed by
// one seed's budget (apex's switch in UNDO was, once in CI: caught after 2,178 images): a run
// that catches nothing is followed by up to kMaxExtraSeeds more, the seed sequence continued,
// and the fault must be caught by one of them (the cost is paid only when the first misses).
inline void expect_scripted_caught(ScriptedScenario& scenario, const std::string& label,
                                   pm::Mode mode, const char* what) {
  constexpr std::uint64_t kMaxExtraSeeds = 3;
  ExploreOptions opt = ExploreOptions::from_env(label, mode);
  opt.max_failures = 1;  // one caught loss is the point; stop there
  const std::uint64_t first_seed = opt.seed;
  for (std::uint64_t extra = 0;; ++extra) {
    opt.seed = first_seed + extra;
    const ExploreReport r = explore(scenario, opt);
    std::cout << opt.label << " (seed " << opt.seed << "): " << r.to_string() << "\n";
    if (r.replay_skipped) GTEST_SKIP() << "PMINDEX_CRASH_REPLAY names another configuration";
    if (!r.ok()) return;
    if (opt.replay || extra == kMaxExtraSeeds) {
      ADD_FAILURE() << "the crash suite did not catch " << what << " (seeds " << first_seed
                    << ".." << opt.seed << ")";
      return;
    }
  }
}

// The kill -9 harness: a /dev/shm pool of 1 MiB, PMINDEX_KILL_CYCLES cycles (30 by default).
inline void run_kill(const std::string& kind, std::uint32_t node_size, pm::Mode mode,
                     const std::string& label, std::uint64_t key_space = 200,
                     const PacTreeOptions& pactree = {}) {
  pmindex::testing::TempDir dir;
  KillConfig cfg = KillConfig::from_env(30);
  cfg.options.kind = kind;
  cfg.options.pactree = pactree;
  cfg.options.node_size = node_size;
  cfg.options.path = dir.file("kill.pool");
  cfg.options.pool_size = 1 << 20;
  cfg.options.persistence = mode;
  cfg.key_space = key_space;
  const KillReport r = run_kill_cycles(cfg);
  std::cout << label << " seed " << cfg.seed << ": " << r.to_string() << "\n";
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_EQ(r.cycles, cfg.cycles);
}

// A known-bad tamper for any index: the pool forgets its root. Format v2 refuses a bare root
// word of 0, so this forges a consistent "creation never published a root" state (both header
// copies checksummed): recovery then builds an empty index, which loses acknowledged records.
inline void forget_root(std::span<char> image) {
  pm::HeaderState st{};
  if (image.size() < pm::kHeaderSize || !pm::image_state(image.data(), &st)) return;
  st.root = 0;
  st.flags = pm::kStateBuilding;
  pm::set_image_state(image.data(), st);
}

// The offset of the head leaf in a crash image or pool file: the index root's word at
// `head_field` (0 when the root or a `leaf_bytes` leaf there would leave the image). For the
// known-bad tampers below.
inline std::uint64_t head_leaf(std::span<const char> image, std::size_t head_field,
                               std::size_t leaf_bytes) {
  std::uint64_t root = 0, head = 0;
  if (image.size() < pm::kHeaderSize) return 0;
  root = pm::image_root(image.data());
  if (root == 0 || root + head_field + 8 > image.size()) return 0;
  std::memcpy(&head, image.data() + root + head_field, 8);
  head = index_common::link_off(head);  // fptree and nbtree links carry a tag (chain_tag.h)
  return head == 0 || head + leaf_bytes > image.size() ? 0 : head;
}

// Both checkers must catch the loss `tamper` causes: the crash driver in every image, and the
// kill harness in the pool file after each kill.
inline void expect_checkers_catch(const Options& options,
                                  const std::function<void(std::span<char>)>& tamper,
                                  const std::string& label);

// The kill harness must catch a loss that `tamper` (an image tamper, as for
// expect_driver_catches) causes in the pool file after each kill, before the reopen.
inline void expect_kill_catches(Options options, std::function<void(std::span<char>)> tamper,
                                const std::string& label) {
  pmindex::testing::TempDir dir;
  KillConfig cfg;
  cfg.options = std::move(options);
  cfg.options.path = dir.file("kill.pool");
  cfg.options.pool_size = 1 << 20;
  cfg.cycles = 8;
  cfg.tamper_pool = [tamper = std::move(tamper)](const std::string& path) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good()) << path;
    std::vector<char> image((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    tamper(image);
    f.seekp(0);
    f.write(image.data(), static_cast<std::streamsize>(image.size()));
  };
  const KillReport r = run_kill_cycles(cfg);
  std::cout << label << ": " << r.to_string() << "\n";
  ASSERT_FALSE(r.ok()) << label << ": the harness missed the planted loss";
  std::cout << "[caught] " << r.failures.front().substr(0, 300) << "\n";
}

inline void expect_checkers_catch(const Options& options,
                                  const std::function<void(std::span<char>)>& tamper,
                                  const std::string& label) {
  expect_driver_catches(options, 40, tamper, label + ".tampered");
  expect_kill_catches(options, tamper, label + ".kill.tampered");
}

}  // namespace pmindex::crash::hybrid_test

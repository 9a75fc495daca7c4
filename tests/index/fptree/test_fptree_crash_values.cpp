// FPTree out-of-line values and bulk load under the crash simulator, ADR and eADR.
//  * CrashFPTreeValues.Driver*: the generic registry driver with max_value_size = 64, so every
//    (8-byte) value of its workload is a PM record: K1 before the slot's NAW, K3 after an
//    update's switch (U5) and after a delete, records reachable through splits.
//  * CrashFPTreeValues.Scenario*: a bulk load (op 1, B1-B4) of values of 0..100 bytes, then a
//    seeded mix of inserts / updates / removes with values of every length class (0, short,
//    8, 9, long) over 20 keys, 8-entry leaves so splits and leaf removals happen. Each image:
//    recover, verify() (which also checks every value record and that the reachable bytes
//    equal the allocator's: a leaked or doubly-owned record fails it), compare with the
//    oracle (the op in flight all or nothing; a bulk load in flight: empty or complete), run
//    more operations, verify and compare again.
// Sized by PMINDEX_CRASH_IMAGES (about 1,000 per mode in CI, 10,000 in `long`).
// Replay: PMINDEX_CRASH_REPLAY='<printed token>' ./test_fptree_crash_values
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <optional>
#include <random>

#include "crash/workload.h"
#include "index/fptree/fptree.h"
#include "pmindex/crash/explorer.h"
#include "pmindex/crash/index_driver.h"
#include "index/common/crash_kit.h"

namespace pmindex::crash {
namespace {

constexpr std::uint32_t kLeaf8 = sizeof(fptree::Leaf<8>);

void run_driver(pm::Mode mode) {
  IndexCrashConfig cfg;
  cfg.options.kind = "fptree";
  cfg.options.node_size = kLeaf8;
  cfg.options.max_value_size = 64;
  cfg.key_space = 40;
  const std::string label = "fptree8values." + std::string(pm::to_string(mode));
  const ExploreOptions opt = ExploreOptions::from_env(label, mode);
  cfg.ops = std::max<std::size_t>(200, default_crash_ops(opt.images_budget));
  const ExploreReport r = run_index_crash(cfg, opt);
  if (r.replay_skipped) GTEST_SKIP() << "PMINDEX_CRASH_REPLAY names another configuration";
  crash_kit::expect_explored(r, opt);
}

TEST(CrashFPTreeValues, DriverAdr) { run_driver(pm::Mode::adr); }
TEST(CrashFPTreeValues, DriverEadr) { run_driver(pm::Mode::eadr); }

enum class Kind { bulk, insert, update, remove };
struct ValueOp {
  Kind kind;
  std::uint64_t key;
  std::string value;
};

std::string make_value(std::mt19937_64& rng) {
  static constexpr std::size_t kLengths[] = {0, 1, 7, 8, 9, 31, 64, 100};
  std::string v(kLengths[rng() % std::size(kLengths)], '\0');
  for (char& c : v) c = static_cast<char>(rng());
  return v;
}

class ValuesScenario final : public Scenario {
 public:
  ValuesScenario(pm::Mode mode, std::uint64_t seed, std::size_t n_ops) : mode_(mode) {
    options_.kind = "fptree";
    options_.node_size = kLeaf8;
    options_.persistence = mode;
    options_.pool_size = 512 * 1024;
    options_.max_value_size = 100;
    entry_ = IndexRegistry::find("fptree");
    std::mt19937_64 rng(seed);
    for (std::uint64_t k = 2; k <= kKeySpace; k += 2) bulk_.emplace_back(encode_u64(k), make_value(rng));
    ops_.push_back({Kind::bulk, 0, {}});
    for (std::size_t i = 0; i < n_ops; ++i) {
      const auto kind = static_cast<Kind>(1 + rng() % 3);
      ops_.push_back({kind, 1 + rng() % kKeySpace, make_value(rng)});
    }
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
    if (Status s = apply(index_.get(), ops_[i - 1], oracle_); !s.ok()) return s;
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
      (void)apply(nullptr, ops_[at.op - 1], *after);
    }
    Oracle state;
    if (Status s = match_contents(*idx, kKeySpace, oracle_, after ? &*after : nullptr, &state); !s.ok())
      return s;
    if (at.op == 1) ++(state.empty() ? empty_images_ : full_images_);  // the bulk load
    std::mt19937_64 rng(salt);
    for (int j = 0; j < 6; ++j) {
      const ValueOp op{static_cast<Kind>(1 + rng() % 3), 1 + rng() % kKeySpace, make_value(rng)};
      if (Status s = apply(idx.get(), op, state); !s.ok())
        return Status(s.code(), "after recovery: " + s.message());
    }
    if (Status s = idx->verify(); !s.ok()) return Status(s.code(), "verify after more ops: " + s.message());
    return match_contents(*idx, kKeySpace, state, nullptr, nullptr);
  }

  void teardown() override {
    index_.reset();
    pool_.reset();
  }
  std::size_t empty_images_ = 0, full_images_ = 0;  // images of op 1 (the bulk load)

 private:
  static constexpr std::uint64_t kKeySpace = 20;

  // Runs op on idx (if given), checks its result code against the oracle, updates the oracle.
  Status apply(Index* idx, const ValueOp& op, Oracle& o) const {
    const std::string k = encode_u64(op.key);
    const bool present = o.count(k) != 0;
    Code want = Code::ok, got = Code::ok;
    switch (op.kind) {
      case Kind::bulk: {
        std::vector<KeyValue> kvs;
        for (const auto& [bk, bv] : bulk_) kvs.push_back({bk, bv});
        if (idx != nullptr) {
          if (Status s = idx->bulk_load(kvs, 0.6); !s.ok()) return s;
        }
        for (const auto& [bk, bv] : bulk_) o[bk] = bv;
        return Status::Ok();
      }
      case Kind::insert:
        want = present ? Code::already_present : Code::ok;
        if (idx != nullptr) got = idx->insert(k, op.value);
        if (!present) o[k] = op.value;
        break;
      case Kind::update:
        want = present ? Code::ok : Code::not_found;
        if (idx != nullptr) got = idx->update(k, op.value);
        if (present) o[k] = op.value;
        break;
      case Kind::remove:
        want = present ? Code::ok : Code::not_found;
        if (idx != nullptr) got = idx->remove(k);
        o.erase(k);
        break;
    }
    if (idx != nullptr && got != want)
      return Status(Code::corrupted, "op on key " + std::to_string(op.key) + " returned " +
                                         std::string(to_string(got)));
    return Status::Ok();
  }

  pm::Mode mode_;
  Options options_;
  const IndexRegistry::Entry* entry_ = nullptr;
  std::vector<std::pair<std::string, std::string>> bulk_;
  std::vector<ValueOp> ops_;
  std::unique_ptr<pm::Pool> pool_;
  std::unique_ptr<Index> index_;
  Oracle oracle_;
};

void run_scenario(pm::Mode mode) {
  const std::string label = "fptree_values_bulk." + std::string(pm::to_string(mode));
  const ExploreOptions opt = ExploreOptions::from_env(label, mode);
  ValuesScenario scenario(mode, opt.seed, std::max<std::size_t>(60, opt.images_budget / 6));
  const ExploreReport r = explore(scenario, opt);
  if (r.replay_skipped) GTEST_SKIP() << "PMINDEX_CRASH_REPLAY names another configuration";
  crash_kit::expect_explored(r, opt);
}

TEST(CrashFPTreeValues, ScenarioAdr) { run_scenario(pm::Mode::adr); }
TEST(CrashFPTreeValues, ScenarioEadr) { run_scenario(pm::Mode::eadr); }

// Every crash point of a bulk load alone (no budget): each image holds the empty tree or the
// whole load, never a part (match_contents accepts only those two states for op 1).
void run_bulk_only(pm::Mode mode) {
  const std::string label = "fptree_bulk_only." + std::string(pm::to_string(mode));
  ExploreOptions opt = ExploreOptions::from_env(label, mode);
  ValuesScenario scenario(mode, opt.seed, 0);
  opt.images_budget = 0;  // every crash point
  const ExploreReport r = explore(scenario, opt);
  if (r.replay_skipped) GTEST_SKIP() << "PMINDEX_CRASH_REPLAY names another configuration";
  crash_kit::expect_explored(r, opt);  // no violation, every crash point's image checked
  std::cout << label << ": " << scenario.empty_images_ << " empty, " << scenario.full_images_
            << " complete\n";
  if (!opt.replay) {
    EXPECT_GT(scenario.empty_images_, 0u);
    EXPECT_GT(scenario.full_images_, 0u);
  }
}

TEST(CrashFPTreeBulk, EveryPointEmptyOrCompleteAdr) { run_bulk_only(pm::Mode::adr); }
TEST(CrashFPTreeBulk, EveryPointEmptyOrCompleteEadr) { run_bulk_only(pm::Mode::eadr); }

}  // namespace
}  // namespace pmindex::crash

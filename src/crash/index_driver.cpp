// The generic index crash driver (include/pmindex/crash/index_driver.h).
#include "pmindex/crash/index_driver.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "crash/workload.h"

namespace pmindex::crash {

namespace {

class IndexScenario final : public Scenario {
 public:
  IndexScenario(const IndexCrashConfig& cfg, const ExploreOptions& opt)
      : cfg_(cfg), mode_(opt.mode), seed_(opt.seed) {
    options_ = cfg.options;
    options_.persistence = opt.mode;
    options_.pool_size = cfg.pool_size;
    options_.path.clear();
    entry_ = IndexRegistry::find(options_.kind);
    const std::size_t n = cfg.ops != 0 ? cfg.ops : default_crash_ops(opt.images_budget);
    ops_ = make_workload(seed_, n, cfg.key_space);
  }

  Result<Region> setup() override {
    index_.reset();
    pool_.reset();
    oracle_.clear();
    if (entry_ == nullptr)
      return Status(Code::invalid_argument, "unknown index kind '" + options_.kind + "'");
    pm::PoolOptions po;
    po.size = cfg_.pool_size;
    po.mode = mode_;
    po.layout = entry_->layout(options_);
    auto pool = pm::Pool::create(po);
    if (!pool.ok()) return pool.status();
    pool_ = std::move(pool).value();
    return Region{pool_->base(), pool_->size()};
  }

  // Op 0 creates the index (so a crash inside create is explored); ops 1..n run the workload.
  std::size_t op_count() const override { return ops_.size() + 1; }

  Status run_op(std::size_t i) override {
    if (i == 0) {
      auto idx = entry_->create(std::move(pool_), options_);
      if (!idx.ok()) return idx.status();
      index_ = std::move(idx).value();
      return index_->verify();
    }
    const WorkOp& op = ops_[i - 1];
    if (Status s = apply_checked(*index_, op, oracle_, cfg_.scan_length); !s.ok()) return s;
    return index_->verify();
  }

  Status check_image(std::span<char> image, const CrashPoint& at, std::uint64_t salt) override {
    if (cfg_.tamper_image) cfg_.tamper_image(image);
    auto pool = pm::Pool::open_image(image.data(), image.size(), mode_, entry_->layout(options_),
                                     "crash image");
    if (!pool.ok()) return Status(pool.status().code(), "image does not open: " +
                                                            pool.status().message());
    auto rec = entry_->recover(std::move(pool).value(), options_);
    if (!rec.ok()) return Status(rec.status().code(), "recovery failed: " + rec.status().message());
    std::unique_ptr<Index> idx = std::move(rec).value();
    if (Status s = idx->verify(); !s.ok())
      return Status(s.code(), "verify after recovery: " + s.message());

    // Acceptable states: completed ops only, or also the op in flight.
    const Oracle& before = oracle_;
    std::optional<Oracle> after;
    if (!at.completed && at.op > 0) {
      after = before;
      apply_to_oracle(ops_[at.op - 1], *after);
    }
    Oracle state;
    if (Status s = match_contents(*idx, cfg_.key_space, before, after ? &*after : nullptr, &state);
        !s.ok()) {
      return s;
    }
    // Keep going on the recovered index: it must stay correct.
    const std::vector<WorkOp> more = make_workload(salt, cfg_.ops_after_recovery, cfg_.key_space);
    for (std::size_t k = 0; k < more.size(); ++k) {
      if (Status s = apply_checked(*idx, more[k], state, cfg_.scan_length); !s.ok())
        return Status(s.code(), "after recovery, op " + std::to_string(k) + ": " + s.message());
    }
    if (Status s = idx->verify(); !s.ok())
      return Status(s.code(), "verify after post-recovery ops: " + s.message());
    return match_contents(*idx, cfg_.key_space, state, nullptr, nullptr);
  }

  void teardown() override {
    index_.reset();
    pool_.reset();
  }

 private:
  IndexCrashConfig cfg_;
  Options options_;
  pm::Mode mode_;
  std::uint64_t seed_;
  const IndexRegistry::Entry* entry_ = nullptr;
  std::vector<WorkOp> ops_;
  std::unique_ptr<pm::Pool> pool_;
  std::unique_ptr<Index> index_;
  Oracle oracle_;
};

}  // namespace

std::size_t default_crash_ops(std::size_t images_budget) {
  // reflist yields about 3.5 distinct images per operation in adr mode (real indexes more,
  // and then the budget is sampled): enough operations to spend the budget, and a bounded run
  // when the budget is unlimited.
  if (images_budget == 0) return 400;
  return std::clamp<std::size_t>(images_budget / 3, 40, 4000);
}

ExploreReport run_index_crash(const IndexCrashConfig& config, const ExploreOptions& options) {
  IndexScenario scenario(config, options);
  return explore(scenario, options);
}

}  // namespace pmindex::crash

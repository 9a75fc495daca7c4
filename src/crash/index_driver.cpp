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
#include "pmindex/pm/image_bytes.h"

namespace pmindex::crash {

namespace {

// Where op 0 starts from: a fresh pool (op 0 = create), or a crash image (op 0 = recover;
// a crash during recovery is explored by a nested exploration of this scenario).
struct StartImage {
  const pm::ImageBytes* image = nullptr;
  const Oracle* before = nullptr;  // acceptable states of the image
  const Oracle* after = nullptr;   // nullptr: only `before`
};

class IndexScenario final : public Scenario {
 public:
  IndexScenario(const IndexCrashConfig& cfg, const ExploreOptions& opt, StartImage start = {})
      : cfg_(cfg), mode_(opt.mode), seed_(opt.seed), label_(opt.label), start_(start) {
    options_ = cfg.options;
    options_.persistence = opt.mode;
    options_.pool_size = cfg.pool_size;
    options_.path.clear();
    entry_ = IndexRegistry::find(options_.kind);
    const std::size_t n = start_.image != nullptr ? cfg.ops_after_recovery
                          : cfg.ops != 0          ? cfg.ops
                                                  : default_crash_ops(opt.images_budget);
    ops_ = make_workload(seed_, n, cfg.key_space);
    if (start_.image == nullptr && cfg.drain_from != 0 && cfg.key_space != 0) {
      // The drain takes the keys in a seeded random order, each once per key_space ops, so
      // every structure empties gradually and together.
      std::vector<std::uint64_t> order(cfg.key_space);
      for (std::uint64_t k = 0; k < cfg.key_space; ++k) order[k] = k + 1;
      std::mt19937_64 rng(seed_ ^ 0x647261696eull);
      std::shuffle(order.begin(), order.end(), rng);
      for (std::size_t i = 0; i < ops_.size(); ++i) {
        OpKind& k = ops_[i].kind;
        const bool write = k == OpKind::insert || k == OpKind::update || k == OpKind::upsert ||
                           k == OpKind::remove;
        if (write) k = i < cfg.drain_from ? OpKind::insert : OpKind::remove;
        if (i >= cfg.drain_from) ops_[i].key = order[(i - cfg.drain_from) % order.size()];
      }
    }
  }

  Result<Region> setup() override {
    index_.reset();
    pool_.reset();
    oracle_.clear();
    if (entry_ == nullptr)
      return Status(Code::invalid_argument, "unknown index kind '" + options_.kind + "'");
    if (start_.image != nullptr) {
      buffer_ = *start_.image;
      oracle_ = *start_.before;
      return Region{buffer_.data(), buffer_.size(), /*preloaded=*/true};
    }
    auto pool = create_run_pool(*entry_, options_, cfg_.pool_size, mode_);
    if (!pool.ok()) return pool.status();
    pool_ = std::move(pool).value();
    return Region{pool_->base(), pool_->size()};
  }

  // Op 0 creates the index (or recovers the start image), so a crash inside it is explored;
  // ops 1..n run the workload.
  std::size_t op_count() const override { return ops_.size() + 1; }

  Status run_op(std::size_t i) override {
    Status s = i == 0 ? (start_.image != nullptr ? recover_start() : create()) : Status::Ok();
    if (i > 0) {
      s = apply_checked(*index_, ops_[i - 1], oracle_, cfg_.scan_length);
      if (s.ok()) s = index_->verify();
    }
    if (s.ok() && cfg_.observe && start_.image == nullptr) cfg_.observe(*index_, i);
    return s;
  }

  Status check_image(std::span<char> image, const CrashPoint& at, std::uint64_t salt) override {
    if (cfg_.tamper_image) cfg_.tamper_image(image);
    // Acceptable states: completed ops only, or also the op in flight.
    Oracle before = oracle_;
    std::optional<Oracle> after;
    if (!at.completed && at.op > 0) {
      after = before;
      apply_to_oracle(ops_[at.op - 1], *after);
    } else if (!at.completed && start_.after != nullptr) {
      after = *start_.after;  // a crash inside recovery: the image's own alternatives
    }
    // A crash during this image's recovery is explored on a pristine copy (opt-in, sampled).
    pm::ImageBytes pristine;
    const bool nested = cfg_.recovery_crash_images > 0 && start_.image == nullptr &&
                        salt % std::max<std::size_t>(cfg_.recovery_crash_every, 1) == 0;
    if (nested) pristine.assign(image.begin(), image.end());

    Oracle state;
    if (Status s = check_recovered(image, before, after ? &*after : nullptr, salt, &state);
        !s.ok()) {
      return s;
    }
    if (nested) return explore_recovery_crash(pristine, before, after ? &*after : nullptr, salt);
    return Status::Ok();
  }

  void teardown() override {
    index_.reset();
    pool_.reset();
  }
  std::size_t inner_images_checked() const override { return inner_images_; }

 private:
  Status create() {
    auto idx = entry_->create(std::move(pool_), options_);
    if (!idx.ok()) return idx.status();
    index_ = std::move(idx).value();
    return index_->verify();
  }

  Status recover_start() {
    auto pool = pm::Pool::open_image(buffer_.data(), buffer_.size(), mode_,
                                     entry_->layout(options_), "crash image");
    if (!pool.ok()) return pool.status();
    auto idx = entry_->recover(std::move(pool).value(), options_);
    if (!idx.ok()) return idx.status();
    index_ = std::move(idx).value();
    if (Status s = index_->verify(); !s.ok()) return s;
    // From here on the oracle is whichever state this recovery chose.
    return match_contents(*index_, cfg_.key_space, *start_.before, start_.after, &oracle_);
  }

  // Recover `image`, verify, compare with before/after, keep operating, verify, compare.
  Status check_recovered(std::span<char> image, const Oracle& before, const Oracle* after,
                         std::uint64_t salt, Oracle* state) {
    auto pool = pm::Pool::open_image(image.data(), image.size(), mode_, entry_->layout(options_),
                                     "crash image");
    if (!pool.ok()) return Status(pool.status().code(), "image does not open: " +
                                                            pool.status().message());
    auto rec = entry_->recover(std::move(pool).value(), options_);
    if (!rec.ok()) return Status(rec.status().code(), "recovery failed: " + rec.status().message());
    std::unique_ptr<Index> idx = std::move(rec).value();
    if (Status s = idx->verify(); !s.ok())
      return Status(s.code(), "verify after recovery: " + s.message());
    if (Status s = match_contents(*idx, cfg_.key_space, before, after, state); !s.ok()) return s;
    // Keep going on the recovered index: it must stay correct.
    const std::vector<WorkOp> more = make_workload(salt, cfg_.ops_after_recovery, cfg_.key_space);
    for (std::size_t k = 0; k < more.size(); ++k) {
      if (Status s = apply_checked(*idx, more[k], *state, cfg_.scan_length); !s.ok())
        return Status(s.code(), "after recovery, op " + std::to_string(k) + ": " + s.message());
    }
    if (Status s = idx->verify(); !s.ok())
      return Status(s.code(), "verify after post-recovery ops: " + s.message());
    return match_contents(*idx, cfg_.key_space, *state, nullptr, nullptr);
  }

  // A nested exploration: the recovery of `image` (and a few operations after it) runs traced,
  // and crash images taken inside it are recovered and checked in turn.
  Status explore_recovery_crash(const pm::ImageBytes& image, const Oracle& before,
                                const Oracle* after, std::uint64_t salt) {
    IndexCrashConfig inner = cfg_;
    inner.recovery_crash_images = 0;  // one level deep
    inner.tamper_image = nullptr;
    inner.observe = nullptr;
    ExploreOptions opt;
    opt.label = label_ + ".recovery";
    opt.mode = mode_;
    opt.seed = salt;
    opt.images_budget = cfg_.recovery_crash_images;
    opt.max_failures = 1;
    IndexScenario scenario(inner, opt, StartImage{&image, &before, after});
    const ExploreReport r = explore(scenario, opt);
    inner_images_ += r.images_checked;
    if (r.ok()) return Status::Ok();
    const Failure& f = r.failures.front();
    return Status(Code::corrupted, "crash during recovery of this image: " + f.message +
                                       " [inner coordinates " + f.token.to_string() +
                                       "; replaying this image's token reruns it]");
  }

  IndexCrashConfig cfg_;
  Options options_;
  pm::Mode mode_;
  std::uint64_t seed_;
  std::string label_;
  StartImage start_;
  const IndexRegistry::Entry* entry_ = nullptr;
  std::vector<WorkOp> ops_;
  pm::ImageBytes buffer_;  // the start image's working copy (nested mode), line-aligned
  std::unique_ptr<pm::Pool> pool_;
  std::unique_ptr<Index> index_;
  Oracle oracle_;
  std::size_t inner_images_ = 0;
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

// LB+-Tree under the crash simulator with a designed workload that walks every persistence
// path in order (PROTOCOL.md): ascending inserts (good case, entry moving, splits with the key
// going right), descending inserts between them (entry moving, splits with the key going left),
// 8-byte in-place updates, then deletes of a contiguous range (leaves empty and are unlinked:
// U1-U4); a second scenario starts with a bulk load (B1-B4). ADR and eADR, m = 1, 2, 4.
// Each image: recover through the registry, verify(), compare with the oracle (completed ops
// present, the op in flight all or nothing), then keep operating and check again.
// Sized by PMINDEX_CRASH_IMAGES, replayable with the printed token.
#include <gtest/gtest.h>

#include <iostream>
#include <optional>

#include "crash/workload.h"
#include "pmindex/crash/explorer.h"

namespace pmindex::crash {
namespace {

class LBTreePhased final : public Scenario {
 public:
  LBTreePhased(std::uint32_t node_size, pm::Mode mode, bool bulk)
      : node_size_(node_size), mode_(mode), bulk_(bulk) {
    options_.kind = "lbtree";
    options_.node_size = node_size;
    options_.persistence = mode;
    options_.pool_size = 512 * 1024;
    entry_ = IndexRegistry::find("lbtree");
    const std::uint64_t s = 14 * (node_size / 256);  // slots per leaf
    key_space_ = 4 * s;
    std::uint64_t v = 1000;
    if (bulk_) {
      for (std::uint64_t k = 2; k <= 4 * s; k += 2) bulk_keys_.push_back(k);
      for (std::uint64_t k = 1; k < s; k += 2) ops_.push_back({OpKind::insert, k, ++v});
      for (std::uint64_t k = 2; k <= s; k += 4) ops_.push_back({OpKind::remove, k, 0});
    } else {
      for (std::uint64_t k = 2; k <= 4 * s; k += 2) ops_.push_back({OpKind::insert, k, ++v});
      for (std::uint64_t k = 4 * s - 1; k >= 1 && k < 4 * s; k -= 2)
        ops_.push_back({OpKind::insert, k, ++v});
      for (std::uint64_t k = 3; k <= 4 * s; k += 7) ops_.push_back({OpKind::update, k, ++v});
      for (std::uint64_t k = 2 * s; k >= 1; --k) ops_.push_back({OpKind::remove, k, 0});
      ops_.push_back({OpKind::scan, 1, 0});
    }
  }

  Result<Region> setup() override {
    index_.reset();
    pool_.reset();
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

  // Op 0 creates the index; with bulk, op 1 is the bulk load; then ops_.
  std::size_t op_count() const override { return 1 + (bulk_ ? 1 : 0) + ops_.size(); }

  Status run_op(std::size_t i) override {
    if (i == 0) {
      auto idx = entry_->create(std::move(pool_), options_);
      if (!idx.ok()) return idx.status();
      index_ = std::move(idx).value();
      return index_->verify();
    }
    const std::uint64_t before = index_->footprint().pm_bytes;
    if (bulk_ && i == 1) {
      std::vector<std::string> keys, values;
      for (std::uint64_t k : bulk_keys_) {
        keys.push_back(encode_u64(k));
        values.push_back(encode_u64(k * 7));
      }
      std::vector<KeyValue> kvs;
      for (std::size_t j = 0; j < keys.size(); ++j) kvs.push_back({keys[j], values[j]});
      if (Status s = index_->bulk_load(kvs, 0.7); !s.ok()) return s;
      apply_bulk(oracle_);
    } else {
      const WorkOp& op = ops_[i - 1 - (bulk_ ? 1 : 0)];
      if (Status s = apply_checked(*index_, op, oracle_, 8); !s.ok()) return s;
    }
    const std::uint64_t after = index_->footprint().pm_bytes;
    if (after == before + node_size_) ++splits_;
    if (after + node_size_ == before) ++removals_;
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
      if (bulk_ && at.op == 1) apply_bulk(*after);
      else apply_to_oracle(ops_[at.op - 1 - (bulk_ ? 1 : 0)], *after);
    }
    Oracle state;
    if (Status s = match_contents(*idx, key_space_, oracle_, after ? &*after : nullptr, &state); !s.ok())
      return s;
    const std::vector<WorkOp> more = make_workload(salt, 6, key_space_);
    for (std::size_t k = 0; k < more.size(); ++k)
      if (Status s = apply_checked(*idx, more[k], state, 8); !s.ok())
        return Status(s.code(), "after recovery, op " + std::to_string(k) + ": " + s.message());
    if (Status s = idx->verify(); !s.ok()) return Status(s.code(), "verify after more ops: " + s.message());
    return match_contents(*idx, key_space_, state, nullptr, nullptr);
  }

  void teardown() override {
    index_.reset();
    pool_.reset();
  }

  std::size_t splits() const { return splits_; }
  std::size_t removals() const { return removals_; }

 private:
  void apply_bulk(Oracle& o) const {
    for (std::uint64_t k : bulk_keys_) o[encode_u64(k)] = encode_u64(k * 7);
  }

  std::uint32_t node_size_;
  pm::Mode mode_;
  bool bulk_;
  Options options_;
  const IndexRegistry::Entry* entry_ = nullptr;
  std::uint64_t key_space_ = 0;
  std::vector<std::uint64_t> bulk_keys_;
  std::vector<WorkOp> ops_;
  std::unique_ptr<pm::Pool> pool_;
  std::unique_ptr<Index> index_;
  Oracle oracle_;
  std::size_t splits_ = 0, removals_ = 0;
};

void run(std::uint32_t node_size, pm::Mode mode, bool bulk) {
  LBTreePhased scenario(node_size, mode, bulk);
  const std::string label = std::string(bulk ? "lbtree_bulk" : "lbtree_phased") +
                            std::to_string(node_size) + "." + std::string(pm::to_string(mode));
  const ExploreOptions opt = ExploreOptions::from_env(label, mode);
  const ExploreReport r = explore(scenario, opt);
  std::cout << label << " seed " << opt.seed << ": " << r.to_string() << " (" << scenario.splits()
            << " splits, " << scenario.removals() << " leaf removals over the runs)\n";
  if (r.replay_skipped) GTEST_SKIP() << "PMINDEX_CRASH_REPLAY names another configuration";
  EXPECT_TRUE(r.ok()) << r.to_string();
  if (!opt.replay) {
    EXPECT_GT(r.images_checked, std::min<std::size_t>(opt.images_budget, 100) / 2);
    EXPECT_GT(scenario.splits(), 0u);
    if (!bulk) { EXPECT_GT(scenario.removals(), 0u); }
  }
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

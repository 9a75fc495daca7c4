// reflist under the crash simulator, in adr and eadr modes. Sized by PMINDEX_CRASH_IMAGES
// (about 1,000 images per mode in CI; the `long` variant runs 10,000) and seeded by
// PMINDEX_CRASH_SEED (CI derives it from the commit hash). A failure prints a replay token:
//   PMINDEX_CRASH_REPLAY='reflist.adr/<seed>/<op>/<point>/<choice>' ./test_reflist_crash
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>

#include "pmindex/crash/explorer.h"
#include "pmindex/crash/index_driver.h"
#include "index/common/crash_kit.h"
#include "index/common/hybrid_test_support.h"
#include "index/reflist/reflist.h"

namespace pmindex::crash {
namespace {

void run(pm::Mode mode) {
  hybrid_test::RegistryCrashRun r;
  r.options.kind = "reflist";
  r.mode = mode;
  r.label = "reflist." + std::string(pm::to_string(mode));
  hybrid_test::run_registry_crash(r);
}

TEST(CrashRefList, Adr) { run(pm::Mode::adr); }

// A crash during the recovery of a crash image (nested exploration), in both modes.
TEST(CrashRefList, CrashDuringRecovery) {
  for (pm::Mode mode : {pm::Mode::adr, pm::Mode::eadr}) {
    IndexCrashConfig cfg;
    cfg.options.kind = "reflist";
    cfg.ops = 40;
    cfg.recovery_crash_images = 6;
    cfg.recovery_crash_every = 4;
    ExploreOptions opt = ExploreOptions::from_env(
        "reflist.nested." + std::string(pm::to_string(mode)), mode, 20261122, 200);
    const ExploreReport r = run_index_crash(cfg, opt);
    if (r.replay_skipped) continue;
    crash_kit::expect_explored(r, opt, {.recovery_crashes = true, .smos = {}});
  }
}

// The driver's oracle must be able to fail: an image whose root pointer is wiped recovers as an
// empty index, which loses completed inserts.
TEST(CrashRefList, DriverCatchesLostRecords) {
  IndexCrashConfig cfg;
  cfg.options.kind = "reflist";
  cfg.ops = 40;
  cfg.tamper_image = hybrid_test::forget_root;
  ExploreOptions opt;
  opt.label = "reflist.tampered";
  opt.images_budget = 200;
  const ExploreReport r = run_index_crash(cfg, opt);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.failures[0].message.find("match no acceptable state"), std::string::npos)
      << r.to_string();
}
TEST(CrashRefList, Eadr) { run(pm::Mode::eadr); }

// R10, R11: the in-place upgrade of a REFLIST1 pool (the released golden image: 100 records
// k -> k*k, untagged links, closed cleanly). Op 0 opens it (the walk, commit_open, R10 for
// every link, R11); op 1 inserts a record into the upgraded list. Every image must open with
// all 100 records, verify (which requires REFLIST2 and every link tagged: the open finishes an
// upgrade cut short), and hold the insert as the oracle says. The scenario counts the images
// that held a cut-short upgrade (REFLIST1 with some links tagged) and ones already upgraded, so
// the test shows that both steps were reached.
class UpgradeScenario final : public Scenario {
 public:
  // bad_order: known-bad, op 0 first runs an upgrade of the test's own in the wrong order (the
  // magic flipped before the links are tagged, no fence between), then opens.
  explicit UpgradeScenario(pm::Mode mode, bool bad_order = false)
      : mode_(mode), bad_order_(bad_order) {
    options_.kind = "reflist";
    options_.open_mode = OpenMode::open;
  }
  Result<Region> setup() override {
    idx_.reset();
    std::ifstream f(std::string(PMINDEX_GOLDEN_DIR) + "/v2-reflist.pool", std::ios::binary);
    buffer_.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    if (buffer_.empty()) return Status(Code::io_error, "golden image missing");
    return Region{buffer_.data(), buffer_.size(), /*preloaded=*/true};
  }
  std::size_t op_count() const override { return 2; }
  Status run_op(std::size_t i) override {
    if (i == 0) {
      if (bad_order_) upgrade_in_the_wrong_order();
      auto idx = open(buffer_.data(), buffer_.size());
      if (!idx.ok()) return idx.status();
      idx_ = std::move(idx).value();
      return idx_->verify();
    }
    if (Code c = idx_->insert(encode_u64(1000), "new"); c != Code::ok)
      return Status(c, "insert after the upgrade");
    return idx_->verify();
  }
  Status check_image(std::span<char> image, const CrashPoint& at, std::uint64_t) override {
    classify(image);
    auto idx = open(image.data(), image.size());
    if (!idx.ok()) return Status(idx.status().code(), "recovery: " + idx.status().message());
    if (Status s = (*idx)->verify(); !s.ok()) return s;
    std::string v;
    for (std::uint64_t k = 0; k < 100; ++k) {
      if ((*idx)->find(encode_u64(k), &v) != Code::ok || decode_u64(v) != k * k)
        return Status(Code::corrupted, "golden record " + std::to_string(k) + " lost or wrong");
    }
    const bool has = (*idx)->find(encode_u64(1000), &v) == Code::ok;
    const bool must = at.op > 1 || (at.op == 1 && at.completed);
    if ((must && !has) || (!has && at.op > 1) || (has && at.op == 0))
      return Status(Code::corrupted, "the insert after the upgrade is wrong at op " +
                                         std::to_string(at.op));
    // The upgraded list keeps working and reopens without a warning.
    if ((*idx)->insert(encode_u64(2000), "more") != Code::ok)
      return Status(Code::corrupted, "insert after recovery");
    return (*idx)->verify();
  }
  void teardown() override { idx_.reset(); }

  std::atomic<std::size_t> cut_short{0};  // images with REFLIST1 and some links tagged
  std::atomic<std::size_t> upgraded{0};   // images already REFLIST2

 private:
  Result<std::unique_ptr<Index>> open(char* base, std::size_t size) {
    auto pool = pm::Pool::open_image(base, size, mode_, reflist::RefList::layout_for(options_),
                                     "upgrade image");
    if (!pool.ok()) return pool.status();
    return reflist::RefList::recover(std::move(pool).value(), options_);
  }
  // What R10, R11 had done in the image (read before its recovery; the golden chain is sound).
  void classify(std::span<char> image) {
    auto pool = pm::Pool::open_image(image.data(), image.size(), mode_,
                                     reflist::RefList::layout_for(options_), "peek");
    if (!pool.ok() || (*pool)->root() == 0) return;
    const auto* root = reinterpret_cast<const reflist::Root*>(image.data() + (*pool)->root());
    if (root->magic == reflist::kRootMagic) {
      ++upgraded;
      return;
    }
    std::size_t tagged = 0, untagged = 0;
    std::uint64_t link = root->head;
    for (int n = 0; n <= 100 && reflist::link_off(link) != 0; ++n) {
      ++(reflist::link_tag(link) != 0 ? tagged : untagged);
      link = reinterpret_cast<const reflist::Record*>(image.data() + reflist::link_off(link))->next;
    }
    if (tagged > 0 && untagged > 0) ++cut_short;
  }

  void upgrade_in_the_wrong_order() {
    std::uint64_t root_off = 0;
    {
      auto pool = pm::Pool::open_image(buffer_.data(), buffer_.size(), mode_,
                                       reflist::RefList::layout_for(options_), "bad upgrade");
      if (!pool.ok()) return;
      root_off = (*pool)->root();
    }
    char* base = buffer_.data();
    auto* root = reinterpret_cast<reflist::Root*>(base + root_off);
    pm::publish(&root->magic, reflist::kRootMagic);  // wrong: the magic first
    pm::flush(&root->magic, 8);
    std::uint64_t* link = &root->head;
    while (*link != 0 && reflist::link_tag(*link) == 0) {
      auto* r = reinterpret_cast<reflist::Record*>(base + *link);
      pm::publish(link, reflist::make_link(*link, reflist::record_tag(r)));
      pm::flush(link, 8);
      link = &r->next;
    }
    pm::publish(link, reflist::kListEnd);
    pm::persist(link, 8);
  }

  pm::Mode mode_;
  bool bad_order_;
  Options options_;
  pm::ImageBytes buffer_;
  std::unique_ptr<Index> idx_;
};

TEST(CrashRefList, UpgradeOfAnUntaggedPool) {
  for (pm::Mode mode : {pm::Mode::adr, pm::Mode::eadr}) {
    UpgradeScenario s(mode);
    ExploreOptions opt = ExploreOptions::from_env(
        "reflist.upgrade." + std::string(pm::to_string(mode)), mode, 20261128, 300);
    const ExploreReport r = explore(s, opt);
    if (r.replay_skipped) continue;
    crash_kit::expect_explored(r, opt);  // no violation, the budget (or every image) checked
    std::cout << opt.label << ": " << s.cut_short << " images with the upgrade cut short, "
              << s.upgraded << " upgraded\n";
    if (opt.replay) continue;
    EXPECT_GT(s.cut_short.load(), 0u) << "no image inside R10";
    EXPECT_GT(s.upgraded.load(), 0u) << "no image after R11";
  }
}

// Known-bad: an upgrade that flips the magic before the links are durably tagged leaves images
// that say REFLIST2 over untagged links; the scenario's check must refuse them.
TEST(CrashRefList, UpgradeCheckCatchesTheMagicFlippedFirst) {
  for (pm::Mode mode : {pm::Mode::adr, pm::Mode::eadr}) {
    UpgradeScenario s(mode, /*bad_order=*/true);
    ExploreOptions opt;
    opt.label = "reflist.upgrade.bad." + std::string(pm::to_string(mode));
    opt.mode = mode;
    opt.images_budget = 200;
    const ExploreReport r = explore(s, opt);
    ASSERT_FALSE(r.ok()) << pm::to_string(mode);
    EXPECT_NE(r.failures[0].message.find("recovery: "), std::string::npos) << r.to_string();
    EXPECT_NE(r.failures[0].message.find("content's tag"), std::string::npos) << r.to_string();
  }
}

}  // namespace
}  // namespace pmindex::crash

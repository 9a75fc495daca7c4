// The randomized kit (map_checker.h) must be able to fail: a wrapper around the reference index
// plants one defect at a time (a lost insert, an ignored update, a remove that keeps the
// record, a scan that skips one, a verify() that reports damage) and the kit's random driver
// must report it; the same driver passes over the unbroken wrapper.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "index/common/forwarding_index.h"
#include "index/common/map_checker.h"
#include "pmindex/index.h"

namespace pmindex {
namespace {

using namespace pmindex::testing;

enum class Fault { none, lost_insert, ignored_update, kept_remove, skipped_scan, bad_verify };

// Forwards to a real index, except for the one planted defect (every 5th call of the kind).
class Faulty final : public ForwardingIndex {
 public:
  Faulty(std::unique_ptr<Index> inner, Fault fault)
      : ForwardingIndex(std::move(inner)), fault_(fault) {}
  Code insert(std::string_view k, std::string_view v) override {
    if (fault_ == Fault::lost_insert && inner().find(k, nullptr) == Code::not_found && hit())
      return Code::ok;
    return inner().insert(k, v);
  }
  Code update(std::string_view k, std::string_view v) override {
    if (fault_ == Fault::ignored_update && inner().find(k, nullptr) == Code::ok && hit())
      return Code::ok;
    return inner().update(k, v);
  }
  Code remove(std::string_view k) override {
    if (fault_ == Fault::kept_remove && inner().find(k, nullptr) == Code::ok && hit())
      return Code::ok;
    return inner().remove(k);
  }
  std::size_t scan(std::string_view start, std::size_t max, ScanBuffer& out) const override {
    const std::size_t n = inner().scan(start, max, out);
    if (fault_ != Fault::skipped_scan || n < 3) return n;
    ScanBuffer all = out;  // drop the second record
    out.clear();
    for (std::size_t i = 0; i < n; ++i)
      if (i != 1) out.append(all.key(i), all.value(i));
    return out.size();
  }
  Status verify() const override {
    if (fault_ == Fault::bad_verify && hit())
      return Status(Code::corrupted, "planted: verify() reports damage");
    return inner().verify();
  }

 private:
  bool hit() const { return ++calls_ % 5 == 0; }
  Fault fault_;
  mutable std::uint64_t calls_ = 0;
};

Options ref_options() {
  Options o;
  o.kind = "reflist";
  o.pool_size = 4 << 20;
  return o;
}

// Runs the kit's driver over the wrapper; returns the gtest failures it reported.
std::size_t failures_of(Fault fault) {
  auto inner = Index::open(ref_options());
  EXPECT_TRUE(inner.ok());
  if (!inner.ok()) return 0;
  MapChecker c(std::make_unique<Faulty>(std::move(inner).value(), fault), ref_options());
  ::testing::TestPartResultArray failures;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
    c.run({.phases = {grow_phase(300), shrink_phase(300)}, .seed = 3},
          [](std::mt19937_64& r) { return encode_u64(r() % 100); }, top_bit_value);
  }
  for (int i = 0; i < failures.size(); ++i)
    std::cout << "caught: " << failures.GetTestPartResult(i).message() << "\n";
  return static_cast<std::size_t>(failures.size());
}

TEST(MapChecker, PassesOverTheUnbrokenIndex) { EXPECT_EQ(failures_of(Fault::none), 0u); }

TEST(MapChecker, CatchesALostInsert) { EXPECT_GT(failures_of(Fault::lost_insert), 0u); }
TEST(MapChecker, CatchesAnIgnoredUpdate) { EXPECT_GT(failures_of(Fault::ignored_update), 0u); }
TEST(MapChecker, CatchesARemoveThatKeepsTheRecord) {
  EXPECT_GT(failures_of(Fault::kept_remove), 0u);
}
TEST(MapChecker, CatchesAScanThatSkipsARecord) {
  EXPECT_GT(failures_of(Fault::skipped_scan), 0u);
}
TEST(MapChecker, CatchesAVerifyFailure) { EXPECT_GT(failures_of(Fault::bad_verify), 0u); }

}  // namespace
}  // namespace pmindex

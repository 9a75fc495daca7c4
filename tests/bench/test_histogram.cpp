#include <gtest/gtest.h>

#include <algorithm>
#include <vector>
#include <cmath>

#include "histogram.h"
#include "rng.h"

namespace pmbench {
namespace {

TEST(Histogram, BucketsTileTheRangeInOrder) {
  std::uint64_t expect_low = 0;
  for (std::size_t b = 0; b + 1 < Histogram::kBuckets; ++b) {
    ASSERT_EQ(Histogram::bucket_low(b), expect_low) << b;
    ASSERT_GE(Histogram::bucket_high(b), Histogram::bucket_low(b));
    ASSERT_EQ(Histogram::bucket_of(Histogram::bucket_low(b)), b);
    ASSERT_EQ(Histogram::bucket_of(Histogram::bucket_high(b)), b);
    expect_low = Histogram::bucket_high(b) + 1;
  }
  EXPECT_EQ(Histogram::bucket_of(~std::uint64_t{0}), Histogram::kBuckets - 1);
}

TEST(Histogram, PercentilesWithinRelativeError) {
  Histogram h;
  std::vector<std::uint64_t> v;
  Xoshiro256ss rng(1, 2);
  for (int i = 0; i < 100000; ++i) {
    const std::uint64_t x = 50 + rng.below(1'000'000);
    v.push_back(x);
    h.record(x);
  }
  std::sort(v.begin(), v.end());
  for (double q : {50.0, 90.0, 99.0, 99.9, 99.99}) {
    const auto rank = static_cast<std::size_t>(std::ceil(q / 100 * v.size())) - 1;
    const double exact = static_cast<double>(v[rank]);
    const double got = static_cast<double>(h.percentile(q));
    EXPECT_GE(got, exact);
    EXPECT_LE(got, exact * (1 + 1.0 / 64) + 1) << q;
  }
  EXPECT_EQ(h.min(), v.front());
  EXPECT_EQ(h.max(), v.back());
  EXPECT_EQ(h.percentile(100), v.back());
}

TEST(Histogram, MergeAndSmallValuesExact) {
  Histogram a, b;
  for (std::uint64_t i = 1; i <= 100; ++i) (i % 2 ? a : b).record(i);
  a.merge(b);
  EXPECT_EQ(a.count(), 100u);
  EXPECT_EQ(a.percentile(50), 50u);
  EXPECT_EQ(a.percentile(99), 99u);
  EXPECT_EQ(a.min(), 1u);
  Histogram empty;
  EXPECT_EQ(empty.percentile(99), 0u);
}

}  // namespace
}  // namespace pmbench

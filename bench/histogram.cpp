#include "histogram.h"

#include <algorithm>
#include <cmath>

namespace pmbench {

std::uint64_t Histogram::bucket_low(std::size_t b) {
  if (b < (1u << kLinearBits)) return b;
  const std::size_t rel = b - (1u << kLinearBits);
  const int k = kLinearBits + static_cast<int>(rel / kSubBuckets);
  const std::uint64_t mantissa = kSubBuckets + rel % kSubBuckets;
  return mantissa << (k - (kLinearBits - 1));
}

std::uint64_t Histogram::bucket_high(std::size_t b) {
  if (b < (1u << kLinearBits)) return b;
  const std::size_t rel = b - (1u << kLinearBits);
  const int k = kLinearBits + static_cast<int>(rel / kSubBuckets);
  return bucket_low(b) + ((std::uint64_t{1} << (k - (kLinearBits - 1))) - 1);
}

void Histogram::merge(const Histogram& o) {
  for (std::size_t i = 0; i < kBuckets; ++i) counts_[i] += o.counts_[i];
  total_ += o.total_;
  min_ = std::min(min_, o.min_);
  max_ = std::max(max_, o.max_);
}

double Histogram::mean() const {
  if (total_ == 0) return 0;
  long double sum = 0;
  for (std::size_t i = 0; i < kBuckets; ++i)
    if (counts_[i] != 0)
      sum += static_cast<long double>(counts_[i]) *
             (static_cast<long double>(bucket_low(i)) + static_cast<long double>(bucket_high(i))) / 2;
  return static_cast<double>(sum / total_);
}

std::uint64_t Histogram::percentile(double q) const {
  if (total_ == 0) return 0;
  // The rank of the value: ceil(q% of n), at least 1.
  auto rank = static_cast<std::uint64_t>(std::ceil(q / 100.0 * static_cast<double>(total_)));
  rank = std::clamp<std::uint64_t>(rank, 1, total_);
  std::uint64_t seen = 0;
  for (std::size_t i = 0; i < kBuckets; ++i) {
    seen += counts_[i];
    if (seen >= rank) return std::min(bucket_high(i), max_);
  }
  return max_;
}

}  // namespace pmbench

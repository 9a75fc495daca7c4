// A small log-linear (HdrHistogram-style) latency histogram. Debian 12 packages no
// HdrHistogram for C/C++, so pmbench carries this one (docs/pmbench.md).
//
// Values below 128 have one bucket each; above, every power of two [2^k, 2^(k+1)) is split
// into 64 equal buckets, so a reported percentile is at most 1/64 (1.6%) above the true value
// (the bucket's highest value is reported, as HdrHistogram does, capped at the exact max).
// Fixed size (3776 counters, ~30 KiB), no allocation while recording; one per thread and
// operation type, merged after the run.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace pmbench {

class Histogram {
 public:
  static constexpr int kLinearBits = 7;                  // 128 exact buckets
  static constexpr int kSubBuckets = 1 << (kLinearBits - 1);  // 64 per power of two above
  static constexpr std::size_t kBuckets = (1u << kLinearBits) + (64 - kLinearBits) * kSubBuckets;

  static std::size_t bucket_of(std::uint64_t v) {
    if (v < (1u << kLinearBits)) return static_cast<std::size_t>(v);
    const int k = 63 - __builtin_clzll(v);               // 2^k <= v < 2^(k+1), k >= 7
    const int shift = k - (kLinearBits - 1);
    const std::uint64_t mantissa = v >> shift;           // in [64, 128)
    return (1u << kLinearBits) + static_cast<std::size_t>(k - kLinearBits) * kSubBuckets +
           static_cast<std::size_t>(mantissa - kSubBuckets);
  }
  // The smallest and largest value that fall into bucket b.
  static std::uint64_t bucket_low(std::size_t b);
  static std::uint64_t bucket_high(std::size_t b);

  void record(std::uint64_t v) {
    ++counts_[bucket_of(v)];
    ++total_;
    if (v < min_) min_ = v;
    if (v > max_) max_ = v;
  }
  void merge(const Histogram& o);

  std::uint64_t count() const { return total_; }
  std::uint64_t min() const { return total_ == 0 ? 0 : min_; }
  std::uint64_t max() const { return max_; }
  double mean() const;
  // The value at or below which `q` (0..100) percent of the recorded values lie.
  std::uint64_t percentile(double q) const;

 private:
  std::array<std::uint64_t, kBuckets> counts_{};
  std::uint64_t total_ = 0;
  std::uint64_t min_ = ~std::uint64_t{0};
  std::uint64_t max_ = 0;
};

}  // namespace pmbench

// Linear models over ordered keys. A model is (slope, intercept) over a model input x:
//   KeyType::u64  x = double(key - node.lo)   relative to the node's lower bound, so keys of a
//                 narrow node stay distinct in a double even near 2^64
//   KeyType::f64  x = the IEEE value of the key (decoded, never the bit pattern), clamped to
//                 [-DBL_MAX, DBL_MAX]; ordered keys outside [-inf, +inf] (NaN encodings, used
//                 only as range bounds) map to the clamp ends
// Every step (int->double, clamp, multiply by slope >= 0, add, floor, clamp) is monotone
// non-decreasing, so a model routes an interval of keys to a non-decreasing slot sequence: the
// keys of one slot form one contiguous interval, which is what makes partitions exact.
#pragma once

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>

#include "pmindex/index.h"

namespace pmindex::apex {

struct LinearModel {
  double slope = 0;
  double intercept = 0;
};

// The ordered encoding of doubles (index.cpp's f64_to_ordered / ordered_to_f64), inline and
// constexpr here: the model input is computed at every routing step, and the bounds below are
// compile-time constants (no function-local statics on the hot path).
constexpr std::uint64_t ordered_of(double v) {
  const auto bits = std::bit_cast<std::uint64_t>(v);
  return (bits >> 63) != 0 ? ~bits : bits | (std::uint64_t{1} << 63);
}
constexpr double f64_of(std::uint64_t v) {
  return std::bit_cast<double>((v >> 63) != 0 ? v & ~(std::uint64_t{1} << 63) : ~v);
}
inline constexpr double kInf = std::numeric_limits<double>::infinity();
inline constexpr std::uint64_t kOrderedNegInf = ordered_of(-kInf);
inline constexpr std::uint64_t kOrderedPosInf = ordered_of(kInf);

inline double model_input(KeyType kt, std::uint64_t key, std::uint64_t lo) {
  if (kt == KeyType::u64) [[likely]] return static_cast<double>(key - lo);
  if (key <= kOrderedNegInf) return -DBL_MAX;
  if (key >= kOrderedPosInf) return DBL_MAX;
  return std::clamp(f64_of(key), -DBL_MAX, DBL_MAX);
}

// Slot in [0, n): clamp(floor(slope*x + intercept)). NaN (only from inf*0) goes to 0.
// Truncation instead of std::floor (a libm call without SSE4.1): the conversion runs only for
// v in (0, n-1), where truncating a positive value is its floor; and floor(v) >= n-1 exactly
// when v >= n-1, n-1 being an integer.
inline std::uint32_t predict_slot(const LinearModel& m, double x, std::uint32_t n) {
  const double v = m.slope * x + m.intercept;
  if (!(v > 0)) return 0;  // also NaN
  if (v >= static_cast<double>(n - 1)) return n - 1;
  return static_cast<std::uint32_t>(v);
}

// Least-squares fit of x[i] -> target[i] = i * scale (ranks scaled to slots). Slope is forced
// >= 0 (monotone). Degenerate inputs (n < 2 or all x equal) give slope 0, intercept at the
// middle of the targets.
inline LinearModel fit_ranks(std::span<const double> xs, double scale) {
  LinearModel m;
  const std::size_t n = xs.size();
  if (n == 0) return m;
  // Centre x on its mean in long double to keep precision for wide ranges.
  long double mx = 0, my = 0;
  for (std::size_t i = 0; i < n; ++i) {
    mx += xs[i];
    my += static_cast<long double>(i) * scale;
  }
  mx /= n;
  my /= n;
  long double sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const long double dx = xs[i] - mx;
    sxx += dx * dx;
    sxy += dx * (static_cast<long double>(i) * scale - my);
  }
  if (n < 2 || !(sxx > 0) || !(sxy > 0)) {
    m.slope = 0;
    m.intercept = static_cast<double>(my);
    return m;
  }
  const long double slope = sxy / sxx;
  m.slope = static_cast<double>(slope);
  m.intercept = static_cast<double>(my - slope * mx);
  if (!std::isfinite(m.slope) || !std::isfinite(m.intercept) || m.slope < 0) {
    m.slope = 0;
    m.intercept = static_cast<double>(my);
  }
  return m;
}

}  // namespace pmindex::apex

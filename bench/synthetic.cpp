#include "synthetic.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numbers>

#include "rng.h"

namespace pmbench {
namespace {

// One standard normal per call (Box-Muller, the second value kept for the next call).
class Normal {
 public:
  explicit Normal(Xoshiro256ss& rng) : rng_(rng) {}
  double next() {
    if (have_) {
      have_ = false;
      return spare_;
    }
    double u1 = 0;
    while (u1 == 0) u1 = rng_.uniform01();
    const double u2 = rng_.uniform01();
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(2 * std::numbers::pi * u2);
    have_ = true;
    return r * std::cos(2 * std::numbers::pi * u2);
  }

 private:
  Xoshiro256ss& rng_;
  double spare_ = 0;
  bool have_ = false;
};

// Draws until `count` distinct values exist: the sort removes duplicates, fresh draws refill.
template <class Draw>
std::vector<std::uint64_t> distinct(std::uint64_t count, Draw draw) {
  std::vector<std::uint64_t> keys;
  keys.reserve(count);
  while (keys.size() < count) {
    while (keys.size() < count) keys.push_back(draw());
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  }
  return keys;
}

}  // namespace

std::vector<std::uint64_t> lognormal_keys(std::uint64_t count, std::uint64_t seed) {
  Xoshiro256ss rng(seed, 0x10e0a1);
  Normal normal(rng);
  constexpr double kMu = 0, kSigma = 2, kScale = 1e9;
  return distinct(count, [&] {
    const double x = std::exp(kMu + kSigma * normal.next()) * kScale;
    // The tail beyond 2^64 is ~sigma*17 away: clamp rather than overflow.
    return x >= 0x1.0p64 ? ~std::uint64_t{0} : static_cast<std::uint64_t>(x);
  });
}

std::vector<std::uint64_t> longlat_keys(std::uint64_t count, std::uint64_t seed) {
  Xoshiro256ss rng(seed, 0x10e61a7);
  Normal normal(rng);
  constexpr int kCentres = 4096;
  std::vector<std::pair<double, double>> centres(kCentres);
  for (auto& [lon, lat] : centres) {
    lon = -180 + 360 * rng.uniform01();
    lat = -60 + 135 * rng.uniform01();
  }
  std::vector<std::uint64_t> bits = distinct(count, [&] {
    const auto& [clon, clat] = centres[rng.below(kCentres)];
    double lon = clon + normal.next();
    const double lat = std::clamp(clat + normal.next(), -90.0, 90.0);
    if (lon < -180) lon += 360;
    if (lon >= 180) lon -= 360;
    const double key = 180 * std::floor(lon) + lat;
    return std::bit_cast<std::uint64_t>(key);
  });
  // Sorted as doubles (bit patterns of negative doubles sort backwards).
  std::sort(bits.begin(), bits.end(), [](std::uint64_t a, std::uint64_t b) {
    return std::bit_cast<double>(a) < std::bit_cast<double>(b);
  });
  return bits;
}

bool synthetic_keys(const std::string& name, std::uint64_t count, std::uint64_t seed,
                    std::vector<std::uint64_t>* out, bool* doubles) {
  if (name == "lognormal") {
    *out = lognormal_keys(count, seed);
    *doubles = false;
    return true;
  }
  if (name == "longlat") {
    *out = longlat_keys(count, seed);
    *doubles = true;
    return true;
  }
  return false;
}

}  // namespace pmbench

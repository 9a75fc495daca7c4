#include "distribution.h"

#include <algorithm>
#include <cctype>
#include <cmath>

namespace pmbench {

std::string to_string(DistKind kind) {
  switch (kind) {
    case DistKind::uniform: return "UNIFORM";
    case DistKind::selfsimilar: return "SELFSIMILAR";
    case DistKind::zipfian: return "ZIPFIAN";
    case DistKind::latest: return "LATEST";
  }
  return "?";
}

bool parse_distribution(std::string text, DistKind* out) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  if (text == "UNIFORM") *out = DistKind::uniform;
  else if (text == "SELFSIMILAR") *out = DistKind::selfsimilar;
  else if (text == "ZIPFIAN") *out = DistKind::zipfian;
  else if (text == "LATEST") *out = DistKind::latest;
  else return false;
  return true;
}

double zeta_extend(double zeta_n0, std::uint64_t n0, std::uint64_t n, double theta) {
  double z = zeta_n0;
  for (std::uint64_t i = n0 + 1; i <= n; ++i) z += std::pow(static_cast<double>(i), -theta);
  return z;
}

Distribution::Distribution(DistKind kind, double skew, std::uint64_t n, double zeta_n)
    : kind_(kind), skew_(skew), n_(n) {
  if (kind_ == DistKind::selfsimilar) exponent_ = std::log(skew_) / std::log(1.0 - skew_);
  if (zipf_like(kind_)) {
    zeta_n_ = zeta_n >= 0 ? zeta_n : zeta_extend(0, 0, n_, skew_);
    zeta2_ = zeta_extend(0, 0, 2, skew_);
    alpha_ = 1.0 / (1.0 - skew_);
    half_pow_theta_ = std::pow(0.5, skew_);
    refresh();
  }
}

void Distribution::refresh() {
  if (!zipf_like(kind_) || n_ == 0) return;
  eta_ = (1.0 - std::pow(2.0 / static_cast<double>(n_), 1.0 - skew_)) / (1.0 - zeta2_ / zeta_n_);
}

void Distribution::grow(std::uint64_t n) {
  if (n <= n_) return;
  if (zipf_like(kind_)) zeta_n_ = zeta_extend(zeta_n_, n_, n, skew_);
  n_ = n;
  refresh();
}

std::uint64_t Distribution::next(Xoshiro256ss& rng) const {
  if (n_ <= 1) return 0;
  switch (kind_) {
    case DistKind::uniform:
      return rng.below(n_);
    case DistKind::selfsimilar: {
      const double r = static_cast<double>(n_) * std::pow(rng.uniform01(), exponent_);
      return std::min<std::uint64_t>(n_ - 1, static_cast<std::uint64_t>(r));
    }
    case DistKind::zipfian:
    case DistKind::latest: {
      const double u = rng.uniform01();
      const double uz = u * zeta_n_;
      if (uz < 1.0) return 0;
      if (uz < 1.0 + half_pow_theta_) return 1;
      const double r = static_cast<double>(n_) * std::pow(eta_ * u - eta_ + 1.0, alpha_);
      return std::min<std::uint64_t>(n_ - 1, static_cast<std::uint64_t>(r));
    }
  }
  return 0;
}

}  // namespace pmbench

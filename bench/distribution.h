// Access distributions over ranks 0..N-1 of the ids that exist at that moment (rank 0 is the
// hottest; the rank -> id -> hash mapping scatters hot ranks over the key space). N may grow
// between draws (a thread's own inserts add ids): grow() is O(added) for the zipfian zeta sum,
// never an O(N) loop per draw or per run.
//
//   uniform      every rank equally likely
//   selfsimilar  Gray et al. 1994: rank = N * u^(ln h / ln(1-h)); skew h in (0, 0.5]
//                (h = 0.2: 80% of accesses on 20% of ranks)
//   zipfian      Gray et al. 1994 with zeta(N, theta) kept incrementally; theta in [0, 1)
//   latest       YCSB's "latest" (workload D): the zipfian draw over ranks ordered by recency,
//                rank 0 = the most recently inserted id (the caller maps ranks to ids
//                newest-first; here it draws exactly as zipfian)
#pragma once

#include <cstdint>
#include <string>

#include "rng.h"

namespace pmbench {

enum class DistKind : std::uint8_t { uniform, selfsimilar, zipfian, latest };
// zipfian and latest share the zipfian draw (and its incrementally kept zeta).
inline bool zipf_like(DistKind k) { return k == DistKind::zipfian || k == DistKind::latest; }
std::string to_string(DistKind kind);
bool parse_distribution(std::string text, DistKind* out);  // case-insensitive

// zeta(n, theta) = sum_{i=1..n} i^-theta, extended from a previous (n0, zeta(n0)).
double zeta_extend(double zeta_n0, std::uint64_t n0, std::uint64_t n, double theta);

class Distribution {
 public:
  // `zeta_n` may pass a precomputed zeta(n, skew) (zipfian) so threads share the O(n) start.
  Distribution(DistKind kind, double skew, std::uint64_t n, double zeta_n = -1);
  // The population grows to n (n >= size()).
  void grow(std::uint64_t n);
  std::uint64_t size() const { return n_; }
  std::uint64_t next(Xoshiro256ss& rng) const;
  double zeta() const { return zeta_n_; }

 private:
  void refresh();
  DistKind kind_;
  double skew_;
  std::uint64_t n_;
  // selfsimilar
  double exponent_ = 0;
  // zipfian
  double zeta_n_ = 0, zeta2_ = 0, alpha_ = 0, eta_ = 0, half_pow_theta_ = 0;
};

}  // namespace pmbench

// The workload generators' pseudo-random numbers: xoshiro256** (Blackman & Vigna), seeded by
// splitmix64, one independent stream per thread. Everything a run does follows from --seed.
#pragma once

#include <cstdint>

namespace pmbench {

// splitmix64: a good 64-bit mixer; used to seed xoshiro and to derive values from keys.
inline std::uint64_t splitmix64_next(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
inline std::uint64_t mix64(std::uint64_t x) { return splitmix64_next(x); }

class Xoshiro256ss {
 public:
  // Stream `stream` of seed `seed`: the four state words come from a splitmix64 sequence
  // started at a state that depends on both, so streams of one seed never share a state.
  Xoshiro256ss(std::uint64_t seed, std::uint64_t stream) {
    std::uint64_t sm = seed ^ mix64(stream + 0x243f6a8885a308d3ull);
    for (auto& w : s_) w = splitmix64_next(sm);
  }
  std::uint64_t next() {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform01() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Uniform in [0, n) (Lemire's multiply-shift; the bias is below 2^-64 * n).
  std::uint64_t below(std::uint64_t n) {
    __extension__ using U128 = unsigned __int128;
    return static_cast<std::uint64_t>((static_cast<U128>(next()) * n) >> 64);
  }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::uint64_t s_[4];
};

}  // namespace pmbench

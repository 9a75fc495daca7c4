// Synthetic key sets like those of ALEX (Ding et al., SIGMOD 2020) and APEX (Lu et al.,
// PVLDB 2022), made in memory for `--dataset gen:NAME` (docs/pmbench.md, "Datasets").
//
//   lognormal  ALEX's lognormal: x ~ lognormal(mu = 0, sigma = 2), key = floor(x * 10^9) as
//              uint64 (a heavy right tail; the largest of 10M keys is around 10^14)
//   longlat    ALEX's compound key 180 * floor(longitude) + latitude over synthetic points
//              (doubles): 4096 cluster centres, longitude uniform in [-180, 180) and latitude
//              uniform in [-60, 75) (roughly where people map), each point a centre plus
//              N(0, 1 degree) in both axes; latitude clamped to [-90, 90], longitude wrapped.
//              OSM's real points are what ALEX used; this keeps its shape (dense clusters, a
//              sawtooth over the longitude cells) without the data.
//
// Both return exactly `count` distinct keys (duplicates are replaced by fresh draws), sorted;
// the caller shuffles. The keys follow from `seed` alone. 10M keys took 5-7 s here (-O2, one
// core of a busy shared machine), mostly the sort that removes duplicates.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pmbench {

std::vector<std::uint64_t> lognormal_keys(std::uint64_t count, std::uint64_t seed);
// IEEE doubles (the bit patterns, as a SOSD file of doubles holds them).
std::vector<std::uint64_t> longlat_keys(std::uint64_t count, std::uint64_t seed);

// The generator for `name` ("lognormal", "longlat"), or false if unknown.
bool synthetic_keys(const std::string& name, std::uint64_t count, std::uint64_t seed,
                    std::vector<std::uint64_t>* out, bool* doubles);

}  // namespace pmbench

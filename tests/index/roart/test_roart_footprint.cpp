// roart's PM footprint per record (README.md table): PMINDEX_FOOTPRINT_RECORDS random 8-byte
// keys (default 100,000; the README's figure is the `long` variant's 10,000,000) inserted one
// by one, then half of them removed; prints allocator class bytes and requested bytes per
// record at both points. Checks the bounds: loaded <= 76 B per record (0.4x the
// survey's 190 B for the original), after removing half <= 1.5x the loaded figure.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <random>

#include "index/roart/roart.h"

namespace pmindex {
namespace {

TEST(RoartFootprint, BytesPerRecordAfterLoadAndAfterRemovingHalf) {
  const char* env = std::getenv("PMINDEX_FOOTPRINT_RECORDS");
  const std::uint64_t n = env != nullptr ? std::strtoull(env, nullptr, 10) : 100000;
  Options o;
  o.kind = "roart";
  o.key_type = KeyType::u64;
  o.expected_records = n;
  auto r = Index::open(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  auto idx = std::move(r).value();
  auto& ro = static_cast<roart::Roart&>(*idx);
  std::mt19937_64 rng(42);
  std::vector<std::uint64_t> keys;
  keys.reserve(n);
  while (keys.size() < n) {
    const std::uint64_t k = rng();
    if (idx->insert(encode_u64(k), encode_u64(k)) == Code::ok) keys.push_back(k);
  }
  const double loaded = double(idx->footprint().pm_bytes) / double(n);
  const double loaded_req = double(ro.requested_bytes_for_testing()) / double(n);
  std::printf("[roart footprint] %llu records: %.1f B/record (allocator class bytes), %.1f B/record "
              "(requested), %llu arrays, %llu splits\n",
              static_cast<unsigned long long>(n), loaded, loaded_req,
              static_cast<unsigned long long>(ro.array_count_for_testing()),
              static_cast<unsigned long long>(ro.splits()));
  for (std::uint64_t i = 0; i < n; i += 2) ASSERT_EQ(idx->remove(encode_u64(keys[i])), Code::ok);
  const std::uint64_t live = n - (n + 1) / 2;
  // Retired blocks still waiting for their epoch count as in use: at most a few per thread.
  const double half = double(idx->footprint().pm_bytes) / double(live);
  const double half_req = double(ro.requested_bytes_for_testing()) / double(live);
  std::printf("[roart footprint] after removing half (%llu live): %.1f B/live record (class "
              "bytes), %.1f B/live record (requested), %llu shrinks, %llu merges, %llu arrays\n",
              static_cast<unsigned long long>(live), half, half_req,
              static_cast<unsigned long long>(ro.shrinks()),
              static_cast<unsigned long long>(ro.merges()),
              static_cast<unsigned long long>(ro.array_count_for_testing()));
  EXPECT_TRUE(idx->close().ok());
  EXPECT_LE(loaded, 76.0);
  EXPECT_LE(half, 1.5 * loaded);
}

}  // namespace
}  // namespace pmindex

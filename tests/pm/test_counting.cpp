// Counting flavour: distinct lines per operation, bytes, and the XPBuffer media model.
#include <gtest/gtest.h>

#include "pmindex/pm/persist.h"

namespace pmindex::pm {
namespace {

static_assert(kCounting, "this test links the counting flavour");

alignas(256) char g_pm[256 * 128];

struct ModeScope {
  explicit ModeScope(Mode m) { EXPECT_TRUE(Runtime::acquire_mode(m)); }
  ~ModeScope() { Runtime::release_mode(); }
};

TEST(Counting, DistinctLinesPerOperation) {
  ModeScope scope(Mode::adr);
  Runtime::end_operation();
  const Counters before = Runtime::counters();
  // Op 1: three stores to one line, one store to another.
  store(reinterpret_cast<std::uint64_t*>(g_pm), std::uint64_t{1});
  store(reinterpret_cast<std::uint64_t*>(g_pm + 8), std::uint64_t{2});
  store(reinterpret_cast<std::uint64_t*>(g_pm + 16), std::uint64_t{3});
  store(reinterpret_cast<std::uint64_t*>(g_pm + 64), std::uint64_t{4});
  Runtime::end_operation();
  // Op 2: a 100-byte copy straddling three lines.
  char src[100] = {};
  copy(g_pm + 1000, src, 100);
  Runtime::end_operation();
  const Counters d = Runtime::counters() - before;
  EXPECT_EQ(d.operations, 2u);
  EXPECT_EQ(d.lines_written, 2u + 3u);  // bytes 1000..1099 touch lines 960, 1024, 1088
  EXPECT_EQ(d.bytes_stored, 32u + 100u);
}

TEST(Counting, XPBufferPartialLinesCostReadModifyWrite) {
  ModeScope scope(Mode::adr);
  Runtime::end_operation();
  const Counters before = Runtime::counters();
  // Write back one cache line in each of 100 distinct XPLines: 64 fit in the buffer, then 36
  // evictions, each a partial XPLine: 256 B read + 256 B written.
  for (int i = 0; i < 100; ++i) {
    char* p = g_pm + 256 * i;
    store(reinterpret_cast<std::uint64_t*>(p), std::uint64_t{7});
    persist(p, 8);
  }
  Counters d = Runtime::counters() - before;
  EXPECT_EQ(d.media_bytes_written, 36u * 256);
  EXPECT_EQ(d.media_bytes_read, 36u * 256);
  // Full XPLines (all four lines written back) cost no read on eviction.
  const Counters mid = Runtime::counters();
  for (int i = 0; i < 100; ++i) {
    char* p = g_pm + 256 * (i % 128);
    persist(p, 256);
  }
  d = Runtime::counters() - mid;
  EXPECT_GT(d.media_bytes_written, 0u);
  EXPECT_LT(d.media_bytes_read, d.media_bytes_written);
}

}  // namespace
}  // namespace pmindex::pm

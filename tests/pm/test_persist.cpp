// The persistence API: modes, the instruction chosen, and the always-on counters.
#include <gtest/gtest.h>

#include <cstdint>

#include "pmindex/pm/persist.h"

namespace pmindex::pm {
namespace {

struct ModeScope {
  explicit ModeScope(Mode m) { EXPECT_TRUE(Runtime::acquire_mode(m)); }
  ~ModeScope() { Runtime::release_mode(); }
};

alignas(256) std::uint64_t g_buf[64];

TEST(Persist, ParseAndPrintModes) {
  Mode m = Mode::dram;
  EXPECT_TRUE(parse_mode("adr", &m));
  EXPECT_EQ(m, Mode::adr);
  EXPECT_TRUE(parse_mode("eadr", &m));
  EXPECT_EQ(m, Mode::eadr);
  EXPECT_TRUE(parse_mode("dram", &m));
  EXPECT_EQ(m, Mode::dram);
  EXPECT_FALSE(parse_mode("ADR ", &m));
  EXPECT_FALSE(parse_mode("", &m));
  EXPECT_EQ(to_string(Mode::eadr), "eadr");
}

TEST(Persist, AdrCountsOneFlushPerLineAndOneFence) {
  ModeScope scope(Mode::adr);
  const Counters before = Runtime::counters();
  store(&g_buf[0], std::uint64_t{42});
  persist(&g_buf[0], 8);                // one line
  persist(&g_buf[7], 16);               // bytes 56..72: two lines
  const Counters d = Runtime::counters() - before;
  EXPECT_EQ(g_buf[0], 42u);
  EXPECT_EQ(d.flushes, 3u);
  EXPECT_EQ(d.fences, 2u);
}

TEST(Persist, EadrFencesOnly) {
  ModeScope scope(Mode::eadr);
  const Counters before = Runtime::counters();
  persist(&g_buf[0], 64);
  flush(&g_buf[0], 256);
  fence();
  const Counters d = Runtime::counters() - before;
  EXPECT_EQ(d.flushes, 0u);
  EXPECT_EQ(d.fences, 2u);
}

TEST(Persist, DramDoesNothing) {
  ModeScope scope(Mode::dram);
  const Counters before = Runtime::counters();
  persist(&g_buf[0], 64);
  fence();
  const Counters d = Runtime::counters() - before;
  EXPECT_EQ(d.flushes, 0u);
  EXPECT_EQ(d.fences, 0u);
}

TEST(Persist, ModeCannotChangeWhilePoolsAreOpen) {
  ASSERT_TRUE(Runtime::acquire_mode(Mode::adr));
  EXPECT_FALSE(Runtime::acquire_mode(Mode::eadr));  // a pool in adr mode is open
  EXPECT_TRUE(Runtime::acquire_mode(Mode::adr));
  Runtime::release_mode();
  Runtime::release_mode();
  EXPECT_TRUE(Runtime::acquire_mode(Mode::eadr));  // now nobody holds adr
  EXPECT_EQ(Runtime::mode(), Mode::eadr);
  Runtime::release_mode();
}

TEST(Persist, PublishAndCas) {
  ModeScope scope(Mode::adr);
  std::uint64_t* w = &g_buf[8];
  publish(w, 5);
  EXPECT_EQ(load_acquire(w), 5u);
  std::uint64_t expected = 4;
  EXPECT_FALSE(cas(w, expected, 9));
  EXPECT_EQ(expected, 5u);
  EXPECT_TRUE(cas(w, expected, 9));
  EXPECT_EQ(load_acquire(w), 9u);
}

TEST(Persist, AdrUsesClwbOnThisMachineWhenAvailable) {
  // The instruction is chosen by CPUID; this machine type has clwb.
  EXPECT_FALSE(Runtime::adr_instruction().empty());
}

}  // namespace
}  // namespace pmindex::pm

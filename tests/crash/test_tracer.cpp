// The tracer's model of x86 persistence, checked event by event, plus the candidate rules and
// replay tokens. (The toy-protocol tests show the whole simulator catching real bug classes.)
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <set>

#include "pmindex/crash/explorer.h"
#include "pmindex/crash/tracer.h"

namespace pmindex::crash {
namespace {

struct ModeScope {
  explicit ModeScope(pm::Mode m) { EXPECT_TRUE(pm::Runtime::acquire_mode(m)); }
  ~ModeScope() { pm::Runtime::release_mode(); }
};

constexpr std::size_t kRegion = 4096;
alignas(4096) char g_region[kRegion];

// Binds a tracer to g_region (zeroed) and records every crash point's lane lengths.
struct Traced {
  explicit Traced(pm::Mode m) : scope(m), tracer(m) {
    std::memset(g_region, 0, sizeof g_region);
    tracer.start();
    tracer.bind(g_region, kRegion);
    tracer.set_crash_hook([this](const CrashPoint& at) {
      points.push_back(at);
      lengths.push_back(tracer.lane_lengths());
    });
    tracer.begin_op(0);
  }
  ~Traced() { tracer.stop(); }
  std::vector<char> image(std::vector<std::uint32_t> choice) {
    std::vector<char> out(kRegion);
    EXPECT_TRUE(tracer.materialize(choice, out.data()));
    return out;
  }
  ModeScope scope;
  Tracer tracer;
  std::vector<CrashPoint> points;
  std::vector<std::vector<std::uint32_t>> lengths;
};

std::uint64_t word_at(const std::vector<char>& img, std::size_t off) {
  std::uint64_t v = 0;
  std::memcpy(&v, img.data() + off, 8);
  return v;
}

TEST(Tracer, AdrSixteenByteStoreIsTwoUnitsOfOneLine) {
  Traced t(pm::Mode::adr);
  struct Pair { std::uint64_t a, b; };
  pm::store(reinterpret_cast<Pair*>(g_region), Pair{1, 2});
  t.tracer.end_op();  // at-return crash point: nothing was flushed
  ASSERT_EQ(t.lengths.size(), 1u);
  EXPECT_EQ(t.lengths[0], (std::vector<std::uint32_t>{2}));
  EXPECT_TRUE(t.points[0].completed);
  auto torn = t.image({1});
  EXPECT_EQ(word_at(torn, 0), 1u);
  EXPECT_EQ(word_at(torn, 8), 0u);  // the second half did not reach PM
}

TEST(Tracer, UnalignedStoresSplitAtEightByteBoundariesAndLines) {
  Traced t(pm::Mode::adr);
  const std::uint64_t v = 0x1122334455667788ull;
  pm::store(reinterpret_cast<std::uint64_t*>(g_region + 4), v);   // units [4,8) and [8,12)
  pm::store(reinterpret_cast<std::uint64_t*>(g_region + 60), v);  // [60,64) line 0, [64,68) line 1
  t.tracer.end_op();
  ASSERT_EQ(t.lengths.size(), 1u);
  EXPECT_EQ(t.lengths[0], (std::vector<std::uint32_t>{3, 1}));
}

TEST(Tracer, FlushTakesEffectAtTheNextFenceOnly) {
  Traced t(pm::Mode::adr);
  auto* w = reinterpret_cast<std::uint64_t*>(g_region);
  pm::store(&w[0], std::uint64_t{7});
  pm::flush(&w[0], 8);
  EXPECT_EQ(word_at(t.tracer.persisted(), 0), 0u);  // not before the fence
  pm::store(&w[1], std::uint64_t{8});              // after the clwb, before the fence
  pm::fence();
  // The crash point just before the fence saw both units pending.
  ASSERT_EQ(t.lengths.size(), 1u);
  EXPECT_EQ(t.lengths[0], (std::vector<std::uint32_t>{2}));
  EXPECT_FALSE(t.points[0].completed);
  EXPECT_EQ(word_at(t.tracer.persisted(), 0), 7u);  // durable after the fence
  EXPECT_EQ(word_at(t.tracer.persisted(), 8), 0u);  // the late store is not guaranteed
  t.tracer.end_op();
  EXPECT_EQ(t.lengths.back(), (std::vector<std::uint32_t>{1}));
}

TEST(Tracer, PersistMakesALineDurableAndEmptiesItsLane) {
  Traced t(pm::Mode::adr);
  auto* w = reinterpret_cast<std::uint64_t*>(g_region + 128);
  pm::store(w, std::uint64_t{5});
  pm::persist(w, 8);
  t.tracer.end_op();
  EXPECT_EQ(word_at(t.tracer.persisted(), 128), 5u);
  EXPECT_TRUE(t.lengths.back().empty());
  EXPECT_EQ(t.points.size(), 2u);  // before the fence, and at the return
}

TEST(Tracer, EadrCrashPointAfterEveryStoreWithTheCallAsOneLane) {
  Traced t(pm::Mode::eadr);
  struct Pair { std::uint64_t a, b; };
  auto* w = reinterpret_cast<std::uint64_t*>(g_region);
  pm::store(&w[0], std::uint64_t{1});
  pm::store(reinterpret_cast<Pair*>(&w[2]), Pair{3, 4});
  pm::fence();  // no crash point in eadr
  t.tracer.end_op();
  ASSERT_EQ(t.points.size(), 3u);
  EXPECT_EQ(t.lengths[0], (std::vector<std::uint32_t>{1}));
  EXPECT_EQ(t.lengths[1], (std::vector<std::uint32_t>{2}));
  EXPECT_TRUE(t.lengths[2].empty());  // at return everything is durable
  EXPECT_EQ(word_at(t.tracer.persisted(), 16), 3u);
  EXPECT_EQ(word_at(t.tracer.persisted(), 24), 4u);
}

TEST(Tracer, EadrTornCallIsAProgramOrderPrefix) {
  Traced t(pm::Mode::eadr);
  std::vector<std::vector<char>> images;
  t.tracer.set_crash_hook([&](const CrashPoint&) {
    if (t.tracer.lanes().empty()) return;
    images.push_back(std::vector<char>(kRegion));
    ASSERT_TRUE(t.tracer.materialize(std::vector<std::uint32_t>{1}, images.back().data()));
  });
  struct Pair { std::uint64_t a, b; };
  pm::store(reinterpret_cast<Pair*>(g_region), Pair{3, 4});
  ASSERT_EQ(images.size(), 1u);
  EXPECT_EQ(word_at(images[0], 0), 3u);
  EXPECT_EQ(word_at(images[0], 8), 0u);
}

TEST(Tracer, BypassIsNamedByOffset) {
  Traced t(pm::Mode::adr);
  pm::store(reinterpret_cast<std::uint64_t*>(g_region), std::uint64_t{1});
  EXPECT_EQ(t.tracer.check_bypass(), "");
  g_region[200] = 9;  // a plain store: the tracer never heard of it
  const std::string msg = t.tracer.check_bypass();
  EXPECT_NE(msg.find("pool offset 200"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bypassed"), std::string::npos) << msg;
}

TEST(Tracer, ImageKeysDistinguishImagesAndCrashPoints) {
  Traced t(pm::Mode::adr);
  std::set<std::uint64_t> keys;
  t.tracer.set_crash_hook([&](const CrashPoint& at) {
    for (auto& c : candidate_choices(t.tracer.lane_lengths(), ExploreOptions{}, 1))
      keys.insert(t.tracer.image_key(c, at));
  });
  auto* w = reinterpret_cast<std::uint64_t*>(g_region);
  pm::store(&w[0], std::uint64_t{1});
  pm::store(&w[8], std::uint64_t{2});
  t.tracer.end_op();  // two lanes of one unit: four distinct images
  EXPECT_EQ(keys.size(), 4u);
}

TEST(Candidates, ExhaustiveWhenFewHeuristicOtherwise) {
  ExploreOptions o;
  o.exhaustive_limit = 128;
  o.pair_cap = 5;
  o.random_images = 3;
  const std::vector<std::uint32_t> few = {2, 3};  // 12 combinations
  std::set<std::vector<std::uint32_t>> distinct;
  for (auto& c : candidate_choices(few, o, 1)) distinct.insert(c);
  EXPECT_EQ(distinct.size(), 12u);
  EXPECT_EQ(candidate_choices(few, o, 1).front(), few);  // everything persisted first

  const std::vector<std::uint32_t> many(10, 1);  // 1024 combinations
  const auto c = candidate_choices(many, o, 1);
  // everything, nothing, 10 alone, 10 all-but-one, 5 sampled pairs, 3 random
  EXPECT_EQ(c.size(), 2u + 10 + 10 + 5 + 3);
  EXPECT_EQ(c, candidate_choices(many, o, 1));  // seeded: reproducible
  EXPECT_EQ(candidate_choices({}, o, 1).size(), 1u);
}

TEST(ReplayToken, RoundTripsAndRejectsGarbage) {
  ReplayToken t{"reflist.adr", 42, 17, 3, {1, 0, 2}};
  EXPECT_EQ(t.to_string(), "reflist.adr/42/17/3/1.0.2");
  auto back = ReplayToken::parse(t.to_string());
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->label, t.label);
  EXPECT_EQ(back->seed, 42u);
  EXPECT_EQ(back->op, 17u);
  EXPECT_EQ(back->point, 3u);
  EXPECT_EQ(back->choice, t.choice);
  auto empty = ReplayToken::parse("x/1/2/3/-");
  ASSERT_TRUE(empty.has_value());
  EXPECT_TRUE(empty->choice.empty());
  EXPECT_FALSE(ReplayToken::parse("x/1/2/3").has_value());
  EXPECT_FALSE(ReplayToken::parse("x/1/a/3/-").has_value());
  EXPECT_FALSE(ReplayToken::parse("x/1/2/3/1..2").has_value());
  EXPECT_FALSE(ReplayToken::parse("/1/2/3/-").has_value());
}

TEST(ExploreOptions, SeedsFromNumbersOrAnyText) {
  ::setenv("PMINDEX_CRASH_SEED", "0x10", 1);
  ::setenv("PMINDEX_CRASH_IMAGES", "123", 1);
  ExploreOptions o = ExploreOptions::from_env("x.adr", pm::Mode::adr);
  EXPECT_EQ(o.seed, 16u);
  EXPECT_EQ(o.images_budget, 123u);
  ::setenv("PMINDEX_CRASH_SEED", "86f9cb4e0aa", 1);  // a commit hash, verbatim
  const std::uint64_t a = ExploreOptions::from_env("x.adr", pm::Mode::adr).seed;
  ::setenv("PMINDEX_CRASH_SEED", "86f9cb4e0ab", 1);
  EXPECT_NE(a, ExploreOptions::from_env("x.adr", pm::Mode::adr).seed);
  ::setenv("PMINDEX_CRASH_REPLAY", "x.adr/5/1/2/-", 1);
  o = ExploreOptions::from_env("x.adr", pm::Mode::adr);
  ASSERT_TRUE(o.replay.has_value());
  EXPECT_EQ(o.seed, 5u);  // the token's seed wins
  ::unsetenv("PMINDEX_CRASH_SEED");
  ::unsetenv("PMINDEX_CRASH_IMAGES");
  ::unsetenv("PMINDEX_CRASH_REPLAY");
  EXPECT_EQ(ExploreOptions::from_env("x.adr", pm::Mode::adr, 77, 9).seed, 77u);
}

}  // namespace
}  // namespace pmindex::crash

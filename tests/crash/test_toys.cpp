// The simulator must be able to fail: toy persistence protocols with known bugs are each
// caught, and their correct versions pass (STYLE.md #13). Each toy writes one record per
// operation into its own slot; the checker classifies every slot of a crash image as absent,
// present or invalid, and demands: slots of completed operations present, the slot of the
// operation in flight present or absent, later slots absent, no slot invalid.
#include <gtest/gtest.h>

#include <csignal>
#include <cstring>
#include <functional>
#include <iostream>

#include "pmindex/crash/explorer.h"
#include "pmindex/pm/pool.h"

namespace pmindex::crash {
namespace {

enum class SlotState { absent, present, invalid };

// Slot j: line A at heap + j*128 (data), line B at heap + j*128 + 64 (flag).
constexpr std::size_t kHeap = pm::kHeaderSize;
constexpr std::size_t kSlots = 6;
std::uint64_t value_of(std::size_t j) { return 0xABC00000ull + j; }

struct Slot {
  std::uint64_t data[2];    // line A, words 0-1
  std::uint64_t hint;       // line A, word 2: ignored by every checker
  std::uint64_t late_flag;  // line A, word 3: the store-after-clwb toy's commit word
  std::uint64_t pad_a[4];
  std::uint64_t flag;       // line B
  std::uint64_t pad_b[7];
};
static_assert(sizeof(Slot) == 128);

struct Toy {
  std::string name;
  std::function<void(Slot*, std::size_t)> write;  // operation j
  std::function<SlotState(const Slot&, std::size_t)> state;
};

class ToyScenario final : public Scenario {
 public:
  explicit ToyScenario(Toy toy) : toy_(std::move(toy)) {}
  Result<Region> setup() override {
    pool_.reset();
    pm::PoolOptions po;
    po.size = pm::kMinPoolSize;
    po.mode = mode_;
    po.layout = pm::Layout{"toy", 0, pm::KeyMode::u64, 0};
    auto pool = pm::Pool::create(po);
    if (!pool.ok()) return pool.status();
    pool_ = std::move(pool).value();
    return Region{pool_->base(), pool_->size()};
  }
  std::size_t op_count() const override { return kSlots; }
  Status run_op(std::size_t i) override {
    toy_.write(slot(pool_->base(), i), i);
    return Status::Ok();
  }
  Status check_image(std::span<char> image, const CrashPoint& at, std::uint64_t) override {
    for (std::size_t j = 0; j < kSlots; ++j) {
      const SlotState s = toy_.state(*slot(image.data(), j), j);
      const bool must = j < at.op || (j == at.op && at.completed);
      const bool may = must || j == at.op;
      if (s == SlotState::invalid)
        return Status(Code::corrupted, "slot " + std::to_string(j) + " is half written");
      if (s == SlotState::present && !may)
        return Status(Code::corrupted, "slot " + std::to_string(j) + " appeared early");
      if (s == SlotState::absent && must)
        return Status(Code::corrupted, "slot " + std::to_string(j) + " of a completed op is lost");
    }
    return Status::Ok();
  }
  void teardown() override { pool_.reset(); }
  void set_mode(pm::Mode m) { mode_ = m; }

 private:
  static Slot* slot(char* base, std::size_t j) {
    return reinterpret_cast<Slot*>(base + kHeap + j * sizeof(Slot));
  }
  Toy toy_;
  pm::Mode mode_ = pm::Mode::adr;
  std::unique_ptr<pm::Pool> pool_;
};

ExploreReport run_toy(const Toy& toy, pm::Mode mode, std::optional<ReplayToken> replay = {}) {
  ToyScenario s(toy);
  s.set_mode(mode);
  ExploreOptions o;
  o.label = toy.name + "." + std::string(pm::to_string(mode));
  o.mode = mode;
  o.seed = 7;
  o.images_budget = 0;  // toys are tiny: check every candidate
  o.max_failures = 1;
  o.replay = std::move(replay);
  return explore(s, o);
}

// data valid iff flag set
SlotState flag_guards_data(const Slot& s, std::size_t j) {
  if (s.flag == 0) return SlotState::absent;
  return s.data[0] == value_of(j) ? SlotState::present : SlotState::invalid;
}

const Toy kFlagBeforeData{"flag_before_data",
                          [](Slot* s, std::size_t j) {
                            pm::store(&s->flag, std::uint64_t{1});  // BUG: flag first
                            pm::persist(&s->flag, 8);
                            pm::store(&s->data[0], value_of(j));
                            pm::persist(&s->data[0], 8);
                          },
                          flag_guards_data};
const Toy kDataBeforeFlag{"data_before_flag",
                          [](Slot* s, std::size_t j) {
                            pm::store(&s->data[0], value_of(j));
                            pm::persist(&s->data[0], 8);
                            pm::store(&s->flag, std::uint64_t{1});
                            pm::persist(&s->flag, 8);
                          },
                          flag_guards_data};

const Toy kSameEpoch{"same_epoch",
                     [](Slot* s, std::size_t j) {
                       pm::store(&s->data[0], value_of(j));
                       pm::store(&s->flag, std::uint64_t{1});
                       pm::flush(&s->data[0], 8);  // BUG: no fence between data and flag
                       pm::flush(&s->flag, 8);
                       pm::fence();
                     },
                     flag_guards_data};

// A 16-byte payload whose halves must agree.
SlotState pair_whole(const Slot& s, std::size_t j) {
  if (s.data[0] == 0 && s.data[1] == 0) return SlotState::absent;
  return s.data[0] == value_of(j) && s.data[1] == value_of(j) ? SlotState::present
                                                                : SlotState::invalid;
}
struct Pair {
  std::uint64_t a, b;
};
const Toy kTorn16{"torn16",
                  [](Slot* s, std::size_t j) {
                    // BUG: 16 bytes are not failure-atomic, and nothing else commits them.
                    pm::store(reinterpret_cast<Pair*>(s->data), Pair{value_of(j), value_of(j)});
                    pm::persist(s->data, 16);
                  },
                  pair_whole};
SlotState pair_committed(const Slot& s, std::size_t j) {
  if (s.flag == 0) return SlotState::absent;
  return pair_whole(s, j) == SlotState::present ? SlotState::present : SlotState::invalid;
}
const Toy kCommitted16{"committed16",
                       [](Slot* s, std::size_t j) {
                         pm::store(reinterpret_cast<Pair*>(s->data),
                                   Pair{value_of(j), value_of(j)});
                         pm::persist(s->data, 16);
                         pm::publish(&s->flag, 1);  // one 8-byte word commits the 16 bytes
                         pm::persist(&s->flag, 8);
                       },
                       pair_committed};

// The commit word shares the data's line.
SlotState late_flag_guards_data(const Slot& s, std::size_t j) {
  if (s.late_flag == 0) return SlotState::absent;
  return s.data[0] == value_of(j) ? SlotState::present : SlotState::invalid;
}
const Toy kStoreAfterClwb{"store_after_clwb",
                          [](Slot* s, std::size_t j) {
                            pm::store(&s->data[0], value_of(j));
                            pm::flush(&s->data[0], 8);
                            pm::store(&s->late_flag, std::uint64_t{1});  // BUG: after the clwb
                            pm::fence();
                          },
                          late_flag_guards_data};
const Toy kStoreBeforeClwb{"store_before_clwb",
                           [](Slot* s, std::size_t j) {
                             pm::store(&s->data[0], value_of(j));
                             // same line, program order: the flag cannot persist without data
                             pm::store(&s->late_flag, std::uint64_t{1});
                             pm::flush(&s->data[0], 8);
                             pm::fence();
                           },
                           late_flag_guards_data};

const Toy kMissingFence{"missing_fence",
                        [](Slot* s, std::size_t j) {
                          pm::store(&s->data[0], value_of(j));
                          pm::persist(&s->data[0], 8);
                          pm::store(&s->flag, std::uint64_t{1});
                          pm::flush(&s->flag, 8);  // BUG: returns without the fence
                        },
                        flag_guards_data};

const Toy kBypass{"bypass",
                  [](Slot* s, std::size_t j) {
                    pm::store(&s->data[0], value_of(j));
                    pm::persist(&s->data[0], 8);
                    s->hint = j + 1;  // BUG: a plain store into PM (no checker reads it)
                    pm::store(&s->flag, std::uint64_t{1});
                    pm::persist(&s->flag, 8);
                  },
                  flag_guards_data};
const Toy kNoBypass{"no_bypass",
                    [](Slot* s, std::size_t j) {
                      pm::store(&s->data[0], value_of(j));
                      pm::persist(&s->data[0], 8);
                      pm::store(&s->hint, std::uint64_t{j + 1});
                      pm::store(&s->flag, std::uint64_t{1});
                      pm::persist(&s->flag, 8);
                    },
                    flag_guards_data};

void expect_caught(const Toy& toy, pm::Mode mode, const std::string& what) {
  const ExploreReport r = run_toy(toy, mode);
  ASSERT_FALSE(r.ok()) << toy.name << " in " << pm::to_string(mode) << " was not caught: "
                       << r.to_string();
  EXPECT_NE(r.failures[0].message.find(what), std::string::npos) << r.to_string();
  if (r.failures[0].image) {
    EXPECT_NE(r.to_string().find("PMINDEX_CRASH_REPLAY='" + toy.name), std::string::npos);
  } else {
    EXPECT_NE(r.to_string().find("PMINDEX_CRASH_SEED=7"), std::string::npos);
  }
  std::cout << "[caught] " << toy.name << " (" << pm::to_string(mode) << "): " << r.to_string()
            << "\n";
}

void expect_passes(const Toy& toy, pm::Mode mode) {
  const ExploreReport r = run_toy(toy, mode);
  EXPECT_TRUE(r.ok()) << toy.name << " in " << pm::to_string(mode) << ": " << r.to_string();
  EXPECT_GT(r.images_checked, 0u);
}

TEST(Toys, FlagPersistedBeforeData) {
  expect_caught(kFlagBeforeData, pm::Mode::adr, "half written");
  expect_caught(kFlagBeforeData, pm::Mode::eadr, "half written");
  expect_passes(kDataBeforeFlag, pm::Mode::adr);
  expect_passes(kDataBeforeFlag, pm::Mode::eadr);
}

TEST(Toys, DataAndFlagInOneEpoch) {
  expect_caught(kSameEpoch, pm::Mode::adr, "half written");
  // With eADR, program order is persistence order: the same code is correct there.
  expect_passes(kSameEpoch, pm::Mode::eadr);
}

TEST(Toys, TornSixteenByteWrite) {
  expect_caught(kTorn16, pm::Mode::adr, "half written");
  expect_caught(kTorn16, pm::Mode::eadr, "half written");
  expect_passes(kCommitted16, pm::Mode::adr);
  expect_passes(kCommitted16, pm::Mode::eadr);
}

TEST(Toys, StoreAfterClwbBeforeFence) {
  expect_caught(kStoreAfterClwb, pm::Mode::adr, "of a completed op is lost");
  expect_passes(kStoreBeforeClwb, pm::Mode::adr);
  expect_passes(kStoreBeforeClwb, pm::Mode::eadr);
}

TEST(Toys, MissingFence) {
  expect_caught(kMissingFence, pm::Mode::adr, "of a completed op is lost");
  expect_passes(kMissingFence, pm::Mode::eadr);  // eADR needs no fence for durability
}

TEST(Toys, StoreBypassingTheApi) {
  expect_caught(kBypass, pm::Mode::adr, "bypassed");
  expect_caught(kBypass, pm::Mode::eadr, "bypassed");
  const ExploreReport r = run_toy(kBypass, pm::Mode::adr);
  ASSERT_FALSE(r.ok());
  EXPECT_FALSE(r.failures[0].image);
  // Slot 0's hint word: heap + 16.
  EXPECT_NE(r.failures[0].message.find("pool offset " + std::to_string(kHeap + 16)),
            std::string::npos)
      << r.to_string();
  expect_passes(kNoBypass, pm::Mode::adr);
  expect_passes(kNoBypass, pm::Mode::eadr);
}

TEST(Toys, ReplayTokenReproducesTheFailure) {
  for (pm::Mode mode : {pm::Mode::adr, pm::Mode::eadr}) {
    const ExploreReport first = run_toy(kTorn16, mode);
    ASSERT_FALSE(first.ok());
    const ReplayToken token = first.failures[0].token;
    const ExploreReport again = run_toy(kTorn16, mode, token);
    ASSERT_FALSE(again.ok()) << again.to_string();
    EXPECT_EQ(again.images_checked, 1u);
    EXPECT_EQ(again.failures[0].message, first.failures[0].message);
    EXPECT_EQ(again.failures[0].token.to_string(), token.to_string());
    // A token for another configuration is skipped, not misapplied.
    ReplayToken other = token;
    other.label = "something.else";
    const ExploreReport skipped = run_toy(kTorn16, mode, other);
    EXPECT_TRUE(skipped.replay_skipped);
    EXPECT_EQ(skipped.images_checked, 0u);
  }
}

// A recovery that kills the process must still name the image it was checking.
class DyingScenario final : public Scenario {
 public:
  explicit DyingScenario(int sig) : sig_(sig) {}
  Result<Region> setup() override { return inner_.setup(); }
  std::size_t op_count() const override { return inner_.op_count(); }
  Status run_op(std::size_t i) override { return inner_.run_op(i); }
  Status check_image(std::span<char>, const CrashPoint& at, std::uint64_t) override {
    if (at.op == 2) raise(sig_);
    return Status::Ok();
  }
  void teardown() override { inner_.teardown(); }

 private:
  int sig_;
  ToyScenario inner_{kDataBeforeFlag};
};

TEST(ToysDeathTest, ACrashingCheckPrintsItsReplayToken) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  for (int sig : {SIGSEGV, SIGABRT}) {
    EXPECT_DEATH(
        {
          DyingScenario s(sig);
          ExploreOptions o;
          o.label = "dying";
          o.images_budget = 0;
          (void)explore(s, o);
        },
        "died while checking image PMINDEX_CRASH_REPLAY='dying/1/2/0/");
  }
}

TEST(Toys, BudgetIsRespected) {
  ToyScenario s(kDataBeforeFlag);
  ExploreOptions o;
  o.label = "budget";
  o.mode = pm::Mode::adr;
  o.images_budget = 5;
  const ExploreReport r = explore(s, o);
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_EQ(r.images_checked, 5u);  // fewer than crash points: first or random candidates
  EXPECT_GT(r.candidate_images, 5u);
  ToyScenario s2(kDataBeforeFlag);
  o.images_budget = 20;  // half to first candidates, half to random ones (make_plan)
  const ExploreReport r2 = explore(s2, o);
  EXPECT_TRUE(r2.ok()) << r2.to_string();
  EXPECT_EQ(r2.images_checked, 20u);
  EXPECT_GT(r2.candidate_images, 20u);
}

// A loss that only a lane combination shows: line A takes four stores (data[0], data[1], hint,
// late_flag) and line B the flag, all made durable by one fence. Recovery trusts the flag once
// data[1] is there, but needs late_flag too, so an image with A persisted up to data[1] or hint
// and B persisted is half written. No structured candidate (everything, nothing, one lane
// alone, all lanes but one) is such an image. A budget above the number of crash points but
// below the candidates must still sample combinations: a plan that spent it all on the first
// structured candidates of every point (the explorer until stop 25) never caught this.
SlotState flag_needs_late_flag(const Slot& s, std::size_t j) {
  if (s.flag == 0) return SlotState::absent;
  if (s.data[1] == value_of(j) && s.late_flag == 0) return SlotState::invalid;
  return SlotState::present;
}
const Toy kOneFenceForTwoLines{"one_fence_two_lines",
                               [](Slot* s, std::size_t j) {
                                 pm::store(&s->data[0], value_of(j));
                                 pm::store(&s->data[1], value_of(j));
                                 pm::store(&s->hint, std::uint64_t{j + 1});
                                 pm::store(&s->late_flag, std::uint64_t{1});
                                 pm::store(&s->flag, std::uint64_t{1});
                                 pm::flush(s->data, 32);  // BUG: the flag's line in the same
                                 pm::flush(&s->flag, 8);  // epoch as the data's
                                 pm::fence();
                               },
                               flag_needs_late_flag};

TEST(Toys, BudgetSamplesLaneCombinations) {
  ToyScenario s(kOneFenceForTwoLines);
  ExploreOptions o;
  o.label = "combinations.adr";
  o.mode = pm::Mode::adr;
  o.seed = 7;
  o.max_failures = 1;
  o.images_budget = 0;
  const ExploreReport all = explore(s, o);
  ASSERT_FALSE(all.ok()) << "the toy's bug needs a combination that exists";
  o.images_budget = all.candidate_images / 2;  // more than the crash points, fewer than all
  ASSERT_GT(o.images_budget, 2 * kSlots);
  const ExploreReport half = explore(s, o);
  EXPECT_FALSE(half.ok()) << "a budget of " << o.images_budget << " of "
                          << all.candidate_images << " candidates checked no combination";
}

// The crash kit's coverage rule: budget reached (>= 90%), or every candidate checked, else short.
TEST(Toys, CoverageSaysWhetherTheBudgetWasExplored) {
  ExploreOptions o;
  o.images_budget = 1000;
  ExploreReport r;
  r.candidate_images = 5000;
  r.images_checked = 51;  // what the old "> min(budget, 100) / 2" check let pass
  EXPECT_EQ(r.coverage(o), ExploreReport::Coverage::short_of_budget);
  EXPECT_NE(r.coverage_text(o).find("SHORT"), std::string::npos);
  r.images_checked = 899;
  EXPECT_EQ(r.coverage(o), ExploreReport::Coverage::short_of_budget);
  r.images_checked = 900;
  EXPECT_EQ(r.coverage(o), ExploreReport::Coverage::budget_reached);
  r.candidate_images = 412;  // a small workload checked all it offered
  r.images_checked = 412;
  EXPECT_EQ(r.coverage(o), ExploreReport::Coverage::exhausted);
  // A real run: the toy offers more than 5 images and a budget of 5 is met exactly.
  ToyScenario s(kDataBeforeFlag);
  o.label = "coverage";
  o.images_budget = 5;
  EXPECT_EQ(explore(s, o).coverage(o), ExploreReport::Coverage::budget_reached);
}

}  // namespace
}  // namespace pmindex::crash

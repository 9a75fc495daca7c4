// An index defined outside the library (examples/pair_log.h) registered with
// IndexRegistry::add: refused registrations, opened by kind, randomized against std::map with
// reopen, and crash-tested by the library's crash driver like a built-in kind (adr and eadr),
// including a deliberately broken variant the driver must catch.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>

#include "index/common/crash_kit.h"
#include "index/common/hybrid_test_support.h"
#include "pair_log.h"
#include "pmindex/crash/index_driver.h"
#include "pmindex/index.h"
#include "support/temp_dir.h"

namespace pmindex::crash {
namespace {

void register_once() {
  static const bool done = [] {
    EXPECT_TRUE(IndexRegistry::add(pair_log::PairLog<>::entry("pair_log")).ok());
    EXPECT_TRUE(IndexRegistry::add(pair_log::PairLog<false>::entry("pair_log_bad")).ok());
    return true;
  }();
  (void)done;
}

TEST(ExternalIndex, RegistrationRefusesBadEntries) {
  register_once();
  const auto entry = [](std::string name) { return pair_log::PairLog<>::entry(std::move(name)); };
  for (const char* bad : {"", "PairLog", "pair-log", "a_name_of_16_chr", "lbtree", "pair_log"})
    EXPECT_EQ(IndexRegistry::add(entry(bad)).code(), Code::invalid_argument) << "'" << bad << "'";
  IndexRegistry::Entry missing = entry("pair_log_x");
  missing.recover = nullptr;
  EXPECT_EQ(IndexRegistry::add(missing).code(), Code::invalid_argument);
  EXPECT_EQ(IndexRegistry::find("pair_log_x"), nullptr);  // nothing registered on refusal
  // Added kinds follow the built-in ones in entries() and names().
  const std::vector<std::string> names = IndexRegistry::names();
  ASSERT_GE(names.size(), 2u);
  EXPECT_EQ(names[names.size() - 2], "pair_log");
  EXPECT_EQ(names.back(), "pair_log_bad");
  EXPECT_EQ(IndexRegistry::find("pair_log")->name, "pair_log");
}

TEST(ExternalIndex, OpenedByKindAndCheckedAgainstAMap) {
  register_once();
  testing::TempDir dir;
  Options o;
  o.kind = "pair_log";
  o.path = dir.file("p.pool");
  o.expected_records = 4'000;
  EXPECT_EQ(Index::open([&] { Options bad = o; bad.key_type = KeyType::bytes; return bad; }())
                .status().code(),
            Code::invalid_argument);
  std::map<std::uint64_t, std::uint64_t> model;
  std::mt19937_64 rng(7);
  for (int round = 0; round < 3; ++round) {
    auto idx = Index::open(o);
    ASSERT_TRUE(idx.ok()) << idx.status().to_string();
    EXPECT_EQ((*idx)->recovery_stats().records, model.size());
    for (int i = 0; i < 3'000; ++i) {
      const std::uint64_t k = rng() % 500, v = rng();
      switch (rng() % 4) {
        case 0: EXPECT_EQ((*idx)->insert(encode_u64(k), encode_u64(v)) == Code::ok,
                          model.emplace(k, v).second); break;
        case 1: EXPECT_EQ((*idx)->update(encode_u64(k), encode_u64(v)) == Code::ok,
                          model.contains(k));
                if (model.contains(k)) { model[k] = v; }
                break;
        case 2: EXPECT_EQ((*idx)->remove(encode_u64(k)) == Code::ok, model.erase(k) == 1); break;
        default: {
          std::string got;
          const bool present = model.contains(k);
          ASSERT_EQ((*idx)->find(encode_u64(k), &got) == Code::ok, present);
          if (present) { EXPECT_EQ(decode_u64(got), model[k]); }
        }
      }
    }
    ScanBuffer out;
    (*idx)->scan(encode_u64(100), 50, out);
    auto it = model.lower_bound(100);
    for (std::size_t j = 0; j < out.size(); ++j, ++it) {
      ASSERT_NE(it, model.end());
      EXPECT_EQ(decode_u64(out.key(j)), it->first);
    }
    EXPECT_TRUE((*idx)->verify().ok());
    EXPECT_EQ((*idx)->size(), model.size());  // what the kind reports to Index::size()
    if (round == 1) {  // the other rounds end as a crash would
      ASSERT_TRUE((*idx)->close().ok());
    }
  }
}

TEST(ExternalIndex, CrashDriverAdrAndEadr) {
  register_once();
  for (pm::Mode mode : {pm::Mode::adr, pm::Mode::eadr}) {
    hybrid_test::RegistryCrashRun r;
    r.options.kind = "pair_log";
    r.mode = mode;
    r.label = "pair_log." + std::string(pm::to_string(mode));
    hybrid_test::run_registry_crash(r);
  }
}

// The broken variant publishes a node before persisting it: an ADR image with the head
// persisted and the node not cuts the chain, losing completed inserts.
TEST(ExternalIndex, CrashDriverCatchesPublishBeforePersist) {
  register_once();
  crash::IndexCrashConfig cfg;
  cfg.options.kind = "pair_log_bad";
  cfg.ops = 40;
  crash::ExploreOptions opt;
  opt.label = "pair_log_bad.adr";
  opt.mode = pm::Mode::adr;
  opt.images_budget = 300;
  const crash::ExploreReport r = crash::run_index_crash(cfg, opt);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.failures[0].message.find("match no acceptable state"), std::string::npos)
      << r.to_string();
}

}  // namespace
}  // namespace pmindex::crash

// pmbench's driver end to end, in-process: PiBench bugs 1, 3 and 5 on a real run, the
// conformance checker failing on a broken wrapper, recovery measurement.
#include <gtest/gtest.h>

#include <cstdlib>

#include "config.h"
#include "driver.h"
#include "pmindex/index.h"
#include "target.h"

namespace pmbench {
namespace {

Config small(const std::string& target) {
  Config c;
  c.target = target;
  c.records = 2000;
  c.operations = 20000;
  c.progress = false;
  c.quiet = true;
  return c;
}

// Bugs 1 and 3: parallel load, 4 threads at 50/50 read/insert; every insert and read succeeds
// (PiBench: 0 successful inserts at 4 threads, 17% read misses).
TEST(Driver, ParallelInsertsAllSucceedAndReadsAllHit) {
  Config c = small("reflist");
  c.threads = 4;
  c.ratio[0] = 0.5;
  c.ratio[1] = 0.5;
  const auto violations = TimedSection::violations.load();
  RunResult r;
  std::string error;
  ASSERT_TRUE(run_once(c, 0, &r, &error)) << error;
  EXPECT_EQ(r.ops[0].completed, 10000u);
  EXPECT_EQ(r.ops[1].completed, 10000u);
  EXPECT_EQ(r.ops[0].succeeded, r.ops[0].completed);
  EXPECT_EQ(r.ops[1].succeeded, r.ops[1].completed);
  EXPECT_TRUE(r.structure_error.empty()) << r.structure_error;
  // Bug 5: nothing was generated while the clock ran.
  EXPECT_EQ(TimedSection::violations.load(), violations);
}

// Every built-in index (as the registry grows, new indexes are covered here) and comparator.
TEST(Driver, ConformancePassesOnEveryBuiltinAndComparator) {
  std::vector<std::string> targets = pmindex::IndexRegistry::names();
  for (const auto& n : dram_comparator_names()) targets.push_back(n);
  for (const std::string& t : targets) {
    Config c = small(t);
    c.verify = true;
    c.value_bits = 64;
    c.threads = 2;
    const double mix[kOpTypes] = {0.3, 0.2, 0.2, 0.1, 0.2};
    std::copy(mix, mix + kOpTypes, c.ratio);
    RunResult r;
    std::string error;
    ASSERT_TRUE(run_once(c, 0, &r, &error)) << t << ": " << error;
    EXPECT_TRUE(r.verify_error.empty()) << t << ": " << r.verify_error;
    EXPECT_EQ(r.checked, c.operations) << t;
  }
}

TEST(Driver, ConformanceFailsOnEveryBugOfTheBrokenWrapper) {
  // Armed after the load, so post-load validation passes and --verify must catch each bug.
  ::setenv("PMBENCH_BROKEN_AFTER", "2000", 1);
  for (const char* bug : {"update", "scan", "insert"}) {
    ::setenv("PMBENCH_BROKEN", bug, 1);
    Config c = small(PMBENCH_BROKEN_TREE);
    c.verify = true;
    const double mix[kOpTypes] = {0.4, 0.2, 0.2, 0, 0.2};
    std::copy(mix, mix + kOpTypes, c.ratio);
    RunResult r;
    std::string error;
    ASSERT_TRUE(run_once(c, 0, &r, &error)) << error;
    EXPECT_FALSE(r.verify_error.empty()) << "bug '" << bug << "' went unnoticed";
    EXPECT_LT(r.completed, c.operations) << "conformance must stop at the first mismatch";
  }
  ::setenv("PMBENCH_BROKEN", "none", 1);
  Config c = small(PMBENCH_BROKEN_TREE);
  c.verify = true;
  const double mix[kOpTypes] = {0.4, 0.2, 0.2, 0, 0.2};
  std::copy(mix, mix + kOpTypes, c.ratio);
  RunResult r;
  std::string error;
  ASSERT_TRUE(run_once(c, 0, &r, &error)) << error;
  EXPECT_TRUE(r.verify_error.empty()) << r.verify_error;
  ::unsetenv("PMBENCH_BROKEN");
  ::unsetenv("PMBENCH_BROKEN_AFTER");
}

TEST(Driver, PostLoadValidationCatchesBrokenLoad) {
  ::setenv("PMBENCH_BROKEN", "insert", 1);
  ::setenv("PMBENCH_BROKEN_AFTER", "0", 1);
  Config c = small(PMBENCH_BROKEN_TREE);
  RunResult r;
  std::string error;
  EXPECT_FALSE(run_once(c, 0, &r, &error));
  EXPECT_NE(error.find("post-load validation"), std::string::npos) << error;
  ::unsetenv("PMBENCH_BROKEN");
  ::unsetenv("PMBENCH_BROKEN_AFTER");
}

TEST(Driver, RecoveryAfterCleanCloseAndKill9) {
  for (const char* kind : {"clean", "crash"}) {
    Config c = small("reflist");
    c.operations = 2000;
    c.recovery = kind;
    RunResult r;
    std::string error;
    ASSERT_TRUE(run_once(c, 0, &r, &error)) << kind << ": " << error;
    ASSERT_TRUE(r.has_recovery);
    EXPECT_GE(r.recovery.records_found, c.records) << kind;
    EXPECT_GT(r.recovery.answer_seconds, 0) << kind;
    EXPECT_EQ(r.recovery.clean_shutdown, std::string(kind) == "clean");
  }
}

TEST(Driver, TimeModeRunsAndBulkLoad) {
  Config c = small("reflist");
  c.mode = RunMode::time;
  c.seconds = 0.3;
  c.sampling_ms = 100;
  c.bulk_load = true;
  RunResult r;
  std::string error;
  ASSERT_TRUE(run_once(c, 0, &r, &error)) << error;
  EXPECT_EQ(r.load_method, "bulk_load");
  EXPECT_GT(r.completed, 0u);
  EXPECT_EQ(r.succeeded, r.completed);
  EXPECT_GE(r.throughput_series.size(), 2u);
}

}  // namespace
}  // namespace pmbench

#include <unistd.h>

#include <bit>
#include <fstream>

namespace pmbench {
namespace {

// A SOSD file of n keys (integers, or doubles' bits), sorted as SOSD ships them.
std::string sosd_file(std::uint64_t n, bool doubles) {
  const std::string path = "/tmp/pmbench-driver-" + std::to_string(::getpid()) + (doubles ? "-f64" : "-u64");
  std::vector<std::uint64_t> keys;
  for (std::uint64_t i = 0; i < n; ++i)
    keys.push_back(doubles ? std::bit_cast<std::uint64_t>(-1000.5 + 0.25 * i) : i * i * 31 + 7);
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(reinterpret_cast<const char*>(keys.data()), static_cast<std::streamsize>(n * 8));
  return path;
}

TEST(Driver, SosdDatasetConformance) {
  for (bool doubles : {false, true}) {
    const std::string path = sosd_file(6000, doubles);
    Config c = small("reflist");
    c.dataset = path;
    c.key_type = doubles ? "double" : "u64";
    c.verify = true;
    c.value_bits = 64;
    c.threads = 2;
    const double mix[kOpTypes] = {0.3, 0.2, 0.2, 0.1, 0.2};
    std::copy(mix, mix + kOpTypes, c.ratio);
    RunResult r;
    std::string error;
    ASSERT_TRUE(run_once(c, 0, &r, &error)) << error;
    EXPECT_TRUE(r.verify_error.empty()) << r.verify_error;
    // 20000 operations with 20% inserts need 4000 more keys than the 2000 loaded: fits in 6000.
    c.operations = 40000;
    EXPECT_FALSE(run_once(c, 0, &r, &error));
    EXPECT_NE(error.find("more keys than the dataset"), std::string::npos) << error;
    ::unlink(path.c_str());
  }
}

}  // namespace
}  // namespace pmbench

// pmbench's driver end to end, in-process: PiBench bugs 1, 3 and 5 on a real run, the
// conformance checker failing on a broken wrapper, recovery measurement.
#include <gtest/gtest.h>

#include <cstdlib>

#include "config.h"
#include "driver.h"
#include "pmindex/index.h"
#include "report.h"
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

// A read-only or insert-only run without timed operations goes through the driver's
// single-type loop (a built-in index called directly, plain 8-byte keys computed inline);
// with every operation timed it goes through the general loop. Both must find every loaded
// key (insert every new one) and count alike, for the three forms of the loop: inline keys
// (apex), format-written keys (double keys), and a tree_api session.
TEST(Driver, SingleTypeLoopAnswersLikeTheGeneralLoop) {
  struct Form {
    const char* target;
    const char* key_type;
  };
  ::setenv("PMBENCH_BROKEN", "none", 1);
  for (const Form f : {Form{"apex", "u64"}, Form{"lbtree", "double"}, Form{PMBENCH_BROKEN_TREE, "u64"}}) {
    for (const int type : {0, 1}) {  // reads, inserts
      std::uint64_t succeeded[2] = {};
      for (const double sampling : {0.0, 1.0}) {
        Config c = small(f.target);
        c.key_type = f.key_type;
        c.latency_sampling = sampling;
        c.ratio[0] = type == 0 ? 1 : 0;
        c.ratio[1] = type == 1 ? 1 : 0;
        RunResult r;
        std::string error;
        ASSERT_TRUE(run_once(c, 0, &r, &error)) << f.target << ": " << error;
        EXPECT_EQ(r.ops[type].completed, c.operations) << f.target;
        EXPECT_TRUE(r.structure_error.empty()) << f.target << ": " << r.structure_error;
        succeeded[sampling > 0] = r.ops[type].succeeded;
      }
      EXPECT_EQ(succeeded[0], 20000u) << f.target << " " << op_name(type) << ": the single-type loop";
      EXPECT_EQ(succeeded[1], 20000u) << f.target << " " << op_name(type);
    }
  }
  ::unsetenv("PMBENCH_BROKEN");
}

// An insert-only run into a pool too small for it stops at the first pool_full in the
// single-type loop (no sampling) as in the general loop (every operation timed): the run is
// void, not a throughput of failures (PoolFullVoidsTheRun below is the same for the first).
TEST(Driver, SingleTypeLoopStopsAtPoolFull) {
  for (const double sampling : {0.0, 1.0}) {
    Config c = small("lbtree");
    c.records = 1000;
    c.operations = 2'000'000;
    c.ratio[0] = 0;
    c.ratio[1] = 1;
    c.pool_size = 16 << 20;  // holds about 650,000 records
    c.latency_sampling = sampling;
    RunResult r;
    std::string error;
    EXPECT_FALSE(run_once(c, 0, &r, &error)) << sampling;
    EXPECT_NE(error.find("the pool filled up during the run"), std::string::npos) << error;
  }
}

// --prefault: the pool is mapped before the run, so an insert run into a fresh pool takes
// almost no page faults; without it the same run faults on the pool pages it grows into (the
// contrast shows the count can fail).
TEST(Driver, PrefaultKeepsPoolFaultsOutOfTheRun) {
  std::uint64_t faults[2] = {};
  for (const bool prefault : {false, true}) {
    Config c = small("lbtree");
    c.records = 1000;
    c.operations = 100000;
    c.ratio[0] = 0;
    c.ratio[1] = 1;
    c.prefault = prefault;
    RunResult r;
    std::string error;
    ASSERT_TRUE(run_once(c, 0, &r, &error)) << error;
    EXPECT_EQ(r.ops[1].succeeded, 100000u);
    EXPECT_EQ(r.prefault, prefault ? "on" : "");
    faults[prefault] = r.run_page_faults;
  }
  // 100k random inserts fill ~10k leaves of 256 B (14 slots, ~70% full): ~600 pool pages,
  // plus DRAM-arena regions (598 measured in a release build, 2026-11-27).
  EXPECT_GT(faults[0], 400u);
  EXPECT_LT(faults[1], faults[0] / 2);
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

// --batch: runs of consecutive reads go through Session::find_many (Index::find_many for the
// built-in indexes, find per key for the comparators); every batched answer is checked by the
// same conformance model, with writes in between.
TEST(Driver, BatchedReadsPassConformanceOnEveryBuiltinAndComparator) {
  std::vector<std::string> targets = pmindex::IndexRegistry::names();
  for (const auto& n : dram_comparator_names()) targets.push_back(n);
  for (const std::string& t : targets) {
    Config c = small(t);
    c.verify = true;
    c.value_bits = 64;
    c.threads = 2;
    c.batch = 16;
    const double mix[kOpTypes] = {0.8, 0.1, 0.05, 0.05, 0};
    std::copy(mix, mix + kOpTypes, c.ratio);
    RunResult r;
    std::string error;
    ASSERT_TRUE(run_once(c, 0, &r, &error)) << t << ": " << error;
    EXPECT_TRUE(r.verify_error.empty()) << t << ": " << r.verify_error;
    EXPECT_EQ(r.checked, c.operations) << t;
    EXPECT_EQ(r.ops[0].completed + r.ops[1].completed + r.ops[2].completed + r.ops[3].completed,
              c.operations)
        << t;
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
    EXPECT_TRUE(r.recovery.records_counted) << kind;
    EXPECT_GE(r.recovery.records_found, c.records) << kind;
    EXPECT_GT(r.recovery.answer_seconds, 0) << kind;
    EXPECT_EQ(r.recovery.clean_shutdown, std::string(kind) == "clean");
  }
}

// A run whose pool fills up measures the full pool, not the index: it fails, saying what to do.
TEST(Driver, PoolFullVoidsTheRun) {
  Config c = small("lbtree");
  c.records = 1000;
  c.operations = 2'000'000;
  c.ratio[0] = 0;
  c.ratio[1] = 1;
  c.pool_size = 16 << 20;  // holds about 650,000 records
  RunResult r;
  std::string error;
  EXPECT_FALSE(run_once(c, 0, &r, &error));
  EXPECT_NE(error.find("the pool filled up during the run"), std::string::npos) << error;
  EXPECT_NE(error.find("--pool_size"), std::string::npos) << error;
}

// Time mode sizes the default pool for the inserts its run can make (it used to size it for
// --records + --operations only, and APEX's 1M-key insert runs at 1 s filled it).
TEST(Driver, TimeModeSizesThePoolForItsInserts) {
  Config c = small("lbtree");
  c.mode = RunMode::time;
  c.seconds = 0.5;
  c.operations = 1000;
  c.ratio[0] = 0;
  c.ratio[1] = 1;
  EXPECT_GE(c.expected_records(), c.records + 2'500'000);  // 0.5 s at kTimeModeInsertBound
  // A read-mostly mix may insert as fast: its fast reads leave the inserts the same time (the
  // default experiment's APEX 90/10 run filled a pool sized by the insert ratio).
  c.ratio[1] = 0.1;
  c.ratio[0] = 0.9;
  EXPECT_GE(c.expected_records(), c.records + 2'500'000);
  c.ratio[1] = 0;
  c.ratio[0] = 1;
  EXPECT_EQ(c.expected_records(), c.records + c.operations);
  c.mode = RunMode::operation;
  EXPECT_EQ(c.expected_records(), c.records + c.operations);
  c.mode = RunMode::time;
  c.ratio[1] = 1;
  c.ratio[0] = 0;
  RunResult r;
  std::string error;
  ASSERT_TRUE(run_once(c, 0, &r, &error)) << error;
  EXPECT_EQ(r.succeeded, r.completed);
  EXPECT_GT(r.completed, c.records + c.operations);  // more inserts than the old sizing allowed for
}

// APEX recovers instantly (nodes rebuilt on first access): it counts no records at open, and
// the result says so instead of reporting 0 records found.
TEST(Driver, LazyRecoveryReportsRecordsAsNotCounted) {
  Config c = small("apex");
  c.operations = 2000;
  c.recovery = "crash";
  RunResult r;
  std::string error;
  ASSERT_TRUE(run_once(c, 0, &r, &error)) << error;
  ASSERT_TRUE(r.has_recovery);
  EXPECT_FALSE(r.recovery.records_counted);
  const auto j = to_json(c, r);
  EXPECT_TRUE(j["recovery"]["records_found"].is_null()) << j["recovery"].dump();
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
#include <sstream>

#include "rng.h"

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

// Doubles through --dataset on EVERY built-in index: APEX receives IEEE values through the
// native API (KeyType::f64), the others the order-preserving 8-byte encoding. Generated
// longlat keys here; SOSD files of doubles run on every built-in in the ctest
// pmbench_dataset_longlat_f64_<kind> (and on reflist in SosdDatasetConformance).
TEST(Driver, DoubleKeysFromDatasetsOnEveryBuiltin) {
  for (const std::string& t : pmindex::IndexRegistry::names()) {
    for (const std::string& dataset : {std::string("gen:longlat")}) {
      Config c = small(t);
      c.operations = 5000;
      c.dataset = dataset;
      c.key_type = "double";
      c.verify = true;
      c.value_bits = 64;
      const double mix[kOpTypes] = {0.3, 0.2, 0.2, 0.1, 0.2};
      std::copy(mix, mix + kOpTypes, c.ratio);
      RunResult r;
      std::string error;
      ASSERT_TRUE(run_once(c, 0, &r, &error)) << t << " " << dataset << ": " << error;
      EXPECT_TRUE(r.verify_error.empty()) << t << " " << dataset << ": " << r.verify_error;
      EXPECT_EQ(r.checked, c.operations);
    }
  }
}

TEST(Driver, LognormalGeneratorBulkLoads) {
  for (const std::string& t : pmindex::IndexRegistry::names()) {
    Config c = small(t);
    c.operations = 5000;
    c.dataset = "gen:lognormal";
    c.bulk_load = true;
    c.verify = true;
    c.value_bits = 64;
    const double mix[kOpTypes] = {0.5, 0.2, 0.1, 0, 0.1, 0.1};
    std::copy(mix, mix + kOpTypes, c.ratio);
    RunResult r;
    std::string error;
    ASSERT_TRUE(run_once(c, 0, &r, &error)) << t << ": " << error;
    EXPECT_TRUE(r.verify_error.empty()) << t << ": " << r.verify_error;
  }
}

// A text dataset: keys of 1..40 bytes with shared prefixes, NUL, 0xff and '\r' bytes.
std::string text_file(int n) {
  const std::string path = "/tmp/pmbench-driver-" + std::to_string(::getpid()) + ".txt";
  std::ofstream f(path, std::ios::binary);
  Xoshiro256ss rng(99, 0);
  for (int i = 0; i < n; ++i) {
    std::string k = i % 3 == 0 ? "common/prefix/" : (i % 3 == 1 ? "c" : "");
    const std::uint64_t len = 1 + rng.below(26);
    for (std::uint64_t j = 0; j < len; ++j) {
      const std::uint64_t b = rng.below(40);
      k += b == 0 ? '\0' : b == 1 ? '\xff' : b == 2 ? '\r' : static_cast<char>('a' + b % 26);
    }
    f << k << '\n';
  }
  return path;
}

// Variable-length keys end to end: every index that takes bytes keys passes conformance with
// all operation types, one and two threads, insert and bulk load; the others refuse the key
// type cleanly (usage error, exit code 2 in main).
TEST(Driver, TextDatasetVariableLengthKeysOnEveryBuiltinAndComparator) {
  const std::string path = text_file(8000);
  std::vector<std::string> targets = pmindex::IndexRegistry::names();
  for (const auto& n : dram_comparator_names()) targets.push_back(n);
  int ran = 0;
  for (const std::string& t : targets) {
    for (unsigned threads : {1u, 2u}) {
      Config c = small(t);
      c.operations = 5000;
      c.dataset = path;
      c.key_type = "bytes";
      c.verify = true;
      c.value_bits = 64;
      c.threads = threads;
      c.bulk_load = threads == 1 && is_builtin(t);
      const double mix[kOpTypes] = {0.3, 0.15, 0.1, 0.1, 0.2, 0.15};
      std::copy(mix, mix + kOpTypes, c.ratio);
      RunResult r;
      std::string error;
      if (!run_once(c, 0, &r, &error)) {
        // Only a refusal of the key type is acceptable, and it must say so.
        EXPECT_TRUE(r.usage_error) << t << ": " << error;
        EXPECT_NE(error.find("refuses"), std::string::npos) << t << ": " << error;
        break;
      }
      ++ran;
      EXPECT_TRUE(r.variable_keys);
      EXPECT_GT(r.max_key_size, 8u);
      EXPECT_TRUE(r.verify_error.empty()) << t << " t" << threads << ": " << r.verify_error;
      EXPECT_EQ(r.checked, c.operations) << t;
      EXPECT_GT(r.ops[static_cast<int>(OpType::scan)].succeeded, 0u) << t;
      EXPECT_EQ(r.ops[static_cast<int>(OpType::rmw)].succeeded,
                r.ops[static_cast<int>(OpType::rmw)].completed) << t;
    }
  }
  // reflist, lbtree, fptree, nbtree and the three comparators at least, with 1 and 2 threads.
  EXPECT_GE(ran, 14);
  ::unlink(path.c_str());
}

TEST(Driver, IndexWithoutBytesKeysIsAUsageError) {
  const std::string path = text_file(3000);
  for (const char* t : {"apex"}) {
    if (!is_builtin(t)) continue;
    Config c = small(t);
    c.dataset = path;
    c.key_type = "bytes";
    RunResult r;
    std::string error;
    EXPECT_FALSE(run_once(c, 0, &r, &error)) << t;
    EXPECT_TRUE(r.usage_error) << t << ": " << error;
    EXPECT_NE(error.find("refuses"), std::string::npos) << error;
  }
  // A text dataset with a fixed key type is refused before any index is made.
  Config c = small("reflist");
  c.dataset = path;
  c.key_type = "u64";
  RunResult r;
  std::string error;
  EXPECT_FALSE(run_once(c, 0, &r, &error));
  EXPECT_TRUE(r.usage_error);
  EXPECT_NE(error.find("--key_type bytes"), std::string::npos) << error;
  ::unlink(path.c_str());
}

// YCSB-F: read-modify-write runs as a find + update of one key and is counted as rmw (in the
// result and in the JSON and CSV), never as an update.
TEST(Driver, RmwCountedAsItsOwnOperationInResultJsonAndCsv) {
  Config c = small("reflist");
  c.ratio[static_cast<int>(OpType::read)] = 0.5;
  c.ratio[static_cast<int>(OpType::rmw)] = 0.5;
  c.verify = true;
  c.value_bits = 64;
  RunResult r;
  std::string error;
  ASSERT_TRUE(run_once(c, 0, &r, &error)) << error;
  EXPECT_TRUE(r.verify_error.empty()) << r.verify_error;
  const OpResult& rmw = r.ops[static_cast<int>(OpType::rmw)];
  EXPECT_EQ(rmw.completed, 10000u);
  EXPECT_EQ(rmw.succeeded, 10000u);
  EXPECT_EQ(r.ops[static_cast<int>(OpType::update)].completed, 0u);
  const std::vector<RunResult> runs{r};
  const auto doc = document(c, runs);
  EXPECT_EQ(doc["ops"]["rmw"]["completed"].get<std::uint64_t>(), 10000u);
  EXPECT_EQ(doc["ops"]["update"]["completed"].get<std::uint64_t>(), 0u);
  EXPECT_TRUE(doc["latency_ns"].contains("rmw"));
  EXPECT_EQ(doc["config"]["rmw_ratio"].get<std::string>(), "0.5");
  std::ostringstream csv;
  write_csv(csv, c, runs);
  EXPECT_NE(csv.str().find(",rmw,10000,10000,"), std::string::npos) << csv.str();
}

// A lost update is caught by the read half of a later read-modify-write.
TEST(Driver, ConformanceCatchesLostUpdateThroughRmw) {
  ::setenv("PMBENCH_BROKEN_AFTER", "2000", 1);
  ::setenv("PMBENCH_BROKEN", "update", 1);
  Config c = small(PMBENCH_BROKEN_TREE);
  c.verify = true;
  const double mix[kOpTypes] = {0, 0, 0, 0, 0, 1};
  std::copy(mix, mix + kOpTypes, c.ratio);
  c.records = 50;  // few keys, so an rmw soon re-reads a key a previous rmw lost
  RunResult r;
  std::string error;
  ASSERT_TRUE(run_once(c, 0, &r, &error)) << error;
  EXPECT_NE(r.verify_error.find("rmw"), std::string::npos) << r.verify_error;
  ::unsetenv("PMBENCH_BROKEN");
  ::unsetenv("PMBENCH_BROKEN_AFTER");
}

}  // namespace
}  // namespace pmbench

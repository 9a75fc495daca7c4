// pmbench's command line: PiBench's defaults, and every invalid value refused with exit code 2.
#include <gtest/gtest.h>

#include <sstream>
#include <vector>

#include "config.h"

namespace pmbench {
namespace {

int parse(std::vector<const char*> args, Config* c, std::string* err = nullptr) {
  args.insert(args.begin(), "pmbench");
  std::ostringstream out, e;
  const int rc = parse_command_line(static_cast<int>(args.size()), args.data(), c, out, e);
  if (err != nullptr) *err = e.str();
  return rc;
}

TEST(Cli, PiBenchDefaults) {
  Config c;
  ASSERT_EQ(parse({"reflist"}, &c), -1);
  EXPECT_EQ(c.records, 1000000u);
  EXPECT_EQ(c.operations, 1000000u);
  EXPECT_EQ(c.threads, 1u);
  EXPECT_EQ(c.key_size, 8u);
  EXPECT_EQ(c.value_size, 8u);
  EXPECT_EQ(c.ratio[0], 1.0);
  EXPECT_EQ(c.scan_size, 100);
  EXPECT_EQ(c.sampling_ms, 1000u);
  EXPECT_EQ(c.seed, 1729u);
  EXPECT_EQ(c.mode, RunMode::operation);
  EXPECT_EQ(c.distribution, DistKind::uniform);
  EXPECT_EQ(c.value_bits, 48u);
  EXPECT_EQ(c.key_order, "memcmp");
}

TEST(Cli, ShortFlagsAndCaseInsensitiveDistribution) {
  Config c;
  ASSERT_EQ(parse({"x.so", "-n", "5", "-p", "7", "-t", "2", "-r", "0.5", "-i", "0.5",
                   "--distribution", "zipfian", "--skew", "0.9", "-m", "time", "--seconds", "3"},
                  &c), -1);
  EXPECT_EQ(c.records, 5u);
  EXPECT_EQ(c.threads, 2u);
  EXPECT_EQ(c.distribution, DistKind::zipfian);
  EXPECT_EQ(c.mode, RunMode::time);
}

TEST(Cli, VerifyDefaultsToAll64ValueBits) {
  Config c;
  ASSERT_EQ(parse({"reflist", "--verify"}, &c), -1);
  EXPECT_EQ(c.value_bits, 64u);
}

TEST(Cli, InvalidValuesExitWith2AndSayWhy) {
  struct Case { std::vector<const char*> args; const char* words; };
  const std::vector<Case> cases = {
      {{"reflist", "-r", "0.5"}, "sum to 1"},
      {{"reflist", "-r", "0.5", "-i", "0.5000001"}, "sum to 1"},
      {{"reflist", "--scan_size", "0"}, "scan_size"},
      {{"reflist", "--scan_size", "1001"}, "scan_size"},
      {{"reflist", "--distribution", "normal"}, "UNIFORM"},
      {{"reflist", "--distribution", "selfsimilar", "--skew", "0.6"}, "(0, 0.5]"},
      {{"reflist", "--distribution", "zipfian", "--skew", "1"}, "[0, 1)"},
      {{"reflist", "--latency_sampling", "1.5"}, "latency_sampling"},
      {{"reflist", "-m", "forever"}, "operation or time"},
      {{"reflist", "--persistence", "nvme"}, "persistence"},
      {{"reflist", "-t", "0"}, "threads"},
      {{"reflist", "-n", "abc"}, "records"},
      {{"reflist", "--workload", "ycsb-z"}, "ycsb"},
      {{}, "missing the index"},
      {{"reflist", "--bogus"}, "bogus"},
      {{"reflist", "--rmw_ratio", "0.5"}, "sum to 1"},
      {{"reflist", "--distribution", "latest", "--skew", "1"}, "[0, 1)"},
      {{"reflist", "--dataset", "keys.txt", "--key_type", "u64"}, "--key_type bytes"},
      {{"reflist", "--dataset", "gen:longlat", "--key_type", "u64"}, "--key_type double"},
      {{"reflist", "--dataset", "gen:lognormal", "--key_type", "double"}, "uint64"},
      {{"reflist", "--dataset", "gen:zipf"}, "unknown generator"},
      {{"reflist", "--dataset", "k.bin", "--dataset_format", "csv"}, "dataset_format"},
      {{"reflist", "--dataset", "k.bin", "-k", "16", "--key_type", "bytes"}, "key_size"},
      {{"x.so", "--key_order", "bigendian"}, "key_order"},
      {{"x.so", "--dataset", "keys.txt", "--key_order", "pibench"}, "fixed-size integer keys"},
  };
  for (const auto& k : cases) {
    Config c;
    std::string err;
    EXPECT_EQ(parse(k.args, &c, &err), 2) << k.words;
    EXPECT_NE(err.find(k.words), std::string::npos) << "message '" << err << "' lacks '" << k.words << "'";
  }
}

// Every numeric flag is range-checked on its text: negatives used to wrap into huge unsigned
// values (-n -1 ran away to gigabytes, -p -1 aborted in a length_error).
TEST(Cli, NumericFlagsOutOfRangeExitWith2AndSayWhy) {
  struct Case { std::vector<const char*> args; const char* words; };
  const std::vector<Case> cases = {
      {{"reflist", "-n", "-5"}, "--records"},
      {{"reflist", "-n", "-1"}, "--records"},
      {{"reflist", "-p", "-1"}, "--operations"},
      {{"reflist", "-p", "18446744073709551615"}, "--operations"},
      {{"reflist", "-n", "99999999999999999999999"}, "--records"},
      {{"reflist", "-n", "1e6"}, "whole number"},
      {{"reflist", "-t", "-1"}, "--threads"},
      {{"reflist", "-t", "4294967297"}, "--threads"},
      {{"reflist", "-k", "-8"}, "--key_size"},
      {{"reflist", "-v", "-8"}, "--value_size"},
      {{"reflist", "-v", "0"}, "--value_size"},
      {{"reflist", "--seed", "-1"}, "--seed"},
      {{"reflist", "--sampling_ms", "-1"}, "--sampling_ms"},
      {{"reflist", "--repeat", "-1"}, "--repeat"},
      {{"reflist", "--node_size", "-256"}, "--node_size"},
      {{"reflist", "--value_bits", "-1"}, "--value_bits"},
      {{"reflist", "--probe_mib", "-1"}, "--probe_mib"},
      {{"reflist", "--scan_size", "-1"}, "scan_size"},
      {{"reflist", "-m", "time", "--seconds", "-1"}, "--seconds"},
      {{"reflist", "-m", "time", "--seconds", "1e300"}, "--seconds"},
      {{"reflist", "--pool_size", "-1"}, "--pool_size"},
      {{"reflist", "--pool_size", "8X"}, "--pool_size"},
      {{"reflist", "--pool_size", "1000"}, "at least 64K"},
      {{"reflist", "--pool_size", "2P"}, "--pool_size"},
      {{"reflist", "--pool_size", "99999999999999G"}, "--pool_size"},
  };
  for (const auto& k : cases) {
    Config c;
    std::string err;
    EXPECT_EQ(parse(k.args, &c, &err), 2) << k.args[1] << " " << k.args[2];
    EXPECT_NE(err.find(k.words), std::string::npos) << "message '" << err << "' lacks '" << k.words << "'";
  }
}

TEST(Cli, PoolSizeTakesBinarySuffixes) {
  struct Case { const char* text; std::size_t bytes; };
  const std::vector<Case> cases = {{"0", 0},          {"1048576", 1 << 20}, {"64K", 64 << 10},
                                   {"512M", 512u << 20}, {"8G", std::size_t{8} << 30},
                                   {"8g", std::size_t{8} << 30}, {"8GiB", std::size_t{8} << 30},
                                   {"2TB", std::size_t{2} << 40}};
  for (const auto& k : cases) {
    Config c;
    ASSERT_EQ(parse({"reflist", "--pool_size", k.text}, &c), -1) << k.text;
    EXPECT_EQ(c.pool_size, k.bytes) << k.text;
  }
}

TEST(Cli, LargestAcceptedCountsParse) {
  Config c;
  ASSERT_EQ(parse({"reflist", "-n", "10000000000", "-p", "0", "--seed", "18446744073709551615"}, &c), -1);
  EXPECT_EQ(c.records, 10'000'000'000u);
  EXPECT_EQ(c.seed, 18446744073709551615u);
}

TEST(Cli, VersionExitsZeroAndPrintsIt) {
  Config c;
  std::vector<const char*> args = {"pmbench", "--version"};
  std::ostringstream out, err;
  EXPECT_EQ(parse_command_line(2, args.data(), &c, out, err), 0);
  EXPECT_NE(out.str().find("pmbench 0."), std::string::npos) << out.str();
}

TEST(Cli, RatiosWithinTolerance) {
  Config c;
  EXPECT_EQ(parse({"reflist", "-r", "0.1", "-i", "0.2", "-u", "0.7"}, &c), -1);
}

TEST(Cli, HelpExitsZero) {
  Config c;
  EXPECT_EQ(parse({"--help"}, &c), 0);
}

TEST(Cli, YcsbWorkloadSetsRatios) {
  Config c;
  ASSERT_EQ(parse({"reflist", "--workload", "ycsb-b"}, &c), -1);
  EXPECT_DOUBLE_EQ(c.ratio[0], 0.95);
  EXPECT_DOUBLE_EQ(c.ratio[2], 0.05);
  EXPECT_EQ(c.distribution, DistKind::zipfian);
  EXPECT_DOUBLE_EQ(c.skew, 0.99);
}

// YCSB-D reads the newest records ("latest"), not the zipfian-hot oldest ones.
TEST(Cli, YcsbDUsesLatestDistribution) {
  Config c;
  ASSERT_EQ(parse({"reflist", "--workload", "ycsb-d"}, &c), -1);
  EXPECT_EQ(c.distribution, DistKind::latest);
  EXPECT_DOUBLE_EQ(c.ratio[static_cast<int>(OpType::read)], 0.95);
  EXPECT_DOUBLE_EQ(c.ratio[static_cast<int>(OpType::insert)], 0.05);
  EXPECT_DOUBLE_EQ(c.skew, 0.99);
  Config l;
  ASSERT_EQ(parse({"reflist", "--distribution", "Latest"}, &l), -1);
  EXPECT_EQ(l.distribution, DistKind::latest);
}

// YCSB-F's read-modify-write is its own operation, not an update.
TEST(Cli, YcsbFUsesReadModifyWrite) {
  Config c;
  ASSERT_EQ(parse({"reflist", "--workload", "ycsb-f"}, &c), -1);
  EXPECT_DOUBLE_EQ(c.ratio[static_cast<int>(OpType::read)], 0.5);
  EXPECT_DOUBLE_EQ(c.ratio[static_cast<int>(OpType::rmw)], 0.5);
  EXPECT_DOUBLE_EQ(c.ratio[static_cast<int>(OpType::update)], 0);
  EXPECT_STREQ(op_name(OpType::rmw), "rmw");
  Config r;
  ASSERT_EQ(parse({"reflist", "-r", "0.25", "--rmw_ratio", "0.75"}, &r), -1);
  EXPECT_DOUBLE_EQ(r.ratio[static_cast<int>(OpType::rmw)], 0.75);
}

// A dataset decides the key type when --key_type is not given.
TEST(Cli, DatasetKindPicksTheKeyType) {
  Config t;
  ASSERT_EQ(parse({"reflist", "--dataset", "names.txt"}, &t), -1);
  EXPECT_EQ(t.key_type, "bytes");
  Config f;
  ASSERT_EQ(parse({"reflist", "--dataset", "names.bin", "--dataset_format", "text"}, &f), -1);
  EXPECT_EQ(f.key_type, "bytes");
  Config g;
  ASSERT_EQ(parse({"apex", "--dataset", "gen:longlat"}, &g), -1);
  EXPECT_EQ(g.key_type, "double");
  Config s;
  ASSERT_EQ(parse({"reflist", "--dataset", "books_200M_uint64"}, &s), -1);
  EXPECT_EQ(s.key_type, "u64");
}

}  // namespace
}  // namespace pmbench

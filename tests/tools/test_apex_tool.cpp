// apex_tool end to end on SOSD key files: a header count that disagrees with the file size
// (too large: would have allocated count x 8 bytes; too small) is refused with a clear error
// before anything is allocated; a good file is loaded and every key counted.
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "support/run_command.h"
#include "support/temp_dir.h"

namespace pmindex {
namespace {

using pmindex::testing::TempDir;

using pmindex::testing::CmdResult;

CmdResult run_tool(const std::string& args) {
  return pmindex::testing::run_command(std::string(APEX_TOOL_PATH) + " " + args);
}

// A SOSD file: `header` as the count, then `keys` doubles.
void write_sosd(const std::string& path, std::uint64_t header, std::size_t keys) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(&header), 8);
  for (std::size_t i = 0; i < keys; ++i) {
    const double d = 180.0 * static_cast<double>(i % 7) + static_cast<double>(i) * 0.25;
    f.write(reinterpret_cast<const char*>(&d), 8);
  }
}

TEST(ApexTool, RefusesHeaderCountLargerThanTheFile) {
  TempDir dir;
  const std::string path = dir.path() + "/huge.sosd";
  write_sosd(path, std::uint64_t{1} << 61, 3);  // 16 EiB of keys claimed, 24 bytes present
  const CmdResult r = run_tool("table1 --keys " + path + " --f64 --records 10");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("SOSD header says 2305843009213693952 keys, but the file holds 3"),
            std::string::npos)
      << r.out;
}

TEST(ApexTool, RefusesHeaderCountSmallerThanTheFile) {
  TempDir dir;
  const std::string path = dir.path() + "/short.sosd";
  write_sosd(path, 1, 3);
  const CmdResult r = run_tool("table1 --keys " + path + " --f64 --records 10");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("SOSD header says 1 keys"), std::string::npos) << r.out;
}

TEST(ApexTool, RefusesFileWithoutHeader) {
  TempDir dir;
  const std::string path = dir.path() + "/empty.sosd";
  std::ofstream(path, std::ios::binary | std::ios::trunc) << "abc";
  const CmdResult r = run_tool("table1 --keys " + path + " --f64 --records 10");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("too short for a SOSD header"), std::string::npos) << r.out;
}

TEST(ApexTool, LoadsAGoodFile) {
  TempDir dir;
  const std::string path = dir.path() + "/good.sosd";
  write_sosd(path, 500, 500);
  const CmdResult r = run_tool("table1 --keys " + path + " --f64 --records 1000 --load insert");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("\"records\":500,"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace pmindex

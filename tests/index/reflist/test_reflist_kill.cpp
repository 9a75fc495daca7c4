// reflist under the kill -9 harness: PMINDEX_KILL_CYCLES cycles (about 30 in CI, hundreds in
// the `long` variant), half of them killed at a random time, half at the k-th persistence call.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <iostream>
#include <vector>

#include "pmindex/crash/kill_harness.h"
#include "support/temp_dir.h"

namespace pmindex::crash {
namespace {

void run(pm::Mode mode) {
  pmindex::testing::TempDir dir;
  KillConfig cfg = KillConfig::from_env(30);
  cfg.options.kind = "reflist";
  cfg.options.path = dir.file("kill.pool");
  cfg.options.pool_size = 1 << 20;
  cfg.options.persistence = mode;
  const KillReport r = run_kill_cycles(cfg);
  std::cout << "reflist." << pm::to_string(mode) << " seed " << cfg.seed << ": " << r.to_string()
            << "\n";
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_EQ(r.cycles, cfg.cycles);
}

TEST(KillRefList, Adr) { run(pm::Mode::adr); }

// The harness's oracle must be able to fail: wiping the root pointer between the kill and the
// reopen loses acknowledged records.
TEST(KillRefList, HarnessCatchesLostRecords) {
  pmindex::testing::TempDir dir;
  KillConfig cfg;
  cfg.options.kind = "reflist";
  cfg.options.path = dir.file("kill.pool");
  cfg.options.pool_size = 1 << 20;
  cfg.cycles = 8;
  cfg.tamper_pool = [](const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    // A consistent "creation never published a root" state (format v2 refuses a bare root 0).
    std::vector<char> header(pm::kHeaderSize);
    ASSERT_EQ(::pread(fd, header.data(), header.size(), 0), 4096);
    pm::HeaderState st{};
    ASSERT_TRUE(pm::image_state(header.data(), &st));
    st.root = 0;
    st.flags = pm::kStateBuilding;
    pm::set_image_state(header.data(), st);
    ASSERT_EQ(::pwrite(fd, header.data(), header.size(), 0), 4096);
    ::close(fd);
  };
  const KillReport r = run_kill_cycles(cfg);
  ASSERT_FALSE(r.ok()) << r.to_string();
  EXPECT_NE(r.failures[0].find("match no acceptable state"), std::string::npos) << r.to_string();
}
TEST(KillRefList, Eadr) { run(pm::Mode::eadr); }

}  // namespace
}  // namespace pmindex::crash

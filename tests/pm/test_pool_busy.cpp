// Code::busy names the holder: a second open from this process says so (it used to say
// "another process", sending users after a process that does not exist); another process is
// named with its pid.
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include <gtest/gtest.h>

#include "pmindex/pm/pool.h"
#include "support/temp_dir.h"

namespace pmindex::pm {
namespace {

using pmindex::testing::TempDir;

PoolOptions opts(const std::string& path) {
  PoolOptions o;
  o.path = path;
  o.size = 1 << 20;
  o.layout = Layout{"busytest", 256, KeyMode::u64, 0};
  return o;
}

TEST(PoolBusy, SecondOpenInThisProcessSaysThisProcess) {
  TempDir dir;
  const std::string path = dir.file("b.pool");
  auto p = Pool::create(opts(path));
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  auto q = Pool::open(opts(path));
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.status().code(), Code::busy);
  EXPECT_NE(q.status().message().find("already open in this process"), std::string::npos)
      << q.status().message();
  PoolOptions over = opts(path);  // overwrite checks the holder the same way
  over.overwrite = true;
  auto r = Pool::create(over);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("already open in this process"), std::string::npos)
      << r.status().message();
}

TEST(PoolBusy, OpenHeldByAnotherProcessNamesItsPid) {
  TempDir dir;
  const std::string path = dir.file("b.pool");
  { ASSERT_TRUE(Pool::create(opts(path)).ok()); }
  int ready[2], done[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(done), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto held = Pool::open(opts(path));
    char x = held.ok() ? 1 : 0;
    (void)!write(ready[1], &x, 1);
    (void)!read(done[0], &x, 1);  // hold the pool until the parent has tried
    _exit(0);
  }
  char x = 0;
  ASSERT_EQ(read(ready[0], &x, 1), 1);
  ASSERT_EQ(x, 1) << "the child could not open the pool";
  auto q = Pool::open(opts(path));
  ASSERT_EQ(write(done[1], &x, 1), 1);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.status().code(), Code::busy);
  EXPECT_NE(q.status().message().find("open in another process (pid " + std::to_string(child) + ")"),
            std::string::npos)
      << q.status().message();
}

}  // namespace
}  // namespace pmindex::pm

// pmpool end to end: info/check on good pools, check on corrupted bodies (out-of-bounds offset,
// cycle), list/rm, bad flags. check must never change the file.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iterator>

#include "index/reflist/reflist.h"
#include "pmindex/index.h"
#include "support/run_command.h"
#include "support/temp_dir.h"

namespace pmindex {
namespace {

using pmindex::testing::TempDir;

using pmindex::testing::CmdResult;

CmdResult run(const std::string& args) {
  return pmindex::testing::run_command(std::string(PMPOOL_PATH) + " " + args);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A reflist pool with keys 0..n-1, closed cleanly. Returns the offsets of the first records.
std::vector<std::uint64_t> make_pool(const std::string& path, int n) {
  Options o;
  o.path = path;
  o.pool_size = 1 << 20;
  auto idx = Index::open(o);
  EXPECT_TRUE(idx.ok()) << idx.status().to_string();
  for (int i = 0; i < n; ++i) EXPECT_EQ((*idx)->insert(encode_u64(i), encode_u64(i)), Code::ok);
  // Walk the chain to learn record offsets (for the corruption tests).
  const pm::Pool& pool = (*idx)->pool();
  const auto* root = pool.at<reflist::Root>(pool.root());
  std::vector<std::uint64_t> offs;
  for (std::uint64_t off = reflist::link_off(root->head); off != 0;
       off = reflist::link_off(pool.at<reflist::Record>(off)->next))
    offs.push_back(off);
  EXPECT_TRUE((*idx)->close().ok());
  return offs;
}

TEST(Pmpool, InfoAndCheckOnAGoodPool) {
  TempDir dir;
  const std::string path = dir.file("good.pool");
  make_pool(path, 50);
  const std::string before = slurp(path);
  CmdResult info = run("info " + path);
  EXPECT_EQ(info.rc, 0) << info.out;
  EXPECT_NE(info.out.find("'reflist' (key u64)"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("clean shutdown:  yes"), std::string::npos) << info.out;
  CmdResult check = run("check " + path);
  EXPECT_EQ(check.rc, 0) << check.out;
  EXPECT_NE(check.out.find("consistent"), std::string::npos);
  EXPECT_EQ(slurp(path), before) << "info/check changed the file";
}

TEST(Pmpool, CheckFindsAnOutOfBoundsOffset) {
  TempDir dir;
  const std::string path = dir.file("oob.pool");
  auto offs = make_pool(path, 20);
  std::string bytes = slurp(path);
  const std::uint64_t bad = bytes.size() + 12345 * 64;
  std::memcpy(bytes.data() + offs[5], &bad, 8);  // record 5's next pointer
  spit(path, bytes);
  CmdResult check = run("check " + path);
  EXPECT_EQ(check.rc, 1) << check.out;
  EXPECT_NE(check.out.find(path), std::string::npos) << check.out;
  EXPECT_NE(check.out.find("out of bounds"), std::string::npos) << check.out;
  EXPECT_EQ(slurp(path), bytes) << "check changed a corrupted file";
}

TEST(Pmpool, CheckFindsACycle) {
  TempDir dir;
  const std::string path = dir.file("cycle.pool");
  auto offs = make_pool(path, 20);
  std::string bytes = slurp(path);
  // record 10 -> record 3: record 2's next word, which carries record 3's tag
  std::memcpy(bytes.data() + offs[10], bytes.data() + offs[2], 8);
  spit(path, bytes);
  CmdResult check = run("check " + path);
  EXPECT_EQ(check.rc, 1) << check.out;
  EXPECT_NE(check.out.find("cycle"), std::string::npos) << check.out;
  EXPECT_EQ(slurp(path), bytes);
}

TEST(Pmpool, OpeningACorruptedBodyFailsAndLeavesTheFileUnchanged) {
  TempDir dir;
  const std::string path = dir.file("body.pool");
  auto offs = make_pool(path, 20);
  std::string bytes = slurp(path);
  std::memcpy(bytes.data() + offs[10], bytes.data() + offs[2], 8);  // a cycle (tag kept)
  spit(path, bytes);
  Options o;
  o.path = path;
  o.open_mode = OpenMode::open;
  auto idx = Index::open(o);  // a real (shared, writable) open, not pmpool's private one
  ASSERT_FALSE(idx.ok());
  EXPECT_EQ(idx.status().code(), Code::corrupted);
  EXPECT_NE(idx.status().message().find(path), std::string::npos) << idx.status().message();
  EXPECT_EQ(slurp(path), bytes) << "a pool refused at recovery was modified";
}

TEST(Pmpool, CheckRefusesForeignAndTruncatedFiles) {
  TempDir dir;
  const std::string path = dir.file("foreign.pool");
  spit(path, std::string(8192, 'z'));
  CmdResult check = run("check " + path);
  EXPECT_EQ(check.rc, 1);
  EXPECT_NE(check.out.find("not a pmindex pool"), std::string::npos) << check.out;
  CmdResult missing = run("check " + dir.file("missing.pool"));
  EXPECT_EQ(missing.rc, 1);
  EXPECT_NE(missing.out.find("no such pool file"), std::string::npos) << missing.out;
}

TEST(Pmpool, ListAndRemove) {
  TempDir dir;
  const std::string path = dir.file("a.pool");
  make_pool(path, 3);
  spit(dir.file("notapool"), "hello");
  CmdResult list = run("list " + dir.path());
  EXPECT_EQ(list.rc, 0);
  EXPECT_NE(list.out.find("a.pool"), std::string::npos) << list.out;
  EXPECT_EQ(list.out.find("notapool"), std::string::npos) << list.out;
  CmdResult rm_bad = run("rm " + dir.file("notapool"));
  EXPECT_EQ(rm_bad.rc, 1) << "rm must refuse a file that is not a pool";
  CmdResult rm = run("rm " + path);
  EXPECT_EQ(rm.rc, 0) << rm.out;
  EXPECT_NE(access(path.c_str(), F_OK), 0);
}

// rm --stale removes only abandoned pools: none that a process holds, none that a clean
// shutdown closed recently; a crashed pool and one closed cleanly long ago go. (Before, it
// removed every pool no process held, the recently closed one too.)
TEST(Pmpool, RemoveStaleKeepsHeldAndRecentlyClosedPools) {
  TempDir dir;
  make_pool(dir.file("recent.pool"), 3);
  make_pool(dir.file("old.pool"), 3);
  const time_t then = time(nullptr) - 2 * 86400;
  const timespec two_days_ago[2] = {{then, 0}, {then, 0}};
  ASSERT_EQ(utimensat(AT_FDCWD, dir.file("old.pool").c_str(), two_days_ago, 0), 0);
  Options o;
  o.path = dir.file("crashed.pool");
  o.pool_size = 1 << 20;
  {
    auto idx = Index::open(o);
    ASSERT_TRUE(idx.ok()) << idx.status().to_string();
    ASSERT_EQ((*idx)->insert(encode_u64(1), encode_u64(1)), Code::ok);
  }  // no close(): as a crash leaves it
  o.path = dir.file("held.pool");
  auto held = Index::open(o);
  ASSERT_TRUE(held.ok()) << held.status().to_string();
  ASSERT_TRUE((*held)->close().ok());  // closed cleanly, yet still open (locked) here
  ASSERT_EQ(utimensat(AT_FDCWD, dir.file("held.pool").c_str(), two_days_ago, 0), 0);
  spit(dir.file("notapool"), "hello");

  CmdResult rm = run("rm --stale --dir " + dir.path());
  EXPECT_EQ(rm.rc, 0) << rm.out;
  auto exists = [&](const char* name) { return access(dir.file(name).c_str(), F_OK) == 0; };
  EXPECT_TRUE(exists("recent.pool")) << "closed cleanly a moment ago";
  EXPECT_TRUE(exists("held.pool")) << "a process holds it";
  EXPECT_TRUE(exists("notapool"));
  EXPECT_FALSE(exists("old.pool")) << "closed cleanly two days ago";
  EXPECT_FALSE(exists("crashed.pool")) << "never closed cleanly, held by no one";
  // --recent 0: a pool closed cleanly at any time before now is abandoned too.
  sleep(1);
  EXPECT_EQ(run("rm --stale --recent 0 --dir " + dir.path()).rc, 0);
  EXPECT_FALSE(exists("recent.pool"));
  EXPECT_TRUE(exists("held.pool"));
  EXPECT_EQ(run("rm --stale --recent -5").rc, 2);
}

// A directory is not a pool: say so, not "truncated".
TEST(Pmpool, CheckAndInfoOfADirectorySayNotARegularFile) {
  TempDir dir;
  for (const char* cmd : {"check ", "info "}) {
    CmdResult r = run(cmd + dir.path());
    EXPECT_EQ(r.rc, 1) << r.out;
    EXPECT_NE(r.out.find("not a regular file"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("truncated"), std::string::npos) << r.out;
  }
}

TEST(Pmpool, ListOfAMissingDirectoryExitsWithTwo) {
  TempDir dir;
  CmdResult r = run("list " + dir.file("missing"));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("no such directory"), std::string::npos) << r.out;
  const std::string file = dir.file("plain");
  spit(file, "x");
  CmdResult f = run("list " + file);
  EXPECT_EQ(f.rc, 2) << f.out;
  EXPECT_NE(f.out.find("not a directory"), std::string::npos) << f.out;
  CmdResult empty = run("list " + dir.path());
  EXPECT_EQ(empty.rc, 0) << empty.out;
}

TEST(Pmpool, VersionAndUnknownSubcommandSayWhatTheyAre) {
  CmdResult v = run("--version");
  EXPECT_EQ(v.rc, 0) << v.out;
  EXPECT_NE(v.out.find("pmpool 0."), std::string::npos) << v.out;
  // The ISA level the library was built for (README "Minimum CPU") is part of the version.
  EXPECT_NE(v.out.find("(" + std::string(pmindex::isa_level()) + ")"), std::string::npos) << v.out;
  EXPECT_EQ(v.out.find("subcommand is required"), std::string::npos) << v.out;
  CmdResult u = run("frobnicate");
  EXPECT_EQ(u.rc, 2) << u.out;
  EXPECT_NE(u.out.find("unknown subcommand 'frobnicate'"), std::string::npos) << u.out;
  EXPECT_EQ(u.out.find("subcommand is required"), std::string::npos) << u.out;
  CmdResult none = run("");
  EXPECT_EQ(none.rc, 2) << none.out;
}

TEST(Pmpool, BadFlagsExitWithTwo) {
  EXPECT_EQ(run("").rc, 2);
  EXPECT_EQ(run("frobnicate").rc, 2);
  EXPECT_EQ(run("check").rc, 2);
  EXPECT_EQ(run("rm").rc, 2);
}

}  // namespace
}  // namespace pmindex

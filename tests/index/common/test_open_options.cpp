// Index::open refuses bad options before it touches the file system (issue 19 item 1), for
// every registered kind:
//   - a refused create leaves no file (nor a temporary one) behind;
//   - a refused create with overwrite leaves the existing pool byte-for-byte as it was;
//   - a huge expected_records is refused, not wrapped into a tiny default pool size;
//   - two processes racing open_or_create on one path (200 rounds): exactly one creates, the
//     other opens or gets busy, never "file exists" or a half-made file.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "pmindex/index.h"
#include "support/temp_dir.h"

namespace pmindex {
namespace {

using pmindex::testing::TempDir;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    out.push_back(e.path().filename().string());
  return out;
}

Options base_options(const std::string& kind, const std::string& path) {
  Options o;
  o.kind = kind;
  o.path = path;
  o.pool_size = 4 << 20;
  o.open_mode = OpenMode::create;
  return o;
}

// Options each kind refuses: a value limit no index has, and (tree kinds) a node size none has.
std::vector<Options> refused_options(const std::string& kind, const std::string& path) {
  std::vector<Options> out;
  Options big_values = base_options(kind, path);
  big_values.max_value_size = 1 << 20;
  out.push_back(big_values);
  if (kind != "reflist") {  // reflist has no node size
    Options odd_node = base_options(kind, path);
    odd_node.node_size = 100;
    out.push_back(odd_node);
  }
  return out;
}

class OpenOptions : public ::testing::TestWithParam<std::string> {};

TEST_P(OpenOptions, RefusedCreateLeavesNoFile) {
  TempDir dir;
  const std::string path = dir.file("p.pool");
  for (const Options& o : refused_options(GetParam(), path)) {
    auto r = Index::open(o);
    ASSERT_FALSE(r.ok()) << "node_size " << o.node_size << " max_value " << o.max_value_size;
    EXPECT_EQ(r.status().code(), Code::invalid_argument) << r.status().to_string();
    EXPECT_TRUE(files_in(dir.path()).empty()) << r.status().to_string();
    Options again = o;  // open_or_create refuses the same way
    again.open_mode = OpenMode::open_or_create;
    EXPECT_FALSE(Index::open(again).ok());
    EXPECT_TRUE(files_in(dir.path()).empty());
  }
}

TEST_P(OpenOptions, RefusedOverwriteLeavesTheOldPoolUnchanged) {
  TempDir dir;
  const std::string path = dir.file("p.pool");
  {
    auto r = Index::open(base_options(GetParam(), path));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_EQ((*r)->insert(encode_u64(5), encode_u64(6)), Code::ok);
    ASSERT_TRUE((*r)->close().ok());
  }
  const std::string before = read_file(path);
  for (Options o : refused_options(GetParam(), path)) {
    o.overwrite = true;
    auto r = Index::open(o);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(read_file(path) == before) << "the old pool changed: " << r.status().to_string();
    EXPECT_EQ(files_in(dir.path()), std::vector<std::string>{"p.pool"});
  }
  Options reopen = base_options(GetParam(), path);
  reopen.open_mode = OpenMode::open;
  auto r = Index::open(reopen);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::string v;
  EXPECT_EQ((*r)->find(encode_u64(5), &v), Code::ok);
}

TEST_P(OpenOptions, HugeExpectedRecordsIsRefusedNotWrapped) {
  TempDir dir;
  Options o = base_options(GetParam(), dir.file("p.pool"));
  o.pool_size = 0;  // the default size comes from expected_records
  o.expected_records = std::size_t{1} << 60;  // 2^60 * (a power-of-two multiple) wraps to 0
  auto r = Index::open(o);
  ASSERT_FALSE(r.ok()) << "created a pool of " << (*r)->pool().size() << " bytes";
  EXPECT_EQ(r.status().code(), Code::invalid_argument);
  EXPECT_NE(r.status().message().find("expected_records"), std::string::npos);
  EXPECT_TRUE(files_in(dir.path()).empty());
}

INSTANTIATE_TEST_SUITE_P(AllKinds, OpenOptions, ::testing::ValuesIn(IndexRegistry::names()),
                         [](const auto& p) { return p.param; });

// Outcome of one open_or_create, as a process exit code.
enum Outcome : int { kCreated = 10, kOpened = 11, kBusy = 12, kOtherError = 13 };

// Both processes spin on a shared counter until both have arrived, so their opens overlap
// (a pipe wake-up left them too far apart to hit the old stat-then-create window).
int open_or_create_once(const std::string& path, std::atomic<int>* arrived) {
  // seq_cst: a plain two-party barrier; cost is irrelevant here.
  arrived->fetch_add(1);
  while (arrived->load() < 2) {
  }
  Options o;
  o.kind = "reflist";
  o.path = path;
  o.pool_size = 1 << 20;
  o.open_mode = OpenMode::open_or_create;
  auto r = Index::open(o);
  if (!r.ok()) {
    if (r.status().code() == Code::busy) return kBusy;
    std::fprintf(stderr, "open_or_create: %s\n", r.status().to_string().c_str());
    return kOtherError;
  }
  const bool created = (*r)->recovery_stats().created;
  if (!(*r)->close().ok()) return kOtherError;
  return created ? kCreated : kOpened;
}

TEST(OpenOrCreate, TwoProcessesRacingOnePathOneCreatesTheOtherOpensOrIsBusy) {
  TempDir dir;
  const std::string path = dir.file("race.pool");
  void* shared = mmap(nullptr, sizeof(std::atomic<int>), PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(shared, MAP_FAILED);
  auto* arrived = new (shared) std::atomic<int>(0);
  static_assert(std::atomic<int>::is_always_lock_free);  // works across processes
  constexpr int kRounds = 200;
  int created_by_one = 0, other_errors = 0, both_busy_or_opened = 0;
  for (int round = 0; round < kRounds; ++round) {
    std::filesystem::remove(path);
    arrived->store(0);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) _exit(open_or_create_once(path, arrived));
    const int mine = open_or_create_once(path, arrived);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    const int theirs = WEXITSTATUS(status);
    if (mine == kOtherError || theirs == kOtherError) ++other_errors;
    else if ((mine == kCreated) != (theirs == kCreated)) ++created_by_one;
    else ++both_busy_or_opened;
  }
  EXPECT_EQ(other_errors, 0);
  EXPECT_EQ(both_busy_or_opened, 0) << "a round where neither or both created";
  EXPECT_EQ(created_by_one, kRounds);
  munmap(shared, sizeof(std::atomic<int>));
  EXPECT_EQ(files_in(dir.path()), std::vector<std::string>{"race.pool"});
}

}  // namespace
}  // namespace pmindex

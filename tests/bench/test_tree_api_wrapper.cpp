// The generic tree_api wrapper over pmindex::Index (libpmindex_<kind>_tree.so), loaded the way
// PiBench loads it: dlopen + create_tree.
#include <dlfcn.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "support/temp_dir.h"
#include "tree_api.h"

namespace {

using Create = tree_api* (*)(const tree_options_t&);

Create load_create() {
  void* h = ::dlopen(PMINDEX_REFLIST_TREE, RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) return nullptr;
  return reinterpret_cast<Create>(::dlsym(h, "create_tree"));
}

std::string key(std::uint64_t v) {
  const std::uint64_t be = __builtin_bswap64(v);
  return std::string(reinterpret_cast<const char*>(&be), 8);
}

TEST(TreeApiWrapper, OpensRecoversAndRefusesOtherLayouts) {
  Create create = load_create();
  ASSERT_NE(create, nullptr) << ::dlerror();
  pmindex::testing::TempDir dir;
  tree_options_t o;
  o.pool_path = dir.file("r.pool");
  o.pool_size = 1 << 22;
  {
    std::unique_ptr<tree_api> t(create(o));
    ASSERT_NE(t, nullptr);
    for (std::uint64_t i = 0; i < 100; ++i) ASSERT_TRUE(t->insert(key(i).data(), 8, key(i * 3).data(), 8));
    EXPECT_FALSE(t->insert(key(5).data(), 8, key(0).data(), 8));   // present
    EXPECT_FALSE(t->update(key(500).data(), 8, key(0).data(), 8)); // absent
    EXPECT_TRUE(t->update(key(7).data(), 8, key(70).data(), 8));
    EXPECT_TRUE(t->remove(key(8).data(), 8));
    EXPECT_FALSE(t->remove(key(8).data(), 8));
    char* out = nullptr;
    ASSERT_EQ(t->scan(key(6).data(), 8, 3, out), 3);
    EXPECT_EQ(std::string(out, 8), key(6));
    EXPECT_EQ(std::string(out + 16, 8), key(7));
    EXPECT_EQ(std::string(out + 24, 8), key(70));
    EXPECT_EQ(std::string(out + 32, 8), key(9));  // 8 was removed
  }
  {  // reopened: the records are back
    std::unique_ptr<tree_api> t(create(o));
    ASSERT_NE(t, nullptr);
    char v[8];
    ASSERT_TRUE(t->find(key(7).data(), 8, v));
    EXPECT_EQ(std::string(v, 8), key(70));
    EXPECT_FALSE(t->find(key(8).data(), 8, v));
  }
  tree_options_t other = o;
  other.key_size = 16;  // bytes keys: another layout
  EXPECT_EQ(create(other), nullptr);
}

TEST(TreeApiWrapper, DefaultPoolIsRemovedWithTheTree) {
  Create create = load_create();
  ASSERT_NE(create, nullptr);
  const std::string path = "/dev/shm/pmindex/reflist-tree-" + std::to_string(::getpid()) + ".pool";
  tree_options_t o;
  o.pool_size = 1 << 22;
  {
    std::unique_ptr<tree_api> t(create(o));
    ASSERT_NE(t, nullptr);
    EXPECT_TRUE(std::filesystem::exists(path));
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(TreeApiWrapper, PersistenceModeFromEnvironment) {
  Create create = load_create();
  ASSERT_NE(create, nullptr);
  ::setenv("PMINDEX_PERSISTENCE", "bogus", 1);
  tree_options_t o;
  o.pool_size = 1 << 22;
  EXPECT_EQ(create(o), nullptr);
  ::setenv("PMINDEX_PERSISTENCE", "eadr", 1);
  std::unique_ptr<tree_api> t(create(o));
  EXPECT_NE(t, nullptr);
  ::unsetenv("PMINDEX_PERSISTENCE");
}

// PACTree's switches come from the environment (PiBench passes no per-index options); a value
// that is neither spelling is refused with create_tree's null, for any kind.
TEST(TreeApiWrapper, PacTreeSwitchesFromEnvironment) {
  Create create = load_create();
  ASSERT_NE(create, nullptr);
  tree_options_t o;
  o.pool_size = 1 << 22;
  for (const char* var : {"PMINDEX_PACTREE_UPDATER", "PMINDEX_PACTREE_SEARCH"}) {
    ::setenv(var, "bogus", 1);
    EXPECT_EQ(create(o), nullptr) << var;
    ::unsetenv(var);
  }
  ::setenv("PMINDEX_PACTREE_UPDATER", "sync", 1);
  ::setenv("PMINDEX_PACTREE_SEARCH", "dram", 1);
  std::unique_ptr<tree_api> t(create(o));
  EXPECT_NE(t, nullptr);
  ::unsetenv("PMINDEX_PACTREE_UPDATER");
  ::unsetenv("PMINDEX_PACTREE_SEARCH");
}

// PMINDEX_TREE_INSERT=upsert: insert replaces a present key's value (a blind upsert, as
// DPTree's original insert); unset or "insert": a present key is refused; anything else
// refuses create_tree.
TEST(TreeApiWrapper, BlindInsertsFromEnvironment) {
  Create create = load_create();
  ASSERT_NE(create, nullptr);
  tree_options_t o;
  o.pool_size = 1 << 22;
  ::setenv("PMINDEX_TREE_INSERT", "bogus", 1);
  EXPECT_EQ(create(o), nullptr);
  for (const char* mode : {"upsert", "insert"}) {
    ::setenv("PMINDEX_TREE_INSERT", mode, 1);
    std::unique_ptr<tree_api> t(create(o));
    ASSERT_NE(t, nullptr) << mode;
    const bool blind = std::strcmp(mode, "upsert") == 0;
    EXPECT_TRUE(t->insert(key(1).data(), 8, key(10).data(), 8));
    EXPECT_EQ(t->insert(key(1).data(), 8, key(11).data(), 8), blind) << mode;
    char v[8];
    ASSERT_TRUE(t->find(key(1).data(), 8, v));
    EXPECT_EQ(std::string(v, 8), key(blind ? 11 : 10)) << mode;
  }
  ::unsetenv("PMINDEX_TREE_INSERT");
}

// PiBench counts a refused write as completed: the wrapper says so on stderr at the first write
// refused for a full pool, once (a run that fills its pool reports an inflated throughput).
TEST(TreeApiWrapper, FullPoolIsSaidOnce) {
  Create create = load_create();
  ASSERT_NE(create, nullptr);
  tree_options_t o;
  o.pool_size = 1 << 22;
  std::unique_ptr<tree_api> t(create(o));
  ASSERT_NE(t, nullptr);
  ::testing::internal::CaptureStderr();
  std::uint64_t i = 0, refused = 0;
  for (; i < 2'000'000 && refused < 3; ++i)
    if (!t->insert(key(i).data(), 8, key(i).data(), 8)) ++refused;
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(refused, 3u) << "the 4 MiB pool never filled in " << i << " inserts";
  const std::string said = "the pool is full";
  const auto at = err.find(said);
  ASSERT_NE(at, std::string::npos) << err;
  EXPECT_EQ(err.find(said, at + 1), std::string::npos) << "said more than once: " << err;
  EXPECT_NE(err.find("PMINDEX_EXPECTED_RECORDS"), std::string::npos) << err;
}

}  // namespace

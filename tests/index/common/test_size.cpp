// Index::size() for every index kind (issue 19 item 6), against std::map: random inserts
// (fresh and duplicate), removes (present and missing), updates and upserts; a bulk load; a
// clean reopen and a crash reopen (recovery's count, and for the lazily recovering kinds the
// background walk's); two threads inserting at once.
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "pmindex/index.h"
#include "support/temp_dir.h"

namespace pmindex {
namespace {

using pmindex::testing::TempDir;

Options size_options(const std::string& kind, const std::string& path) {
  Options o;
  o.kind = kind;
  o.path = path;
  o.pool_size = 64 << 20;
  o.expected_records = 100'000;
  return o;
}

// Random operations on idx and the model; size() must match after each batch.
void churn(Index& idx, std::map<std::uint64_t, std::uint64_t>& model, std::uint64_t seed,
           int ops) {
  std::mt19937_64 rng(seed);
  for (int i = 0; i < ops; ++i) {
    const std::uint64_t k = rng() % 4000 + 1;
    const std::string key = encode_u64(k), value = encode_u64(i);
    switch (rng() % 4) {
      case 0: {
        const Code c = idx.insert(key, value);
        ASSERT_EQ(c, model.count(k) ? Code::already_present : Code::ok) << k;
        model.emplace(k, i);
        break;
      }
      case 1: {
        const Code c = idx.remove(key);
        ASSERT_EQ(c, model.erase(k) ? Code::ok : Code::not_found) << k;
        break;
      }
      case 2:
        ASSERT_EQ(idx.update(key, value), model.count(k) ? Code::ok : Code::not_found) << k;
        if (model.count(k)) model[k] = i;
        break;
      default:
        ASSERT_EQ(idx.upsert(key, value), Code::ok) << k;
        model[k] = i;
    }
    if (i % 500 == 0) {
      ASSERT_EQ(idx.size(), model.size()) << "after op " << i;
    }
  }
  ASSERT_EQ(idx.size(), model.size());
}

class Size : public ::testing::TestWithParam<std::string> {};

TEST_P(Size, MatchesAMapThroughOperationsReopenAndCrash) {
  TempDir dir;
  const std::string path = dir.file("size.pool");
  std::map<std::uint64_t, std::uint64_t> model;
  {
    auto idx = Index::open(size_options(GetParam(), path));
    ASSERT_TRUE(idx.ok()) << idx.status().to_string();
    EXPECT_EQ((*idx)->size(), 0u);
    churn(**idx, model, 1, 20'000);
    ASSERT_TRUE((*idx)->close().ok());
  }
  {
    auto idx = Index::open(size_options(GetParam(), path));  // clean reopen
    ASSERT_TRUE(idx.ok()) << idx.status().to_string();
    ASSERT_EQ((*idx)->size(), model.size()) << "recovered count";
    churn(**idx, model, 2, 5'000);
  }  // no close: a crash
  auto idx = Index::open(size_options(GetParam(), path));
  ASSERT_TRUE(idx.ok()) << idx.status().to_string();
  ASSERT_EQ((*idx)->size(), model.size()) << "count recovered after a crash";
  churn(**idx, model, 3, 5'000);
}

TEST_P(Size, CountsABulkLoad) {
  auto idx = Index::open(size_options(GetParam(), ""));
  ASSERT_TRUE(idx.ok()) << idx.status().to_string();
  std::vector<std::string> keys, values;
  for (std::uint64_t k = 1; k <= 5000; ++k) {
    keys.push_back(encode_u64(k * 7));
    values.push_back(encode_u64(k));
  }
  std::vector<KeyValue> sorted;
  for (std::size_t i = 0; i < keys.size(); ++i) sorted.push_back({keys[i], values[i]});
  ASSERT_TRUE((*idx)->bulk_load(sorted, 0.8).ok());
  EXPECT_EQ((*idx)->size(), 5000u);
  ASSERT_EQ((*idx)->insert(encode_u64(3), encode_u64(3)), Code::ok);
  ASSERT_EQ((*idx)->remove(encode_u64(14)), Code::ok);
  EXPECT_EQ((*idx)->size(), 5000u);
}

// Each thread counts on its own slot; the sum after both joined is every insert.
TEST_P(Size, TwoThreadsInsertAtOnce) {
  if (GetParam() == "reflist") GTEST_SKIP() << "reflist is not concurrent (one mutex)";
  auto idx = Index::open(size_options(GetParam(), ""));
  ASSERT_TRUE(idx.ok()) << idx.status().to_string();
  auto worker = [&](std::uint64_t t) {
    auto scope = (*idx)->attach_thread();
    for (std::uint64_t i = 0; i < 20'000; ++i)
      (void)(*idx)->insert(encode_u64(i * 2 + t + 1), encode_u64(i));
    for (std::uint64_t i = 0; i < 20'000; i += 4) (void)(*idx)->remove(encode_u64(i * 2 + t + 1));
  };
  std::thread a(worker, 0), b(worker, 1);
  a.join();
  b.join();
  EXPECT_EQ((*idx)->size(), 2u * (20'000 - 5'000));
}

INSTANTIATE_TEST_SUITE_P(Kinds, Size,
                         ::testing::Values("reflist", "lbtree", "fptree", "nbtree", "apex",
                                           "utree", "part"),
                         [](const auto& p) { return p.param; });
INSTANTIATE_TEST_SUITE_P(Roart, Size, ::testing::Values("roart"),
                         [](const auto& p) { return p.param; });

}  // namespace
}  // namespace pmindex

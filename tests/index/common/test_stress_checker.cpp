// The two-thread stress (hybrid_stress.h) must catch what a thread reads wrongly of the other
// thread's keys: a wrapper around the reference index tears the values that a worker reads of
// keys the other worker wrote (the high half of the value found, the low half of that key's
// previous write), in finds or in scans. A worker's reads of its own keys, and the final checks
// (run on the main thread), see whole values, so only the cross-thread checks can catch it. The
// same stress passes over the unbroken wrapper.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "index/common/forwarding_index.h"
#include "index/common/hybrid_stress.h"
#include "pmindex/index.h"

namespace pmindex {
namespace {

enum class Tear { none, finds, scans };

class TornReads final : public testing::ForwardingIndex {
 public:
  TornReads(std::unique_ptr<Index> inner, Tear tear)
      : ForwardingIndex(std::move(inner)), tear_(tear) {}
  Code insert(std::string_view k, std::string_view v) override {
    return noted(k, v, inner().insert(k, v));
  }
  Code update(std::string_view k, std::string_view v) override {
    return noted(k, v, inner().update(k, v));
  }
  Code upsert(std::string_view k, std::string_view v) override {
    return noted(k, v, inner().upsert(k, v));
  }
  Code find(std::string_view k, std::string* v) const override {
    const Code c = inner().find(k, v);
    if (c == Code::ok && v != nullptr && tear_ == Tear::finds) *v = torn(k, *v);
    return c;
  }
  std::size_t scan(std::string_view start, std::size_t max, ScanBuffer& out) const override {
    const std::size_t n = inner().scan(start, max, out);
    if (tear_ != Tear::scans) return n;
    ScanBuffer all = out;
    out.clear();
    for (std::size_t i = 0; i < n; ++i)
      out.append(all.key(i), torn(all.key(i), std::string(all.value(i))));
    return out.size();
  }

 private:
  struct Writes {
    std::thread::id writer;
    std::string current, previous;
  };
  Code noted(std::string_view k, std::string_view v, Code c) {
    if (c != Code::ok) return c;
    std::lock_guard<std::mutex> g(mu_);
    Writes& w = writes_[std::string(k)];
    w.writer = std::this_thread::get_id();
    w.previous = std::move(w.current);
    w.current = std::string(v);
    writers_.insert(w.writer);
    return c;
  }
  // `value` torn with the key's previous write when a writer reads a key another thread wrote.
  std::string torn(std::string_view k, const std::string& value) const {
    std::lock_guard<std::mutex> g(mu_);
    const auto me = std::this_thread::get_id();
    const auto it = writes_.find(std::string(k));
    if (writers_.count(me) == 0 || it == writes_.end() || it->second.writer == me ||
        it->second.previous.size() != 8 || value.size() != 8)
      return value;
    return value.substr(0, 4) + it->second.previous.substr(4);
  }

  Tear tear_;
  mutable std::mutex mu_;
  std::map<std::string, Writes> writes_;
  std::set<std::thread::id> writers_;
};

// The gtest failures of a short stress over the wrapper (from any thread), concatenated.
std::string stress_failures(Tear tear) {
  Options o;
  o.kind = "reflist";
  o.pool_size = 16 << 20;
  auto inner = Index::open(o);
  EXPECT_TRUE(inner.ok()) << inner.status().to_string();
  if (!inner.ok()) return "open failed";
  TornReads idx(std::move(inner).value(), tear);
  ::testing::TestPartResultArray failures;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ALL_THREADS, &failures);
    hybrid_test::stress_two_threads(idx, 100, 0.3, {}, 11, "torn reads");
  }
  std::string all;
  for (int i = 0; i < failures.size(); ++i) {
    all += failures.GetTestPartResult(i).message();
    all += "\n";
  }
  std::cout << "caught: " << (all.empty() ? "nothing\n" : all);
  return all;
}

TEST(StressChecker, KeyedValuesAreRecognised) {
  const std::string v = hybrid_test::keyed_value(42, 0x123456789abcdefull);
  EXPECT_TRUE(hybrid_test::is_keyed_value(42, v));
  EXPECT_FALSE(hybrid_test::is_keyed_value(43, v));  // another key's value
  const std::string w = hybrid_test::keyed_value(42, 0xfedcba9876543210ull);
  EXPECT_FALSE(hybrid_test::is_keyed_value(42, v.substr(0, 4) + w.substr(4)));  // torn
  EXPECT_FALSE(hybrid_test::is_keyed_value(42, v.substr(0, 7)));
}

TEST(StressChecker, PassesOverTheUnbrokenIndex) { EXPECT_EQ(stress_failures(Tear::none), ""); }

TEST(StressChecker, CatchesATornFindOfTheOtherThreadsKey) {
  EXPECT_NE(stress_failures(Tear::finds).find("find of the other thread's key"),
            std::string::npos);
}

TEST(StressChecker, CatchesATornScanOfTheOtherThreadsKey) {
  EXPECT_NE(stress_failures(Tear::scans).find("scan of the other thread's key"),
            std::string::npos);
}

}  // namespace
}  // namespace pmindex

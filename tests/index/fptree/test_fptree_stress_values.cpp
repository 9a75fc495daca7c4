// Out-of-line values under concurrency: a writer thread updates, removes and re-inserts keys
// with values of varying length (each update writes a new record and frees the old one, U5)
// while a reader thread looks them up and scans. Every value is self-describing (its key, a
// length byte, then filler derived from both), so the reader can tell a torn or recycled
// record from a real one: a lookup or scan must only ever return a whole value written for
// that key. 8-entry leaves (splits and leaf removals race too). Time-boxed by
// PMINDEX_STRESS_SECONDS (default 2); run under TSan (cmake --preset tsan) for the race check.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <random>
#include <thread>

#include "index/fptree/layout.h"
#include "pmindex/index.h"

namespace pmindex {
namespace {

constexpr std::uint32_t kMaxValue = 120;

std::string make_value(const std::string& key, std::uint64_t r) {
  const std::size_t len = 9 + r % (kMaxValue - 9 + 1);  // 9..120 bytes: always out of line
  std::string v = key;
  v.push_back(static_cast<char>(len));
  while (v.size() < len) v.push_back(static_cast<char>(key[7] * 31 + v.size() + len));
  return v;
}

bool well_formed(const std::string& key, const std::string& v) {
  if (v.size() < 9 || v.compare(0, 8, key) != 0) return false;
  const std::size_t len = static_cast<unsigned char>(v[8]);
  if (len != v.size()) return false;
  for (std::size_t i = 9; i < len; ++i)
    if (v[i] != static_cast<char>(key[7] * 31 + i + len)) return false;
  return true;
}

// Bytes keys: the key records are retired and reused too (same 8-byte strings as keys).
void run(KeyType kt) {
  Options o;
  o.kind = "fptree";
  o.key_type = kt;
  o.max_key_size = 8;
  o.node_size = sizeof(fptree::Leaf<8>);
  o.pool_size = 64 << 20;
  o.max_value_size = kMaxValue;
  auto r = Index::open(o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::unique_ptr<Index> idx = std::move(r).value();
  constexpr std::uint64_t kKeys = 200;
  for (std::uint64_t k = 0; k < kKeys; ++k)
    ASSERT_EQ(idx->insert(encode_u64(k), make_value(encode_u64(k), k)), Code::ok);
  const char* env = std::getenv("PMINDEX_STRESS_SECONDS");
  const double seconds = (env != nullptr ? std::max(0.1, std::atof(env)) : 2.0) / 2;
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(seconds));
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  std::uint64_t writes = 0, reads = 0;
  std::thread writer([&] {
    auto scope = idx->attach_thread();
    std::mt19937_64 rng(5);
    while (std::chrono::steady_clock::now() < until) {
      const std::string k = encode_u64(rng() % kKeys);
      if (rng() % 8 == 0) {
        if (idx->remove(k) == Code::ok && idx->insert(k, make_value(k, rng())) != Code::ok) ++bad;
      } else if (idx->update(k, make_value(k, rng())) != Code::ok) {
        ++bad;
      }
      ++writes;
    }
    stop.store(true, std::memory_order_release);
  });
  std::thread reader([&] {
    auto scope = idx->attach_thread();
    std::mt19937_64 rng(6);
    ScanBuffer buf;
    std::string v;
    while (!stop.load(std::memory_order_acquire)) {
      const std::string k = encode_u64(rng() % kKeys);
      const Code c = idx->find(k, &v);
      if (c == Code::ok ? !well_formed(k, v) : c != Code::not_found) ++bad;
      idx->scan(k, 10, buf);
      for (std::size_t i = 0; i < buf.size(); ++i)
        if (!well_formed(std::string(buf.key(i)), std::string(buf.value(i)))) ++bad;
      ++reads;
    }
  });
  writer.join();
  reader.join();
  EXPECT_EQ(bad.load(), 0);
  const Status s = idx->verify();  // also: every live record reachable, none leaked
  ASSERT_TRUE(s.ok()) << s.to_string();
  std::printf("fptree values: %llu writes, %llu reads\n", static_cast<unsigned long long>(writes),
              static_cast<unsigned long long>(reads));
  EXPECT_GT(writes, 100u);
}

TEST(FPTreeStressValues, ReaderSeesOnlyWholeValuesWhileWriterReplacesRecords) {
  run(KeyType::u64);
  run(KeyType::bytes);
}

}  // namespace
}  // namespace pmindex

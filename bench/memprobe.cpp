#include "memprobe.h"

#include <sys/mman.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <utility>
#include <vector>

namespace pmbench {

namespace {

constexpr std::size_t kLine = 64;
constexpr std::size_t kHuge = std::size_t{2} << 20;

// A 2 MiB aligned anonymous mapping of `bytes` (a multiple of 2 MiB), advised as asked.
class Buffer {
 public:
  Buffer(std::size_t bytes, int advice) : bytes_(bytes) {
    raw_bytes_ = bytes + kHuge;
    raw_ = mmap(nullptr, raw_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw_ == MAP_FAILED) {
      raw_ = nullptr;
      return;
    }
    const auto a = (reinterpret_cast<std::uintptr_t>(raw_) + kHuge - 1) & ~(kHuge - 1);
    base_ = reinterpret_cast<char*>(a);
    (void)madvise(base_, bytes_, advice);  // a hint: the result is read back from smaps
  }
  ~Buffer() {
    if (raw_ != nullptr) munmap(raw_, raw_bytes_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  char* data() const { return base_; }
  bool ok() const { return base_ != nullptr; }

  // AnonHugePages of this mapping, from /proc/self/smaps (0 if it cannot be read).
  std::uint64_t huge_bytes() const {
    std::ifstream smaps("/proc/self/smaps");
    std::string line;
    bool ours = false;
    while (std::getline(smaps, line)) {
      std::uintptr_t lo = 0, hi = 0;
      char dash = 0;
      std::istringstream range(line);
      if (range >> std::hex >> lo >> dash >> hi && dash == '-') {
        const auto p = reinterpret_cast<std::uintptr_t>(raw_);
        ours = lo <= p && p < hi;
        continue;
      }
      if (ours && line.rfind("AnonHugePages:", 0) == 0) {
        std::istringstream kb(line.substr(14));
        std::uint64_t v = 0;
        kb >> v;
        return v * 1024;
      }
    }
    return 0;
  }

 private:
  std::size_t bytes_;
  std::size_t raw_bytes_ = 0;
  void* raw_ = nullptr;
  char* base_ = nullptr;
};

// Links every line of buf into one random cycle (Sattolo's shuffle: a single cycle, so the
// chase visits every line before it repeats) and times `hops` dependent loads along it.
double chase_ns(char* buf, std::size_t bytes, std::uint64_t hops, std::uint64_t seed) {
  const std::size_t lines = bytes / kLine;
  std::vector<std::uint32_t> order(lines);
  for (std::size_t i = 0; i < lines; ++i) order[i] = static_cast<std::uint32_t>(i);
  std::mt19937_64 rng(seed);
  for (std::size_t i = lines - 1; i > 0; --i) {
    std::uniform_int_distribution<std::size_t> pick(0, i - 1);
    std::swap(order[i], order[pick(rng)]);
  }
  // order is a cyclic permutation: line i points at line order[i].
  for (std::size_t i = 0; i < lines; ++i) {
    const std::uint64_t next = std::uint64_t{order[i]} * kLine;
    std::memcpy(buf + i * kLine, &next, sizeof next);
  }
  std::uint64_t at = 0;
  for (std::uint64_t i = 0; i < hops / 10; ++i) std::memcpy(&at, buf + at, sizeof at);  // warm
  const auto t0 = std::chrono::steady_clock::now();
  for (std::uint64_t i = 0; i < hops; ++i) std::memcpy(&at, buf + at, sizeof at);
  const auto t1 = std::chrono::steady_clock::now();
  // The chain's end decides the result, so the loop cannot be removed (a chase ends on a line
  // offset, never on ~0).
  if (at == ~std::uint64_t{0}) return -1;
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(hops);
}

}  // namespace

MemoryLatency probe_memory_latency(std::size_t bytes, std::uint64_t hops) {
  MemoryLatency m;
  m.bytes = (bytes + kHuge - 1) / kHuge * kHuge;
  m.hops = hops == 0 ? 1 : hops;
  {
    Buffer small(m.bytes, MADV_NOHUGEPAGE);
    if (!small.ok()) {
      m.error = "mmap of the 4 KiB-page buffer failed";
      return m;
    }
    m.ns_4k = chase_ns(small.data(), m.bytes, m.hops, 1);
  }
  Buffer huge(m.bytes, MADV_HUGEPAGE);
  if (!huge.ok()) {
    m.error = "mmap of the huge-page buffer failed";
    return m;
  }
  m.ns_huge = chase_ns(huge.data(), m.bytes, m.hops, 2);
  m.huge_bytes = huge.huge_bytes();
  return m;
}

}  // namespace pmbench

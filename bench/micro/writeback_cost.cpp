// What a write-back (clwb + sfence) costs the instruction after it, on a file mapping like an
// emulated pool (docs/persistence.md, "What a write-back costs the code after it").
//
//   build/release/bench/writeback_cost [--dir /dev/shm] [--mib 256] [--lines 200000]
//
// Each case writes one random 8-byte word per line of a shared file mapping (so every line is
// a cache miss with a 4 KiB page walk, like a leaf of a 10M-key tree), then does what the case
// names; the figure is ns per line. Nothing here is pmindex code: plain intrinsics, so the
// numbers describe the machine, not the library.
#include <fcntl.h>
#include <immintrin.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

enum class Case { store, persist, persist_load, persist_cas, persist_store, persist_store_mfence };
constexpr const char* kNames[] = {
    "store only (independent misses overlap)",
    "store + clwb + sfence",
    "  ... then a load of the same word",
    "  ... then a CAS on the same word",
    "  ... then a store to the same word",
    "  ... then a store to the same word + mfence",
};

[[gnu::target("clwb")]] double run(char* base, const std::vector<std::size_t>& offs, Case c) {
  std::uint64_t sink = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < offs.size(); ++i) {
    auto* w = reinterpret_cast<std::uint64_t*>(base + offs[i]);
    std::atomic_ref<std::uint64_t> a(*w);
    a.store(i, std::memory_order_relaxed);
    if (c == Case::store) continue;
    _mm_clwb(w);
    _mm_sfence();
    switch (c) {
      case Case::persist_load: sink += a.load(std::memory_order_relaxed); break;
      case Case::persist_cas: {
        std::uint64_t e = i;
        a.compare_exchange_strong(e, i + 1, std::memory_order_acq_rel);
        break;
      }
      case Case::persist_store: a.store(i + 1, std::memory_order_relaxed); break;
      case Case::persist_store_mfence:
        a.store(i + 1, std::memory_order_relaxed);
        _mm_mfence();
        break;
      default: break;
    }
  }
  const double ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  if (sink == 1) std::puts("");  // keeps the loads
  return ns / static_cast<double>(offs.size());
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/dev/shm";
  std::size_t mib = 256, lines = 200000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--dir")) dir = argv[i + 1];
    else if (!std::strcmp(argv[i], "--mib")) mib = std::strtoull(argv[i + 1], nullptr, 10);
    else if (!std::strcmp(argv[i], "--lines")) lines = std::strtoull(argv[i + 1], nullptr, 10);
    else { std::fprintf(stderr, "unknown option %s\n", argv[i]); return 2; }
  }
  if ((argc % 2) == 0 || mib < 1 || lines < 1) {
    std::fprintf(stderr, "usage: %s [--dir DIR] [--mib N] [--lines N]\n", argv[0]);
    return 2;
  }
  const std::size_t bytes = mib << 20;
  std::string path = dir + "/writeback_cost.XXXXXX";
  const int fd = mkstemp(path.data());
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    std::perror(path.c_str());
    return 1;
  }
  unlink(path.c_str());
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  auto* base = static_cast<char*>(p);
  for (std::size_t i = 0; i < bytes; i += 4096) base[i] = 1;  // no page faults while timing
  std::mt19937_64 rng(1729);
  std::vector<std::size_t> offs(lines);
  for (auto& o : offs) o = (rng() % (bytes / 64)) * 64;
  std::printf("write-back cost, %zu random lines of a %zu MiB MAP_SHARED file in %s "
              "(ns per line):\n",
              lines, mib, dir.c_str());
  for (int c = 0; c < 6; ++c)
    std::printf("  %-46s %7.1f\n", kNames[c], run(base, offs, static_cast<Case>(c)));
  return 0;
}

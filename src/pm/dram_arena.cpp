#include "pmindex/pm/dram_arena.h"

#include <sys/mman.h>

#include "pm/aligned_mapping.h"

namespace pmindex::pm {

namespace {
std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }
}  // namespace

DramArena::~DramArena() { reset(); }

void* DramArena::allocate(std::size_t bytes) {
  const std::size_t size = round_up(bytes == 0 ? 1 : bytes, kAlign);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = free_.find(size);
  if (it != free_.end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    in_use_.fetch_add(size, std::memory_order_relaxed);
    return p;
  }
  if (bump_ == nullptr || static_cast<std::size_t>(bump_end_ - bump_) < size) {
    // 2 MiB aligned for THP.
    const std::size_t region = round_up(size, kRegionSize);
    void* raw = detail::map_aligned_anonymous(region, kRegionSize, PROT_READ | PROT_WRITE);
    if (raw == MAP_FAILED) return nullptr;
    char* base = static_cast<char*>(raw);
    if (madvise(base, region, MADV_HUGEPAGE) == 0) huge_pages_.store(true, std::memory_order_relaxed);
    regions_.push_back({base, region});
    reserved_.fetch_add(region, std::memory_order_relaxed);
    // The rest of the previous region's bump space is abandoned (at most one node's worth).
    bump_ = base;
    bump_end_ = base + region;
  }
  void* p = bump_;
  bump_ += size;
  in_use_.fetch_add(size, std::memory_order_relaxed);
  return p;
}

void DramArena::deallocate(void* p, std::size_t bytes) {
  if (p == nullptr) return;
  const std::size_t size = round_up(bytes == 0 ? 1 : bytes, kAlign);
  std::lock_guard<std::mutex> lock(mu_);
  free_[size].push_back(p);
  in_use_.fetch_sub(size, std::memory_order_relaxed);
}

void DramArena::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Region& r : regions_) munmap(r.base, r.size);
  regions_.clear();
  free_.clear();
  bump_ = bump_end_ = nullptr;
  in_use_.store(0, std::memory_order_relaxed);
  reserved_.store(0, std::memory_order_relaxed);
}

}  // namespace pmindex::pm

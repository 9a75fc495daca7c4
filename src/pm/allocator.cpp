// The pool allocator (contract in include/pmindex/pm/allocator.h, design in docs/allocator.md).
//
// Volatile state only: free extents (address-ordered, coalesced), per-class central free
// lists, per-thread caches. The one persistent word is the heap high-water mark.
#include "pmindex/pm/allocator.h"

#include <algorithm>
#include <array>
#include <map>

#include "pmindex/pm/layout.h"
#include "pmindex/pm/pool.h"
#include "pmindex/pm/thread_slot.h"

namespace pmindex::pm {

namespace {

constexpr std::size_t kUnit = Allocator::kXPLineAlign;  // 256

// 64, 128, 192; 256..1024 step 256; then four classes per power of two up to 16 MiB.
constexpr auto kClassSizes = [] {
  std::array<std::size_t, 63> sizes{};
  std::size_t n = 0;
  for (std::size_t s = 64; s <= 192; s += 64) sizes[n++] = s;
  for (std::size_t s = 256; s <= 1024; s += 256) sizes[n++] = s;
  for (std::size_t p = 1024; p < Allocator::kMaxBlock; p *= 2)
    for (std::size_t q = 5; q <= 8; ++q) sizes[n++] = p * q / 4;
  return sizes;
}();
static_assert(kClassSizes.back() == Allocator::kMaxBlock);
static_assert(kClassSizes[3] == 256 && kClassSizes[7] == 1280);
constexpr int kNumClasses = static_cast<int>(kClassSizes.size());

bool is_small(int cls) { return kClassSizes[static_cast<std::size_t>(cls)] < kUnit; }

// How many blocks a thread cache fetches at once: more for small blocks, one for big ones.
std::size_t batch_of(int cls) {
  const std::size_t size = kClassSizes[static_cast<std::size_t>(cls)];
  return std::clamp<std::size_t>(std::size_t{16384} / size, 1, 32);
}

std::uint64_t round_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

}  // namespace

struct Allocator::ThreadCache {
  std::array<std::vector<std::uint64_t>, kNumClasses> free;
  // Written only by the owning thread (relaxed, no contention); summed by stats().
  std::array<std::atomic<std::int64_t>, kNumClasses> in_use{};
  std::atomic<std::uint64_t> allocations{0};
  std::atomic<std::uint64_t> frees{0};
};

struct Allocator::Central {
  std::mutex mu;
  std::map<std::uint64_t, std::uint64_t> extents;  // start -> length, coalesced
  std::array<std::vector<std::uint64_t>, kNumClasses> free;
  std::array<std::atomic<ThreadCache*>, kMaxThreadSlots> caches{};
  // Recovery
  std::vector<std::pair<std::uint64_t, std::uint64_t>> reachable;  // offset, class size
  std::array<std::int64_t, kNumClasses> recovered_in_use{};
  Status mark_error;
  std::uint64_t recovery_high_water = 0;
  bool start_now = false;  // [recovery_high_water, heap_end) was freed at begin_recovery

  void add_extent(std::uint64_t start, std::uint64_t len) {
    if (len == 0) return;
    auto next = extents.lower_bound(start);
    if (next != extents.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == start) {
        start = prev->first;
        len += prev->second;
        extents.erase(prev);
      }
    }
    if (next != extents.end() && start + len == next->first) {
      len += next->second;
      extents.erase(next);
    }
    extents.emplace(start, len);
  }
};

int Allocator::class_of(std::size_t bytes) {
  if (bytes > kMaxBlock) return -1;
  auto it = std::lower_bound(kClassSizes.begin(), kClassSizes.end(), bytes);
  return static_cast<int>(it - kClassSizes.begin());
}
std::size_t Allocator::class_size(int cls) { return kClassSizes[static_cast<std::size_t>(cls)]; }
int Allocator::num_classes() { return kNumClasses; }

Allocator::Allocator(Pool& pool, std::uint64_t heap_begin, std::uint64_t heap_end)
    : pool_(pool),
      heap_begin_(round_up(heap_begin, kUnit)),
      heap_end_(heap_end / kUnit * kUnit),
      central_(std::make_unique<Central>()) {}

Allocator::~Allocator() {
  for (auto& c : central_->caches) delete c.load(std::memory_order_acquire);
}

Allocator::ThreadCache& Allocator::cache() {
  auto& slot = central_->caches[this_thread_slot()];
  // acquire: pairs with the release below, so a recycled slot's cache is seen fully built.
  ThreadCache* tc = slot.load(std::memory_order_acquire);
  if (tc == nullptr) {
    tc = new ThreadCache();
    slot.store(tc, std::memory_order_release);
  }
  return *tc;
}

void Allocator::init_empty() {
  std::lock_guard<std::mutex> lock(central_->mu);
  central_->extents.clear();
  central_->add_extent(heap_begin_, heap_end_ - heap_begin_);
}

void Allocator::raise_high_water(std::uint64_t end) {
  auto* h = pool_.at<PoolHeader>(0);
  const std::uint64_t current = h->heap_high_water;
  if (end <= current) return;
  // Raise in steps of 1/16 of the heap (at least 64 KiB), so the persisted word changes rarely.
  const std::uint64_t step = std::max<std::uint64_t>((heap_end_ - heap_begin_) / 16, 64 * 1024);
  const std::uint64_t target = std::min(heap_end_, round_up(std::max(end, current + step), kUnit));
  publish(&h->heap_high_water, target);
  persist(&h->heap_high_water, sizeof h->heap_high_water);
}

// Carves `bytes` (a multiple of 256) from the lowest-addressed extent that fits. Caller holds mu.
std::uint64_t Allocator::carve(std::size_t bytes, Code* code) {
  auto& ext = central_->extents;
  for (auto it = ext.begin(); it != ext.end(); ++it) {
    if (it->second < bytes) continue;
    const std::uint64_t start = it->first;
    const std::uint64_t rest = it->second - bytes;
    ext.erase(it);
    if (rest != 0) ext.emplace(start + bytes, rest);
    raise_high_water(start + bytes);
    return start;
  }
  if (code) *code = Code::pool_full;
  return 0;
}

bool Allocator::refill(int cls, ThreadCache& tc, Code* code) {
  const std::size_t want = batch_of(cls);
  auto& mine = tc.free[static_cast<std::size_t>(cls)];
  std::lock_guard<std::mutex> lock(central_->mu);
  auto& central = central_->free[static_cast<std::size_t>(cls)];
  while (!central.empty() && mine.size() < want) {
    mine.push_back(central.back());
    central.pop_back();
  }
  if (!mine.empty()) return true;
  const std::size_t size = class_size(cls);
  if (is_small(cls)) {
    // A 256 B unit split into blocks of this class; a 192 B block leaves one 64 B block over.
    const std::uint64_t unit = carve(kUnit, code);
    if (unit == 0) return false;
    std::uint64_t off = unit;
    for (; off + size <= unit + kUnit; off += size) mine.push_back(off);
    for (; off < unit + kUnit; off += 64) central_->free[0].push_back(off);
    return true;
  }
  // Several blocks in one carve when the heap allows, else one.
  for (std::size_t n = want; n >= 1; n /= 2) {
    Code ignored = Code::ok;
    const std::uint64_t start = carve(n * size, n == 1 ? code : &ignored);
    if (start != 0) {
      for (std::size_t i = 0; i < n; ++i) mine.push_back(start + i * size);
      return true;
    }
    if (n == 1) break;
  }
  return false;
}

std::uint64_t Allocator::allocate(std::size_t bytes, Code* code) {
  const int cls = class_of(bytes);
  if (cls < 0) {
    if (code) *code = Code::invalid_argument;
    return 0;
  }
  ThreadCache& tc = cache();
  auto& mine = tc.free[static_cast<std::size_t>(cls)];
  if (mine.empty() && !refill(cls, tc, code)) return 0;
  const std::uint64_t off = mine.back();
  mine.pop_back();
  tc.in_use[static_cast<std::size_t>(cls)].fetch_add(1, std::memory_order_relaxed);
  tc.allocations.fetch_add(1, std::memory_order_relaxed);
  return off;
}

void Allocator::deallocate(std::uint64_t offset, std::size_t bytes) {
  const int cls = class_of(bytes);
  if (cls < 0 || offset == 0) return;
  ThreadCache& tc = cache();
  auto& mine = tc.free[static_cast<std::size_t>(cls)];
  mine.push_back(offset);
  tc.in_use[static_cast<std::size_t>(cls)].fetch_sub(1, std::memory_order_relaxed);
  tc.frees.fetch_add(1, std::memory_order_relaxed);
  const std::size_t batch = batch_of(cls);
  if (mine.size() > 2 * batch) {
    std::lock_guard<std::mutex> lock(central_->mu);
    auto& central = central_->free[static_cast<std::size_t>(cls)];
    while (mine.size() > batch) {
      central.push_back(mine.back());
      mine.pop_back();
    }
  }
}

void Allocator::begin_recovery(bool start_now) {
  std::lock_guard<std::mutex> lock(central_->mu);
  central_->extents.clear();
  for (auto& f : central_->free) f.clear();
  central_->reachable.clear();
  central_->recovered_in_use.fill(0);
  central_->mark_error = Status::Ok();
  central_->recovery_high_water = pool_.at<PoolHeader>(0)->heap_high_water;
  // Called at open, before any other thread uses this allocator: thread caches can be reset.
  for (auto& slot : central_->caches) {
    ThreadCache* tc = slot.load(std::memory_order_acquire);
    if (tc == nullptr) continue;
    for (auto& f : tc->free) f.clear();
    for (auto& n : tc->in_use) n.store(0, std::memory_order_relaxed);
  }
  central_->start_now = start_now;
  if (start_now) {
    central_->add_extent(central_->recovery_high_water,
                         heap_end_ - central_->recovery_high_water);
  }
  recovering_.store(true, std::memory_order_release);
}

Code Allocator::mark_reachable(std::uint64_t offset, std::size_t bytes) {
  const int cls = class_of(bytes);
  std::lock_guard<std::mutex> lock(central_->mu);
  auto fail = [&](const std::string& why) {
    if (central_->mark_error.ok()) {
      central_->mark_error = pool_.error(
          Code::corrupted, "block at offset " + std::to_string(offset) + " of " +
                               std::to_string(bytes) + " bytes " + why);
    }
    return Code::corrupted;
  };
  if (cls < 0) return fail("is larger than any size class");
  const std::size_t size = class_size(cls);
  if (offset < heap_begin_ || offset + size > central_->recovery_high_water)
    return fail("lies outside the allocated heap");
  if (is_small(cls) ? (offset % 64 != 0 || offset / kUnit != (offset + size - 1) / kUnit)
                    : offset % kUnit != 0)
    return fail("is misaligned for its size class");
  central_->reachable.emplace_back(offset, size);
  ++central_->recovered_in_use[static_cast<std::size_t>(cls)];
  return Code::ok;
}

Status Allocator::finish_recovery() {
  std::lock_guard<std::mutex> lock(central_->mu);
  if (!central_->mark_error.ok()) return central_->mark_error;
  auto& blocks = central_->reachable;
  std::sort(blocks.begin(), blocks.end());
  // Everything between reachable blocks (below the recovery high-water mark) is free.
  // 256 B-aligned stretches become extents; the 64 B pieces around them serve the 64 B class.
  auto free_gap = [&](std::uint64_t a, std::uint64_t b) {
    const std::uint64_t mid_a = std::min(round_up(a, kUnit), b);
    const std::uint64_t mid_b = std::max(b / kUnit * kUnit, mid_a);
    for (std::uint64_t o = a; o < mid_a; o += 64) central_->free[0].push_back(o);
    central_->add_extent(mid_a, mid_b - mid_a);
    for (std::uint64_t o = mid_b; o < b; o += 64) central_->free[0].push_back(o);
  };
  std::uint64_t cursor = heap_begin_;
  for (const auto& [off, size] : blocks) {
    if (off < cursor) {
      return pool_.error(Code::corrupted, "blocks at offsets " + std::to_string(off) +
                                              " and below overlap (reachable twice?)");
    }
    free_gap(cursor, off);
    cursor = off + size;
  }
  free_gap(cursor, central_->recovery_high_water);
  // Nothing at or above the high-water mark was ever handed out: it is free too (start-now
  // recovery already freed it in begin_recovery, and may have allocated from it since).
  if (!central_->start_now) {
    central_->add_extent(central_->recovery_high_water,
                         heap_end_ - central_->recovery_high_water);
  }
  blocks.clear();
  blocks.shrink_to_fit();
  recovering_.store(false, std::memory_order_release);
  return Status::Ok();
}

AllocatorStats Allocator::stats() const {
  AllocatorStats s;
  s.heap_bytes = heap_end_ - heap_begin_;
  std::array<std::int64_t, kNumClasses> in_use{};
  std::array<std::uint64_t, kNumClasses> cached{};
  {
    std::lock_guard<std::mutex> lock(central_->mu);
    in_use = central_->recovered_in_use;
    std::uint64_t free_extents = 0;
    for (const auto& [start, len] : central_->extents) free_extents += len;
    // Reserved: what was ever carved, i.e. the heap minus untouched extents.
    s.bytes_reserved = s.heap_bytes - free_extents;
    for (int c = 0; c < kNumClasses; ++c)
      cached[static_cast<std::size_t>(c)] = central_->free[static_cast<std::size_t>(c)].size();
    for (const auto& slot : central_->caches) {
      const ThreadCache* tc = slot.load(std::memory_order_acquire);
      if (tc == nullptr) continue;
      for (std::size_t c = 0; c < kClassSizes.size(); ++c) {
        in_use[c] += tc->in_use[c].load(std::memory_order_relaxed);
      }
      s.allocations += tc->allocations.load(std::memory_order_relaxed);
      s.frees += tc->frees.load(std::memory_order_relaxed);
    }
  }
  for (std::size_t c = 0; c < kClassSizes.size(); ++c) {
    if (in_use[c] == 0 && cached[c] == 0) continue;
    s.bytes_in_use += static_cast<std::uint64_t>(in_use[c]) * kClassSizes[c];
    s.classes.push_back({kClassSizes[c], static_cast<std::uint64_t>(in_use[c]), cached[c]});
  }
  return s;
}

}  // namespace pmindex::pm

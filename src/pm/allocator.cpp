// The pool allocator (contract in include/pmindex/pm/allocator.h, design in docs/allocator.md).
//
// Volatile state only: free extents (address-ordered, coalesced), per-class central free
// lists, per-thread caches. The one persistent word is the heap high-water mark. Recovery and
// the reclaim pass share one routine (Central::release) that turns a free address range into
// extents and class blocks, so a range is cut the same way whichever path freed it.
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
constexpr std::size_t kLine = Allocator::kLine;          // 64

// 16, 32; 64, 128, 192; 256..1024 step 256; then four classes per power of two up to 16 MiB.
constexpr auto kClassSizes = [] {
  std::array<std::size_t, 65> sizes{};
  std::size_t n = 0;
  sizes[n++] = 16;
  sizes[n++] = 32;
  for (std::size_t s = 64; s <= 192; s += 64) sizes[n++] = s;
  for (std::size_t s = 256; s <= 1024; s += 256) sizes[n++] = s;
  for (std::size_t p = 1024; p < Allocator::kMaxBlock; p *= 2)
    for (std::size_t q = 5; q <= 8; ++q) sizes[n++] = p * q / 4;
  return sizes;
}();
static_assert(kClassSizes.back() == Allocator::kMaxBlock);
static_assert(kClassSizes[0] == Allocator::kMinBlock && kClassSizes[5] == 256 &&
              kClassSizes[9] == 1280);
constexpr int kNumClasses = static_cast<int>(kClassSizes.size());
constexpr int kLineClass = 2;  // the 64 B class, whose blocks carry the 16 and 32 B classes
static_assert(kClassSizes[kLineClass] == kLine);

int class_index(std::size_t size) {
  return static_cast<int>(std::lower_bound(kClassSizes.begin(), kClassSizes.end(), size) -
                          kClassSizes.begin());
}

// How many blocks a thread cache fetches at once: more for small blocks, one for big ones.
std::size_t batch_of(int cls) {
  const std::size_t size = kClassSizes[static_cast<std::size_t>(cls)];
  return std::clamp<std::size_t>(std::size_t{16384} / size, 1, 32);
}

std::uint64_t round_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

}  // namespace

// Adds d to a counter that only the calling thread writes: a relaxed load and store, not a
// read-modify-write. A locked fetch_add waits for the thread's earlier write-backs (clwb) to
// finish (docs/persistence.md), and an LB+-Tree split allocates right after an insert's persist.
namespace {
template <class T>
void bump(std::atomic<T>& counter, T d) {
  counter.store(counter.load(std::memory_order_relaxed) + d, std::memory_order_relaxed);
}
}  // namespace

struct Allocator::ThreadCache {
  std::array<std::vector<std::uint64_t>, kNumClasses> free;
  // Written only by the owning thread (relaxed, no contention); summed by stats().
  std::array<std::atomic<std::int64_t>, kNumClasses> in_use{};
  // Bytes requested (not class bytes) of the blocks this thread allocated minus those it freed:
  // the survey counted footprints this way (sized deallocation makes it exact).
  std::atomic<std::int64_t> requested{0};
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
  std::int64_t recovered_requested = 0;  // the marks' requested bytes
  Status mark_error;
  std::uint64_t recovery_high_water = 0;
  bool start_now = false;  // [recovery_high_water, heap_end) was freed at begin_recovery
  // Blocks reached the central lists since the last reclaim pass (worth another pass).
  bool dirty = false;
  // carve() may raise the heap high-water mark (and so grow a growable pool's file). refill
  // clears it for its first try, so freed blocks are merged before the heap grows.
  bool may_raise = true;

  void push_block(std::uint64_t off, std::size_t size) {
    free[static_cast<std::size_t>(class_index(size))].push_back(off);
  }

  // Frees [a, b) (16 B granular): whole 256 B units become extents; a piece of a unit becomes
  // one 64/128/192 B block; a piece of a line becomes 32 B (if 32 B aligned) and 16 B blocks.
  // Each block so made is aligned as its class requires (see mark_reachable).
  void release(std::uint64_t a, std::uint64_t b) {
    while (a < b) {
      if (a % kUnit == 0 && b - a >= kUnit) {
        const std::uint64_t e = b / kUnit * kUnit;
        add_extent(a, e - a);
        a = e;
      } else if (a % kLine == 0 && b - a >= kLine) {
        const std::uint64_t e = std::min(round_up(a + 1, kUnit), b / kLine * kLine);
        push_block(a, e - a);
        a = e;
      } else {
        const std::size_t size = a % 32 == 0 && b - a >= 32 ? 32 : 16;
        push_block(a, size);
        a += size;
      }
    }
  }

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

int Allocator::class_of(std::size_t bytes) { return bytes > kMaxBlock ? -1 : class_index(bytes); }
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

bool Allocator::raise_high_water(std::uint64_t end) {
  const std::uint64_t current = pool_.heap_high_water();
  if (end <= current) return true;
  // The pool file must hold a block before the mark says it may exist: grow first (a crash in
  // between leaves a longer file, which opens; the reverse order would leave a truncated one).
  if (!pool_.grow(end)) return false;
  // Raise in steps of 1/16 of the heap (at least 64 KiB), so the persisted word changes rarely,
  // but never past the file's end.
  const std::uint64_t step = std::max<std::uint64_t>((heap_end_ - heap_begin_) / 16, 64 * 1024);
  const std::uint64_t target =
      std::min({heap_end_, std::uint64_t{pool_.extent()} / kUnit * kUnit,
                round_up(std::max(end, current + step), kUnit)});
  pool_.raise_heap_high_water(target);  // one persisted header state change
  return true;
}

// Carves `bytes` (a multiple of 256) from the lowest-addressed extent that fits. Caller holds mu.
std::uint64_t Allocator::carve(std::size_t bytes, Code* code) {
  auto& ext = central_->extents;
  for (auto it = ext.begin(); it != ext.end(); ++it) {
    if (it->second < bytes) continue;
    const std::uint64_t start = it->first;
    // Any other extent that fits lies higher and would need a longer file still.
    if (!central_->may_raise && start + bytes > pool_.heap_high_water()) break;
    if (!raise_high_water(start + bytes)) break;
    const std::uint64_t rest = it->second - bytes;
    ext.erase(it);
    if (rest != 0) ext.emplace(start + bytes, rest);
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
  // Round 0 takes only space below the heap's high-water mark; then a reclaim pass merges what
  // was freed since the last one, and round 1 may raise the mark (growing the file). Without
  // that order, blocks of a class nobody asks for any more (APEX's data nodes all expanding
  // from one size class to the next) would stay in their list while the heap grew past them:
  // 2.1x the live bytes after 100M random inserts (issue 19). The pass runs at most once per
  // rise of the mark, and only if something was freed since the last pass.
  // *code is written only if both fail: a caller may treat any code but ok as failure.
  Code failure = Code::ok;
  for (int round = 0; round < 2; ++round) {
    while (!central.empty() && mine.size() < want) {
      mine.push_back(central.back());
      central.pop_back();
    }
    if (!mine.empty()) return true;
    central_->may_raise = round == 1;
    const bool got = fresh_blocks(cls, tc, &failure);
    central_->may_raise = true;
    if (got) return true;
    if (round == 0) (void)reclaim(tc);
  }
  if (code) *code = failure;
  return false;
}

// A free 64 B line (a 64 B block, or the carrier of 16/32 B blocks): from the 64 B class, else
// a new 256 B unit whose other three lines go to the 64 B class, else (heap full) the first
// line of a free 128/192 B block, whose other lines go to the 64 B class. Caller holds mu.
std::uint64_t Allocator::take_line(Code* code) {
  auto& lines = central_->free[kLineClass];
  auto split = [&](std::uint64_t block, std::size_t size) {
    for (std::uint64_t off = block + kLine; off < block + size; off += kLine) lines.push_back(off);
    return block;
  };
  if (!lines.empty()) {
    const std::uint64_t line = lines.back();
    lines.pop_back();
    return line;
  }
  Code full = Code::ok;
  if (const std::uint64_t unit = carve(kUnit, &full); unit != 0) return split(unit, kUnit);
  for (int cls = kLineClass + 1; class_size(cls) < kUnit; ++cls) {
    auto& list = central_->free[static_cast<std::size_t>(cls)];
    if (list.empty()) continue;
    const std::uint64_t block = list.back();
    list.pop_back();
    return split(block, class_size(cls));
  }
  if (code) *code = full;
  return 0;
}

// Blocks never handed out before, for tc's list of class cls (empty on entry). Caller holds mu.
bool Allocator::fresh_blocks(int cls, ThreadCache& tc, Code* code) {
  const std::size_t want = batch_of(cls);
  auto& mine = tc.free[static_cast<std::size_t>(cls)];
  const std::size_t size = class_size(cls);
  if (size <= kLine) {
    // Whole lines (carriers of this class when below 64 B); pool_full only if no line is left.
    Code ignored = Code::ok;
    while (mine.size() < want) {
      const std::uint64_t line = take_line(mine.empty() ? code : &ignored);
      if (line == 0) break;
      for (std::uint64_t off = line; off < line + kLine; off += size) mine.push_back(off);
    }
    return !mine.empty();
  }
  if (size < kUnit) {
    // A 256 B unit split into blocks of this class; a 192 B block leaves one 64 B block over.
    // (Blocks of 128/192 B are not cut from smaller free blocks: a full heap refuses them.)
    const std::uint64_t unit = carve(kUnit, code);
    if (unit == 0) return false;
    std::uint64_t off = unit;
    for (; off + size <= unit + kUnit; off += size) mine.push_back(off);
    for (; off < unit + kUnit; off += kLine) central_->free[kLineClass].push_back(off);
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

// Run-time coalescing: the calling thread's cached blocks and every block in the central lists
// are sorted and adjacent ones merged; each merged range is cut again by release(), so whole
// units go back to the extents (where add_extent coalesces them) and fully free carrier lines
// become 64 B blocks. Other threads' caches are theirs alone and stay as they are. Runs only
// when an allocation found nothing to carve, and only if something was freed since the last
// pass, so a full pool does not repeat it per failed allocation. Caller holds mu.
bool Allocator::reclaim(ThreadCache& tc) {
  Central& c = *central_;
  for (std::size_t cls = 0; cls < tc.free.size(); ++cls) {
    if (tc.free[cls].empty()) continue;
    c.free[cls].insert(c.free[cls].end(), tc.free[cls].begin(), tc.free[cls].end());
    tc.free[cls].clear();
    c.dirty = true;
  }
  if (!c.dirty) return false;
  c.dirty = false;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> blocks;  // offset, end
  for (std::size_t cls = 0; cls < c.free.size(); ++cls) {
    for (std::uint64_t off : c.free[cls]) blocks.emplace_back(off, off + kClassSizes[cls]);
    c.free[cls].clear();
  }
  std::sort(blocks.begin(), blocks.end());
  for (std::size_t i = 0; i < blocks.size();) {
    const std::uint64_t a = blocks[i].first;
    std::uint64_t b = blocks[i].second;
    for (++i; i < blocks.size() && blocks[i].first == b; ++i) b = blocks[i].second;
    c.release(a, b);
  }
  return true;
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
  bump(tc.in_use[static_cast<std::size_t>(cls)], std::int64_t{1});
  bump(tc.requested, static_cast<std::int64_t>(bytes));
  bump(tc.allocations, std::uint64_t{1});
  return off;
}

void Allocator::deallocate(std::uint64_t offset, std::size_t bytes) {
  const int cls = class_of(bytes);
  if (cls < 0 || offset == 0) return;
  ThreadCache& tc = cache();
  auto& mine = tc.free[static_cast<std::size_t>(cls)];
  mine.push_back(offset);
  bump(tc.in_use[static_cast<std::size_t>(cls)], std::int64_t{-1});
  bump(tc.requested, -static_cast<std::int64_t>(bytes));
  bump(tc.frees, std::uint64_t{1});
  const std::size_t batch = batch_of(cls);
  if (mine.size() > 2 * batch) {
    std::lock_guard<std::mutex> lock(central_->mu);
    central_->dirty = true;
    auto& central = central_->free[static_cast<std::size_t>(cls)];
    while (mine.size() > batch) {
      central.push_back(mine.back());
      mine.pop_back();
    }
  }
}

void Allocator::release_thread_cache() {
  ThreadCache& tc = cache();
  std::lock_guard<std::mutex> lock(central_->mu);
  for (std::size_t cls = 0; cls < tc.free.size(); ++cls) {
    auto& mine = tc.free[cls];
    if (mine.empty()) continue;
    // dirty: the blocks may merge with free neighbours into something a refill can use.
    central_->dirty = true;
    central_->free[cls].insert(central_->free[cls].end(), mine.begin(), mine.end());
    mine.clear();
  }
}

void Allocator::begin_recovery(bool start_now) {
  std::lock_guard<std::mutex> lock(central_->mu);
  central_->extents.clear();
  for (auto& f : central_->free) f.clear();
  central_->reachable.clear();
  central_->recovered_in_use.fill(0);
  central_->recovered_requested = 0;
  central_->mark_error = Status::Ok();
  central_->dirty = false;
  central_->recovery_high_water = pool_.heap_high_water();
  // Called at open, before any other thread uses this allocator: thread caches can be reset.
  for (auto& slot : central_->caches) {
    ThreadCache* tc = slot.load(std::memory_order_acquire);
    if (tc == nullptr) continue;
    for (auto& f : tc->free) f.clear();
    for (auto& n : tc->in_use) n.store(0, std::memory_order_relaxed);
    tc->requested.store(0, std::memory_order_relaxed);
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
  // As release() and refill cut blocks: a sub-line block aligned to its size (so inside one
  // line), a 64/128/192 B block 64 B aligned inside one unit, bigger blocks 256 B aligned.
  const bool misaligned = size < kLine    ? offset % size != 0
                          : size < kUnit ? offset % kLine != 0 ||
                                               offset / kUnit != (offset + size - 1) / kUnit
                                         : offset % kUnit != 0;
  if (misaligned) return fail("is misaligned for its size class");
  central_->reachable.emplace_back(offset, size);
  ++central_->recovered_in_use[static_cast<std::size_t>(cls)];
  central_->recovered_requested += static_cast<std::int64_t>(bytes);
  return Code::ok;
}

Status Allocator::finish_recovery() {
  std::lock_guard<std::mutex> lock(central_->mu);
  if (!central_->mark_error.ok()) return central_->mark_error;
  auto& blocks = central_->reachable;
  std::sort(blocks.begin(), blocks.end());
  // Validate every mark before freeing anything, so a refused recovery changes nothing.
  for (std::size_t i = 1; i < blocks.size(); ++i) {
    const auto [prev_off, prev_size] = blocks[i - 1];
    const auto [off, size] = blocks[i];
    if (off < prev_off + prev_size) {
      return pool_.error(Code::corrupted,
                         "block at offset " + std::to_string(off) + " of " +
                             std::to_string(size) + " bytes overlaps the block at offset " +
                             std::to_string(prev_off) + " of " + std::to_string(prev_size) +
                             " bytes (reachable twice?)");
    }
  }
  // Everything between reachable blocks (below the recovery high-water mark) is free.
  std::uint64_t cursor = heap_begin_;
  for (const auto& [off, size] : blocks) {
    central_->release(cursor, off);
    cursor = off + size;
  }
  central_->release(cursor, central_->recovery_high_water);
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
    std::int64_t requested = central_->recovered_requested;
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
      requested += tc->requested.load(std::memory_order_relaxed);
      s.allocations += tc->allocations.load(std::memory_order_relaxed);
      s.frees += tc->frees.load(std::memory_order_relaxed);
    }
    s.bytes_requested = requested < 0 ? 0 : static_cast<std::uint64_t>(requested);
  }
  for (std::size_t c = 0; c < kClassSizes.size(); ++c) {
    if (in_use[c] == 0 && cached[c] == 0) continue;
    s.bytes_in_use += static_cast<std::uint64_t>(in_use[c]) * kClassSizes[c];
    s.classes.push_back({kClassSizes[c], static_cast<std::uint64_t>(in_use[c]), cached[c]});
  }
  return s;
}

}  // namespace pmindex::pm

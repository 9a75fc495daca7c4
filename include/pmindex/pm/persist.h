/// \file
/// The one persistence API. Every write to persistent memory in pmindex goes through here;
/// index code never calls clwb/clflushopt/sfence intrinsics directly (STYLE.md #6).
///
///   pm::store(&slot, value)        plain store of a trivially copyable value
///   pm::copy(dst, src, n)          memcpy into PM
///   pm::zero(dst, n)               memset 0 into PM
///   pm::publish(&word, v)          failure-atomic 8-byte store with release order
///   pm::cas(&word, expected, v)    8-byte compare-and-swap on PM (acq_rel)
///   pm::flush(p, n)                write back the cache lines covering [p, p+n), n >= 1 (adr only)
///   pm::fence()                    order: sfence (adr and eadr), nothing in dram mode
///   pm::persist(p, n)              flush + fence, n >= 1
///
/// Persistence mode is a run-time choice (Runtime::set_mode, done when a pool opens):
///   adr   clwb + sfence (clflushopt, then clflush by CPUID when clwb is missing)
///   eadr  caches are in the persistence domain: fences only
///   dram  no persistence work at all
///
/// Build flavours (PMINDEX_PM_FLAVOUR, set by CMake per library target; never by index code):
///   0 production  the raw instructions plus two thread-local counters (flushes, fences)
///   1 counting    also lines written / bytes stored per operation and an XPBuffer media model
///   2 tracing     also reports every store, flush and fence to the crash simulator
/// The flavour switch is `if constexpr` on one constant below, so there are no \#ifdef copies.
///
/// Thread safety: all functions are safe to call from any thread. The mode is process-wide and
/// may only change while no index is open (Runtime enforces this with a reference count).
#pragma once

#include <xmmintrin.h>  // _mm_sfence: SSE, part of the x86-64 baseline

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

#ifndef PMINDEX_PM_FLAVOUR
#error "PMINDEX_PM_FLAVOUR must be set by the build (link one of the pmindex library flavours)"
#endif

namespace pmindex::pm {

/// The unit a flush writes back and the simulator's unit of failure atomicity is 8 bytes in it.
inline constexpr std::size_t kCacheLine = 64;
/// Optane's internal write unit (XPLine): the allocator never lets a small block straddle one.
inline constexpr std::size_t kXPLine = 256;

/// The persistence mode a pool runs in (see the file comment): what flush and fence do.
enum class Mode : std::uint8_t {
  adr,   ///< caches are volatile: write back (clwb) and fence
  eadr,  ///< caches are persistent: fence only
  dram,  ///< nothing is persistent: no flushes, no fences
};
/// "adr", "eadr" or "dram".
std::string_view to_string(Mode mode);
/// Parses "adr", "eadr" or "dram"; returns false on anything else.
bool parse_mode(std::string_view text, Mode* out);

/// The build flavour of the library a program links (see the file comment).
enum class Flavour : int {
  production = 0,  ///< raw instructions and flush/fence counters
  counting = 1,    ///< plus per-operation lines written and the XPBuffer media model
  tracing = 2,     ///< plus every store, flush and fence reported to the crash simulator
};
/// This translation unit's flavour (PMINDEX_PM_FLAVOUR, set by the library target).
inline constexpr Flavour kFlavour = static_cast<Flavour>(PMINDEX_PM_FLAVOUR);
/// True in the counting and tracing flavours.
inline constexpr bool kCounting = kFlavour != Flavour::production;
/// True in the tracing flavour.
inline constexpr bool kTracing = kFlavour == Flavour::tracing;
/// "production", "counting" or "tracing".
std::string_view to_string(Flavour flavour);

/// What a flush/persist call does, folded into one word so the hot path has one branch:
/// the common adr case on this CPU is `clwb`, everything else goes out of line.
enum class FlushKind : std::uint8_t { clwb, clflushopt, clflush, fence_only, none };

/// Per-thread counters. flushes/fences are counted in every flavour; the rest only when
/// kCounting (they need a per-store hook that the production path must not pay for).
struct Counters {
  std::uint64_t flushes = 0;            ///< cache lines written back (clwb/clflushopt/clflush)
  std::uint64_t fences = 0;             ///< sfence instructions issued
  std::uint64_t bytes_stored = 0;       ///< counting: bytes stored through pm::
  std::uint64_t lines_written = 0;      ///< counting: distinct 64 B lines stored, summed per op
  std::uint64_t operations = 0;         ///< counting: end_operation() calls
  std::uint64_t media_bytes_read = 0;   ///< counting: XPBuffer read-modify-write reads (256 B each)
  std::uint64_t media_bytes_written = 0;  ///< counting: XPBuffer write-backs (256 B each)

  /// Field-wise sum (totals over threads).
  Counters& operator+=(const Counters& o);
  /// Field-wise difference (the work between two snapshots).
  friend Counters operator-(Counters a, const Counters& b);
};

/// The hooks the crash simulator implements (tracing flavour only). Registered once per
/// process by the simulator; the production and counting flavours never call them.
class TraceSink {
 public:
  virtual ~TraceSink() = default;
  virtual void on_store(const void* dst, std::size_t n) = 0;  ///< after the bytes are in place
  virtual void on_flush(const void* p, std::size_t n) = 0;  ///< after a write-back was issued
  virtual void on_fence() = 0;                               ///< after a fence
  /// A scheduling point for the deterministic multi-thread scheduler: atomic operations on
  /// shared DRAM state, test hooks and spin-loop iterations call pm::yield_point(tag).
  virtual void on_yield_point(std::string_view tag) = 0;
};

/// The process-wide persistence state behind the functions below: the mode, the write-back
/// instruction chosen from CPUID, the per-thread counters and the crash simulator's sink.
/// All members are static and thread-safe; pools call acquire_mode/release_mode.
class Runtime {
 public:
  /// Sets the process-wide mode. Fails (returns false) if pools are open in another mode.
  static bool acquire_mode(Mode mode);
  /// Drops one pool's hold on the mode (the mode may change once none is left).
  static void release_mode();
  /// The current mode.
  static Mode mode() { return static_cast<Mode>(mode_.load(std::memory_order_relaxed)); }
  /// relaxed: written only while no pool is open (acquire_mode), read on every flush.
  static FlushKind flush_kind() {
    return static_cast<FlushKind>(flush_kind_.load(std::memory_order_relaxed));
  }
  /// The instruction adr mode uses on this CPU ("clwb", "clflushopt" or "clflush").
  static std::string_view adr_instruction();

  /// This thread's counters (reset or snapshot them around the work to measure).
  static Counters& counters() { return counters_; }
  /// Counting flavour: closes the current operation (folds its distinct lines into
  /// lines_written). A no-op in production.
  static void end_operation();
  /// Installs the crash simulator's sink (tracing flavour; nullptr removes it).
  static void set_trace_sink(TraceSink* sink);
  /// The installed sink, or nullptr.
  static TraceSink* trace_sink() { return sink_.load(std::memory_order_acquire); }

  /// Out-of-line pieces of the hot functions below: flush when clwb is not the instruction.
  static void flush_slow(const void* p, std::size_t n);
  /// persist when clwb is not the instruction (or in eadr/dram mode).
  static void persist_slow(const void* p, std::size_t n);
  /// counting flavour: records a store's bytes and lines.
  static void count_store(const void* dst, std::size_t n);
  static void after_flush(const void* p, std::size_t n);  ///< counting + tracing hook

 private:
  static std::atomic<std::uint8_t> mode_;
  static std::atomic<std::uint8_t> flush_kind_;
  static std::atomic<int> open_pools_;
  static std::atomic<TraceSink*> sink_;
  static constinit thread_local Counters counters_;  ///< constinit: no TLS wrapper call
};

namespace detail {
inline void after_store(const void* dst, std::size_t n) {
  if constexpr (kCounting) Runtime::count_store(dst, n);
  if constexpr (kTracing) {
    if (TraceSink* s = Runtime::trace_sink()) s->on_store(dst, n);
  }
}
inline std::uintptr_t line_of(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) & ~(kCacheLine - 1);
}
/// clwb of one line, as inline assembly rather than _mm_clwb: the intrinsic needs -mclwb in
/// every translation unit that includes this header, which would impose an ISA flag on users.
/// Run-time dispatch (FlushKind) guarantees the instruction runs only on CPUs that have it.
/// The "memory" clobber keeps every earlier store to the line before the write-back.
inline void clwb_line(std::uintptr_t line) {
  __asm__ __volatile__("clwb %0" : : "m"(*reinterpret_cast<const char*>(line)) : "memory");
}
/// clwb on every line of [p, p+n), n >= 1; returns the number of lines. A do-while: the range
/// always covers at least one line, so the loop needs no entry check.
inline std::uint64_t clwb_range(const void* p, std::size_t n) {
  const std::uintptr_t end = reinterpret_cast<std::uintptr_t>(p) + n;
  std::uintptr_t line = line_of(p);
  std::uint64_t lines = 0;
  do {
    clwb_line(line);
    line += kCacheLine;
    ++lines;
  } while (line < end);
  return lines;
}
}  // namespace detail

// --- stores ---------------------------------------------------------------------------------

/// Stores a trivially copyable value into PM (not persisted, not failure-atomic beyond 8 B).
template <class T>
inline void store(T* dst, const T& value) {
  static_assert(std::is_trivially_copyable_v<T>, "PM holds trivially copyable data only");
  std::memcpy(static_cast<void*>(dst), &value, sizeof(T));
  detail::after_store(dst, sizeof(T));
}

/// memcpy into PM (not persisted).
inline void copy(void* dst, const void* src, std::size_t n) {
  std::memcpy(dst, src, n);
  detail::after_store(dst, n);
}

/// memset 0 into PM (not persisted).
inline void zero(void* dst, std::size_t n) {
  std::memset(dst, 0, n);
  detail::after_store(dst, n);
}

/// Failure-atomic publish of an aligned 8-byte word: release order, so a reader that
/// acquire-loads the word sees everything written before it (an 8-byte aligned store is the
/// unit x86 guarantees to reach PM whole).
inline void publish(std::uint64_t* word, std::uint64_t value) {
  std::atomic_ref<std::uint64_t>(*word).store(value, std::memory_order_release);
  detail::after_store(word, sizeof(*word));
}

/// Acquire load of a word that another thread publishes with pm::publish or pm::cas.
inline std::uint64_t load_acquire(const std::uint64_t* word) {
  return std::atomic_ref<std::uint64_t>(*const_cast<std::uint64_t*>(word))
      .load(std::memory_order_acquire);
}

/// Compare-and-swap of an aligned PM word. acq_rel: a winner's later writes are ordered after
/// the CAS and it sees the previous owner's writes. On failure `expected` holds the current value.
inline bool cas(std::uint64_t* word, std::uint64_t& expected, std::uint64_t desired) {
  bool ok = std::atomic_ref<std::uint64_t>(*word).compare_exchange_strong(
      expected, desired, std::memory_order_acq_rel, std::memory_order_acquire);
  if (ok) detail::after_store(word, sizeof(*word));
  return ok;
}

// --- write-back and ordering ------------------------------------------------------------------

/// Writes back the cache lines covering [p, p+n), n >= 1, in adr mode; unordered until a fence.
inline void flush(const void* p, std::size_t n) {
  if (Runtime::flush_kind() == FlushKind::clwb) [[likely]] {
    Runtime::counters().flushes += detail::clwb_range(p, n);
    if constexpr (kCounting) Runtime::after_flush(p, n);
  } else {
    Runtime::flush_slow(p, n);
  }
}

/// Orders earlier stores and write-backs before later ones (sfence in adr and eadr modes).
inline void fence() {
  if (Runtime::flush_kind() != FlushKind::none) [[likely]] {
    _mm_sfence();
    ++Runtime::counters().fences;
    if constexpr (kTracing) {
      if (TraceSink* s = Runtime::trace_sink()) s->on_fence();
    }
  }
}

/// flush(p, n) then fence(): [p, p+n) is durable when it returns (in adr and eadr modes).
inline void persist(const void* p, std::size_t n) {
  if (Runtime::flush_kind() == FlushKind::clwb) [[likely]] {
    const std::uint64_t lines = detail::clwb_range(p, n);
    _mm_sfence();
    Counters& c = Runtime::counters();
    c.flushes += lines;
    ++c.fences;
    if constexpr (kCounting) Runtime::after_flush(p, n);
    if constexpr (kTracing) {
      if (TraceSink* s = Runtime::trace_sink()) s->on_fence();
    }
  } else {
    Runtime::persist_slow(p, n);
  }
}

/// A scheduling point for the crash simulator's deterministic scheduler (tracing flavour);
/// compiles to nothing otherwise. Concurrent index code calls it before atomic operations on
/// shared DRAM state and in spin loops.
inline void yield_point(std::string_view tag) {
  if constexpr (kTracing) {
    if (TraceSink* s = Runtime::trace_sink()) s->on_yield_point(tag);
  } else {
    (void)tag;
  }
}

}  // namespace pmindex::pm

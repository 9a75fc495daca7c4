// Process-wide persistence runtime: the mode, the flush instruction, per-thread counters and,
// in the counting flavour, the per-operation line set and the XPBuffer model.
#include <cpuid.h>

#include <algorithm>
#include <array>
#include <cstdint>

#include "isa.h"
#include "pmindex/pm/persist.h"

namespace pmindex::pm {

namespace {

struct CpuFlush {
  bool clwb = false;
  bool clflushopt = false;
};

CpuFlush detect_flush() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  CpuFlush f;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) {
    f.clflushopt = (ebx & (1u << 23)) != 0;
    f.clwb = (ebx & (1u << 24)) != 0;
  }
  return f;
}

const CpuFlush kCpu = detect_flush();

// Every program that uses the library links this runtime; this reference makes it link
// src/isa.cpp's object too, whose constructor stops a CPU below the library's ISA level. A
// static link would otherwise leave that object out: nothing calls into it.
[[gnu::used]] void (*const kIsaCheckLinked)() = &isa::require_built_level;

FlushKind kind_for(Mode mode) {
  switch (mode) {
    case Mode::adr:
      return kCpu.clwb ? FlushKind::clwb : kCpu.clflushopt ? FlushKind::clflushopt
                                                             : FlushKind::clflush;
    case Mode::eadr:
      return FlushKind::fence_only;
    case Mode::dram:
      return FlushKind::none;
  }
  return FlushKind::none;
}

// Counting flavour: the 64 B lines stored during the current operation, and a 64-entry LRU of
// 256 B XPLines standing in for Optane's XPBuffer. Per thread (the real buffer is per DIMM and
// shared; a per-thread model keeps counts deterministic and is documented as such).
struct OpLines {
  static constexpr std::size_t kMax = 256;
  std::array<std::uintptr_t, kMax> lines{};
  std::size_t count = 0;
  std::uint64_t extra = 0;  // lines beyond kMax (counted, not de-duplicated)

  void add(std::uintptr_t line) {
    for (std::size_t i = 0; i < count; ++i)
      if (lines[i] == line) return;
    if (count < kMax) lines[count++] = line;
    else ++extra;
  }
};

struct XPBuffer {
  static constexpr std::size_t kEntries = 64;
  struct Entry {
    std::uintptr_t xpline = 0;
    std::uint8_t lines_mask = 0;  // which of the 4 cache lines have been written back
    std::uint64_t stamp = 0;
  };
  std::array<Entry, kEntries> entries{};
  std::size_t used = 0;
  std::uint64_t clock = 0;

  // A cache line reaches the DIMM. A full XPLine is written whole on eviction; a partial one
  // costs a read-modify-write (256 B read + 256 B write).
  void write_back(std::uintptr_t line, Counters& c) {
    const std::uintptr_t xp = line & ~(kXPLine - 1);
    const auto bit = static_cast<std::uint8_t>(1u << ((line - xp) / kCacheLine));
    ++clock;
    for (std::size_t i = 0; i < used; ++i) {
      if (entries[i].xpline == xp) {
        entries[i].lines_mask |= bit;
        entries[i].stamp = clock;
        return;
      }
    }
    if (used < kEntries) {
      entries[used++] = {xp, bit, clock};
      return;
    }
    auto victim = std::min_element(entries.begin(), entries.end(),
                                   [](const Entry& a, const Entry& b) { return a.stamp < b.stamp; });
    evict(*victim, c);
    *victim = {xp, bit, clock};
  }

  static void evict(const Entry& e, Counters& c) {
    if (e.lines_mask != 0xF) c.media_bytes_read += kXPLine;
    c.media_bytes_written += kXPLine;
  }
};

struct CountingState {
  OpLines op;
  XPBuffer xp;
};

thread_local CountingState t_counting;

}  // namespace

std::atomic<std::uint8_t> Runtime::mode_{static_cast<std::uint8_t>(Mode::adr)};
std::atomic<std::uint8_t> Runtime::flush_kind_{static_cast<std::uint8_t>(kind_for(Mode::adr))};
std::atomic<int> Runtime::open_pools_{0};
std::atomic<TraceSink*> Runtime::sink_{nullptr};
constinit thread_local Counters Runtime::counters_;

std::string_view to_string(Mode mode) {
  switch (mode) {
    case Mode::adr: return "adr";
    case Mode::eadr: return "eadr";
    case Mode::dram: return "dram";
  }
  return "?";
}

bool parse_mode(std::string_view text, Mode* out) {
  for (Mode m : {Mode::adr, Mode::eadr, Mode::dram}) {
    if (text == to_string(m)) {
      *out = m;
      return true;
    }
  }
  return false;
}

std::string_view to_string(Flavour flavour) {
  switch (flavour) {
    case Flavour::production: return "production";
    case Flavour::counting: return "counting";
    case Flavour::tracing: return "tracing";
  }
  return "?";
}

Counters& Counters::operator+=(const Counters& o) {
  flushes += o.flushes;
  fences += o.fences;
  bytes_stored += o.bytes_stored;
  lines_written += o.lines_written;
  operations += o.operations;
  media_bytes_read += o.media_bytes_read;
  media_bytes_written += o.media_bytes_written;
  return *this;
}

Counters operator-(Counters a, const Counters& b) {
  a.flushes -= b.flushes;
  a.fences -= b.fences;
  a.bytes_stored -= b.bytes_stored;
  a.lines_written -= b.lines_written;
  a.operations -= b.operations;
  a.media_bytes_read -= b.media_bytes_read;
  a.media_bytes_written -= b.media_bytes_written;
  return a;
}

bool Runtime::acquire_mode(Mode mode) {
  // A CAS loop on the open-pool count: the mode may change only when no pool is open.
  int open = open_pools_.load(std::memory_order_acquire);
  for (;;) {
    if (open > 0 && Runtime::mode() != mode) return false;
    if (open == 0) {
      mode_.store(static_cast<std::uint8_t>(mode), std::memory_order_relaxed);
      flush_kind_.store(static_cast<std::uint8_t>(kind_for(mode)), std::memory_order_relaxed);
    }
    if (open_pools_.compare_exchange_weak(open, open + 1, std::memory_order_acq_rel)) return true;
  }
}

void Runtime::release_mode() { open_pools_.fetch_sub(1, std::memory_order_acq_rel); }

std::string_view Runtime::adr_instruction() {
  switch (kind_for(Mode::adr)) {
    case FlushKind::clwb: return "clwb";
    case FlushKind::clflushopt: return "clflushopt";
    default: return "clflush";
  }
}

void Runtime::set_trace_sink(TraceSink* sink) { sink_.store(sink, std::memory_order_release); }

void Runtime::flush_slow(const void* p, std::size_t n) {
  const FlushKind kind = flush_kind();
  if (kind == FlushKind::fence_only || kind == FlushKind::none) return;
  const std::uintptr_t end = reinterpret_cast<std::uintptr_t>(p) + n;
  std::uint64_t lines = 0;
  for (std::uintptr_t line = detail::line_of(p); line < end; line += kCacheLine, ++lines) {
    // Inline assembly, as persist.h's clwb: _mm_clflushopt would need -mclflushopt for this
    // file, and the library imposes no ISA flag beyond its level (FlushKind is chosen at run
    // time). The "memory" clobber keeps the stores to the line before its write-back.
    const auto* at = reinterpret_cast<const char*>(line);
    if (kind == FlushKind::clflushopt) __asm__ __volatile__("clflushopt %0" : : "m"(*at) : "memory");
    else __asm__ __volatile__("clflush %0" : : "m"(*at) : "memory");
  }
  counters_.flushes += lines;
  if constexpr (kCounting) after_flush(p, n);
}

void Runtime::persist_slow(const void* p, std::size_t n) {
  flush_slow(p, n);
  fence();
}

void Runtime::count_store(const void* dst, std::size_t n) {
  if (n == 0) return;
  Counters& c = counters_;
  c.bytes_stored += n;
  const std::uintptr_t end = reinterpret_cast<std::uintptr_t>(dst) + n;
  for (std::uintptr_t line = detail::line_of(dst); line < end; line += kCacheLine) {
    t_counting.op.add(line);
    // In eadr and dram modes nothing is flushed: a stored line reaches the DIMM by eviction,
    // which the model approximates as "once per operation" in end_operation().
  }
}

void Runtime::after_flush(const void* p, std::size_t n) {
  if (Runtime::mode() == Mode::adr) {
    const std::uintptr_t end = reinterpret_cast<std::uintptr_t>(p) + n;
    for (std::uintptr_t line = detail::line_of(p); line < end; line += kCacheLine) {
      t_counting.xp.write_back(line, counters_);
    }
  }
  if constexpr (kTracing) {
    if (TraceSink* s = trace_sink()) s->on_flush(p, n);
  }
}

void Runtime::end_operation() {
  if constexpr (kCounting) {
    CountingState& s = t_counting;
    Counters& c = counters_;
    c.lines_written += s.op.count + s.op.extra;
    ++c.operations;
    if (Runtime::mode() != Mode::adr) {
      for (std::size_t i = 0; i < s.op.count; ++i) s.xp.write_back(s.op.lines[i], c);
    }
    s.op.count = 0;
    s.op.extra = 0;
  }
}

}  // namespace pmindex::pm

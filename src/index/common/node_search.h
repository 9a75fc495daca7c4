// The search of one DRAM inner node's sorted separators, shared by InnerTree (LB+-Tree, FPTree)
// and NBTree: upper_bound without a branch that depends on a comparison. With random probes
// every comparison of a branching search is a coin flip, and the mispredictions cost more than
// the node's cache misses once its lines are prefetched.
//
// Cheap compares (integer keys): binary steps narrow the range to kWindow slots, which are then
// counted slot by slot; a node of at most kWindow separators is counted whole. The counted
// compares are independent and overlap, where binary steps are a chain of dependent
// load-compare steps. Expensive compares (byte-string keys, kWindow = 0): binary steps only.
// Counting executes more instructions (callgrind: a 1M-key LB+-Tree bulk load plus 200k
// inserts went from 4.73 to 5.56 G) and still wins on time, because the node's loads all
// wait on the same miss instead of one after another. always_inline: g++ kept one shared
// out-of-line copy, which cost the descents measurably.
//
// Thread safety: reads only. Optimistic readers pass a `sep` that loads with optimistic_read
// (or an atomic load): separators may be torn or unsorted mid-write, and then the result is any
// index in [0, cnt] and the caller's validation throws it away.
//
// Integer keys with a node capacity known at compile time (count_u64_window): the window is
// compared four separators per AVX2 instruction instead of one per five instructions, so a
// 14-key node costs about twenty instructions instead of seventy (issue 16: LB+-Tree lookups
// spent ~230 instructions per inner level); the baseline form (x86-64-v2, README "Minimum
// CPU") compares two per SSE4.2 instruction. Both forms are compiled in every build and the
// caller picks one by a template parameter (SearchIsa): a baseline build uses the AVX2 form
// only inside the run-time-dispatched entry points (docs/isa.md). The vector load reads seqlock
// data that a writer may change: as with optimistic_read, the result is discarded unless the node's version
// validates, and the caller's next read (the child word) depends on it, so the load cannot be
// moved past the validation. A vector load is not a C++ atomic, so a ThreadSanitizer build
// counts slot by slot with optimistic_read (the same result; TSan sees only atomic reads).
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

#include "pmindex/sync/optimistic_lock.h"

#if defined(__SANITIZE_THREAD__)
#define PMINDEX_NODE_SEARCH_SCALAR 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PMINDEX_NODE_SEARCH_SCALAR 1
#endif
#endif
#if !defined(PMINDEX_NODE_SEARCH_SCALAR)
#if !defined(__SSE4_2__)
#error "the library is compiled for x86-64-v2 at least (cmake/PmindexTargets.cmake)"
#endif
// Both vector forms are compiled in every build (docs/isa.md): the SSE4.2 one with the
// library's flags, the AVX2 one inside functions marked target("avx2").
#include <immintrin.h>
#define PMINDEX_NODE_SEARCH_SSE42 1
// clang checks a builtin's target where it is written, not where it is finally compiled, so
// its baseline builds have no AVX2 form (SearchIsa::avx2 runs the SSE4.2 one there). Neither do
// unoptimised g++ builds (-O0, e.g. a Debug build of a project that adds pmindex as a
// subproject): g++ then leaves the helpers that hold the builtins out of line, outside the
// target("avx2") entry point, and rejects them.
#if defined(__AVX2__) || (!defined(__clang__) && defined(__OPTIMIZE__))
#define PMINDEX_NODE_SEARCH_AVX2 1
#endif
#endif
// The attribute of a dispatched entry point's AVX2 instantiation (docs/isa.md): the only
// functions of a baseline build in which the compiler may use AVX2, each reached only when
// isa::search_level() is avx2. Empty where all code is AVX2 already (a PMINDEX_ISA=avx2 build)
// or no vector form exists (ThreadSanitizer).
#if defined(PMINDEX_NODE_SEARCH_AVX2) && !defined(__AVX2__)
#define PMINDEX_AVX2_ENTRY [[gnu::target("avx2")]]
#else
#define PMINDEX_AVX2_ENTRY
#endif

namespace pmindex::index_common {

// Which form of the vector searches a caller instantiates (docs/isa.md). avx2: the AVX2 form,
// which compiles only inside a function marked [[gnu::target("avx2")]] (or in a PMINDEX_ISA=avx2
// build); such a function is reached only after isa::search_level() said the CPU has AVX2.
// baseline: the SSE4.2 form. kBuiltIsa, the default of the callers that do not dispatch
// (uTree, DPTree, batched and writer descents), is what the build's own flags allow, so those
// keep the form they had: AVX2 in a PMINDEX_ISA=avx2 build, SSE4.2 in a baseline one.
enum class SearchIsa : unsigned char { baseline = 0, avx2 = 1 };
#if defined(__AVX2__)
inline constexpr SearchIsa kBuiltIsa = SearchIsa::avx2;
#else
inline constexpr SearchIsa kBuiltIsa = SearchIsa::baseline;
#endif

// The number of separators sep(0) .. sep(cnt - 1) that are <= the probe; probe_less(s) is
// "probe < s". capacity: the node's separator slots (cnt <= capacity); sep(i) is called for
// i < capacity only (the counted window is clamped there; slots at or past cnt are masked).
template <unsigned kWindow, class Sep, class ProbeLess>
[[gnu::always_inline]] inline unsigned count_not_above(unsigned cnt, unsigned capacity, Sep sep,
                                                    ProbeLess probe_less) {
  if constexpr (kWindow > 0) {
    if (capacity <= kWindow) {  // a small node is counted whole
      unsigned below = 0;
      for (unsigned i = 0; i < capacity; ++i)
        below += static_cast<unsigned>(i < cnt) & static_cast<unsigned>(!probe_less(sep(i)));
      return below;
    }
  }
  // Binary steps. The probe goes right past slot lo + half (keeping len - half - 1 slots) or
  // left (keeping half); both updates are masks, so g++ cannot turn them into branches (it
  // did with the ternary form). Unsigned wrap-around is intended: len - 2 half - 1 is -1
  // for an even len, and half + (-1) = len - half - 1 there too.
  unsigned lo = 0, len = cnt;
  while (len > kWindow) {
    const unsigned half = len / 2;
    const unsigned right = 0u - static_cast<unsigned>(!probe_less(sep(lo + half)));  // ~0 or 0
    lo += (half + 1) & right;
    len = half + ((len - 2 * half - 1) & right);
  }
  if constexpr (kWindow > 0) {
    // kWindow slots from lo (a constant trip count: unrolled), clamped into the node.
    unsigned below = lo;
    for (unsigned i = 0; i < kWindow; ++i) {
      const unsigned slot = std::min(lo + i, capacity - 1);
      below += static_cast<unsigned>(i < len) & static_cast<unsigned>(!probe_less(sep(slot)));
    }
    return below;
  }
  return lo;
}

#if defined(PMINDEX_NODE_SEARCH_AVX2)
namespace detail {
// count_u64_window's AVX2 form packs the four 64-bit compare results of slots 0..15 into one 32-bit byte
// mask with two bits per slot (two packs and a movemask instead of four movemasks, shifts and
// ors); the packs interleave the 128-bit halves. The bit of slot i (the lower of its pair):
constexpr unsigned packed_bit(unsigned i) {
  const unsigned g = i / 4, r = i % 4, half = r / 2, j = r % 2;
  return 16 * half + 8 * (g / 2) + 4 * (g % 2) + 2 * j;
}
// kInUse<kSlots>.mask[c & 31]: the packed bits of slots 0 .. min(c & 31, kSlots)-1. Indexed
// by a masked count and clamped at the capacity, so a torn count (a reader racing a writer;
// its validation fails later) selects at most kSlots slots without a compare and branch.
template <unsigned kSlots>
constexpr auto make_in_use() {
  struct Table { std::uint32_t mask[32]; } t{};
  for (unsigned c = 0; c < 32; ++c)
    for (unsigned i = 0; i < std::min(c, kSlots); ++i) t.mask[c] |= std::uint32_t{1} << packed_bit(i);
  return t;
}
template <unsigned kSlots>
inline constexpr auto kInUse = make_in_use<kSlots>();
static_assert(packed_bit(0) == 0 && packed_bit(2) == 16 && packed_bit(4) == 4 &&
              packed_bit(8) == 8 && packed_bit(15) == 30);
}  // namespace detail
#endif
#if defined(PMINDEX_NODE_SEARCH_SSE42)
namespace detail {
// The SSE4.2 form (the baseline x86-64-v2 build, README "Minimum CPU") compares two slots per
// instruction and packs slots 0..7 and 8..15 into one 16-bit byte mask each, in slot order:
// slot i owns bits 2i and 2i+1. kInUseSse<kSlots>.mask[c & 31]: bit 2i of slots
// 0 .. min(c & 31, kSlots)-1, clamped as kInUse is.
template <unsigned kSlots>
constexpr auto make_in_use_sse() {
  struct Table { std::uint32_t mask[32]; } t{};
  for (unsigned c = 0; c < 32; ++c)
    for (unsigned i = 0; i < std::min(c, kSlots); ++i) t.mask[c] |= std::uint32_t{1} << (2 * i);
  return t;
}
template <unsigned kSlots>
inline constexpr auto kInUseSse = make_in_use_sse<kSlots>();
}  // namespace detail
#endif

// Sign-bit bias of integer words: w ^ kSignBias orders as a signed integer the way w orders
// as an unsigned one, so AVX2's signed 64-bit compare can count unsigned keys.
inline constexpr std::uint64_t kSignBias = std::uint64_t{1} << 63;

#if defined(PMINDEX_NODE_SEARCH_AVX2)
// The AVX2 form, written with GCC's generic vectors and the AVX2 builtins themselves rather
// than the _mm256 intrinsics (docs/isa.md): an intrinsic is an always_inline function marked
// target("avx2"), which g++ refuses to inline into the plain functions between the dispatched
// entry point and this code (InnerTree::descend_impl, NBTree::snapshot, ...), so it would stay
// an out-of-line call per node. A builtin is checked where it is finally compiled: inlined into
// a target("avx2") entry point (PMINDEX_AVX2_ENTRY) it is one instruction; left in a plain
// function of a baseline build it fails to compile ("needs isa option -mavx2"), so the AVX2
// form cannot leak out of the entry points. The same instructions as the intrinsics (which
// wrap these builtins and vector operators).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"  // 32-byte vector values: only ever inlined
namespace avx2 {
using I64x4 = long long __attribute__((vector_size(32)));
using I64x4Unaligned = long long __attribute__((vector_size(32), aligned(1)));
using I32x8 = int __attribute__((vector_size(32)));
using I16x16 = short __attribute__((vector_size(32)));
using I8x32 = char __attribute__((vector_size(32)));
using I8x32Unaligned = char __attribute__((vector_size(32), aligned(1)));

// vmovmskb of the bytes of p[0 .. 32) equal to b: bit i set where p[i] == b.
[[gnu::always_inline]] inline std::uint32_t match_bytes(const void* p, std::uint8_t b) {
  const I8x32 x = *static_cast<const I8x32Unaligned*>(p);
  const auto c = static_cast<char>(b);
  const I8x32 want = {c, c, c, c, c, c, c, c, c, c, c, c, c, c, c, c,
                      c, c, c, c, c, c, c, c, c, c, c, c, c, c, c, c};
  return static_cast<std::uint32_t>(__builtin_ia32_pmovmskb256(x == want));
}
}  // namespace avx2

namespace detail {
// No function here takes or returns a vector (g++'s -Wpsabi notes on such functions outside
// an AVX function; these are always inlined anyway).
template <unsigned kSlots, bool kBiased>
[[gnu::always_inline]] inline unsigned count_u64_window_avx2(const std::uint64_t* k, unsigned cnt,
                                                            std::uint64_t probe) {
  // Unsigned order through the signed compare: flip the sign bit of both sides.
  const auto q = static_cast<long long>(probe ^ kSignBias);
  const avx2::I64x4 p = {q, q, q, q};
  avx2::I64x4 above[4] = {};  // lanes of slots 4g .. 4g+3: all ones where k > probe
#pragma GCC unroll 4
  for (unsigned g = 0; g < 4; ++g) {
    if (4 * g >= kSlots) continue;
    avx2::I64x4 x = *reinterpret_cast<const avx2::I64x4Unaligned*>(k + 4 * g);
    if constexpr (!kBiased) x ^= static_cast<long long>(kSignBias);
    above[g] = x > p;
  }
  // _mm256_packs_epi32 of groups 0, 1 and of 2, 3; _mm256_packs_epi16; _mm256_movemask_epi8.
  const avx2::I16x16 lo = __builtin_ia32_packssdw256(__builtin_bit_cast(avx2::I32x8, above[0]),
                                                     __builtin_bit_cast(avx2::I32x8, above[1]));
  const avx2::I16x16 hi = __builtin_ia32_packssdw256(__builtin_bit_cast(avx2::I32x8, above[2]),
                                                     __builtin_bit_cast(avx2::I32x8, above[3]));
  const auto mask =
      static_cast<std::uint32_t>(__builtin_ia32_pmovmskb256(__builtin_ia32_packsswb256(lo, hi)));
  return static_cast<unsigned>(__builtin_popcount(~mask & kInUse<kSlots>.mask[cnt & 31]));
}
}  // namespace detail
#pragma GCC diagnostic pop
#endif

// The number of the first `cnt` (kSlots <= 16) words of k[0 .. kSlots) that are <= probe; a
// cnt above kSlots (a torn read, whose validation fails) gives some count <= kSlots. k[cnt .. round_up(kSlots, 4)) must be
// readable memory (any contents): the vector path reads whole groups of four and masks the
// slots at or past cnt. kBiased: k holds its words already
// biased (w ^ kSignBias; InnerTree stores its separators so), which saves a vector xor per
// group of four; `probe` is unbiased either way. kIsa: the form (SearchIsa); the avx2 one only
// inside a target("avx2") function of a baseline build.
template <unsigned kSlots, bool kBiased = false, SearchIsa kIsa = kBuiltIsa>
[[gnu::always_inline]] inline unsigned count_u64_window(const std::uint64_t* k, unsigned cnt,
                                                       std::uint64_t probe) {
  static_assert(kSlots >= 1 && kSlots <= 16);
#if defined(PMINDEX_NODE_SEARCH_SSE42)
#if defined(PMINDEX_NODE_SEARCH_AVX2)
  if constexpr (kIsa == SearchIsa::avx2) {
    return detail::count_u64_window_avx2<kSlots, kBiased>(k, cnt, probe);
  } else
#endif
  {
    // 128-bit vectors: pcmpgtq (SSE4.2) on two slots, packs down to bytes.
    const __m128i flip = _mm_set1_epi64x(INT64_MIN);
    const __m128i p = _mm_set1_epi64x(static_cast<long long>(probe ^ kSignBias));
    const auto above = [&](unsigned g) {  // lanes of slots 2g, 2g+1: all ones if k > probe
      if (2 * g >= kSlots) return _mm_setzero_si128();
      const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(k + 2 * g));
      return _mm_cmpgt_epi64(kBiased ? x : _mm_xor_si128(x, flip), p);
    };
    const auto eight = [&](unsigned g) {  // slots 2g .. 2g+7, two mask bits each
      return static_cast<std::uint32_t>(_mm_movemask_epi8(
          _mm_packs_epi16(_mm_packs_epi32(above(g), above(g + 1)),
                          _mm_packs_epi32(above(g + 2), above(g + 3)))));
    };
    std::uint32_t mask = eight(0);
    if constexpr (kSlots > 8) mask |= eight(4) << 16;
    const std::uint32_t in_use = detail::kInUseSse<kSlots>.mask[cnt & 31];
    return static_cast<unsigned>(__builtin_popcount(~mask & in_use));
  }
#else
  const std::uint64_t unbias = kBiased ? kSignBias : 0;
  unsigned below = 0;
  for (unsigned i = 0; i < kSlots; ++i)
    below += static_cast<unsigned>(i < std::min(cnt, kSlots)) &
             static_cast<unsigned>((sync::optimistic_read(k[i]) ^ unbias) <= probe);
  return below;
#endif
}

// count_not_above for integer keys k[0 .. cnt) with the node's capacity known at compile
// time: binary steps down to 16 slots (as count_not_above), then count_u64_window. Reads
// k[0 .. cnt + 16) at most (the vector window may reach past the keys: the caller's node must
// hold that many words from k on, any contents); a capacity of 2^m - 1 reads k[0 .. kCapacity].
template <unsigned kCapacity, bool kBiased = false, SearchIsa kIsa = kBuiltIsa>
[[gnu::always_inline]] inline unsigned count_u64_not_above(const std::uint64_t* k, unsigned cnt,
                                                          std::uint64_t probe) {
  if constexpr (kCapacity <= 16) {
    return count_u64_window<kCapacity, kBiased, kIsa>(k, cnt, probe);
  } else if constexpr ((kCapacity & (kCapacity + 1)) == 0) {
    // Capacity 2^m - 1 (NBTree's 63, FPTree's 127): every step halves the remaining length
    // whichever way it goes (2^j - 1 -> 2^(j-1) - 1), so the steps are a constant sequence
    // over the whole capacity; a slot at or past the count reads as "above". About half the
    // instructions of the count-driven steps below (issue 16). Reads k[0 .. kCapacity]
    // whatever the count (a torn count included), and returns at most kCapacity.
    const std::uint64_t unbias = kBiased ? kSignBias : 0;
    unsigned lo = 0;
#pragma GCC unroll 8
    for (unsigned len = kCapacity; len > 15; len /= 2) {
      const unsigned mid = lo + len / 2;
      const bool right =
          (mid < cnt) & !(probe < (sync::optimistic_read(k[mid]) ^ unbias));
      lo = right ? mid + 1 : lo;
    }
    const unsigned rest = cnt > lo ? cnt - lo : 0;
    return lo + count_u64_window<15, kBiased, kIsa>(k + lo, rest < 15 ? rest : 15, probe);
  } else {
    const std::uint64_t unbias = kBiased ? kSignBias : 0;
    unsigned lo = 0, len = cnt;
    while (len > 16) {
      const unsigned half = len / 2;
      const unsigned right =
          0u - static_cast<unsigned>(!(probe < (sync::optimistic_read(k[lo + half]) ^ unbias)));
      lo += (half + 1) & right;
      len = half + ((len - 2 * half - 1) & right);
    }
    return lo + count_u64_window<16, kBiased, kIsa>(k + lo, len, probe);
  }
}

}  // namespace pmindex::index_common

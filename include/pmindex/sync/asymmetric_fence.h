/// \file
/// Asymmetric StoreLoad fences: a cheap side for the hot path and an expensive side for the rare
/// path of a Dekker-style handshake (epoch.h: readers pin on every operation, reclaimers seal
/// and advance once per many operations).
///
///   light()  hot side: only a compiler barrier when heavy() can reach the other threads,
///            otherwise a seq_cst fence.
///   heavy()  rare side: membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED), which returns only after
///            every other running thread of the process has executed a full memory barrier
///            (an IPI to its CPU; a thread that is not running gets one at its next switch),
///            otherwise a seq_cst fence.
///
/// Why light() may be a compiler barrier (x86-64, which pmindex targets: its stores become
/// visible to all other CPUs at once). Take a store-buffering pair: thread L does `x = 1;
/// light(); r1 = y`, thread H does `y = 1; heavy(); r2 = x`. heavy() puts a full barrier into L
/// at some instruction boundary B, and the compiler barrier keeps L's two accesses in program
/// order around it. If B comes after L's store, that store is visible before heavy() returns,
/// so r2 = 1. If B comes before it, L's load executes after B, after H's store was made
/// visible by heavy()'s own barrier, so r1 = 1. Either way r1 = r2 = 0 is impossible, which is
/// what a seq_cst fence on both sides guarantees. tests/sync/test_asymmetric_fence.cpp runs
/// that litmus test (and shows that two compiler barriers do allow r1 = r2 = 0).
///
/// Why the light side matters: a full fence waits until the store buffer drains, and on PM a
/// store buffer often holds stores ordered behind an earlier clwb + sfence, so a seq_cst fence
/// at the start of an operation waits for the previous operation's write-back.
///
/// The mode is decided once per process, before main() (a static initialiser in
/// asymmetric_fence.cpp; heavy() and decide() make the same decision if called earlier), and
/// never changes: MEMBARRIER_CMD_QUERY must offer PRIVATE_EXPEDITED and its registration must
/// succeed, and the environment variable PMINDEX_SYMMETRIC_FENCES must not be set to a
/// non-empty value other than 0 (set it to test or to compare the fallback). The decision is
/// kept in a constant-initialised flag, so light() reads one byte with no initialisation guard.
/// A light() that runs before the decision reads false and issues a full fence, which is safe
/// with either heavy side; a light() that read true skipped its fence, and then the decision
/// was made, so every heavy() (which takes the decision itself first) uses membarrier. After a
/// fork() the child re-registers on its first heavy() if the kernel asks for it; a heavy()
/// that cannot reach the other threads is fatal, because light() has already skipped fences.
#pragma once

#include <atomic>

namespace pmindex::sync {

/// The light/heavy fence pair described above. All members static and thread-safe.
class AsymmetricFence {
 public:
  /// True when light() is a compiler barrier (see above). Thread-safe.
  static bool enabled() noexcept { return decide(); }

  /// What light() reads: whether the mode was decided (before main()) as enabled. For tests
  /// and reports; relaxed, like light().
  static bool light_skips_fence() noexcept { return on_.load(std::memory_order_relaxed); }

  /// The frequent side (e.g. an epoch pin): a compiler barrier when enabled(), else a full fence.
  static void light() noexcept {
    // relaxed: the flag publishes no other data; it only says whether heavy() uses
    // membarrier, and decide() there yields the value that was stored here (above).
    if (on_.load(std::memory_order_relaxed)) [[likely]] {
      std::atomic_signal_fence(std::memory_order_seq_cst);
    } else {
      full_fence();
    }
  }

  /// The rare side (e.g. advancing the epoch): a process-wide barrier through membarrier when
  /// enabled(), else a full fence. Aborts if the membarrier fails after light() skipped fences.
  static void heavy() noexcept;

  /// A plain seq_cst fence: what both sides are in the fallback.
  static void full_fence() noexcept;

 private:
  /// The once-per-process decision (thread-safe; the first call stores it into on_).
  static bool decide() noexcept;
  static bool init() noexcept;
  /// The decision, once made (false before). constinit: no guard variable on the hot path.
  static constinit inline std::atomic<bool> on_{false};
};

}  // namespace pmindex::sync

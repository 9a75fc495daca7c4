// Asymmetric fences: the membarrier(2) side and the once-per-process mode decision. The
// argument is in include/pmindex/sync/asymmetric_fence.h.
#include "pmindex/sync/asymmetric_fence.h"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace pmindex::sync {

namespace {

long membarrier(int cmd) { return syscall(__NR_membarrier, cmd, 0, 0); }

bool symmetric_requested() {
  const char* v = std::getenv("PMINDEX_SYMMETRIC_FENCES");
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}

}  // namespace

bool AsymmetricFence::decide() noexcept {
  // The function-local static makes one decision even if threads race here before main();
  // relaxed store: see light().
  static const bool on = [] {
    const bool v = init();
    on_.store(v, std::memory_order_relaxed);
    return v;
  }();
  return on;
}

namespace {
// Decides at process start, so light() finds the flag set without a guard of its own.
[[maybe_unused]] const bool decided_at_start = AsymmetricFence::enabled();
}  // namespace

bool AsymmetricFence::init() noexcept {
  if (symmetric_requested()) return false;
  const long offered = membarrier(MEMBARRIER_CMD_QUERY);
  if (offered < 0 || (offered & MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return false;
  return membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
}

void AsymmetricFence::full_fence() noexcept {
  // g++ warns (-Wtsan) that TSan does not model fences; that is expected: the fences decide
  // which values are read, and the happens-before edges TSan checks come from release/acquire
  // accesses (epoch.h).
#if defined(__GNUC__) && !defined(__clang__) && defined(__SANITIZE_THREAD__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wtsan"
#endif
  std::atomic_thread_fence(std::memory_order_seq_cst);
#if defined(__GNUC__) && !defined(__clang__) && defined(__SANITIZE_THREAD__)
#pragma GCC diagnostic pop
#endif
}

void AsymmetricFence::heavy() noexcept {
  // Our own side of the pair, like a seq_cst fence (the syscall would order it too).
  full_fence();
  if (!decide()) return;
  if (membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return;
  // A forked child may have to register again (the registration belongs to the address space).
  if (errno == EPERM && membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0 &&
      membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0)
    return;
  std::fprintf(stderr,
               "pmindex: membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) failed (%s) after it was "
               "registered; the light fences already skipped cannot be made safe. Set "
               "PMINDEX_SYMMETRIC_FENCES=1 to run without asymmetric fences.\n",
               std::strerror(errno));
  std::abort();
}

}  // namespace pmindex::sync

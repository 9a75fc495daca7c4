/// \file
/// Small dense per-thread ids, recycled when a thread exits, for per-thread tables (allocator
/// caches, epoch participants) that must not grow with the number of threads ever created.
#pragma once

#include <cstddef>

namespace pmindex::pm {

/// Threads that may be alive at once while using pmindex.
inline constexpr std::size_t kMaxThreadSlots = 512;

/// The calling thread's slot in [0, kMaxThreadSlots). Aborts with a message if more than
/// kMaxThreadSlots threads are alive at once.
std::size_t this_thread_slot();

}  // namespace pmindex::pm

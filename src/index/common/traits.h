// Shared wording of IndexTraits fields (include/pmindex/index.h) that several indexes have in
// common, so the survey report's design matrix says the same thing the same way.
#pragma once

#include <string_view>

namespace pmindex::traits {

// Every built-in index allocates through pm::Allocator (docs/allocator.md).
inline constexpr std::string_view kPmindexAllocator =
    "pmindex allocator: size classes, no per-allocation persistence, leaks reclaimed by a "
    "reachability pass at recovery";
inline constexpr std::string_view kPmindexAllocatorStartNow =
    "pmindex allocator: size classes, no per-allocation persistence, leaks reclaimed by a "
    "background reachability pass (start-now mode)";

}  // namespace pmindex::traits

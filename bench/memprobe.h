// The machine's random-access memory latency, measured: the floor under every emulated-PM
// number. An index lookup on a large tree is a few dependent cache misses, so its throughput
// moves with this latency, and on a shared VM that latency drifts from hour to hour (the
// README's runs A and B differ by 1.5x with the same code). `pmbench --probe_memory` measures
// it so that a result can be quoted beside the latency it was measured at.
//
// Method: a pointer chase through one random cycle over every cache line of a buffer (each
// load's address is the previous load's value, so the loads cannot overlap), once in 4 KiB
// pages (as a tmpfs pool is mapped) and once in transparent huge pages (as pmindex's DRAM
// arenas ask for). The buffer is larger than any cache level of the machines we run on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pmbench {

struct MemoryLatency {
  std::size_t bytes = 0;            // working set of each chase
  std::uint64_t hops = 0;           // dependent loads timed per chase
  double ns_4k = 0;                 // nanoseconds per load, 4 KiB pages
  double ns_huge = 0;               // nanoseconds per load, MADV_HUGEPAGE
  std::uint64_t huge_bytes = 0;     // of the huge-page buffer, bytes the kernel backed by THP
  std::string error;                // non-empty: the probe could not run (mmap failed)
};

// Takes about bytes / 64 * 2 random writes to build the cycles plus 2 * hops timed loads
// (~1 s for the defaults on a machine with ~150 ns latency).
MemoryLatency probe_memory_latency(std::size_t bytes = std::size_t{256} << 20,
                                   std::uint64_t hops = 2'000'000);

}  // namespace pmbench

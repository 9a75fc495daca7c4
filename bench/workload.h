// Workload generation: every key, value and operation of a run is generated here, before the
// clock starts (the timed loop only reads these arrays).
//
// Ids (docs/pmbench.md, "Generators"):
//   loaded ids     0 .. records-1; thread t of T loads ids t, t+T, t+2T, ...
//   insert ids     thread t inserts records + t + j*T for j = 0, 1, ... : disjoint between
//                  threads and never loaded (PiBench bug 1)
//   other ops      target ids that exist at that moment (PiBench bug 3):
//                    shared mode: a loaded id or one this thread inserted earlier;
//                    owned mode (removes in the mix, or --verify): an id this thread loaded or
//                    inserted and has not removed. Every outcome is then known in advance.
// Operation mix: the global count of each type is the largest-remainder rounding of
// ratio * operations; types are dealt round-robin to threads, and each thread shuffles its
// exact multiset with its own PRNG stream (PiBench bugs 2 and 6).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "config.h"
#include "distribution.h"
#include "keys.h"

namespace pmbench {

struct WorkloadSpec {
  std::uint64_t records = 0;
  unsigned threads = 1;
  std::uint64_t operations = 0;        // total over all threads
  std::array<double, kOpTypes> ratio{1, 0, 0, 0, 0};
  DistKind distribution = DistKind::uniform;
  double skew = 0.2;
  std::uint64_t seed = 1729;
  KeyFormat keys;
  ValueFormat values;
  double latency_sampling = 0;
  bool owned = false;
  int scan_size = 100;

  static WorkloadSpec from(const Config& c, std::uint64_t operations,
                           std::shared_ptr<const Dataset> dataset = nullptr);
};

inline std::uint64_t insert_id(std::uint64_t records, unsigned threads, unsigned t,
                               std::uint64_t j) {
  return records + t + j * threads;
}
// An id no thread ever loads or inserts (a thread that removed all its ids targets it).
inline std::uint64_t absent_id(unsigned t) { return ~std::uint64_t{0} - t; }

// One thread's operations, in execution order.
// Compact (issue 26: a 100M-record run's harness must stay under 2 GB): keys are stored only
// when they come from a dataset (a lookup into the dataset would be a cache miss inside the
// timed loop); hash keys are computed from the id by key() (a multiply and a byte swap, no
// PRNG, no memory access), and values always by value() (a mix of id and version). Versions
// are stored only when the mix writes values (update, rmw).
struct Schedule {
  std::vector<OpType> types;
  std::vector<std::uint64_t> ids;
  std::vector<std::uint32_t> versions;  // value version written (update/rmw: > 0); empty: all 0
  std::vector<std::uint8_t> timed;      // 1: measure this operation's latency
  std::uint64_t timed_count = 0;        // how many are 1
  std::vector<char> keys;               // stored keys back to back (datasets only)
  std::vector<std::uint64_t> key_offsets;  // stored key i is keys[key_offsets[i], key_offsets[i+1])
  std::array<std::uint64_t, kOpTypes> counts{};
  std::uint64_t expected_misses = 0;    // ops on a thread with no ids left (owned mode)
  std::size_t value_size = 8;
  const KeyFormat* key_format = nullptr;      // the spec's (it outlives the schedule)
  const ValueFormat* value_format = nullptr;

  std::size_t size() const { return types.size(); }
  bool stored_keys() const { return !key_offsets.empty(); }
  std::uint32_t version(std::size_t i) const { return versions.empty() ? 0 : versions[i]; }
  // A per-thread buffer for key(): the key format's prefix and padding, written once.
  std::string key_buffer() const { return stored_keys() ? std::string() : key_format->make(0); }
  // Key i: a view into the stored keys, or computed into `buf` (from key_buffer()).
  std::string_view key(std::size_t i, std::string& buf) const {
    if (stored_keys()) return {keys.data() + key_offsets[i], key_offsets[i + 1] - key_offsets[i]};
    key_format->write_word(ids[i], buf.data());
    return buf;
  }
  // Value i (value_size bytes) written into buf (insert: version 0; update/rmw: its version).
  std::string_view value(std::size_t i, std::string& buf) const {
    buf.resize(value_size);
    value_format->write(ids[i], version(i), buf.data());
    return buf;
  }
  // Bytes this schedule holds (for the harness memory report).
  std::uint64_t bytes() const {
    return types.capacity() * sizeof(OpType) + ids.capacity() * 8 + versions.capacity() * 4 +
           timed.capacity() + keys.capacity() + key_offsets.capacity() * 8;
  }
};

// The exact per-type counts of `operations` for `ratio` (largest remainder; sums exactly).
std::array<std::uint64_t, kOpTypes> exact_counts(std::uint64_t operations,
                                                 const std::array<double, kOpTypes>& ratio);
// Deals the global counts to threads round-robin: per-thread counts, each thread's total is
// operations/threads rounded down or up.
std::vector<std::array<std::uint64_t, kOpTypes>> deal_counts(
    const std::array<std::uint64_t, kOpTypes>& counts, unsigned threads);

// Builds all threads' schedules (in parallel, one builder thread per worker).
std::vector<Schedule> build_schedules(const WorkloadSpec& spec);
// The ids thread t loads, in load order.
std::vector<std::uint64_t> load_ids(std::uint64_t records, unsigned threads, unsigned t);

// A check that generation never runs inside the timed section (PiBench bug 5): the driver
// marks the timed section; every generator entry point counts a violation if called inside.
struct TimedSection {
  static std::atomic<int> active;
  static std::atomic<std::uint64_t> violations;
  static void enter() { active.fetch_add(1, std::memory_order_relaxed); }
  static void leave() { active.fetch_sub(1, std::memory_order_relaxed); }
  static void note_generation() {
    if (active.load(std::memory_order_relaxed) != 0)
      violations.fetch_add(1, std::memory_order_relaxed);
  }
};

}  // namespace pmbench

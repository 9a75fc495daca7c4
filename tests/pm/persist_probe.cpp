// The function whose machine code test_persist_asm inspects: one 8-byte PM store made durable
// in adr mode. Compiled at -O2 without sanitizers (see tests/CMakeLists.txt).
#include <cstdint>

#include "pmindex/pm/persist.h"

extern "C" __attribute__((noinline)) void pmindex_probe_store_persist(std::uint64_t* p,
                                                                      std::uint64_t v) {
  pmindex::pm::store(p, v);
  pmindex::pm::persist(p, sizeof v);
}

// Known-bad: what the fast path must not become (a hook call and an extra branch per store).
extern "C" __attribute__((noinline)) void pmindex_probe_opaque(std::uint64_t);
extern "C" __attribute__((noinline)) void pmindex_probe_bad(std::uint64_t* p, std::uint64_t v) {
  pmindex::pm::store(p, v);
  if (v & 1) pmindex_probe_opaque(v);
  pmindex::pm::persist(p, sizeof v);
}
extern "C" void pmindex_probe_opaque(std::uint64_t v) { asm volatile("" ::"r"(v)); }

int main() {
  alignas(64) static std::uint64_t word;
  pmindex_probe_store_persist(&word, 1);
  pmindex_probe_bad(&word, 1);
  return word == 1 ? 0 : 1;
}

// Compiled twice by tests/CMakeLists.txt, at the baseline level and with -mavx2, to check
// tools/check-isa.sh both ways: the loop below is vectorised at -O3, so the -mavx2 object
// holds AVX instructions in a function that is not run-time dispatched.
#include <cstddef>
#include <cstdint>

void pmindex_isa_probe_add(std::uint32_t* a, const std::uint32_t* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) a[i] += b[i] * 3u;
}

// Fuzzes pool open + index recovery + verify over mutated pool images. Recovery must never
// crash, hang or read outside the image, whatever the bytes: it bounds-checks every offset and
// cycle-checks every chain walk.
//
// The input is a list of patches applied to a valid template image (a small reflist pool with
// records), so the fuzzer explores deep recovery paths instead of dying at the magic check:
//   byte 0        flags: bit 0 = recompute the header checksum after patching
//   then repeated [offset: 3 bytes][length: 1 byte][bytes...]
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "pmindex/index.h"
#include "pmindex/pm/pool.h"

namespace {

constexpr std::size_t kImageSize = 64 * 1024;

std::vector<char> make_template() {
  pmindex::Options o;
  o.kind = "reflist";
  o.pool_size = kImageSize;
  o.persistence = pmindex::pm::Mode::dram;
  auto idx = pmindex::Index::open(o);
  if (!idx.ok()) __builtin_trap();
  for (std::uint64_t k = 0; k < 40; ++k)
    (void)(*idx)->insert(pmindex::encode_u64(k * 3), pmindex::encode_u64(k));
  for (std::uint64_t k = 0; k < 40; k += 5) (void)(*idx)->remove(pmindex::encode_u64(k * 3));
  const pmindex::pm::Pool& pool = (*idx)->pool();
  return std::vector<char>(pool.base(), pool.base() + pool.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::vector<char> kTemplate = make_template();
  pmindex::pm::ImageBytes image(kTemplate.begin(), kTemplate.end());  // line-aligned
  if (size == 0) return 0;
  const bool fix_checksum = (data[0] & 1) != 0;
  std::size_t i = 1;
  while (i + 4 <= size) {
    const std::size_t off = (std::size_t{data[i]} | std::size_t{data[i + 1]} << 8 |
                             std::size_t{data[i + 2]} << 16) % kImageSize;
    std::size_t len = data[i + 3];
    i += 4;
    len = std::min({len, size - i, kImageSize - off});
    std::memcpy(image.data() + off, data + i, len);
    i += len;
  }
  auto* h = reinterpret_cast<pmindex::pm::PoolHeader*>(image.data());
  if (fix_checksum) h->checksum = pmindex::pm::header_checksum(*h);
  // Bit 1: reseal both header state copies from copy 0, so the state's words reach the checks
  // behind the checksums.
  if ((data[0] & 2) != 0) {
    h->state[0] = h->state[1] = pmindex::pm::sealed_state(*h, h->state[0]);
  }

  pmindex::Options o;
  o.kind = "reflist";
  o.persistence = pmindex::pm::Mode::dram;
  const auto* entry = pmindex::IndexRegistry::find("reflist");
  auto pool = pmindex::pm::Pool::open_image(image.data(), image.size(), o.persistence,
                                            entry->layout(o), "fuzz-image");
  if (!pool.ok()) return 0;
  auto idx = entry->recover(std::move(pool).value(), o);
  if (!idx.ok()) return 0;
  (void)(*idx)->verify();
  // A recovered index must also work: a few operations, then verify again.
  (void)(*idx)->insert(pmindex::encode_u64(7), pmindex::encode_u64(7));
  (void)(*idx)->remove(pmindex::encode_u64(9));
  pmindex::ScanBuffer buf;
  (*idx)->scan(pmindex::encode_u64(0), 10, buf);
  if (pmindex::Status s = (*idx)->verify(); !s.ok()) {
    std::fprintf(stderr, "recovered index broke after operations: %s\n", s.to_string().c_str());
    __builtin_trap();
  }
  return 0;
}

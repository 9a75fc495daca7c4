#include "pmindex/pm/layout.h"

#include <zlib.h>

#include <string>

namespace pmindex::pm {

std::string_view to_string(KeyMode mode) {
  switch (mode) {
    case KeyMode::u64: return "u64";
    case KeyMode::f64: return "double";
    case KeyMode::bytes: return "bytes";
  }
  return "unknown";
}

std::string Layout::describe() const {
  std::string out = "'" + kind + "' (";
  if (node_size != 0) out += "node " + std::to_string(node_size) + " B, ";
  out += "key " + std::string(to_string(key_mode));
  if (variant != 0) out += ", variant " + std::to_string(variant);
  return out + ")";
}

std::uint64_t header_checksum(const PoolHeader& header) {
  return crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(&header),
               static_cast<uInt>(kChecksummedBytes));
}

}  // namespace pmindex::pm

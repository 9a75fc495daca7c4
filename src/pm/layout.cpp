#include "pmindex/pm/layout.h"

#include <zlib.h>

#include <cstring>
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

// Seeded with the uuid, so a state copy from another pool never passes as this pool's.
std::uint64_t state_checksum(const PoolHeader& header, const HeaderState& state) {
  uLong crc = crc32(crc32(0L, Z_NULL, 0), header.uuid, sizeof header.uuid);
  return crc32(crc, reinterpret_cast<const Bytef*>(&state),
               static_cast<uInt>(kStateChecksummedBytes));
}

HeaderState sealed_state(const PoolHeader& header, HeaderState state) {
  state.checksum = state_checksum(header, state);
  return state;
}

namespace {
bool state_valid(const PoolHeader& h, const HeaderState& s) {
  return s.checksum == state_checksum(h, s) && s.sequence != 0;
}
}  // namespace

// A state change writes copy 0 whole (persisted) before copy 1, so at any crash copy 1 holds
// either the same state as copy 0 or the one before it (sequence one lower), and at most the
// copy being written is torn. See docs/pool-format.md for the full argument.
bool read_state(const PoolHeader& h, HeaderState* out, std::string* note) {
  const HeaderState& a = h.state[0];
  const HeaderState& b = h.state[1];
  const bool va = state_valid(h, a), vb = state_valid(h, b);
  auto say = [note](std::string text) {
    if (note != nullptr) *note = std::move(text);
  };
  if (!va && !vb) {
    say("both copies of the header state fail their checksum (header corrupted)");
    return false;
  }
  if (va && vb) {
    if (a.sequence == b.sequence && std::memcmp(&a, &b, sizeof a) != 0) {
      say("the two header state copies disagree at the same sequence number (header corrupted)");
      return false;
    }
    if (a.sequence != b.sequence && a.sequence != b.sequence + 1) {
      say("header state copies at sequence " + std::to_string(a.sequence) + " and " +
          std::to_string(b.sequence) + ": no crash leaves that (header corrupted)");
      return false;
    }
    *out = a;  // equal, or copy 1 not yet rewritten when the writer stopped: copy 0 is newer
    if (note != nullptr) note->clear();
    return true;
  }
  // One copy is torn (a crash while writing it) or damaged. Copy 0 alone valid: copy 1 was
  // being written after copy 0 was whole, or was damaged; copy 0 is the newest state either
  // way. Copy 1 alone valid: copy 0 was being written (its change never completed, so nothing
  // relied on it) or was damaged (then copy 1 equals it).
  *out = va ? a : b;
  say(std::string("header state copy ") + (va ? "1" : "0") +
      " failed its checksum (torn by a crash or damaged); the other copy was used");
  return true;
}

bool image_state(const void* image, HeaderState* out) {
  PoolHeader h;
  std::memcpy(&h, image, sizeof h);
  return read_state(h, out, nullptr);
}

std::uint64_t image_root(const void* image) {
  HeaderState st{};
  return image_state(image, &st) ? st.root : 0;
}

void set_image_state(void* image, const HeaderState& state) {
  PoolHeader h;
  std::memcpy(&h, image, sizeof h);
  h.state[0] = h.state[1] = sealed_state(h, state);
  std::memcpy(image, &h, sizeof h);
}

}  // namespace pmindex::pm

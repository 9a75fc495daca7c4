#include "keys.h"

#include <bit>
#include <cmath>

namespace pmbench {

std::uint64_t f64_ordered_bits(double v) {
  const auto bits = std::bit_cast<std::uint64_t>(v);
  return (bits >> 63) != 0 ? ~bits : bits | (std::uint64_t{1} << 63);
}

bool KeyFormat::id_of(std::string_view key, std::uint64_t* id) const {
  if (variable()) return dataset_->find_text_id(key, id);
  if (key.size() != key_size_) return false;
  if (key_size_ > 8) {
    if (key.compare(0, prefix_.size(), prefix_) != 0) return false;
    for (std::size_t i = prefix_.size(); i < key_size_ - 8; ++i)
      if (key[i] != '\0') return false;
  }
  const std::uint64_t word = load_word(key.data() + key_size_ - 8);
  if (dataset_) {
    std::uint64_t raw = word;
    if (kind_ == KeyKind::f64)  // invert f64_ordered_bits
      raw = (word >> 63) != 0 ? word & ~(std::uint64_t{1} << 63) : ~word;
    return dataset_->find_id(raw, id);
  }
  if (kind_ == KeyKind::f64) {
    if ((word >> 63) == 0) return false;  // a negative double: never one of ours
    const double d = std::bit_cast<double>(word & ~(std::uint64_t{1} << 63));
    if (!(d >= 0 && d < 0x1.0p53) || d != std::floor(d)) return false;
    const std::uint64_t h53 = static_cast<std::uint64_t>(d);
    *id = (h53 * kHashInverse) & ((std::uint64_t{1} << 53) - 1);
    return true;
  }
  *id = id_of_hash(word);
  return true;
}

}  // namespace pmbench

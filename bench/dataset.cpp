#include "dataset.h"

#include <algorithm>
#include <fstream>
#include <iterator>

#include "rng.h"

namespace pmbench {

bool Dataset::find_id(std::uint64_t key, std::uint64_t* id) const {
  auto it = std::lower_bound(by_key.begin(), by_key.end(), std::make_pair(key, std::uint64_t{0}));
  if (it == by_key.end() || it->first != key) return false;
  *id = it->second;
  return true;
}

std::shared_ptr<const Dataset> load_sosd(const std::string& path, std::uint64_t seed,
                                         std::string* error) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) {
    *error = path + ": cannot open";
    return nullptr;
  }
  const auto size = static_cast<std::uint64_t>(f.tellg());
  f.seekg(0);
  std::uint64_t count = 0;
  if (size < 8 || !f.read(reinterpret_cast<char*>(&count), 8)) {
    *error = path + ": too short for a SOSD header (8-byte key count)";
    return nullptr;
  }
  if (count > (size - 8) / 8 || 8 + count * 8 != size) {
    *error = path + ": SOSD header says " + std::to_string(count) + " keys, but the file holds " +
             std::to_string((size - 8) / 8) + " (size " + std::to_string(size) + ")";
    return nullptr;
  }
  auto d = std::make_shared<Dataset>();
  d->path = path;
  d->raw_count = count;
  d->keys.resize(count);
  if (count > 0 && !f.read(reinterpret_cast<char*>(d->keys.data()), static_cast<std::streamsize>(count * 8))) {
    *error = path + ": read failed";
    return nullptr;
  }
  std::sort(d->keys.begin(), d->keys.end());
  d->keys.erase(std::unique(d->keys.begin(), d->keys.end()), d->keys.end());
  Xoshiro256ss rng(seed, 0xda7a5e7);
  for (std::uint64_t i = d->keys.size(); i > 1; --i) std::swap(d->keys[i - 1], d->keys[rng.below(i)]);
  d->by_key.reserve(d->keys.size());
  for (std::uint64_t i = 0; i < d->keys.size(); ++i) d->by_key.emplace_back(d->keys[i], i);
  std::sort(d->by_key.begin(), d->by_key.end());
  return d;
}

bool load_text_keys(const std::string& path, std::vector<std::string>* keys, std::string* error) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    *error = path + ": cannot open";
    return false;
  }
  const std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  keys->clear();
  std::size_t start = 0;
  while (start < all.size()) {
    const std::size_t nl = all.find('\n', start);
    if (nl == std::string::npos) {
      keys->push_back(all.substr(start));
      break;
    }
    keys->push_back(all.substr(start, nl - start));
    start = nl + 1;
  }
  return true;
}

}  // namespace pmbench

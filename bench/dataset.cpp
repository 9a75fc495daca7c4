#include "dataset.h"

#include <algorithm>
#include <fstream>
#include <numeric>
#include <sstream>

#include "rng.h"
#include "synthetic.h"

namespace pmbench {

bool resolve_dataset_format(const std::string& format, const std::string& path,
                            DatasetFormat* out) {
  if (format == "sosd") *out = DatasetFormat::sosd;
  else if (format == "text") *out = DatasetFormat::text;
  else if (format == "auto") {
    if (path.rfind("gen:", 0) == 0) *out = DatasetFormat::generated;
    else if (path.ends_with(".txt")) *out = DatasetFormat::text;
    else *out = DatasetFormat::sosd;
  } else {
    return false;
  }
  return true;
}

bool Dataset::find_id(std::uint64_t key, std::uint64_t* id) const {
  auto it = std::lower_bound(by_key.begin(), by_key.end(), std::make_pair(key, std::uint64_t{0}));
  if (it == by_key.end() || it->first != key) return false;
  *id = it->second;
  return true;
}

bool Dataset::find_text_id(std::string_view key, std::uint64_t* id) const {
  auto it = std::lower_bound(text_sorted_ids.begin(), text_sorted_ids.end(), key,
                             [this](std::uint64_t a, std::string_view k) { return text(a) < k; });
  if (it == text_sorted_ids.end() || text(*it) != key) return false;
  *id = *it;
  return true;
}

std::shared_ptr<const Dataset> dataset_from_keys(std::string name, std::vector<std::uint64_t> raw,
                                                 std::uint64_t seed) {
  auto d = std::make_shared<Dataset>();
  d->path = std::move(name);
  d->raw_count = raw.size();
  d->keys = std::move(raw);
  std::sort(d->keys.begin(), d->keys.end());
  d->keys.erase(std::unique(d->keys.begin(), d->keys.end()), d->keys.end());
  Xoshiro256ss rng(seed, 0xda7a5e7);
  for (std::uint64_t i = d->keys.size(); i > 1; --i) std::swap(d->keys[i - 1], d->keys[rng.below(i)]);
  d->by_key.reserve(d->keys.size());
  for (std::uint64_t i = 0; i < d->keys.size(); ++i) d->by_key.emplace_back(d->keys[i], i);
  std::sort(d->by_key.begin(), d->by_key.end());
  return d;
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
  std::vector<std::uint64_t> keys(count);
  if (count > 0 && !f.read(reinterpret_cast<char*>(keys.data()), static_cast<std::streamsize>(count * 8))) {
    *error = path + ": read failed";
    return nullptr;
  }
  return dataset_from_keys(path, std::move(keys), seed);
}

std::shared_ptr<const Dataset> load_text(const std::string& path, std::uint64_t seed,
                                         std::string* error) {
  std::vector<std::string> lines;
  if (!load_text_keys(path, &lines, error)) return nullptr;
  auto d = std::make_shared<Dataset>();
  d->path = path;
  d->format = DatasetFormat::text;
  d->raw_count = lines.size();
  std::sort(lines.begin(), lines.end());
  lines.erase(std::unique(lines.begin(), lines.end()), lines.end());
  if (!lines.empty() && lines.front().empty()) lines.erase(lines.begin());  // the empty key
  Xoshiro256ss rng(seed, 0xda7a5e7);
  // Shuffle a permutation, then pack the keys in id order.
  std::vector<std::uint64_t> order(lines.size());
  std::iota(order.begin(), order.end(), std::uint64_t{0});
  for (std::uint64_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
  std::uint64_t total = 0;
  d->max_length = 0;
  for (const auto& l : lines) {
    total += l.size();
    d->max_length = std::max(d->max_length, l.size());
  }
  d->text_bytes.reserve(total);
  d->text_offsets.reserve(lines.size() + 1);
  d->text_offsets.push_back(0);
  // sorted position p holds id `inverse[p]`
  d->text_sorted_ids.assign(lines.size(), 0);
  for (std::uint64_t id = 0; id < order.size(); ++id) {
    const std::string& l = lines[order[id]];
    d->text_bytes.insert(d->text_bytes.end(), l.begin(), l.end());
    d->text_offsets.push_back(d->text_bytes.size());
    d->text_sorted_ids[order[id]] = id;
  }
  return d;
}

std::shared_ptr<const Dataset> load_dataset(const std::string& path, DatasetFormat format,
                                            std::uint64_t count, std::uint64_t seed,
                                            std::string* error) {
  switch (format) {
    case DatasetFormat::sosd: return load_sosd(path, seed, error);
    case DatasetFormat::text: return load_text(path, seed, error);
    case DatasetFormat::generated: {
      std::vector<std::uint64_t> keys;
      bool doubles = false;
      const std::string name = path.substr(4);  // after "gen:"
      if (!synthetic_keys(name, count, seed, &keys, &doubles)) {
        *error = path + ": unknown generator (gen:lognormal, gen:longlat)";
        return nullptr;
      }
      return dataset_from_keys(path, std::move(keys), seed);
    }
  }
  *error = path + ": unknown dataset format";
  return nullptr;
}

bool load_text_keys(const std::string& path, std::vector<std::string>* keys, std::string* error) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    *error = path + ": cannot open";
    return false;
  }
  // Read through a stringstream, not istreambuf_iterator: g++ 12 flags the iterator's inlined
  // streambuf accesses with -Wnull-dereference in release builds.
  std::ostringstream contents;
  contents << f.rdbuf();
  if (f.bad()) {
    *error = path + ": read failed";
    return false;
  }
  const std::string all = std::move(contents).str();
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

// Real and synthetic key sets for --dataset (docs/pmbench.md, "Datasets").
//
//   SOSD binary  little-endian uint64 count, then `count` 8-byte little-endian keys (the format
//                of the SOSD benchmark's files; e.g. books_200M_uint64). The 8 bytes are an
//                unsigned integer, or an IEEE double with --key_type double (bench/datasets.py
//                writes its double datasets, longitudes and longlat, this way).
//   text         one key per line, any bytes but '\n' (a trailing '\r' is kept as a byte).
//                Keys keep their lengths: the driver runs them as variable-length byte keys.
//                An empty line is skipped (not every index accepts the empty key).
//   gen:NAME     a synthetic key set made in memory (bench/synthetic.h): gen:lognormal
//                (uint64) and gen:longlat (doubles).
//
// Loading never trusts the file: the count must match the file size, and a truncated or
// oversized file is refused with a message naming it. Duplicates are removed (the generator
// needs distinct keys) and the distinct keys are shuffled with the run's seed, so key id i
// (0 <= i < size) is a uniform sample of the file whatever order it was sorted in.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace pmbench {

enum class DatasetFormat : std::uint8_t { sosd, text, generated };
// "auto" resolves by name: "gen:..." is generated, a name ending in ".txt" is text, anything
// else SOSD binary. Returns false for an unknown format word.
bool resolve_dataset_format(const std::string& format, const std::string& path,
                            DatasetFormat* out);

struct Dataset {
  std::string path;
  DatasetFormat format = DatasetFormat::sosd;
  std::uint64_t raw_count = 0;            // keys in the file (before removing duplicates)
  // 8-byte keys (SOSD, generated): distinct keys, shuffled: keys[id].
  std::vector<std::uint64_t> keys;
  // (key, id) sorted by key, to map a key back to its id (conformance checks).
  std::vector<std::pair<std::uint64_t, std::uint64_t>> by_key;
  // Text keys: distinct, shuffled, packed: key id i is bytes [offsets[i], offsets[i+1]).
  std::vector<char> text_bytes;
  std::vector<std::uint64_t> text_offsets;
  std::vector<std::uint64_t> text_sorted_ids;  // ids in key order (find_text_id)
  std::size_t max_length = 8;             // the longest key in bytes

  bool variable_length() const { return format == DatasetFormat::text; }
  std::uint64_t size() const {
    return variable_length() ? text_offsets.size() - 1 : keys.size();
  }
  std::string_view text(std::uint64_t id) const {
    return {text_bytes.data() + text_offsets[id], text_offsets[id + 1] - text_offsets[id]};
  }
  bool find_id(std::uint64_t key, std::uint64_t* id) const;
  bool find_text_id(std::string_view key, std::uint64_t* id) const;
};

// Reads a SOSD binary file. Returns null with `error` set on any problem.
std::shared_ptr<const Dataset> load_sosd(const std::string& path, std::uint64_t seed,
                                         std::string* error);
// Reads a text dataset (one key per line) for the driver.
std::shared_ptr<const Dataset> load_text(const std::string& path, std::uint64_t seed,
                                         std::string* error);
// 8-byte keys made elsewhere (generators): deduplicated and shuffled like a SOSD file.
std::shared_ptr<const Dataset> dataset_from_keys(std::string name, std::vector<std::uint64_t> raw,
                                                 std::uint64_t seed);
// Any of the above by format; `count` is the number of keys a generator makes.
std::shared_ptr<const Dataset> load_dataset(const std::string& path, DatasetFormat format,
                                            std::uint64_t count, std::uint64_t seed,
                                            std::string* error);
// Reads a text file of one key per line (empty lines are keys too, except a final newline).
bool load_text_keys(const std::string& path, std::vector<std::string>* keys, std::string* error);

}  // namespace pmbench

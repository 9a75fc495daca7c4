// Real key sets for --dataset.
//
//   SOSD binary  little-endian uint64 count, then `count` 8-byte little-endian keys (the format
//                of the SOSD benchmark's files; e.g. books_200M_uint64). The 8 bytes are an
//                unsigned integer, or an IEEE double with --key_type double.
//   text         one key per line, any bytes but '\n' (a trailing '\r' is kept as a byte).
//                Loaded and checked here; the driver does not run variable-length keys yet.
//
// Loading never trusts the file: the count must match the file size, and a truncated or
// oversized file is refused with a message naming it. Duplicates are removed (the generator
// needs distinct keys) and the distinct keys are shuffled with the run's seed, so key id i
// (0 <= i < size) is a uniform sample of the file whatever order it was sorted in.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace pmbench {

struct Dataset {
  std::string path;
  std::uint64_t raw_count = 0;            // keys in the file
  std::vector<std::uint64_t> keys;        // distinct keys, shuffled: keys[id]
  // (key, id) sorted by key, to map a key back to its id (conformance checks).
  std::vector<std::pair<std::uint64_t, std::uint64_t>> by_key;
  bool find_id(std::uint64_t key, std::uint64_t* id) const;
};

// Reads a SOSD binary file. Returns null with `error` set on any problem.
std::shared_ptr<const Dataset> load_sosd(const std::string& path, std::uint64_t seed,
                                         std::string* error);
// Reads a text file of one key per line (empty lines are keys too, except a final newline).
bool load_text_keys(const std::string& path, std::vector<std::string>* keys, std::string* error);

}  // namespace pmbench

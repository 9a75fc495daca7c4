// pool_exercise: the mutation campaign's probe (tools/mutation-campaign.py). It opens a pool as
// a user would and checks every answer against the records the pool was built with, so damage
// the library did not notice shows up as a wrong answer instead of going unseen.
//
//   pool_exercise --create N --kind K --seed S PATH   build a pristine pool of N records, close it
//     (--unclean: end without close(), as after a crash: no clean mark and no close counts, so
//     only what recovery checks after an unclean end can see damage in it)
//   pool_exercise --kind K --seed S --count N PATH    reopen and exercise it (or --keys FILE)
//
// Exercising: find every key and compare its value, scans from a few starting points checked for
// order and content, a few inserts/removes of new keys, then verify(). It prints one JSON line
// and exits with the outcome:
//   0  intact       every key found with its value, scans right, writes right, verify ok
//   3  clean error  open refused, or an operation/verify answered an error (corrupted, ...) and
//                   no wrong answer was returned
//   4  silent loss  a wrong answer was returned: a key missing, a wrong value, a scan that skips
//                   or invents records, a write that contradicts the records ("flagged" says
//                   whether an operation or verify() reported damage as well)
//   2  usage error
// A crash or hang is not an exit code here: the campaign sees the signal or the timeout.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "pmindex/index.h"

namespace {

using pmindex::Code;

constexpr int kIntact = 0;
constexpr int kUsage = 2;
constexpr int kCleanError = 3;
constexpr int kSilentLoss = 4;

std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The value stored under a key: a function of key and seed, so a value moved to another key
// (a swapped page, a stale record) reads as wrong.
std::string value_of(std::uint64_t key, std::uint64_t seed) {
  std::uint64_t s = key ^ (seed * 0x2545f4914f6cdd1dull);
  return pmindex::encode_u64(splitmix64(s));
}

// N distinct keys in [1, 2^62), sorted; the same for the same seed. The range keeps clear of 0
// and of the top values some indexes use as sentinels.
std::vector<std::uint64_t> make_keys(std::size_t n, std::uint64_t seed) {
  std::vector<std::uint64_t> keys;
  std::uint64_t state = seed;
  while (keys.size() < n) {
    while (keys.size() < n) keys.push_back((splitmix64(state) >> 2) | 1);
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  }
  return keys;
}

bool load_key_file(const std::string& file, std::vector<std::uint64_t>* keys) {
  std::ifstream in(file);
  if (!in) return false;
  std::uint64_t k = 0;
  while (in >> k) keys->push_back(k);
  std::sort(keys->begin(), keys->end());
  keys->erase(std::unique(keys->begin(), keys->end()), keys->end());
  return !keys->empty();
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

// What the exercise saw. Wrong answers (missing, wrong, scan_bad, write_bad) make silent loss;
// error answers (errors, a failed verify) alone make a clean error.
struct Tally {
  std::string stage = "open";
  std::string open_status = "ok";
  std::string verify_status = "not run";
  std::string first_error;
  std::uint64_t found = 0, missing = 0, wrong = 0, errors = 0;
  std::uint64_t scans = 0, scan_bad = 0, writes = 0, write_bad = 0;
  bool verify_ok = false;

  bool wrong_answers() const { return missing + wrong + scan_bad + write_bad > 0; }
  bool flagged() const { return errors > 0 || !verify_ok; }
  void error(Code c, const std::string& what) {
    ++errors;
    if (first_error.empty()) first_error = what + ": " + std::string(pmindex::to_string(c));
  }
};

int outcome_of(const Tally& t) {
  if (t.wrong_answers()) return kSilentLoss;
  if (t.flagged()) return kCleanError;
  return kIntact;
}

const char* outcome_name(int rc) {
  switch (rc) {
    case kIntact: return "intact";
    case kCleanError: return "clean_error";
    case kSilentLoss: return "silent_loss";
    default: return "usage";
  }
}

void report(const std::string& kind, std::size_t n, const Tally& t, int rc) {
  std::cout << "{\"outcome\":\"" << outcome_name(rc) << "\",\"kind\":\"" << json_escape(kind)
            << "\",\"keys\":" << n << ",\"stage\":\"" << t.stage << "\",\"open\":\""
            << json_escape(t.open_status) << "\",\"found\":" << t.found
            << ",\"missing\":" << t.missing << ",\"wrong\":" << t.wrong
            << ",\"errors\":" << t.errors << ",\"scans\":" << t.scans
            << ",\"scan_bad\":" << t.scan_bad << ",\"writes\":" << t.writes
            << ",\"write_bad\":" << t.write_bad << ",\"verify\":\""
            << json_escape(t.verify_status) << "\",\"first_error\":\""
            << json_escape(t.first_error) << "\",\"flagged\":" << (t.flagged() ? "true" : "false")
            << "}" << std::endl;
}

void find_all(const pmindex::Index& idx, const std::vector<std::uint64_t>& keys,
              std::uint64_t seed, Tally& t) {
  t.stage = "find";
  std::string v;
  for (const std::uint64_t k : keys) {
    const Code c = idx.find(pmindex::encode_u64(k), &v);
    if (c == Code::ok) {
      if (v == value_of(k, seed)) ++t.found; else ++t.wrong;
    } else if (c == Code::not_found) {
      ++t.missing;
    } else {
      t.error(c, "find");
    }
  }
}

// Scans of up to 64 records from 16 starting points spread over the key range (one before the
// first key): each must return exactly the next records of the sorted key set, in order.
void scan_some(const pmindex::Index& idx, const std::vector<std::uint64_t>& keys,
               std::uint64_t seed, Tally& t) {
  t.stage = "scan";
  constexpr std::size_t kMax = 64;
  pmindex::ScanBuffer out;
  for (std::size_t s = 0; s < 16; ++s) {
    const std::size_t at = keys.size() * s / 16;
    const std::uint64_t start = s == 0 ? 0 : keys[at];
    ++t.scans;
    const std::size_t got = idx.scan(pmindex::encode_u64(start), kMax, out);
    const std::size_t want = std::min(kMax, keys.size() - at);
    bool bad = got != want || out.size() != got;
    for (std::size_t i = 0; !bad && i < got; ++i) {
      bad = out.key(i).size() != 8 || pmindex::decode_u64(out.key(i)) != keys[at + i] ||
            out.value(i) != value_of(keys[at + i], seed);
    }
    if (bad) ++t.scan_bad;
  }
}

// Inserts 8 keys absent from the set, finds them, removes them and checks they are gone. A
// damaged index may refuse writes (an error); it may not contradict the records.
void write_some(pmindex::Index& idx, const std::vector<std::uint64_t>& keys, std::uint64_t seed,
                Tally& t) {
  t.stage = "write";
  std::vector<std::uint64_t> fresh;
  std::uint64_t state = seed ^ 0x5eedf00dull;
  while (fresh.size() < 8) {
    const std::uint64_t k = (splitmix64(state) >> 2) | 1;
    if (!std::binary_search(keys.begin(), keys.end(), k)) fresh.push_back(k);
  }
  std::string v;
  for (const std::uint64_t k : fresh) {
    const std::string key = pmindex::encode_u64(k);
    ++t.writes;
    Code c = idx.insert(key, value_of(k, seed));
    if (c == Code::already_present) { ++t.write_bad; continue; }
    if (c != Code::ok) { t.error(c, "insert"); continue; }
    c = idx.find(key, &v);
    if (c == Code::ok && v != value_of(k, seed)) ++t.write_bad;
    if (c == Code::not_found) ++t.write_bad;
    if (c != Code::ok && c != Code::not_found) t.error(c, "find after insert");
    c = idx.remove(key);
    if (c == Code::not_found) ++t.write_bad;
    if (c != Code::ok && c != Code::not_found) t.error(c, "remove");
    c = idx.find(key, &v);
    if (c == Code::ok) ++t.write_bad;
    if (c != Code::ok && c != Code::not_found) t.error(c, "find after remove");
  }
}

int create_pool(const std::string& kind, const std::string& path,
                const std::vector<std::uint64_t>& keys, std::uint64_t seed, bool unclean) {
  pmindex::Options o;
  o.kind = kind;
  o.path = path;
  o.open_mode = pmindex::OpenMode::create;
  o.overwrite = true;
  o.expected_records = keys.size() * 2;
  auto idx = pmindex::Index::open(o);
  if (!idx.ok()) {
    std::cerr << "pool_exercise: " << idx.status().to_string() << "\n";
    return 1;
  }
  for (const std::uint64_t k : keys) {
    if (const Code c = (*idx)->insert(pmindex::encode_u64(k), value_of(k, seed)); c != Code::ok) {
      std::cerr << "pool_exercise: insert " << k << ": " << pmindex::to_string(c) << "\n";
      return 1;
    }
  }
  if (auto s = (*idx)->verify(); !s.ok()) {
    std::cerr << "pool_exercise: verify after create: " << s.to_string() << "\n";
    return 1;
  }
  if (unclean) {
    (*idx).reset();  // the index is dropped without close(): every acknowledged write is durable
  } else if (auto s = (*idx)->close(); !s.ok()) {
    std::cerr << "pool_exercise: close: " << s.to_string() << "\n";
    return 1;
  }
  std::cout << "{\"created\":\"" << json_escape(path) << "\",\"kind\":\"" << kind
            << "\",\"keys\":" << keys.size() << ",\"clean\":" << (unclean ? "false" : "true")
            << "}" << std::endl;
  return 0;
}

int exercise(const std::string& kind, const std::string& path,
             const std::vector<std::uint64_t>& keys, std::uint64_t seed) {
  Tally t;
  pmindex::Options o;
  o.kind = kind;
  o.path = path;
  o.open_mode = pmindex::OpenMode::open;
  o.layout_from_pool = true;
  auto opened = pmindex::Index::open(o);
  if (!opened.ok()) {
    t.open_status = opened.status().to_string();
    report(kind, keys.size(), t, kCleanError);
    return kCleanError;
  }
  pmindex::Index& idx = **opened;
  auto scope = idx.attach_thread();
  find_all(idx, keys, seed, t);
  scan_some(idx, keys, seed, t);
  write_some(idx, keys, seed, t);
  t.stage = "verify";
  const pmindex::Status v = idx.verify();
  t.verify_ok = v.ok();
  t.verify_status = v.ok() ? "ok" : v.to_string();
  t.stage = "done";
  const int rc = outcome_of(t);
  report(kind, keys.size(), t, rc);
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pool_exercise: build a pristine pool, or exercise a (possibly damaged) one"};
  std::string path, kind = "reflist", key_file;
  std::uint64_t seed = 1;
  std::size_t count = 0, create = 0;
  app.add_option("PATH", path, "pool file")->required();
  app.add_option("--kind", kind, "index kind");
  app.add_option("--seed", seed, "seed the keys and values were generated from");
  app.add_option("--count", count, "number of keys the pool was built with");
  app.add_option("--keys", key_file, "file of u64 keys (decimal, whitespace separated)");
  app.add_option("--create", create, "build a pristine pool of this many keys and close it");
  bool unclean = false;
  app.add_flag("--unclean", unclean, "with --create: end without close(), as after a crash")
      ->needs(app.get_option("--create"));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kUsage;
  }
  std::vector<std::uint64_t> keys;
  if (!key_file.empty()) {
    if (!load_key_file(key_file, &keys)) {
      std::cerr << "pool_exercise: no keys in " << key_file << "\n";
      return kUsage;
    }
  } else {
    const std::size_t n = create > 0 ? create : count;
    if (n == 0) {
      std::cerr << "pool_exercise: give --create N, --count N or --keys FILE\n";
      return kUsage;
    }
    keys = make_keys(n, seed);
  }
  if (create > 0) return create_pool(kind, path, keys, seed, unclean);
  return exercise(kind, path, keys, seed);
}

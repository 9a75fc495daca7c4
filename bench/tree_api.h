// PiBench's index ABI, unchanged, so wrappers written for PiBench load into pmbench and the
// pmindex wrappers (libpmindex_<kind>_tree.so) load into PiBench.
//
// Semantics pmbench relies on (docs/pmbench.md, "tree_api"):
//   - keys compare by memcmp (shorter key first on a common prefix); with --key_order pibench
//     pmbench instead stores the 8-byte key word little-endian and expects integer order of
//     it, as PiBench's own wrappers keep;
//   - scan may, as in PiBench's own wrappers, leave values_out null or return 0; pmbench then
//     validates by lookups and reports what it could not check (docs/pmbench.md);
//   - find writes value_size bytes to value_out and returns true if the key is present;
//   - insert returns false if the key is present; update returns false if it is absent;
//     remove returns false if it is absent;
//   - scan sets values_out to wrapper-owned memory holding up to scan_sz <key><value> pairs
//     (key_size + value_size bytes each) with key >= the start key, in ascending key order,
//     and returns their count; the memory stays valid until the same thread's next scan;
//   - variable-length keys (a pmbench extension; PiBench's keys are all key_size bytes): when
//     the environment has PMINDEX_TREE_VARIABLE_KEYS=1 at create_tree, keys are 1..key_size
//     bytes (key_sz per call) and each scan record is <u32 key length, little-endian><key>
//     <value>. pmbench sets it when it drives a text dataset through a library; pmindex's
//     wrappers support it (a library that cannot should return nullptr from create_tree);
//   - create_tree opens the pool at pool_path if one of the matching layout exists
//     (recovering it), creates it otherwise, and refuses a pool of another layout
//     (returns nullptr).
// tree_api cannot express bulk load, key types or pool-full errors; pmbench reaches those
// through pmindex's native API for built-in indexes and loads external wrappers by insert.
#pragma once

#include <cstddef>
#include <string>

struct tree_options_t {
  size_t key_size = 8;
  size_t value_size = 8;
  std::string pool_path = "";
  size_t pool_size = 0;
  size_t num_threads = 1;
};

class tree_api {
 public:
  virtual ~tree_api() {}
  virtual bool find(const char* key, size_t sz, char* value_out) = 0;
  virtual bool insert(const char* key, size_t key_sz, const char* value, size_t value_sz) = 0;
  virtual bool update(const char* key, size_t key_sz, const char* value, size_t value_sz) = 0;
  virtual bool remove(const char* key, size_t key_sz) = 0;
  virtual int scan(const char* key, size_t key_sz, int scan_sz, char*& values_out) = 0;
};

extern "C" tree_api* create_tree(const tree_options_t& opt);

// Variable-length byte keys (any bytes, NUL included), compared by memcmp, with values of up
// to 64 bytes stored out of line.
//
//   variable_keys
#include <cstdio>
#include <string>
#include <vector>

#include "pmindex/index.h"

int main() {
  pmindex::Options o;
  o.kind = "lbtree";
  o.persistence = pmindex::pm::Mode::dram;  // anonymous pool; see choose_mode for files
  o.key_type = pmindex::KeyType::bytes;
  o.max_key_size = 256;
  o.max_value_size = 64;
  auto opened = pmindex::Index::open(o);
  if (!opened.ok()) {
    std::fprintf(stderr, "open: %s\n", opened.status().to_string().c_str());
    return 1;
  }
  pmindex::Index& idx = **opened;
  const std::vector<std::string> keys = {"usr/bin/pmpool", "usr/lib", std::string("a\0b", 3),
                                         "usr/lib/libpmindex.so", "etc"};
  for (const std::string& k : keys) {
    if (idx.insert(k, "value of " + k) != pmindex::Code::ok) {
      std::fprintf(stderr, "insert failed\n");
      return 1;
    }
  }
  // A key longer than max_key_size is refused with a clear code, and nothing changes.
  const pmindex::Code too_long = idx.insert(std::string(300, 'x'), "v");
  std::printf("300-byte key: %s\n", std::string(pmindex::to_string(too_long)).c_str());

  pmindex::ScanBuffer out;
  idx.scan("usr/", 10, out);  // everything from "usr/" on, in memcmp order
  for (std::size_t i = 0; i < out.size(); ++i) {
    std::printf("%.*s = %.*s\n", static_cast<int>(out.key(i).size()), out.key(i).data(),
                static_cast<int>(out.value(i).size()), out.value(i).data());
  }
  return out.size() == 3 && too_long == pmindex::Code::key_too_large ? 0 : 1;
}

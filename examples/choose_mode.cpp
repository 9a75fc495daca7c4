// The same code on real PM (a DAX file), on a tmpfs file or in DRAM: the persistence mode is
// a run-time option.
//   adr   clwb + sfence after every persistent write (PM whose caches are not persistent)
//   eadr  fences only (PM whose caches are in the persistence domain)
//   dram  no persistence work; with an empty path, no file either
//
//   choose_mode adr|eadr|dram [POOL_PATH]    (empty or missing path: anonymous DRAM pool)
#include <cstdio>
#include <filesystem>
#include <string>

#include "pmindex/index.h"

int main(int argc, char** argv) {
  pmindex::Options o;
  o.kind = "apex";
  if (argc < 2 || !pmindex::pm::parse_mode(argv[1], &o.persistence)) {
    std::fprintf(stderr, "usage: choose_mode adr|eadr|dram [POOL_PATH]\n");
    return 2;
  }
  o.path = argc > 2 ? argv[2] : "";
  if (!o.path.empty()) {
    std::filesystem::create_directories(std::filesystem::path(o.path).parent_path());
    o.open_mode = pmindex::OpenMode::create;
    o.overwrite = true;  // an example: start afresh each run
  }
  o.expected_records = 100'000;
  auto opened = pmindex::Index::open(o);
  if (!opened.ok()) {
    std::fprintf(stderr, "open: %s\n", opened.status().to_string().c_str());
    return 1;
  }
  pmindex::Index& idx = **opened;
  pmindex::Index::ThreadScope scope = idx.attach_thread();
  for (std::uint64_t k = 1; k <= 100'000; ++k) {
    if (idx.insert(pmindex::encode_u64(k), pmindex::encode_u64(k)) != pmindex::Code::ok) return 1;
  }
  const pmindex::pm::Counters& c = pmindex::pm::Runtime::counters();
  std::printf("mode %s: 100000 inserts, %llu cache-line write-backs, %llu fences\n", argv[1],
              static_cast<unsigned long long>(c.flushes), static_cast<unsigned long long>(c.fences));
  return idx.close().ok() ? 0 : 1;
}

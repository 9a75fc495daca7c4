// An index defined outside the library (pair_log.h), registered at run time and then used
// exactly like a built-in kind: opened by name, written, closed, reopened and recovered.
// The same index is crash-tested by the library's crash driver in pmindex's own tests
// (tests/index/common/test_external_index.cpp) and run by pmbench through pair_log_plugin.cpp.
//
//   external_index [POOL_PATH]      default /dev/shm/pmindex-examples/external_index.pool
#include <cstdio>
#include <filesystem>
#include <string>

#include "pair_log.h"
#include "pmindex/index.h"

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "/dev/shm/pmindex-examples/external_index.pool";
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  if (pmindex::Status s = pmindex::IndexRegistry::add(pair_log::PairLog<>::entry("pair_log"));
      !s.ok()) {
    std::fprintf(stderr, "register: %s\n", s.to_string().c_str());
    return 1;
  }

  pmindex::Options o;
  o.kind = "pair_log";  // a registered kind is opened by name like a built-in one
  o.path = path;
  o.open_mode = pmindex::OpenMode::create;
  o.overwrite = true;
  o.expected_records = 1'000;
  {
    auto idx = pmindex::Index::open(o);
    if (!idx.ok()) {
      std::fprintf(stderr, "create: %s\n", idx.status().to_string().c_str());
      return 1;
    }
    for (std::uint64_t k = 1; k <= 100; ++k)
      if ((*idx)->insert(pmindex::encode_u64(k), pmindex::encode_u64(k * k)) != pmindex::Code::ok)
        return 1;
    if ((*idx)->remove(pmindex::encode_u64(50)) != pmindex::Code::ok) return 1;
    // No close(): the index goes as a crash would leave it, and the next open recovers.
  }
  o.open_mode = pmindex::OpenMode::open;
  auto idx = pmindex::Index::open(o);
  if (!idx.ok()) {
    std::fprintf(stderr, "reopen: %s\n", idx.status().to_string().c_str());
    return 1;
  }
  const pmindex::RecoveryStats rs = (*idx)->recovery_stats();
  pmindex::ScanBuffer out;
  (*idx)->scan(pmindex::encode_u64(48), 4, out);
  std::printf("recovered %llu records (%s); from key 48:", static_cast<unsigned long long>(rs.records),
              rs.clean_shutdown ? "clean shutdown" : "after a crash");
  for (std::size_t i = 0; i < out.size(); ++i)
    std::printf(" %llu", static_cast<unsigned long long>(pmindex::decode_u64(out.key(i))));
  std::printf("\n");
  const pmindex::Status v = (*idx)->verify();
  if (!v.ok() || rs.records != 99 || out.size() != 4 || pmindex::decode_u64(out.key(2)) != 51) {
    std::fprintf(stderr, "unexpected state: %s\n", v.to_string().c_str());
    return 1;
  }
  return (*idx)->close().ok() ? 0 : 1;
}

// Open a pool (creating it the first time), see what recovery found, add a record, close.
// Run it twice: the second run recovers the first run's records.
//
//   open_and_recover [POOL_PATH]      default /dev/shm/pmindex-examples/open_and_recover.pool
#include <cstdio>
#include <filesystem>
#include <string>

#include "pmindex/index.h"

int main(int argc, char** argv) {
  const std::string path =
      argc > 1 ? argv[1] : "/dev/shm/pmindex-examples/open_and_recover.pool";
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());

  pmindex::Options o;
  o.kind = "lbtree";
  o.path = path;
  o.expected_records = 10'000;
  auto idx = pmindex::Index::open(o);  // recovers the pool if it exists, creates it otherwise
  if (!idx.ok()) {
    std::fprintf(stderr, "open: %s\n", idx.status().to_string().c_str());
    return 1;
  }
  const pmindex::RecoveryStats rs = (*idx)->recovery_stats();
  if (rs.created) {
    std::printf("created pool %s\n", path.c_str());
  } else {
    std::printf("recovered pool %s: %s, %llu records, %.3f ms\n", path.c_str(),
                rs.clean_shutdown ? "clean shutdown" : "not shut down cleanly",
                static_cast<unsigned long long>(rs.records), rs.seconds * 1e3);
  }

  const auto key = pmindex::encode_u64(rs.records + 1);  // one more record per run
  const pmindex::Code c = (*idx)->insert(key, pmindex::encode_u64(42));
  if (c != pmindex::Code::ok) {
    std::fprintf(stderr, "insert: %s\n", std::string(pmindex::to_string(c)).c_str());
    return 1;
  }
  const pmindex::Status closed = (*idx)->close();  // marks a clean shutdown
  if (!closed.ok()) {
    std::fprintf(stderr, "close: %s\n", closed.to_string().c_str());
    return 1;
  }
  std::printf("inserted key %llu; closed cleanly\n", static_cast<unsigned long long>(rs.records + 1));
  return 0;
}

// Insert integer keys, look one up, scan a range in key order.
//
//   insert_and_scan [KIND]            any built-in kind (default fptree); the pool lives in DRAM
#include <cstdio>
#include <string>

#include "pmindex/index.h"

int main(int argc, char** argv) {
  pmindex::Options o;
  o.kind = argc > 1 ? argv[1] : "fptree";
  o.path = "";  // no file: an anonymous DRAM pool, gone with the process
  o.persistence = pmindex::pm::Mode::dram;
  o.expected_records = 10'000;
  auto opened = pmindex::Index::open(o);
  if (!opened.ok()) {
    std::fprintf(stderr, "open: %s\n", opened.status().to_string().c_str());
    return 1;
  }
  pmindex::Index& idx = **opened;
  pmindex::Index::ThreadScope scope = idx.attach_thread();  // once per thread using the index

  for (std::uint64_t k = 0; k < 1000; ++k) {
    if (idx.insert(pmindex::encode_u64(k * 10), pmindex::encode_u64(k)) != pmindex::Code::ok) {
      std::fprintf(stderr, "insert %llu failed\n", static_cast<unsigned long long>(k * 10));
      return 1;
    }
  }
  std::string value;
  if (idx.find(pmindex::encode_u64(420), &value) != pmindex::Code::ok ||
      pmindex::decode_u64(value) != 42) {
    std::fprintf(stderr, "find 420: wrong answer\n");
    return 1;
  }
  // Five records with key >= 995: 1000, 1010, 1020, 1030, 1040.
  pmindex::ScanBuffer out;
  const std::size_t n = idx.scan(pmindex::encode_u64(995), 5, out);
  for (std::size_t i = 0; i < n; ++i) {
    std::printf("%llu -> %llu\n", static_cast<unsigned long long>(pmindex::decode_u64(out.key(i))),
                static_cast<unsigned long long>(pmindex::decode_u64(out.value(i))));
  }
  if (n != 5 || pmindex::decode_u64(out.key(0)) != 1000) {
    std::fprintf(stderr, "scan: wrong answer\n");
    return 1;
  }
  const pmindex::Status v = idx.verify();
  std::printf("%s: 1000 records, verify: %s\n", o.kind.c_str(), v.ok() ? "ok" : v.to_string().c_str());
  return v.ok() ? 0 : 1;
}

// Upgrading a version-1 pool file to format version 2 (pmpool upgrade). Crash-safe: the
// upgraded pool is written whole to a hidden file beside the old one, synced, and renamed over
// it, so a crash at any point leaves either the untouched version-1 pool or the version-2 one.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <vector>

#include "pmindex/pm/pool.h"

namespace pmindex::pm {
namespace {

// Version 1's mutable words: four failure-atomic words at [128,160), unprotected.
struct V1Words {
  std::uint64_t root, clean_shutdown, heap_high_water, generation;
};
static_assert(kV1RootOffset == offsetof(PoolHeader, state));

Status fail(const std::string& path, Code code, const std::string& what) {
  return Status(code, path + ": " + what);
}

// The version-2 header for a version-1 one (already checked), in place.
void convert_header(PoolHeader* h) {
  V1Words v1;
  std::memcpy(&v1, reinterpret_cast<const char*>(h) + kV1RootOffset, sizeof v1);
  std::memset(h->state, 0, sizeof h->state);
  h->format_version = kFormatVersion;
  h->checksum = header_checksum(*h);
  HeaderState st{};
  st.sequence = 1;
  st.root = v1.root;
  st.clean_shutdown = v1.clean_shutdown;
  st.heap_high_water = v1.heap_high_water;
  st.generation = v1.generation;
  st.last_mode = 0;  // unknown: version 1 did not record it
  st.records_at_close = kNoCount;
  st.nodes_at_close = kNoCount;
  // Version 1 allowed root 0 over a used heap (a crash before the first set_root); keep its
  // meaning, "creation unfinished", rather than turning it into corruption.
  st.flags = kStateUnstamped;  // its index roots predate the layout stamp
  if (v1.root == 0) st.flags |= kStateBuilding;
  h->state[0] = h->state[1] = sealed_state(*h, st);
}

// Copies `size` bytes of `in` to `out` with `header` first, leaving zero runs as holes.
Status copy_body(int in, int out, const PoolHeader& header, std::uint64_t size,
                 const std::string& path) {
  if (ftruncate(out, static_cast<off_t>(size)) != 0 ||
      pwrite(out, &header, sizeof header, 0) != static_cast<ssize_t>(sizeof header))
    return fail(path, Code::io_error, std::string("cannot write the copy: ") + strerror(errno));
  std::vector<char> buf(std::size_t{1} << 20);
  for (std::uint64_t off = kHeaderSize; off < size;) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), size - off));
    if (pread(in, buf.data(), n, static_cast<off_t>(off)) != static_cast<ssize_t>(n))
      return fail(path, Code::io_error, "cannot read the pool");
    const bool zero = buf[0] == 0 && std::memcmp(buf.data(), buf.data() + 1, n - 1) == 0;
    if (!zero && pwrite(out, buf.data(), n, static_cast<off_t>(off)) != static_cast<ssize_t>(n))
      return fail(path, Code::io_error, std::string("cannot write the copy: ") + strerror(errno));
    off += n;
  }
  if (fsync(out) != 0)
    return fail(path, Code::io_error, std::string("cannot sync the copy: ") + strerror(errno));
  return Status::Ok();
}

// Checks the version-1 header as version 1 did (the fields both versions share).
Status check_v1(const PoolHeader& h, std::uint64_t size, const std::string& path) {
  if (std::memcmp(h.magic, kPoolMagic.data(), kPoolMagic.size()) != 0)
    return fail(path, Code::corrupted, "not a pmindex pool (wrong magic)");
  if (h.format_version == kFormatVersion)
    return fail(path, Code::invalid_argument, "already format version 2; nothing to upgrade");
  if (h.format_version != 1)
    return fail(path, Code::unsupported,
                "format version " + std::to_string(h.format_version) + " cannot be upgraded");
  if (h.endian_tag != kEndianTag || header_checksum(h) != h.checksum || h.pool_size != size)
    return fail(path, Code::corrupted, "version-1 header fails its checks; not upgraded");
  return Status::Ok();
}

}  // namespace

Status upgrade_pool_file(const std::string& path) {
  const int in = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) return fail(path, Code::io_error, std::string("cannot open: ") + strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } in_closer{in};
  if (flock(in, LOCK_EX | LOCK_NB) != 0) return fail(path, Code::busy, "pool is open");
  struct stat st{};
  PoolHeader h{};
  if (fstat(in, &st) != 0 || static_cast<std::uint64_t>(st.st_size) < kHeaderSize ||
      pread(in, &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h))
    return fail(path, Code::corrupted, "cannot read a pool header");
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (Status s = check_v1(h, size, path); !s.ok()) return s;
  convert_header(&h);
  const std::string temp = path + ".upgrading-" + std::to_string(getpid()) + "-" +
                           std::to_string(std::random_device{}());
  const int out = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, st.st_mode & 0777);
  if (out < 0) return fail(path, Code::io_error, std::string("cannot create the copy: ") + strerror(errno));
  Status s = copy_body(in, out, h, size, path);
  ::close(out);
  if (s.ok() && ::rename(temp.c_str(), path.c_str()) != 0)
    s = fail(path, Code::io_error, std::string("cannot rename the copy: ") + strerror(errno));
  if (!s.ok()) ::unlink(temp.c_str());
  return s;
}

}  // namespace pmindex::pm

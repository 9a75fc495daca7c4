#include "pmindex/pm/pool.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "pm/aligned_mapping.h"

namespace pmindex::pm {

#ifndef MAP_SHARED_VALIDATE
#define MAP_SHARED_VALIDATE 0x03
#endif
#ifndef MAP_SYNC
#define MAP_SYNC 0x80000
#endif

std::string_view to_string(Backing backing) {
  switch (backing) {
    case Backing::dax: return "dax";
    case Backing::tmpfs: return "tmpfs";
    case Backing::tmpfs_huge: return "tmpfs-huge";
    case Backing::file: return "file";
    case Backing::anonymous: return "anonymous";
    case Backing::image: return "image";
  }
  return "?";
}

std::string_view durability_note(Backing backing) {
  switch (backing) {
    case Backing::dax:
      return "DAX mapping (MAP_SYNC): stores flushed with clwb+sfence survive power failure";
    case Backing::tmpfs:
      return "tmpfs file (4 KiB pages): survives process crashes (kill -9), not power failure; "
             "PM is emulated";
    case Backing::tmpfs_huge:
      return "tmpfs file (huge=always, 2 MiB pages): survives process crashes, not power "
             "failure; PM is emulated";
    case Backing::file:
      return "regular file through the page cache: durable only after msync; not a PM stand-in";
    case Backing::anonymous:
      return "anonymous DRAM (MADV_HUGEPAGE): gone when the process exits";
    case Backing::image:
      return "in-memory image (crash simulator / fuzzing): nothing is durable";
  }
  return "";
}

namespace {

std::string errno_text(int err) { return std::strerror(err); }

std::size_t round_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }
std::size_t round_to_page(std::size_t v) {
  return round_up(v, static_cast<std::size_t>(sysconf(_SC_PAGESIZE)));
}

// Growth chunks: double the extent, at most 1 GiB at a time, in 2 MiB units (whole huge pages
// on DAX / huge-page tmpfs). From the 64 MiB default start that is 64 MiB, 128 MiB, ...
constexpr std::size_t kGrowMin = std::size_t{2} << 20;
constexpr std::size_t kGrowMax = std::size_t{1} << 30;
constexpr std::size_t kGrowAlign = std::size_t{2} << 20;

Status make_error(const std::string& name, Code code, std::string_view what) {
  return Status(code, (name.empty() ? std::string("<anonymous pool>") : name) + ": " +
                          std::string(what));
}

std::string uuid_text(const std::uint8_t* u) {
  char buf[37];
  std::snprintf(buf, sizeof buf,
                "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
                u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
                u[14], u[15]);
  return buf;
}

std::string kind_text(const char (&kind)[16]) {
  return std::string(kind, strnlen(kind, sizeof kind));
}

HeaderInfo decode(const PoolHeader& h, const HeaderState& st) {
  HeaderInfo info;
  info.format_version = h.format_version;
  info.pool_size = h.pool_size;
  info.uuid = uuid_text(h.uuid);
  info.creation_time = h.creation_time;
  info.layout.kind = kind_text(h.kind);
  info.layout.node_size = h.node_size;
  info.layout.key_mode = static_cast<KeyMode>(h.key_mode);
  info.layout.variant = h.variant;
  info.heap_offset = h.heap_offset;
  info.root = st.root;
  info.clean_shutdown = st.clean_shutdown == kCleanMark;
  info.heap_high_water = st.heap_high_water;
  info.generation = st.generation;
  info.state_sequence = st.sequence;
  info.last_mode = st.last_mode;
  info.state_flags = st.flags;
  info.records_at_close = st.records_at_close;
  info.nodes_at_close = st.nodes_at_close;
  return info;
}

// Version 1 kept the mutable words unprotected; its pools are refused with the way out.
Status refuse_version(const PoolHeader& h, const std::string& name) {
  if (h.format_version == 1) {
    return make_error(name, Code::unsupported,
                      "pool format version 1 is no longer read (this build reads version 2, "
                      "whose header state is checksummed); upgrade it in place with "
                      "`pmpool upgrade " + name + "` (crash-safe: it writes a copy and renames "
                      "it over the file)");
  }
  return make_error(name, Code::unsupported,
                    "unknown pool format version " + std::to_string(h.format_version) +
                        " (this build reads version " + std::to_string(kFormatVersion) + ")");
}

// The state's words against the pool's bounds. `st` is the copy read_state chose.
Status validate_state(const PoolHeader& h, const HeaderState& st, const std::string& name) {
  // The allocator only ever writes 256 B-aligned marks (found by the fuzzer: an unaligned mark
  // made recovery carve misaligned blocks).
  if (st.heap_high_water < h.heap_offset || st.heap_high_water > h.pool_size ||
      st.heap_high_water % kXPLine != 0)
    return make_error(name, Code::corrupted, "heap high-water mark out of bounds or misaligned");
  if (st.root != 0 &&
      (st.root < h.heap_offset || st.root >= st.heap_high_water || st.root % 64 != 0))
    return make_error(name, Code::corrupted, "root offset out of bounds");
  if ((st.flags & ~(kStateBuilding | kStateUnstamped)) != 0 || st.last_mode > 3 ||
      (st.clean_shutdown != 0 && st.clean_shutdown != kCleanMark))
    return make_error(name, Code::corrupted, "unknown value in the header state");
  if (st.clean_shutdown != kCleanMark &&
      (st.records_at_close != kNoCount || st.nodes_at_close != kNoCount))
    return make_error(name, Code::corrupted, "header state holds close counts without a clean close");
  // Creation publishes the root before the pool is finished (kStateBuilding cleared in the
  // same state change), so a finished pool whose heap was used must have a root.
  if (st.root == 0 && (st.flags & kStateBuilding) == 0 && st.heap_high_water > h.heap_offset)
    return make_error(name, Code::corrupted,
                      "root offset 0 in a used heap (the root word was lost; opening would "
                      "build an empty index over the old data)");
  return Status::Ok();
}

// Every check a header must pass, in the order a reader would want the first failure named.
// `want` may be null (inspect: no expectation about the layout). On success *state is the
// header's current state and *note says whether one copy was torn or damaged.
Status validate(const PoolHeader& h, std::uint64_t actual_size, const Layout* want,
                const std::string& name, HeaderState* state, std::string* note) {
  if (std::memcmp(h.magic, kPoolMagic.data(), kPoolMagic.size()) != 0)
    return make_error(name, Code::corrupted, "not a pmindex pool (wrong magic)");
  if (h.endian_tag != kEndianTag)
    return make_error(name, Code::unsupported, "pool was written on a machine of other endianness");
  if (h.format_version != kFormatVersion) return refuse_version(h, name);
  if (header_checksum(h) != h.checksum)
    return make_error(name, Code::corrupted, "header checksum mismatch (header corrupted)");
  if (h.header_size != kHeaderSize || h.heap_offset != kHeaderSize)
    return make_error(name, Code::corrupted, "header size or heap offset is not 4096");
  if (h.arch != kArchX86_64)
    return make_error(name, Code::unsupported, "pool was written on another architecture");
  if (h.cache_line != kCacheLine)
    return make_error(name, Code::unsupported, "pool was written for another cache-line size");
  // pool_size is the maximum the file may grow to; the file's own size is the current extent.
  if (actual_size > h.pool_size) {
    return make_error(name, Code::corrupted,
                      "extended past its maximum: header says at most " +
                          std::to_string(h.pool_size) + " bytes, file has " +
                          std::to_string(actual_size));
  }
  if (h.pool_size < kMinPoolSize)
    return make_error(name, Code::corrupted, "pool size below the minimum");
  if (!read_state(h, state, note)) return make_error(name, Code::corrupted, *note);
  if (Status s = validate_state(h, *state, name); !s.ok()) return s;
  // Growth extends the file before the mark rises past its old end, so a file shorter than the
  // mark lost bytes that may hold blocks. (A crash mid-extension leaves it longer: fine.)
  if (state->heap_high_water > actual_size) {
    return make_error(name, Code::corrupted,
                      "truncated: the heap reaches " + std::to_string(state->heap_high_water) +
                          " bytes (high-water mark), file has " + std::to_string(actual_size));
  }
  const KeyMode km = static_cast<KeyMode>(h.key_mode);
  if (km != KeyMode::u64 && km != KeyMode::f64 && km != KeyMode::bytes)
    return make_error(name, Code::corrupted, "unknown key mode in the layout id");
  if (want != nullptr) {
    Layout have{kind_text(h.kind), h.node_size, km, h.variant};
    if (!(have == *want)) {
      return make_error(name, Code::wrong_layout,
                        "pool holds " + have.describe() + " but " + want->describe() +
                            " was requested");
    }
  }
  return Status::Ok();
}

Backing detect_backing(const std::string& path, int fd) {
  struct statfs fs{};
  if (fstatfs(fd, &fs) != 0 || fs.f_type != TMPFS_MAGIC) return Backing::file;
  // Find the tmpfs mount holding the file and read its huge= option.
  // A pool being created has no name yet (Pool::create): resolve its directory instead.
  char real[PATH_MAX];
  const std::size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  if (realpath(path.c_str(), real) == nullptr && realpath(dir.c_str(), real) == nullptr)
    return Backing::tmpfs;
  std::ifstream mounts("/proc/mounts");
  std::string dev, mnt, type, opts, rest;
  std::size_t best = 0;
  bool huge = false;
  while (mounts >> dev >> mnt >> type >> opts && std::getline(mounts, rest)) {
    if (type != "tmpfs") continue;
    const std::string_view r(real);
    if (r.substr(0, mnt.size()) != mnt || (r.size() > mnt.size() && mnt != "/" && r[mnt.size()] != '/'))
      continue;
    if (mnt.size() >= best) {
      best = mnt.size();
      huge = opts.find("huge=always") != std::string::npos ||
             opts.find("huge=within_size") != std::string::npos;
    }
  }
  return huge ? Backing::tmpfs_huge : Backing::tmpfs;
}

// Reserves `reserve` bytes of address space at a 2 MiB-aligned address and maps the first
// `length` bytes of `fd` over it. A DAX file (fsdax with aligned extents, devdax) or a huge-page
// tmpfs can then be mapped with 2 MiB pages, one TLB entry where 4 KiB pages need 512;
// MADV_HUGEPAGE asks for them where the policy is "advise". On a 4 KiB-page tmpfs (this VM's
// /dev/shm) neither changes anything. The rest of the PROT_NONE reservation is where the pool
// grows (Pool::grow maps the extended file there), so the base never moves.
void* map_aligned(std::size_t reserve, std::size_t length, int flags, int fd) {
  constexpr std::size_t kHuge = std::size_t{2} << 20;
  const std::size_t reserved = round_to_page(reserve);
  void* r = detail::map_aligned_anonymous(reserved, kHuge, PROT_NONE, MAP_NORESERVE);
  if (r == MAP_FAILED) return MAP_FAILED;
  void* p = mmap(r, round_to_page(length), PROT_READ | PROT_WRITE, flags | MAP_FIXED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    munmap(r, reserved);
    errno = err;
    return MAP_FAILED;
  }
  madvise(p, length, MADV_HUGEPAGE);  // advisory: refusals (e.g. DAX) change nothing
  return p;
}

// A pool file's mapping: MAP_SYNC first (DAX: stores are durable once flushed, no msync),
// else a shared mapping whose backing (tmpfs, huge-page tmpfs, file) is detected. *flags gets
// the flags that worked, for the extensions.
void* map_pool_file(const std::string& path, int fd, std::size_t reserve, std::size_t length,
                    Backing* backing, int* flags) {
  *flags = MAP_SHARED_VALIDATE | MAP_SYNC;
  void* p = map_aligned(reserve, length, *flags, fd);
  if (p != MAP_FAILED) {
    *backing = Backing::dax;
    return p;
  }
  *flags = MAP_SHARED;
  p = map_aligned(reserve, length, *flags, fd);
  if (p != MAP_FAILED) *backing = detect_backing(path, fd);
  return p;
}

void random_uuid(std::uint8_t* out) {
  std::random_device rd;
  for (int i = 0; i < 16; i += 4) {
    const std::uint32_t v = rd();
    std::memcpy(out + i, &v, 4);
  }
  out[6] = static_cast<std::uint8_t>((out[6] & 0x0f) | 0x40);  // version 4
  out[8] = static_cast<std::uint8_t>((out[8] & 0x3f) | 0x80);  // RFC 4122 variant
}

bool valid_kind(const std::string& kind) { return !kind.empty() && kind.size() < 16; }

// Who holds the flock on fd's file, from /proc/locks ("1: FLOCK ADVISORY WRITE <pid>
// <major>:<minor>:<inode> 0 EOF"; the pid is the process that took the lock). A second open in
// the same process conflicts too (flock is per open file description), and "another process"
// then sent users looking for a process that does not exist.
std::string busy_text(int fd) {
  struct stat st{};
  std::ifstream locks("/proc/locks");
  std::string line;
  while (fstat(fd, &st) == 0 && std::getline(locks, line)) {
    char kind[16] = {};
    int pid = 0;
    unsigned maj = 0, min = 0;
    unsigned long ino = 0;
    if (std::sscanf(line.c_str(), "%*d: %15s %*s %*s %d %x:%x:%lu", kind, &pid, &maj, &min,
                    &ino) != 5 ||
        std::strcmp(kind, "FLOCK") != 0 || ino != st.st_ino || maj != major(st.st_dev) ||
        min != minor(st.st_dev))
      continue;
    if (pid == getpid()) return "pool is already open in this process";
    return "pool is open in another process (pid " + std::to_string(pid) + ")";
  }
  return "pool is open in another process";
}

}  // namespace

// A pool file under construction: an unnamed file (O_TMPFILE), or where the file system lacks
// those a hidden name in the same directory, so nothing appears at the pool's path until the
// header is whole. `temp` is that hidden name (empty for an unnamed file); the destructor
// removes it if the file was never published. `displaced` holds the locked file an overwrite
// replaces, so no other process opens it in between.
struct UnpublishedFile {
  int fd = -1;
  std::string temp;
  int displaced = -1;
  UnpublishedFile() = default;
  UnpublishedFile(const UnpublishedFile&) = delete;
  UnpublishedFile& operator=(const UnpublishedFile&) = delete;
  ~UnpublishedFile() {
    if (!temp.empty()) ::unlink(temp.c_str());
    if (displaced >= 0) ::close(displaced);
  }
};

namespace {

std::string directory_of(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

// A fresh hidden name beside `path`, for an unnamed file that must get a name before a rename.
std::string sibling_temp_name(const std::string& path) {
  std::random_device rd;
  const std::size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  return dir + "." + base + ".creating-" + std::to_string(getpid()) + "-" + std::to_string(rd());
}

// The file exists: open it (open_existing) or refuse.
Result<std::unique_ptr<Pool>> file_exists(const PoolOptions& o) {
  if (o.open_existing) return Pool::open(o);
  return make_error(o.path, Code::invalid_argument,
                    "file exists; refusing to overwrite it (pass overwrite to replace it)");
}

// Creates, locks and sizes the unpublished file. With overwrite, first locks the file it will
// replace: a pool open elsewhere is refused (busy) before anything is written.
Status make_unpublished_file(const PoolOptions& o, std::size_t size, UnpublishedFile* f) {
  const std::string& name = o.path;
  // The default directory is ours to make; any other directory must exist.
  if (o.path.rfind(std::string(kDefaultPoolDir) + "/", 0) == 0)
    mkdir(std::string(kDefaultPoolDir).c_str(), 0775);
  if (o.overwrite) {
    f->displaced = ::open(o.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (f->displaced >= 0 && o.lock && flock(f->displaced, LOCK_EX | LOCK_NB) != 0)
      return make_error(name, Code::busy, busy_text(f->displaced));
  }
  f->fd = ::open(directory_of(o.path).c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0664);
  if (f->fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
    std::string templ = sibling_temp_name(o.path) + "XXXXXX";
    f->fd = mkostemp(templ.data(), O_CLOEXEC);
    if (f->fd >= 0) {
      f->temp = templ;
      fchmod(f->fd, 0664);
    }
  }
  if (f->fd < 0) return make_error(name, Code::io_error, "cannot create: " + errno_text(errno));
  if (o.lock && flock(f->fd, LOCK_EX | LOCK_NB) != 0)
    return make_error(name, Code::busy, "cannot lock the new pool file: " + errno_text(errno));
  if (int err = posix_fallocate(f->fd, 0, static_cast<off_t>(size)); err != 0) {
    return make_error(name, Code::io_error,
                      "cannot reserve " + std::to_string(size) + " bytes: " + errno_text(err));
  }
  return Status::Ok();
}

// Gives the finished file its name: link() where no file may be replaced (atomic: EEXIST if
// another creator won, answered as already_present), rename() over the old pool with
// overwrite. An unnamed file is linked through /proc/self/fd.
Status publish_file(const PoolOptions& o, UnpublishedFile* f) {
  const std::string proc = "/proc/self/fd/" + std::to_string(f->fd);
  int rc = 0;
  if (f->temp.empty() && !o.overwrite) {
    rc = linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, o.path.c_str(), AT_SYMLINK_FOLLOW);
  } else {
    if (f->temp.empty()) {
      f->temp = sibling_temp_name(o.path);
      if (linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, f->temp.c_str(), AT_SYMLINK_FOLLOW) != 0) {
        f->temp.clear();
        return make_error(o.path, Code::io_error, "cannot name the new pool: " + errno_text(errno));
      }
    }
    rc = o.overwrite ? ::rename(f->temp.c_str(), o.path.c_str())
                     : ::link(f->temp.c_str(), o.path.c_str());
    if (rc == 0 && o.overwrite) f->temp.clear();  // renamed: nothing left to remove
  }
  if (rc != 0 && errno == EEXIST) return Status(Code::already_present, "file exists");
  if (rc != 0) return make_error(o.path, Code::io_error, "cannot create: " + errno_text(errno));
  return Status::Ok();
}

// A weaker mode than adr does not flush (dram) or relies on caches being persistent (eadr):
// after an unclean end of such a session on an adr machine, recent stores may never have
// reached the media, so the user is told.
std::string open_warning_text(const HeaderState& st, Mode now, const std::string& note) {
  std::string out = note;
  const bool weak = st.last_mode == static_cast<std::uint32_t>(Mode::eadr) + 1 ||
                    st.last_mode == static_cast<std::uint32_t>(Mode::dram) + 1;
  if (now == Mode::adr && weak && st.clean_shutdown != kCleanMark) {
    const Mode last = static_cast<Mode>(st.last_mode - 1);
    if (!out.empty()) out += "; ";
    out += "pool was last written in " + std::string(to_string(last)) +
           " mode and not shut down cleanly: stores of that session may not have reached "
           "persistent memory (run pmpool check)";
  }
  return out;
}

}  // namespace

Status Pool::error(Code code, std::string_view what) const { return make_error(path_, code, what); }

Pool::Pool() = default;

Pool::~Pool() {
  allocator_.reset();
  if (owns_mapping_ && base_ != nullptr) munmap(base_, reserved_);
  unpublished_.reset();  // an unpublished pool's hidden name goes with it
  if (fd_ >= 0) close(fd_);  // releases the flock
  if (mode_acquired_) Runtime::release_mode();
}

bool Pool::in_heap(std::uint64_t offset, std::size_t bytes) const {
  const std::uint64_t begin = kHeaderSize;
  const std::uint64_t end = extent();  // beyond it the reservation is PROT_NONE
  return offset >= begin && offset <= end && bytes <= end - offset;
}

std::uint64_t Pool::heap_begin() const { return kHeaderSize; }

// Copy 0 whole and persisted before copy 1 is touched: at any crash at most one copy is torn
// and the other holds this state or the one before (read_state's argument).
void Pool::write_state(HeaderState next) {
  auto* h = at<PoolHeader>(0);
  // Copy 1 must hold a whole state before copy 0 is overwritten. After an open that found copy
  // 1 torn (a crash while it was written) or damaged, copy 0 is the only valid one, and a crash
  // tearing it now would leave none (found by the crash simulator: a crash during the recovery
  // of such an image). So a copy 1 that differs from the current state is rewritten first.
  if (std::memcmp(&h->state[1], &state_, sizeof state_) != 0) {
    copy(&h->state[1], &state_, sizeof state_);
    persist(&h->state[1], sizeof state_);
  }
  next.sequence = state_.sequence + 1;
  next = sealed_state(*h, next);
  for (HeaderState& slot : h->state) {
    copy(&slot, &next, sizeof next);
    persist(&slot, sizeof slot);
  }
  state_ = next;
}

std::uint64_t Pool::root() const {
  std::lock_guard<std::mutex> lock(state_mu_);
  return state_.root;
}

void Pool::set_root(std::uint64_t offset) {
  std::lock_guard<std::mutex> lock(state_mu_);
  HeaderState next = state_;
  next.root = offset;
  next.flags &= ~kStateBuilding;  // the same change: a finished pool always has its root
  write_state(next);
}

std::uint64_t Pool::heap_high_water() const {
  std::lock_guard<std::mutex> lock(state_mu_);
  return state_.heap_high_water;
}

void Pool::raise_heap_high_water(std::uint64_t target) {
  std::lock_guard<std::mutex> lock(state_mu_);
  if (target <= state_.heap_high_water) return;
  HeaderState next = state_;
  next.heap_high_water = target;
  write_state(next);
}

void Pool::close_clean(std::uint64_t records, std::uint64_t nodes) {
  std::lock_guard<std::mutex> lock(state_mu_);
  HeaderState next = state_;
  next.clean_shutdown = kCleanMark;
  next.records_at_close = records;  // the same change as the mark: counts only with it
  next.nodes_at_close = nodes;
  write_state(next);
  // The file's mtime then says when it was last closed cleanly (stores through a shared mapping
  // do not reliably update it): `pmpool rm --stale` keeps pools closed recently.
  if (fd_ >= 0 && !private_) futimens(fd_, nullptr);
}

namespace {

// Creation's refusals of the options, before anything is made: a bad kind, a pool below the
// minimum.
Status check_create(const PoolOptions& o) {
  if (!valid_kind(o.layout.kind))
    return make_error(o.path, Code::invalid_argument, "layout kind must be 1..15 bytes");
  if (o.size < kMinPoolSize) {
    return make_error(o.path, Code::invalid_argument,
                      "pool size " + std::to_string(o.size) + " is below the minimum of " +
                          std::to_string(kMinPoolSize) + " bytes");
  }
  return Status::Ok();
}

// A new pool's header, magic zeroed (written last) and both state copies sealed.
PoolHeader initial_header(const PoolOptions& o, std::size_t size) {
  PoolHeader h{};
  h.format_version = kFormatVersion;
  h.header_size = kHeaderSize;
  h.arch = kArchX86_64;
  h.endian_tag = kEndianTag;
  h.cache_line = kCacheLine;
  h.pool_size = size;
  random_uuid(h.uuid);
  h.creation_time = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::seconds>(
          std::chrono::system_clock::now().time_since_epoch()).count());
  std::memcpy(h.kind, o.layout.kind.data(), o.layout.kind.size());
  h.node_size = o.layout.node_size;
  h.key_mode = static_cast<std::uint32_t>(o.layout.key_mode);
  h.variant = o.layout.variant;
  h.heap_offset = kHeaderSize;
  std::memcpy(h.magic, kPoolMagic.data(), kPoolMagic.size());
  h.checksum = header_checksum(h);  // covers the magic a complete header will carry
  std::memset(h.magic, 0, sizeof h.magic);
  HeaderState first{};
  first.sequence = 1;
  first.heap_high_water = kHeaderSize;
  first.generation = 1;
  first.last_mode = static_cast<std::uint32_t>(o.mode) + 1;
  first.flags = kStateBuilding;  // until the index's set_root
  first.records_at_close = kNoCount;
  first.nodes_at_close = kNoCount;
  h.state[0] = h.state[1] = sealed_state(h, first);
  return h;
}

}  // namespace

// Maps the new pool: anonymous memory for an empty path, else a file made under a hidden name
// (`file`, given its name by publish) and mapped at its initial extent.
Status Pool::map_new(const PoolOptions& o, std::size_t initial, UnpublishedFile* file) {
  if (o.path.empty()) {
    void* p = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      return make_error(o.path, Code::io_error, "cannot map anonymous memory: " + errno_text(errno));
    madvise(p, size_, MADV_HUGEPAGE);
    base_ = static_cast<char*>(p);
    owns_mapping_ = true;
    backing_ = Backing::anonymous;
    extent_.store(size_, std::memory_order_relaxed);  // untouched pages cost nothing
    return Status::Ok();
  }
  const Status made = make_unpublished_file(o, initial, file);
  fd_ = file->fd;  // the pool closes it (releasing the flock) on every path
  if (!made.ok()) return made;
  void* p = map_pool_file(o.path, file->fd, size_, initial, &backing_, &map_flags_);
  if (p == MAP_FAILED) return make_error(o.path, Code::io_error, "cannot map: " + errno_text(errno));
  base_ = static_cast<char*>(p);
  owns_mapping_ = true;
  mapped_ = round_to_page(initial);
  extent_.store(initial, std::memory_order_relaxed);
  prefault_ = o.prefault;
  populate(0, mapped_);
  return Status::Ok();
}

Result<std::unique_ptr<Pool>> Pool::create(const PoolOptions& o) {
  if (Status s = check_create(o); !s.ok()) return s;
  struct stat st{};
  if (!o.path.empty() && !o.overwrite && ::stat(o.path.c_str(), &st) == 0)
    return file_exists(o);  // refused, or opened with open_existing
  const std::size_t size = o.size / kXPLine * kXPLine;
  const std::size_t asked = o.initial_size != 0 ? o.initial_size : kDefaultInitialPoolSize;
  const std::size_t initial = std::min(size, std::max(kMinPoolSize, asked / kXPLine * kXPLine));
  std::unique_ptr<Pool> pool(new Pool());
  pool->path_ = o.path;
  pool->size_ = size;
  pool->reserved_ = round_to_page(size);
  pool->mode_ = o.mode;
  pool->created_ = true;
  auto file = std::make_unique<UnpublishedFile>();
  if (Status s = pool->map_new(o, initial, file.get()); !s.ok()) return s;
  if (!Runtime::acquire_mode(o.mode)) {
    return make_error(o.path, Code::invalid_argument,
                      "persistence mode " + std::string(to_string(o.mode)) +
                          " conflicts with pools already open in mode " +
                          std::string(to_string(Runtime::mode())));
  }
  pool->mode_acquired_ = true;

  // Write everything but the magic, persist, then the magic: a crash during creation leaves a
  // file that is refused as "not a pmindex pool" rather than one with a half-written header.
  const PoolHeader h = initial_header(o, size);
  auto* dst = pool->at<PoolHeader>(0);
  copy(dst, &h, sizeof h);
  persist(dst, sizeof h);
  copy(dst->magic, kPoolMagic.data(), kPoolMagic.size());
  persist(dst->magic, sizeof dst->magic);

  pool->generation_ = 1;
  pool->state_ = h.state[0];
  pool->info_ = decode(*dst, pool->state_);
  pool->allocator_ = std::make_unique<Allocator>(*pool, kHeaderSize, size);
  pool->allocator_->init_empty();
  if (o.path.empty()) return pool;
  if (o.defer_publish) {  // Index::open publishes once the root is in place
    pool->unpublished_ = std::move(file);
    pool->publish_options_ = o;
    return pool;
  }
  // Only a whole pool gets the name; a concurrent creator that won keeps its pool.
  if (Status s = publish_file(o, file.get()); !s.ok()) {
    if (s.code() != Code::already_present) return s;
    pool.reset();  // releases the unpublished file and the runtime mode
    return file_exists(o);
  }
  return pool;
}

Status Pool::publish() const {
  if (unpublished_ == nullptr) return Status::Ok();
  Status s = publish_file(publish_options_, unpublished_.get());
  if (s.ok()) unpublished_.reset();  // its hidden name (if any) and the displaced pool's lock
  return s;
}

Result<std::unique_ptr<Pool>> Pool::open(const PoolOptions& o) {
  const std::string& name = o.path;
  if (o.path.empty())
    return make_error(name, Code::invalid_argument, "an anonymous pool cannot be reopened");
  struct stat st{};
  if (::stat(o.path.c_str(), &st) != 0) {
    if (errno == ENOENT) return make_error(name, Code::io_error, "no such pool file");
    return make_error(name, Code::io_error, "cannot stat: " + errno_text(errno));
  }
  if (!S_ISREG(st.st_mode)) return make_error(name, Code::io_error, "not a regular file");
  const int fd = ::open(o.path.c_str(), (o.private_mapping ? O_RDONLY : O_RDWR) | O_CLOEXEC);
  if (fd < 0) return make_error(name, Code::io_error, "cannot open: " + errno_text(errno));
  std::unique_ptr<Pool> pool(new Pool());
  pool->fd_ = fd;
  pool->path_ = o.path;
  pool->mode_ = o.mode;
  if (o.lock && flock(fd, (o.private_mapping ? LOCK_SH : LOCK_EX) | LOCK_NB) != 0)
    return make_error(name, Code::busy, busy_text(fd));

  const auto actual = static_cast<std::uint64_t>(st.st_size);
  if (actual < kHeaderSize) {
    return make_error(name, Code::corrupted,
                      "truncated: file has " + std::to_string(actual) +
                          " bytes, less than a pool header (4096)");
  }
  PoolHeader h{};
  if (pread(fd, &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h))
    return make_error(name, Code::io_error, "cannot read the header: " + errno_text(errno));
  HeaderState state{};
  std::string note;
  if (Status s = validate(h, actual, &o.layout, name, &state, &note); !s.ok()) return s;

  void* p = MAP_FAILED;
  if (o.private_mapping) {
    pool->map_flags_ = MAP_PRIVATE;
    pool->private_ = true;
    p = map_aligned(h.pool_size, actual, MAP_PRIVATE, fd);
    pool->backing_ = Backing::image;
  } else {
    p = map_pool_file(o.path, fd, h.pool_size, actual, &pool->backing_, &pool->map_flags_);
  }
  if (p == MAP_FAILED) return make_error(name, Code::io_error, "cannot map: " + errno_text(errno));
  pool->base_ = static_cast<char*>(p);
  pool->size_ = h.pool_size;
  pool->reserved_ = round_to_page(h.pool_size);
  pool->mapped_ = round_to_page(actual);
  // A file cut or extended off the 256 B grid (by hand; growth never does) is used up to the
  // grid: the high-water mark is on it, so nothing allocated lies in the cut-off tail.
  pool->extent_.store(actual / kXPLine * kXPLine, std::memory_order_relaxed);
  pool->owns_mapping_ = true;
  pool->prefault_ = o.prefault && !pool->private_;  // a private copy would copy every page
  pool->populate(0, pool->mapped_);
  return finish_open(std::move(pool), o.layout);
}

Result<std::unique_ptr<Pool>> Pool::open_image(void* memory, std::size_t size, Mode mode,
                                               const Layout& layout, std::string name) {
  if (reinterpret_cast<std::uintptr_t>(memory) % kCacheLine != 0) {
    return make_error(name, Code::invalid_argument,
                      "image memory is not 64-byte aligned: the pool's cache lines would not be "
                      "the machine's (hold images in pm::ImageBytes)");
  }
  if (size < kHeaderSize) {
    return make_error(name, Code::corrupted,
                      "truncated: image has " + std::to_string(size) + " bytes");
  }
  PoolHeader h;
  std::memcpy(&h, memory, sizeof h);
  HeaderState st{};
  std::string note;
  if (Status s = validate(h, size, &layout, name, &st, &note); !s.ok()) return s;
  std::unique_ptr<Pool> pool(new Pool());
  pool->path_ = std::move(name);
  pool->base_ = static_cast<char*>(memory);
  pool->size_ = size;  // a buffer cannot grow: its size is the maximum
  pool->extent_.store(size, std::memory_order_relaxed);
  pool->mode_ = mode;
  pool->backing_ = Backing::image;
  return finish_open(std::move(pool), layout);
}

Result<std::unique_ptr<Pool>> Pool::finish_open(std::unique_ptr<Pool> pool, const Layout&) {
  if (!Runtime::acquire_mode(pool->mode_)) {
    return pool->error(Code::invalid_argument,
                       "persistence mode " + std::string(to_string(pool->mode_)) +
                           " conflicts with pools already open in mode " +
                           std::string(to_string(Runtime::mode())));
  }
  pool->mode_acquired_ = true;
  // The mapping shows what validate() read (the file is locked), so this cannot fail; it is
  // checked anyway rather than trusted.
  auto* h = pool->at<PoolHeader>(0);
  std::string note;
  if (!read_state(*h, &pool->state_, &note)) return pool->error(Code::corrupted, note);
  pool->info_ = decode(*h, pool->state_);
  pool->info_.state_note = note;
  pool->was_clean_ = pool->state_.clean_shutdown == kCleanMark;
  pool->generation_ = pool->state_.generation + 1;
  pool->open_warning_ = open_warning_text(pool->state_, pool->mode_, note);
  pool->allocator_ = std::make_unique<Allocator>(*pool, kHeaderSize, pool->size_);
  return pool;
}

bool Pool::grow(std::uint64_t end) {
  if (end <= extent()) return true;
  std::lock_guard<std::mutex> lock(grow_mu_);
  const std::size_t have = extent_.load(std::memory_order_relaxed);
  if (end <= have) return true;  // another thread grew it meanwhile
  if (map_flags_ == 0 || end > size_) return false;
  const std::size_t chunk = std::clamp(have, kGrowMin, kGrowMax);
  const std::size_t want =
      std::min(size_, round_up(std::max<std::size_t>(end, have + chunk), kGrowAlign));
  if (extend_to(want)) return true;
  // The file system may still hold what this allocation needs, if not a whole chunk.
  const std::size_t need = std::min(size_, round_up(end, kGrowAlign));
  return need < want && extend_to(need);
}

// Extends the file to `bytes` (reserving its blocks: a full tmpfs fails here, not with SIGBUS
// on a later store) and maps the new part over the reservation. The file grows first: a crash
// before the allocator persists a high-water mark above the old end leaves a longer file,
// which opens. Caller holds grow_mu_.
bool Pool::extend_to(std::size_t bytes) {
  if (!private_) {
    if (posix_fallocate(fd_, 0, static_cast<off_t>(bytes)) != 0) return false;
    // DAX: the new size must be durable before a high-water mark above the old end is.
    if (backing_ == Backing::dax && fdatasync(fd_) != 0) return false;
  }
  const std::size_t want_mapped = std::min(round_to_page(bytes), reserved_);
  if (want_mapped > mapped_) {
    const std::size_t length = want_mapped - mapped_;
    // A private copy grows with anonymous memory: the file is never changed.
    void* p = private_ ? mmap(base_ + mapped_, length, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0)
                       : mmap(base_ + mapped_, length, PROT_READ | PROT_WRITE,
                              map_flags_ | MAP_FIXED, fd_, static_cast<off_t>(mapped_));
    if (p == MAP_FAILED) return false;
    madvise(p, length, MADV_HUGEPAGE);
    populate(mapped_, want_mapped);
    mapped_ = want_mapped;
  }
  // release: a thread that sees the new extent (in_heap, a block carved from it) sees it mapped.
  extent_.store(bytes / kXPLine * kXPLine, std::memory_order_release);
  return true;
}

// PoolOptions::prefault: one call maps every page of the range writable (the file's pages;
// nothing is written), where first touches would take a fault each during operations.
void Pool::populate(std::size_t from, std::size_t to) {
  if (!prefault_ || to <= from) return;
  const bool ok = madvise(base_ + from, to - from, MADV_POPULATE_WRITE) == 0;
  prefaulted_.store(ok && (from == 0 || prefaulted_.load(std::memory_order_relaxed)),
                    std::memory_order_relaxed);
}

void Pool::commit_open() {
  // Only after the index has validated and recovered the pool: a pool refused at open or at
  // recovery is left unchanged. Writing both copies also repairs a torn or damaged one.
  std::lock_guard<std::mutex> lock(state_mu_);
  HeaderState next = state_;
  next.generation = generation_;
  next.clean_shutdown = 0;
  next.last_mode = static_cast<std::uint32_t>(mode_) + 1;
  next.records_at_close = kNoCount;  // this session's changes make them stale
  next.nodes_at_close = kNoCount;
  write_state(next);
}

Result<HeaderInfo> Pool::inspect(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0)
    return make_error(path, Code::io_error, errno == ENOENT ? "no such pool file"
                                                            : "cannot stat: " + errno_text(errno));
  if (!S_ISREG(st.st_mode)) return make_error(path, Code::io_error, "not a regular file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return make_error(path, Code::io_error, "cannot open: " + errno_text(errno));
  PoolHeader h{};
  const auto actual = static_cast<std::uint64_t>(st.st_size);
  const ssize_t got = actual >= kHeaderSize ? pread(fd, &h, sizeof h, 0) : 0;
  ::close(fd);
  if (actual < kHeaderSize) {
    return make_error(path, Code::corrupted,
                      "truncated: file has " + std::to_string(actual) +
                          " bytes, less than a pool header (4096)");
  }
  if (got != static_cast<ssize_t>(sizeof h))
    return make_error(path, Code::io_error, "cannot read the header");
  HeaderState state{};
  std::string note;
  if (Status s = validate(h, actual, nullptr, path, &state, &note); !s.ok()) return s;
  HeaderInfo info = decode(h, state);
  info.state_note = note;
  return info;
}

}  // namespace pmindex::pm

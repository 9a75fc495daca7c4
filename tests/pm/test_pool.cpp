// Pool creation, reopening and every bad input the issue names: each gives a clear error that
// names the file, and none changes the file.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>
#include <vector>

#include "pmindex/pm/pool.h"
#include "pmindex/pm/pptr.h"
#include "support/temp_dir.h"

namespace pmindex::pm {
namespace {

using pmindex::testing::TempDir;

const Layout kLayout{"testidx", 256, KeyMode::u64, 0};

PoolOptions opts(const std::string& path, std::size_t size = 1 << 20) {
  PoolOptions o;
  o.path = path;
  o.size = size;
  o.layout = kLayout;
  return o;
}

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Makes a valid pool file at path (closed cleanly) and returns its bytes.
std::vector<char> make_pool(const std::string& path) {
  auto p = Pool::create(opts(path));
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  (*p)->close_clean();
  p.value().reset();
  return read_file(path);
}

// Expects open() to fail with `code`, a message naming the file and containing `words`, and
// the file to be byte-for-byte unchanged.
void expect_refused(const std::string& path, Code code, const std::string& words,
                    const Layout& layout = kLayout) {
  const auto before = read_file(path);
  PoolOptions o = opts(path);
  o.layout = layout;
  auto p = Pool::open(o);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), code) << p.status().to_string();
  EXPECT_NE(p.status().message().find(path), std::string::npos) << p.status().message();
  EXPECT_NE(p.status().message().find(words), std::string::npos) << p.status().message();
  EXPECT_EQ(read_file(path), before) << "a refused open changed the file";
}

TEST(Pool, CreateReopenKeepsRootAndReportsBacking) {
  TempDir dir;
  const std::string path = dir.file("a.pool");
  std::uint64_t root = 0;
  {
    auto p = Pool::create(opts(path));
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    EXPECT_EQ((*p)->backing(), Backing::tmpfs);  // /dev/shm on the stock mount
    EXPECT_TRUE((*p)->created());
    root = (*p)->allocator().allocate(64);
    ASSERT_NE(root, 0u);
    (*p)->set_root(root);
    (*p)->close_clean();
  }
  auto info = Pool::inspect(path);
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_EQ(info->layout, kLayout);
  EXPECT_EQ(info->root, root);
  EXPECT_TRUE(info->clean_shutdown);
  EXPECT_EQ(info->uuid.size(), 36u);
  auto p = Pool::open(opts(path));
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_TRUE((*p)->was_clean());
  EXPECT_EQ((*p)->root(), root);
  EXPECT_EQ((*p)->generation(), 2u);
  (*p)->commit_open();
  p.value().reset();
  auto again = Pool::inspect(path);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->clean_shutdown) << "open without close leaves the pool marked unclean";
  EXPECT_EQ(again->generation, 2u);
}

// DAX and huge-page tmpfs map a pool with 2 MiB pages only at a 2 MiB-aligned address, so
// create, open and the crash simulator's private open all map there. A size that is not a
// whole number of pages (1 MiB + 256 B) checks that the slack around the mapping is given back
// without cutting into it: every byte of the pool stays writable.
TEST(Pool, MappingsStartOn2MiBBoundaries) {
  TempDir dir;
  const std::string path = dir.file("aligned.pool");
  const std::size_t size = (std::size_t{1} << 20) + 256;
  const auto aligned = [](const Pool& p) {
    return reinterpret_cast<std::uintptr_t>(p.base()) % (std::uintptr_t{2} << 20) == 0;
  };
  {
    auto p = Pool::create(opts(path, size));
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    EXPECT_TRUE(aligned(**p));
    ASSERT_EQ((*p)->size(), size);
    std::memset((*p)->base() + kHeaderSize, 0x5a, size - kHeaderSize);
    (*p)->close_clean();
  }
  for (const bool private_mapping : {false, true}) {
    PoolOptions o = opts(path, size);
    o.private_mapping = private_mapping;
    auto p = Pool::open(o);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    EXPECT_TRUE(aligned(**p)) << "private " << private_mapping;
    EXPECT_EQ((*p)->base()[size - 1], 0x5a);
  }
}

TEST(Pool, AnonymousPoolNeedsNoFile) {
  auto p = Pool::create(opts(""));
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ((*p)->backing(), Backing::anonymous);
  EXPECT_NE((*p)->allocator().allocate(1024), 0u);
}

TEST(Pool, MissingFile) {
  TempDir dir;
  auto p = Pool::open(opts(dir.file("nope.pool")));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), Code::io_error);
  EXPECT_NE(p.status().message().find("nope.pool: no such pool file"), std::string::npos);
}

TEST(Pool, TruncatedBelowHeader) {
  TempDir dir;
  const std::string path = dir.file("t.pool");
  auto bytes = make_pool(path);
  bytes.resize(100);
  write_file(path, bytes);
  expect_refused(path, Code::corrupted, "truncated");
}

// The file may be shorter than pool_size (it grows), but never shorter than the heap's
// high-water mark: bytes below it may hold blocks.
TEST(Pool, TruncatedBelowHighWaterMark) {
  TempDir dir;
  const std::string path = dir.file("t.pool");
  {
    auto p = Pool::create(opts(path));
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    ASSERT_NE((*p)->allocator().allocate(256 << 10), 0u);  // raises the mark past 256 KiB
    (*p)->close_clean();
  }
  auto bytes = read_file(path);
  HeaderState state{};
  ASSERT_TRUE(image_state(bytes.data(), &state));
  const std::uint64_t hwm = state.heap_high_water;
  ASSERT_GT(hwm, std::uint64_t{256} << 10);
  bytes.resize(hwm - 256);
  write_file(path, bytes);
  expect_refused(path, Code::corrupted, "truncated: the heap reaches");
}

TEST(Pool, ExtendedPastMaximumRefused) {
  TempDir dir;
  const std::string path = dir.file("x.pool");
  auto bytes = make_pool(path);
  bytes.resize(bytes.size() + 4096);
  write_file(path, bytes);
  expect_refused(path, Code::corrupted, "extended past its maximum");
}

// Growth: a pool that starts at 64 KiB of file fills its 16 MiB maximum, block by block, in
// doubling chunks; every block is mapped and backed by the file; past the maximum the answer
// is pool_full; the grown pool reopens with its data.
TEST(Pool, GrowsFromTinyToItsMaximum) {
  TempDir dir;
  const std::string path = dir.file("g.pool");
  PoolOptions o = opts(path, std::size_t{16} << 20);
  o.initial_size = kMinPoolSize;
  std::vector<std::uint64_t> blocks;
  {
    auto p = Pool::create(o);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    Pool& pool = **p;
    EXPECT_EQ(pool.size(), o.size);
    EXPECT_EQ(pool.extent(), kMinPoolSize);
    struct stat st{};
    ASSERT_EQ(stat(path.c_str(), &st), 0);
    EXPECT_EQ(static_cast<std::size_t>(st.st_size), kMinPoolSize);
    std::size_t extents_seen = 1;
    std::size_t last = pool.extent();
    Code code = Code::ok;
    for (;;) {
      const std::uint64_t off = pool.allocator().allocate(4096, &code);
      if (off == 0) break;
      ASSERT_LE(off + 4096, pool.extent());
      std::memset(pool.base() + off, static_cast<int>(off / 4096 % 251), 4096);
      blocks.push_back(off);
      if (pool.extent() != last) ++extents_seen, last = pool.extent();
    }
    EXPECT_EQ(code, Code::pool_full);
    EXPECT_GE(extents_seen, 4u) << "64 KiB -> 2 -> 4 -> 8 -> 16 MiB";
    EXPECT_EQ(pool.extent(), o.size);
    EXPECT_GT(blocks.size(), 4000u);
    ASSERT_EQ(stat(path.c_str(), &st), 0);
    EXPECT_EQ(static_cast<std::size_t>(st.st_size), o.size);
    pool.set_root(blocks.front());
    pool.close_clean();
  }
  auto p = Pool::open(opts(path, 0));
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ((*p)->extent(), o.size);
  EXPECT_EQ((*p)->root(), blocks.front());
  for (std::uint64_t off : blocks) {
    ASSERT_EQ(static_cast<unsigned char>((*p)->base()[off + 4095]), off / 4096 % 251) << off;
  }
}

// Page faults this process has taken (minor and major, every thread).
std::uint64_t page_faults() {
  rusage u{};
  EXPECT_EQ(getrusage(RUSAGE_SELF, &u), 0);
  return static_cast<std::uint64_t>(u.ru_minflt + u.ru_majflt);
}

// Fills a 16 MiB pool (from a 64 KiB file: it grows) with 4 KiB blocks, then returns the page
// faults taken by one store to each block's page; *blocks gets their offsets. Under a
// sanitizer each store also reads shadow memory: one shadow page per 8 pool pages.
std::uint64_t faults_writing_blocks(Pool& pool, std::vector<std::uint64_t>* blocks) {
  std::vector<std::uint64_t>& offs = *blocks;
  Code code = Code::ok;
  for (std::uint64_t off; (off = pool.allocator().allocate(4096, &code)) != 0;) offs.push_back(off);
  EXPECT_EQ(code, Code::pool_full);
  const std::uint64_t before = page_faults();
  for (std::uint64_t off : offs) pool.base()[off + 8] = 1;
  return page_faults() - before;
}

// PoolOptions::prefault maps the file's pages at create, at every growth and at open, so
// stores into blocks take no first-touch faults; without it each page faults once (the
// contrast shows the count can fail). A private copy is never prefaulted (it would copy every
// page).
TEST(Pool, PrefaultMapsPagesBeforeTheirFirstStore) {
  TempDir dir;
  for (const bool prefault : {false, true}) {
    const std::string path = dir.file(prefault ? "pf.pool" : "plain.pool");
    PoolOptions o = opts(path, std::size_t{16} << 20);
    o.initial_size = kMinPoolSize;
    o.prefault = prefault;
    auto p = Pool::create(o);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    EXPECT_EQ((*p)->prefaulted(), prefault) << "MADV_POPULATE_WRITE needs Linux 5.14";
    std::vector<std::uint64_t> blocks;
    const std::uint64_t faults = faults_writing_blocks(**p, &blocks);
    ASSERT_GT(blocks.size(), 3000u);
    if (prefault) {
      EXPECT_LT(faults, blocks.size() / 4) << "created and grown with prefault";
    } else {
      EXPECT_GE(faults, blocks.size() / 2) << "without prefault every page faults once";
    }
    (*p)->set_root(blocks.front());
    (*p)->close_clean();
  }
  PoolOptions reopen = opts(dir.file("plain.pool"), 0);
  reopen.prefault = true;
  auto p = Pool::open(reopen);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_TRUE((*p)->prefaulted());
  const std::uint64_t before = page_faults();
  for (std::size_t off = kHeaderSize; off + 4096 <= (*p)->extent(); off += 4096) (*p)->base()[off] = 1;
  EXPECT_LT(page_faults() - before, (*p)->extent() / 4096 / 4) << "opened with prefault";
  p.value().reset();
  reopen.private_mapping = true;
  auto copy = Pool::open(reopen);
  ASSERT_TRUE(copy.ok()) << copy.status().to_string();
  EXPECT_FALSE((*copy)->prefaulted());
}

// A crash during an extension leaves the file longer than the high-water mark (the mark is
// raised only after the file grew): that pool opens, and allocation carries on from there.
TEST(Pool, FileExtendedButNotYetUsedOpens) {
  TempDir dir;
  const std::string path = dir.file("e.pool");
  PoolOptions o = opts(path, std::size_t{16} << 20);
  o.initial_size = kMinPoolSize;
  std::uint64_t hwm = 0;
  {
    auto p = Pool::create(o);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    ASSERT_NE((*p)->allocator().allocate(1024), 0u);
    hwm = (*p)->heap_high_water();
  }  // no close_clean: a crash
  ASSERT_EQ(truncate(path.c_str(), static_cast<off_t>(3 << 20) + 4096 + 100), 0);  // mid-chunk
  auto p = Pool::open(opts(path, 0));
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  Pool& pool = **p;
  EXPECT_FALSE(pool.was_clean());
  EXPECT_EQ(pool.extent(), (std::size_t{3} << 20) + 4096);
  EXPECT_EQ(pool.heap_high_water(), hwm);
  pool.allocator().begin_recovery(false);
  ASSERT_TRUE(pool.allocator().finish_recovery().ok());
  std::size_t got = 0;
  while (pool.allocator().allocate(1 << 20) != 0) ++got;
  EXPECT_EQ(got, 15u) << "the rest of the 16 MiB maximum, past the odd-sized file";
  EXPECT_EQ(pool.extent(), o.size);
}

// Growth that the file system refuses (here: RLIMIT_FSIZE, as a full tmpfs would) is a clean
// pool_full, and the pool keeps serving what it has.
TEST(Pool, FailureToGrowIsPoolFull) {
  TempDir dir;
  const std::string path = dir.file("f.pool");
  const pid_t pid = fork();
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{std::size_t{5} << 20, std::size_t{5} << 20};
    if (setrlimit(RLIMIT_FSIZE, &limit) != 0) _exit(10);
    PoolOptions o = opts(path, std::size_t{64} << 20);
    o.initial_size = std::size_t{1} << 20;
    auto p = Pool::create(o);
    if (!p.ok()) _exit(11);
    Code code = Code::ok;
    std::size_t n = 0;
    const std::uint64_t first = (*p)->allocator().allocate(64 << 10);
    while ((*p)->allocator().allocate(64 << 10, &code) != 0) ++n;
    if (code != Code::pool_full) _exit(12);
    // 2 MiB chunks fit under the limit, the 8 MiB doubling and the 6 MiB fallback do not.
    if ((*p)->extent() != std::size_t{4} << 20 || n < 50) _exit(13);
    (*p)->allocator().deallocate(first, 64 << 10);
    _exit((*p)->allocator().allocate(64 << 10) != 0 ? 0 : 14);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// Two threads allocate from a pool that has to grow under them: blocks never overlap, every
// block lies inside the mapped extent when handed out, and all of them are writable.
TEST(Pool, TwoThreadsGrowAtOnce) {
  TempDir dir;
  PoolOptions o = opts(dir.file("t2.pool"), std::size_t{32} << 20);
  o.initial_size = kMinPoolSize;
  auto p = Pool::create(o);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  Pool& pool = **p;
  std::vector<std::uint64_t> got[2];
  std::atomic<bool> outside{false};
  auto worker = [&](int t) {
    const std::size_t bytes = t == 0 ? 2048 : 96;
    for (;;) {
      const std::uint64_t off = pool.allocator().allocate(bytes);
      if (off == 0) return;
      if (off + bytes > pool.extent()) outside = true;
      std::memset(pool.base() + off, t + 1, bytes);
      got[t].push_back(off);
    }
  };
  std::thread a(worker, 0), b(worker, 1);
  a.join();
  b.join();
  EXPECT_FALSE(outside.load());
  EXPECT_EQ(pool.extent(), o.size);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> all;
  for (int t = 0; t < 2; ++t)
    for (std::uint64_t off : got[t]) all.emplace_back(off, off + (t == 0 ? 2048 : 96));
  std::sort(all.begin(), all.end());
  for (std::size_t i = 1; i < all.size(); ++i) ASSERT_LE(all[i - 1].second, all[i].first);
  for (std::uint64_t off : got[0]) ASSERT_EQ(pool.base()[off + 2047], 1);
  for (std::uint64_t off : got[1]) ASSERT_EQ(pool.base()[off + 95], 2);
}

// A MAP_PRIVATE open (pmpool check) grows with anonymous memory and leaves the file alone.
TEST(Pool, PrivateMappingGrowsWithoutTheFile) {
  TempDir dir;
  const std::string path = dir.file("pg.pool");
  PoolOptions o = opts(path, std::size_t{8} << 20);
  o.initial_size = kMinPoolSize;
  {
    auto p = Pool::create(o);
    ASSERT_TRUE(p.ok());
    (*p)->close_clean();
  }
  const auto before = read_file(path);
  PoolOptions po = opts(path, 0);
  po.private_mapping = true;
  auto p = Pool::open(po);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  (*p)->allocator().init_empty();
  const std::uint64_t off = (*p)->allocator().allocate(1 << 20);
  ASSERT_NE(off, 0u);
  std::memset((*p)->base() + off, 7, 1 << 20);
  p.value().reset();
  EXPECT_EQ(read_file(path), before);
}

TEST(Pool, EmptyFile) {
  TempDir dir;
  const std::string path = dir.file("e.pool");
  write_file(path, {});
  expect_refused(path, Code::corrupted, "truncated");
}

TEST(Pool, WrongMagicForeignFile) {
  TempDir dir;
  const std::string path = dir.file("f.pool");
  write_file(path, std::vector<char>(1 << 16, 'x'));
  expect_refused(path, Code::corrupted, "not a pmindex pool");
}

TEST(Pool, UnknownFormatVersion) {
  TempDir dir;
  const std::string path = dir.file("v.pool");
  auto bytes = make_pool(path);
  auto* h = reinterpret_cast<PoolHeader*>(bytes.data());
  h->format_version = 99;
  h->checksum = header_checksum(*h);
  write_file(path, bytes);
  expect_refused(path, Code::unsupported, "unknown pool format version 99");
}

TEST(Pool, WrongLayout) {
  TempDir dir;
  const std::string path = dir.file("l.pool");
  make_pool(path);
  expect_refused(path, Code::wrong_layout, "'testidx' (node 256 B, key u64)",
                 Layout{"testidx", 512, KeyMode::u64, 0});
  expect_refused(path, Code::wrong_layout, "was requested", Layout{"other", 256, KeyMode::u64, 0});
  expect_refused(path, Code::wrong_layout, "was requested",
                 Layout{"testidx", 256, KeyMode::bytes, 0});
}

TEST(Pool, CorruptedHeaderChecksum) {
  TempDir dir;
  const std::string path = dir.file("c.pool");
  auto bytes = make_pool(path);
  bytes[33] ^= 0x10;  // a bit of pool_size, checksum not updated
  write_file(path, bytes);
  expect_refused(path, Code::corrupted, "checksum");
}

TEST(Pool, CorruptedRootOffset) {
  TempDir dir;
  const std::string path = dir.file("r.pool");
  auto bytes = make_pool(path);
  HeaderState st{};
  ASSERT_TRUE(image_state(bytes.data(), &st));
  st.root = bytes.size() + 4096;
  set_image_state(bytes.data(), st);
  write_file(path, bytes);
  expect_refused(path, Code::corrupted, "root offset out of bounds");
}

TEST(Pool, MisalignedHighWaterMark) {
  TempDir dir;
  const std::string path = dir.file("h.pool");
  auto bytes = make_pool(path);
  HeaderState st{};
  ASSERT_TRUE(image_state(bytes.data(), &st));
  st.heap_high_water = 4096 + 256 + 20;
  set_image_state(bytes.data(), st);
  write_file(path, bytes);
  expect_refused(path, Code::corrupted, "heap high-water mark out of bounds or misaligned");
}

TEST(Pool, UnwritablePath) {
  auto p = Pool::create(opts("/proc/pmindex-cannot-be-here.pool"));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), Code::io_error);
  EXPECT_NE(p.status().message().find("/proc/pmindex-cannot-be-here.pool: cannot create"),
            std::string::npos)
      << p.status().message();
}

TEST(Pool, CreateRefusesToOverwriteUnlessAsked) {
  TempDir dir;
  const std::string path = dir.file("o.pool");
  const auto before = make_pool(path);
  auto p = Pool::create(opts(path));
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("refusing to overwrite"), std::string::npos);
  EXPECT_EQ(read_file(path), before);
  PoolOptions o = opts(path);
  o.overwrite = true;
  auto q = Pool::create(o);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
}

TEST(Pool, TooSmallSizeRefused) {
  TempDir dir;
  auto p = Pool::create(opts(dir.file("s.pool"), 4096));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), Code::invalid_argument);
  EXPECT_NE(p.status().message().find("below the minimum"), std::string::npos);
}

TEST(Pool, FullFileSystemFailsAtCreation) {
  // 1 TiB cannot be reserved on this machine's /dev/shm: fallocate of the initial size fails
  // at creation, with a clear message, and no file is left behind. (A 1 TiB maximum with the
  // default initial size is fine: only address space is reserved.)
  TempDir dir;
  const std::string path = dir.file("huge.pool");
  PoolOptions o = opts(path, std::size_t{1} << 40);
  o.initial_size = o.size;
  auto p = Pool::create(o);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), Code::io_error);
  EXPECT_NE(p.status().message().find("cannot reserve"), std::string::npos)
      << p.status().message();
  EXPECT_NE(access(path.c_str(), F_OK), 0);
}

TEST(Pool, AlreadyOpenInAnotherProcess) {
  TempDir dir;
  const std::string path = dir.file("b.pool");
  make_pool(path);
  auto p = Pool::open(opts(path));
  ASSERT_TRUE(p.ok());
  // flock is per open file description: a forked child opening the file again conflicts.
  const pid_t pid = fork();
  if (pid == 0) {
    auto q = Pool::open(opts(path));
    const bool busy = !q.ok() && q.status().code() == Code::busy &&
                      q.status().message().find("open in another process") != std::string::npos;
    _exit(busy ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST(Pool, CheckedRejectsOutOfBoundsAndMisaligned) {
  auto p = Pool::create(opts(""));
  ASSERT_TRUE(p.ok());
  Pool& pool = **p;
  EXPECT_EQ(pool.checked<std::uint64_t>(0), nullptr);            // header, not heap
  EXPECT_EQ(pool.checked<std::uint64_t>(pool.size()), nullptr);  // one past the end
  EXPECT_EQ(pool.checked<std::uint64_t>(pool.size() - 4), nullptr);
  EXPECT_EQ(pool.checked<std::uint64_t>(8192 + 3), nullptr);     // misaligned
  EXPECT_NE(pool.checked<std::uint64_t>(8192), nullptr);
  EXPECT_EQ(pool.checked<char>(~std::uint64_t{0} - 2, 16, 1), nullptr);  // overflow
}

TEST(Pool, TypedPersistentPointer) {
  auto p = Pool::create(opts(""));
  ASSERT_TRUE(p.ok());
  Pool& pool = **p;
  struct Node { PPtr<Node> next; std::uint64_t v; };
  const std::uint64_t a = pool.allocator().allocate(sizeof(Node));
  const std::uint64_t b = pool.allocator().allocate(sizeof(Node));
  Node* na = pool.at<Node>(a);
  store(na, Node{{0}, 1});
  EXPECT_EQ(na->next.get(pool), nullptr);
  na->next.publish(b);
  EXPECT_EQ(na->next.get(pool), pool.at<Node>(b));
  EXPECT_EQ(na->next.load_acquire(), b);
  PPtr<Node> wild{pool.size() + 64};
  EXPECT_EQ(wild.checked(pool), nullptr);
  PPtr<Node> misaligned{b + 1};
  EXPECT_EQ(misaligned.checked(pool), nullptr);
}

TEST(Pool, PrivateMappingNeverChangesTheFile) {
  TempDir dir;
  const std::string path = dir.file("p.pool");
  const auto before = make_pool(path);
  PoolOptions o = opts(path);
  o.private_mapping = true;
  auto p = Pool::open(o);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  (*p)->set_root(8192);
  (*p)->commit_open();
  p.value().reset();
  EXPECT_EQ(read_file(path), before);
}

TEST(Pool, ImageOpenValidatesLikeAFile) {
  TempDir dir;
  const std::string path = dir.file("i.pool");
  const std::vector<char> file = make_pool(path);
  ImageBytes bytes(file.begin(), file.end());
  auto p = Pool::open_image(bytes.data(), bytes.size(), Mode::adr, kLayout, "image");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ((*p)->backing(), Backing::image);
  p.value().reset();
  bytes[0] = 'Q';
  auto q = Pool::open_image(bytes.data(), bytes.size(), Mode::adr, kLayout, "image");
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().message().find("image: not a pmindex pool"), std::string::npos);
}

// The persistence API flushes the machine's lines and the layouts count the pool's: an image
// whose base is not a multiple of 64 would make every flush name the wrong line (the crash
// simulator then drops stores that were flushed). Such memory is refused, not opened.
TEST(Pool, ImageOpenRefusesMemoryOffCacheLines) {
  TempDir dir;
  const std::string path = dir.file("i.pool");
  const std::vector<char> file = make_pool(path);
  ImageBytes bytes(file.size() + 64);
  for (std::size_t shift : {8, 16, 32}) {
    std::memcpy(bytes.data() + shift, file.data(), file.size());
    auto p = Pool::open_image(bytes.data() + shift, file.size(), Mode::adr, kLayout, "image");
    ASSERT_FALSE(p.ok()) << "shift " << shift;
    EXPECT_EQ(p.status().code(), Code::invalid_argument);
    EXPECT_NE(p.status().message().find("not 64-byte aligned"), std::string::npos)
        << p.status().to_string();
  }
  std::memcpy(bytes.data() + 64, file.data(), file.size());
  EXPECT_TRUE(Pool::open_image(bytes.data() + 64, file.size(), Mode::adr, kLayout, "image").ok());
}

// ---- format version 2: the header state is two checksummed copies ----

// A pool with a published root, closed cleanly; returns its bytes and current state.
std::vector<char> make_rooted_pool(const std::string& path, HeaderState* st) {
  {
    auto p = Pool::create(opts(path));
    EXPECT_TRUE(p.ok()) << p.status().to_string();
    (*p)->set_root((*p)->allocator().allocate(64));
    (*p)->close_clean();
  }
  auto bytes = read_file(path);
  EXPECT_TRUE(image_state(bytes.data(), st));
  return bytes;
}

HeaderState* copy_at(std::vector<char>& bytes, int i) {
  return &reinterpret_cast<PoolHeader*>(bytes.data())->state[i];
}

// One damaged (or torn) copy: the other is used, the user is told, and the first state change
// (commit_open) writes both copies whole again.
TEST(PoolStateV2, OneDamagedCopyIsSurvivedAndRepaired) {
  for (int bad : {0, 1}) {
    TempDir dir;
    const std::string path = dir.file("s.pool");
    HeaderState st{};
    auto bytes = make_rooted_pool(path, &st);
    copy_at(bytes, bad)->root ^= 0x40;  // a valid-looking offset, checksum not updated
    write_file(path, bytes);
    auto p = Pool::open(opts(path));
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    EXPECT_EQ((*p)->root(), st.root) << "copy " << bad;
    EXPECT_TRUE((*p)->was_clean());
    EXPECT_NE((*p)->open_warning().find("copy " + std::to_string(bad) + " failed its checksum"),
              std::string::npos)
        << (*p)->open_warning();
    (*p)->commit_open();
    p.value().reset();
    auto info = Pool::inspect(path);
    ASSERT_TRUE(info.ok()) << info.status().to_string();
    EXPECT_TRUE(info->state_note.empty()) << info->state_note;
    EXPECT_EQ(info->root, st.root);
  }
}

TEST(PoolStateV2, BothCopiesDamagedIsCorrupted) {
  TempDir dir;
  const std::string path = dir.file("s.pool");
  HeaderState st{};
  auto bytes = make_rooted_pool(path, &st);
  copy_at(bytes, 0)->generation = 0;
  copy_at(bytes, 1)->heap_high_water += 256;
  write_file(path, bytes);
  expect_refused(path, Code::corrupted, "both copies of the header state fail their checksum");
}

// A crash after copy 0 was written whole and before copy 1: copy 0 (one sequence ahead) wins.
TEST(PoolStateV2, CrashBetweenTheCopiesTakesTheNewerOne) {
  TempDir dir;
  const std::string path = dir.file("s.pool");
  HeaderState st{};
  auto bytes = make_rooted_pool(path, &st);
  HeaderState next = st;
  next.sequence += 1;
  next.clean_shutdown = 0;
  *copy_at(bytes, 0) = sealed_state(*reinterpret_cast<PoolHeader*>(bytes.data()), next);
  write_file(path, bytes);
  auto p = Pool::open(opts(path));
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_FALSE((*p)->was_clean()) << "copy 0 is newer and says unclean";
  EXPECT_EQ((*p)->info().state_sequence, next.sequence);
  EXPECT_TRUE((*p)->open_warning().empty()) << (*p)->open_warning();
}

// Two valid copies no crash can leave: the same sequence with different contents, copy 1
// ahead of copy 0, or a gap of more than one.
TEST(PoolStateV2, ImpossibleCopyPairsAreCorrupted) {
  struct Case { std::uint64_t seq0, seq1; bool differ; const char* words; };
  const Case cases[] = {{5, 5, true, "disagree at the same sequence"},
                        {5, 6, false, "no crash leaves that"},
                        {9, 5, false, "no crash leaves that"}};
  for (const Case& c : cases) {
    TempDir dir;
    const std::string path = dir.file("s.pool");
    HeaderState st{};
    auto bytes = make_rooted_pool(path, &st);
    const auto& h = *reinterpret_cast<PoolHeader*>(bytes.data());
    HeaderState a = st, b = st;
    a.sequence = c.seq0;
    b.sequence = c.seq1;
    if (c.differ) b.generation += 1;
    *copy_at(bytes, 0) = sealed_state(h, a);
    *copy_at(bytes, 1) = sealed_state(h, b);
    write_file(path, bytes);
    expect_refused(path, Code::corrupted, c.words);
  }
}

// A copy from another pool (same words, other uuid) fails the checksum: it is seeded with the uuid.
TEST(PoolStateV2, StateFromAnotherPoolIsRejected) {
  TempDir dir;
  HeaderState st{};
  auto a = make_rooted_pool(dir.file("a.pool"), &st);
  auto b = make_rooted_pool(dir.file("b.pool"), &st);
  std::memcpy(copy_at(b, 0), copy_at(a, 0), 2 * sizeof(HeaderState));
  write_file(dir.file("b.pool"), b);
  expect_refused(dir.file("b.pool"), Code::corrupted, "both copies");
}

// The root word lost with a valid checksum (issue 18 item 3: an open used to build an empty
// index over the old blocks). A pool still being built (no root published yet) opens.
TEST(PoolStateV2, RootZeroInAUsedHeapIsCorrupted) {
  TempDir dir;
  const std::string path = dir.file("s.pool");
  HeaderState st{};
  auto bytes = make_rooted_pool(path, &st);
  st.root = 0;
  set_image_state(bytes.data(), st);
  write_file(path, bytes);
  expect_refused(path, Code::corrupted, "root offset 0 in a used heap");

  st.flags = kStateBuilding;
  set_image_state(bytes.data(), st);
  write_file(path, bytes);
  auto p = Pool::open(opts(path));
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ((*p)->root(), 0u);
}

TEST(PoolStateV2, UnknownStateValuesAreCorrupted) {
  TempDir dir;
  const std::string path = dir.file("s.pool");
  HeaderState st{};
  auto bytes = make_rooted_pool(path, &st);
  st.clean_shutdown = 1;  // neither 0 nor kCleanMark
  set_image_state(bytes.data(), st);
  write_file(path, bytes);
  expect_refused(path, Code::corrupted, "unknown value in the header state");
}

// A pool last written in eadr (or dram) and not closed cleanly is reported when opened in adr;
// a clean close, or opening in the same mode, says nothing.
TEST(PoolStateV2, WeakerModeUncleanIsReportedInAdr) {
  for (Mode last : {Mode::eadr, Mode::dram}) {
    for (bool clean : {false, true}) {
      TempDir dir;
      const std::string path = dir.file("m.pool");
      {
        PoolOptions o = opts(path);
        o.mode = last;
        auto p = Pool::create(o);
        ASSERT_TRUE(p.ok()) << p.status().to_string();
        (*p)->set_root((*p)->allocator().allocate(64));
        if (clean) (*p)->close_clean();
      }
      auto p = Pool::open(opts(path));
      ASSERT_TRUE(p.ok()) << p.status().to_string();
      const bool said = (*p)->open_warning().find("last written in " +
                                                  std::string(to_string(last))) !=
                        std::string::npos;
      EXPECT_EQ(said, !clean) << to_string(last) << ": " << (*p)->open_warning();
      EXPECT_EQ((*p)->info().last_mode, static_cast<std::uint32_t>(last) + 1);
      (*p)->commit_open();  // now last written in adr
      p.value().reset();
      auto again = Pool::inspect(path);
      ASSERT_TRUE(again.ok());
      EXPECT_EQ(again->last_mode, static_cast<std::uint32_t>(Mode::adr) + 1);
    }
  }
}

TEST(PoolStateV2, Version1IsRefusedWithTheWayToUpgrade) {
  TempDir dir;
  const std::string path = dir.file("v1.pool");
  auto bytes = make_pool(path);
  auto* h = reinterpret_cast<PoolHeader*>(bytes.data());
  h->format_version = 1;
  h->checksum = header_checksum(*h);
  write_file(path, bytes);
  expect_refused(path, Code::unsupported, "pmpool upgrade " + path);
}

// defer_publish: nothing at the path until publish(); a pool dropped before it leaves no file,
// and with overwrite leaves the old pool as it was.
TEST(PoolStateV2, DeferredPublishShowsOnlyAFinishedPool) {
  TempDir dir;
  const std::string path = dir.file("d.pool");
  PoolOptions o = opts(path);
  o.defer_publish = true;
  {
    auto p = Pool::create(o);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    EXPECT_FALSE(std::ifstream(path).good()) << "published before publish()";
  }
  EXPECT_FALSE(std::ifstream(path).good()) << "a dropped unpublished pool left a file";
  const auto old = make_pool(path);
  o.overwrite = true;
  {
    auto p = Pool::create(o);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
  }
  EXPECT_EQ(read_file(path), old) << "a dropped overwrite replaced the old pool";
  {
    auto p = Pool::create(o);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    (*p)->set_root((*p)->allocator().allocate(64));
    ASSERT_TRUE((*p)->publish().ok());
    (*p)->close_clean();
  }
  auto info = Pool::inspect(path);
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_NE(info->root, 0u);
}

}  // namespace
}  // namespace pmindex::pm

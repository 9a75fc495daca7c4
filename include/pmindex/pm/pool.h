/// \file
/// A persistent-memory pool: one file (or anonymous memory) mapped at any address, with a
/// self-describing header, a crash-safe allocator and one root offset for the index.
///
/// Backings, chosen by the path and reported by backing():
///   dax         a DAX file system: mapped MAP_SHARED_VALIDATE|MAP_SYNC, power-fail durable
///   tmpfs       /dev/shm or another tmpfs: survives process crashes (kill -9), not power loss
///   tmpfs_huge  tmpfs mounted with huge=always: same durability, 2 MiB pages (a fairer PM
///               stand-in next to THP-backed DRAM)
///   file        any other file system: page cache, durable only after msync; not a PM stand-in
///   anonymous   no file (empty path): MAP_ANONYMOUS + MADV_HUGEPAGE, gone with the process
///   image       a caller-owned memory buffer (crash-simulator images, fuzzing, pmpool check)
///
/// Opening never trusts the file: every header field is checked before anything is mapped
/// writable, and a pool that fails a check is left byte-for-byte unchanged. See docs/pool-format.md.
///
/// Growth: a file pool reserves address space for its maximum size (the header's pool_size) at
/// open and maps the file over the start of it; the file starts at PoolOptions::initial_size and
/// the allocator calls grow() when its heap needs more, which extends the file and the mapping in
/// chunks. Pointers are offsets and the base never moves. A crash during an extension leaves a
/// longer file (it opens); a file shorter than the heap high-water mark is truncated (refused).
///
/// Thread safety: a Pool is created/opened by one thread; afterwards base(), size(), extent(),
/// grow(), root and allocator() may be used from any thread. The file is locked (flock) while open, so a second
/// open (another process, or this one again) gets Code::busy; the message says which.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "pmindex/pm/allocator.h"
#include "pmindex/pm/image_bytes.h"
#include "pmindex/pm/layout.h"
#include "pmindex/pm/persist.h"
#include "pmindex/status.h"

namespace pmindex::pm {

/// What a pool is mapped from (the file comment says what each one survives).
enum class Backing : std::uint8_t {
  dax,         ///< a DAX file system: power-fail durable
  tmpfs,       ///< tmpfs: survives process crashes, not power loss
  tmpfs_huge,  ///< tmpfs with huge=always: as tmpfs, 2 MiB pages
  file,        ///< another file system: durable only after msync
  anonymous,   ///< no file: gone with the process
  image,       ///< a caller-owned memory buffer
};
/// "dax", "tmpfs", ...
std::string_view to_string(Backing backing);
/// One sentence on what survives with this backing, for reports.
std::string_view durability_note(Backing backing);

/// Where tools put pools when given a bare name.
inline constexpr std::string_view kDefaultPoolDir = "/dev/shm/pmindex";
/// The smallest pool Pool::create accepts.
inline constexpr std::size_t kMinPoolSize = 64 * 1024;
/// What a file pool starts with when PoolOptions::initial_size is 0 (all of it if smaller).
inline constexpr std::size_t kDefaultInitialPoolSize = std::size_t{64} << 20;

/// How Pool::create and Pool::open map a pool.
struct PoolOptions {
  std::string path;               ///< empty: anonymous memory (no file)
  std::size_t size = 0;           ///< create: maximum size in bytes (>= kMinPoolSize); address
                                  /// space for it is reserved, the file grows up to it
  std::size_t initial_size = 0;   ///< create: bytes the file starts with (0: the default above);
                                  /// anonymous pools map all of `size` at once
  Mode mode = Mode::adr;          ///< the persistence mode of this session
  Layout layout;                  ///< what the caller expects (create writes it; open checks it)
  bool overwrite = false;         ///< create: replace an existing file at path
  bool open_existing = false;     ///< create: if a file is at path (even one another process has
                                  /// just created), open it instead (created() is then false)
  bool private_mapping = false;   ///< open: MAP_PRIVATE copy-on-write; the file is never changed
  bool lock = true;               ///< open/create: take an exclusive flock on the file
  bool defer_publish = false;     ///< create: give the file its name only at publish() (Index::open
                                  /// does, after the index has published its root)
  /// File pools (shared mappings): map every page of the file at open/create and of every
  /// growth (MADV_POPULATE_WRITE), so operations take no first-touch page faults, as the
  /// originals' pools that touch every page before a run. Advisory: a kernel that refuses it
  /// (before Linux 5.14) changes nothing; prefaulted() says whether it took. Nothing is written.
  bool prefault = false;
};

struct UnpublishedFile;  ///< a created file not yet given its name (defer_publish)

/// Upgrades a format-version-1 pool file (unprotected header words) to version 2 (src/pm/
/// upgrade.cpp). Crash-safe: writes the upgraded pool beside it, syncs, renames it over. Refuses
/// a pool that is open (busy), not version 1, or whose header fails version 1's checks.
Status upgrade_pool_file(const std::string& path);

/// A mapped pool: its header, heap, allocator and root offset. See the file comment.
class Pool {
 public:
  /// Creates a new pool. Refuses an existing file unless options.overwrite or open_existing.
  /// The file appears at options.path only with a whole header, already locked; a failed
  /// create leaves no file there, and with overwrite leaves the old pool as it was.
  static Result<std::unique_ptr<Pool>> create(const PoolOptions& options);
  /// Opens an existing pool, checking every header field against options.layout.
  static Result<std::unique_ptr<Pool>> open(const PoolOptions& options);
  /// Wraps a caller-owned memory buffer holding a pool image (no file, no lock). The buffer
  /// must outlive the Pool and start at a multiple of 64 (Code::invalid_argument otherwise:
  /// flushes name the machine's lines, layouts the pool's; pm::ImageBytes is aligned). Used
  /// by the crash simulator and the fuzz target.
  static Result<std::unique_ptr<Pool>> open_image(void* memory, std::size_t size, Mode mode,
                                                  const Layout& layout, std::string name);
  /// Reads and checks only the header of the file at path (never maps it writable).
  static Result<HeaderInfo> inspect(const std::string& path);

  Pool(const Pool&) = delete;             ///< one owner per mapping
  Pool& operator=(const Pool&) = delete;  ///< one owner per mapping
  /// Unmaps without marking a clean shutdown (what a crash leaves).
  ~Pool();

  /// Called by the index once it has validated and recovered the pool: bumps the generation
  /// and clears the clean-shutdown mark (persisted). Until then the file is unchanged, so a pool
  /// refused at open or at recovery is left as it was.
  void commit_open();
  /// Marks the pool cleanly shut down (persisted). The index calls this after its last persist,
  /// with the records and leaves/nodes it holds if it counted them (kNoCount otherwise): the
  /// next open's full recovery walk compares its own counts with them (a damaged chain that
  /// lost leaves is then seen), through index_common::check_close_counts.
  void close_clean(std::uint64_t records = kNoCount, std::uint64_t nodes = kNoCount);
  /// What the previous session's clean close counted (kNoCount if it did not, or was unclean).
  std::uint64_t records_at_close() const { return info_.records_at_close; }
  /// The leaves/nodes that clean close counted (kNoCount if none).
  std::uint64_t nodes_at_close() const { return info_.nodes_at_close; }
  /// A pool created with defer_publish: gives the finished file its name (link, or rename over
  /// the old pool with overwrite). already_present if a file appeared at the path meanwhile.
  /// Const because Index exposes its pool as const; it changes no pool byte. No-op otherwise.
  Status publish() const;
  /// Something the open found worth telling the user although the pool opened: a torn or
  /// damaged header state copy, or a pool last written in a weaker persistence mode that was
  /// not shut down cleanly. Empty when there is nothing to say.
  const std::string& open_warning() const { return open_warning_; }

  /// The address of offset 0 (fixed while the pool is open).
  char* base() const { return base_; }
  /// The maximum size (header pool_size): every offset the pool may ever hold is below it.
  std::size_t size() const { return size_; }
  /// Bytes usable now ([0, extent()) is mapped and backed by the file); grows up to size().
  /// acquire: pairs with grow()'s release, so the new range is mapped before it is seen.
  std::size_t extent() const { return extent_.load(std::memory_order_acquire); }
  /// Makes [0, end) usable, extending the file and the mapping by at least one chunk (doubling,
  /// at most 1 GiB at a time, in 2 MiB units). False if end > size(), the pool cannot grow (anonymous, image)
  /// or the file system refuses the space: the allocator answers pool_full. Thread-safe.
  bool grow(std::uint64_t end);
  const std::string& path() const { return path_; }  ///< the file, empty for anonymous/image
  Backing backing() const { return backing_; }        ///< what the pool is mapped from
  Mode mode() const { return mode_; }                 ///< this session's persistence mode
  const HeaderInfo& info() const { return info_; }    ///< the header as decoded at open
  /// True if the previous session ended with close_clean(); false after a crash or for a
  /// freshly created pool (use created() to tell those apart).
  bool was_clean() const { return was_clean_; }
  /// True if this object created the pool (as opposed to opening an existing one).
  bool created() const { return created_; }
  /// True if PoolOptions::prefault asked for it and the kernel mapped the pages.
  bool prefaulted() const { return prefaulted_.load(std::memory_order_relaxed); }
  /// Incremented (and persisted) at every open: a per-restart generation number (APEX's
  /// global version G).
  std::uint64_t generation() const { return generation_; }

  /// The index's root object: 0 until the index publishes one (one failure-atomic 8-byte
  /// store, persisted).
  std::uint64_t root() const;
  /// Publishes the index's root (one header state change, persisted; clears kStateBuilding).
  void set_root(std::uint64_t offset);

  /// The heap high-water mark (allocator): raising it is one persisted header state change.
  std::uint64_t heap_high_water() const;
  /// Raises the mark to at least `target` (never lowers it), persisted before it returns.
  void raise_heap_high_water(std::uint64_t target);

  Allocator& allocator() { return *allocator_; }              ///< the pool's allocator
  const Allocator& allocator() const { return *allocator_; }  ///< the pool's allocator

  /// Offset <-> address. at() trusts the offset; checked() is for recovery code, which never
  /// trusts PM: it returns nullptr unless [offset, offset+bytes) lies in the heap and offset is
  /// aligned to `align`.
  template <class T>
  T* at(std::uint64_t offset) const { return reinterpret_cast<T*>(base_ + offset); }
  /// The checked form of at(): nullptr unless the range lies in the heap and is aligned.
  template <class T>
  T* checked(std::uint64_t offset, std::size_t bytes = sizeof(T),
             std::size_t align = alignof(T)) const {
    if (!in_heap(offset, bytes) || offset % align != 0) return nullptr;
    return at<T>(offset);
  }
  /// True if [offset, offset+bytes) lies in the heap as mapped now (kHeaderSize to extent()).
  bool in_heap(std::uint64_t offset, std::size_t bytes) const;
  /// The offset of an address inside the mapping.
  std::uint64_t offset_of(const void* p) const {
    return static_cast<std::uint64_t>(static_cast<const char*>(p) - base_);
  }
  /// The first heap offset (after the header).
  std::uint64_t heap_begin() const;

  /// An error naming this pool: "<path>: <what>".
  Status error(Code code, std::string_view what) const;

 private:
  Pool();
  static Result<std::unique_ptr<Pool>> finish_open(std::unique_ptr<Pool> pool, const Layout& want);
  bool extend_to(std::size_t bytes);  ///< under grow_mu_
  void populate(std::size_t from, std::size_t to);  ///< prefault [from, to) of the mapping
  /// create's mapping step: anonymous memory, or a file under a hidden name until published.
  Status map_new(const PoolOptions& options, std::size_t initial, UnpublishedFile* file);
  /// Writes `next` (sequence + 1, sealed) to state copy 0, persists, then copy 1. Caller holds
  /// state_mu_.
  void write_state(HeaderState next);

  char* base_ = nullptr;
  std::size_t size_ = 0;
  std::atomic<std::size_t> extent_{0};
  std::size_t mapped_ = 0;     ///< page-aligned bytes of the reservation mapped (under grow_mu_)
  std::size_t reserved_ = 0;   ///< page-aligned bytes of address space reserved
  int map_flags_ = 0;          ///< flags the file was mapped with (0: the pool cannot grow)
  bool private_ = false;       ///< MAP_PRIVATE copy: grows with anonymous memory, file untouched
  bool prefault_ = false;      ///< PoolOptions::prefault for a shared file mapping
  std::atomic<bool> prefaulted_{false};  ///< relaxed: a report, set under grow_mu_ or before sharing
  std::mutex grow_mu_;
  std::string path_;
  int fd_ = -1;
  bool owns_mapping_ = false;
  bool mode_acquired_ = false;
  bool was_clean_ = false;
  bool created_ = false;
  std::uint64_t generation_ = 0;
  Backing backing_ = Backing::anonymous;
  Mode mode_ = Mode::adr;
  HeaderInfo info_;
  std::string open_warning_;
  mutable std::mutex state_mu_;  ///< orders header state changes (allocator, set_root, close)
  HeaderState state_{};          ///< the current state (DRAM copy of the newest PM copy)
  mutable std::unique_ptr<UnpublishedFile> unpublished_;  ///< create with defer_publish, until publish()
  PoolOptions publish_options_;
  std::unique_ptr<Allocator> allocator_;
};

}  // namespace pmindex::pm

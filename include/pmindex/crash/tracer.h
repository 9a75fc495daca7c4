/// \file
/// The crash simulator's tracer: a pm::TraceSink that models what persistent memory could
/// hold if power failed at a given instant (docs/crash-simulator.md, "Simulated semantics").
///
/// Model (x86, as Foundation II specifies it):
///   * Every traced store is split at 8-byte boundaries into units; only a unit (an aligned
///     piece of at most 8 bytes) is failure-atomic. A 16-byte pm::store is two units.
///   * adr:  each 64 B line has a pending sequence of units in program order. Its PM content is
///           always a prefix of that sequence (any dirty line may be written back early).
///           pm::flush marks the line's current length; the next fence makes that prefix
///           durable. A unit stored after the flush but before the fence stays pending.
///   * eadr: every store is durable once it is performed; the pending "lane" is only the last
///           store call's units (a multi-unit call may be torn in program order).
/// The tracer keeps three things: the persisted image (what is certainly durable), the
/// pending lanes, and a volatile view built only from traced stores, which is compared with
/// the live pool at operation boundaries to catch stores that bypassed pm::.
///
/// Crash points: adr just before every fence and at every operation's return; eadr after every
/// store call and at every operation's return. At each one the tracer calls the crash hook,
/// which may ask for images: a choice vector gives each pending lane a prefix length.
///
/// Thread safety: events are accepted only from the thread that called start() (the traced
/// thread) and, with set_scheduler(), from that scheduler's simulated threads (one runs at a
/// time; after each of their events the tracer yields to the scheduler). Events from any other
/// thread (the image checker) are ignored. A flush takes effect at the next fence *of the same
/// thread*. All other members are called from a traced thread, or from the crash hook it runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "pmindex/pm/persist.h"

namespace pmindex::crash {

/// One failure-atomic piece of a traced store.
struct Unit {
  std::uint64_t seq = 0;     ///< global program order
  std::uint64_t offset = 0;  ///< pool offset (never crosses an 8-byte boundary)
  std::uint8_t len = 0;      ///< 1..8
  std::uint8_t bytes[8] = {};  ///< the stored bytes (the first `len` count)
};

/// A pending sequence of units whose durable content is a prefix (adr: one cache line;
/// eadr: the last store call).
struct Lane {
  std::uint64_t line = 0;        ///< pool offset of the line (adr) or of the call (eadr)
  std::vector<Unit> units;       ///< program order
};

class Scheduler;

/// Where the explorer stopped to consider crash images.
struct CrashPoint {
  std::size_t op = 0;            ///< operation in flight (or just completed)
  std::size_t index = 0;         ///< crash point number within the operation
  std::size_t global = 0;        ///< crash point number within the run
  bool completed = false;        ///< at the operation's return: it must be fully durable
};

/// The crash simulator's trace of one run: it keeps the persisted image and the pending
/// (written but not yet durable) stores of the traced threads, raises crash points, and
/// materializes the images a crash there could leave (docs/crash-simulator.md). One traced
/// run at a time per process; used by the explorer, not thread-safe on its own.
class Tracer final : public pm::TraceSink {
 public:
  /// Called at every crash point (the explorer enumerates images there).
  using CrashHook = std::function<void(const CrashPoint&)>;

  /// A tracer for a pool running in `mode` (adr: line-granular write-back; eadr: store order).
  explicit Tracer(pm::Mode mode);
  ~Tracer() override;
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  /// Installs the tracer as the process's sink; the calling thread becomes the traced thread.
  /// Until bind(), events are only logged (the pool's address is not known before it exists).
  /// If another Tracer is installed (a nested exploration: a crash during the recovery of a
  /// crash image, run on the outer explorer's worker thread), that one forwards to this one the
  /// events of threads it does not trace.
  void start();
  /// The pool region: the persisted image and the volatile view start as zeros (fresh
  /// anonymous memory) or, if `preloaded`, as the region's current content (a crash image,
  /// all of it durable); then the logged events are replayed without crash points.
  void bind(const char* base, std::size_t size, bool preloaded = false);
  /// Uninstalls the sink.
  void stop();
  /// The function to call at every crash point.
  void set_crash_hook(CrashHook hook) { hook_ = std::move(hook); }
  /// Multi-threaded simulation: also trace `scheduler`'s threads and yield to it after each of
  /// their events (nullptr: single-threaded).
  void set_scheduler(Scheduler* scheduler) { scheduler_ = scheduler; }

  /// Operation boundaries (called by the explorer around every operation).
  void begin_op(std::size_t op);
  /// Commits what eadr has performed and raises the at-return crash point.
  void end_op();

  /// Compares the live pool with the volatile view; returns "" or a message naming the first
  /// differing offset (a store that bypassed pm::).
  std::string check_bypass() const;

  /// At a crash point: the pending lanes (canonical order) and their lengths.
  const std::vector<const Lane*>& lanes() const { return lanes_view_; }
  /// The pending lanes' lengths in units, in lanes() order.
  std::vector<std::uint32_t> lane_lengths() const;
  /// Writes the image selected by `choice` (one prefix length per lane) into `out`
  /// (size() bytes). Returns false if the choice does not fit the pending lanes.
  bool materialize(std::span<const std::uint32_t> choice, char* out) const;
  /// A hash identifying the image `choice` selects at the current crash point (dedup key).
  std::uint64_t image_key(std::span<const std::uint32_t> choice, const CrashPoint& at) const;

  pm::Mode mode() const { return mode_; }                          ///< the traced mode
  std::size_t size() const { return size_; }                       ///< the bound region's size
  const char* base() const { return base_; }                       ///< the bound region
  const std::vector<char>& persisted() const { return persisted_; }  ///< durable image
  std::size_t crash_points() const { return global_points_; }       ///< raised so far

  /// pm::TraceSink
  void on_store(const void* dst, std::size_t n) override;
  void on_flush(const void* p, std::size_t n) override;
  void on_fence() override;
  void on_yield_point(std::string_view tag) override;

 private:
  struct LoggedEvent {
    enum Kind : std::uint8_t { store, flush, fence } kind;
    std::uintptr_t addr;
    std::size_t n;
    std::vector<char> bytes;
  };
  bool mine() const;
  std::size_t thread_slot() const;  ///< 0: the start() thread; 1..: simulated threads
  void maybe_yield();
  bool in_region(std::uintptr_t a, std::size_t n) const;
  void record_store(std::uint64_t off, const char* src, std::size_t n, bool crash_points);
  void record_flush(std::uint64_t off, std::size_t n, std::size_t slot);
  void record_fence(bool crash_points, std::size_t slot);
  void commit_eadr_lane();
  void apply(const Unit& u);
  void crash_point(bool completed);
  void rebuild_view();

  const pm::Mode mode_;
  std::thread::id thread_;
  bool started_ = false;
  bool bound_ = false;
  const char* base_ = nullptr;
  std::size_t size_ = 0;
  std::vector<LoggedEvent> log_;
  std::vector<char> persisted_;
  std::vector<char> volatile_;
  std::map<std::uint64_t, Lane> adr_lanes_;  ///< by line offset: canonical order
  /// adr, per thread slot: line -> seq of the last unit a flush covered since that thread's
  /// last fence (clwb captures the line; that thread's next sfence makes it durable).
  std::vector<std::map<std::uint64_t, std::uint64_t>> flush_marks_;
  Scheduler* scheduler_ = nullptr;
  Tracer* outer_ = nullptr;  ///< the tracer that forwards to us (nested exploration)
  Tracer* inner_ = nullptr;  ///< the tracer we forward other threads' events to
  Lane eadr_lane_;
  std::vector<const Lane*> lanes_view_;
  std::uint64_t next_seq_ = 1;
  std::uint64_t persisted_version_ = 0;   ///< bumped whenever persisted_ changes
  std::uint64_t persisted_last_seq_ = 0;  ///< eadr: last unit in persisted_
  std::size_t op_ = 0;
  std::size_t op_points_ = 0;
  std::size_t global_points_ = 0;
  bool in_hook_ = false;
  CrashHook hook_;
};

}  // namespace pmindex::crash

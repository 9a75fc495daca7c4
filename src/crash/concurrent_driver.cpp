// The multi-threaded index crash driver (include/pmindex/crash/index_driver.h,
// docs/crash-simulator.md "Multi-threaded index driver").
//
// History: one record per operation, written only by the simulated thread that runs it (one
// simulated thread runs at a time under the scheduler) and read by the image check while every
// simulated thread is parked, so the records are exactly the history at the crash.
#include <algorithm>
#include <atomic>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "crash/workload.h"
#include "pmindex/crash/index_driver.h"
#include "pmindex/pm/persist.h"

namespace pmindex::crash {

namespace {

enum class Kind : std::uint8_t { insert, update, remove, find };

const char* name_of(Kind k) {
  switch (k) {
    case Kind::insert: return "insert";
    case Kind::update: return "update";
    case Kind::remove: return "remove";
    case Kind::find: return "find";
  }
  return "?";
}

constexpr std::uint64_t kOutOfLineTag = std::uint64_t{1} << 63;

// Values carry the id of the operation that wrote them. Every fourth write uses an 8-byte value
// with the top bit set (an index with reserved value bits stores it out of line).
std::string value_for(std::uint64_t id) {
  return encode_u64(id % 4 == 0 ? (id | kOutOfLineTag) : id);
}
bool id_of(std::string_view value, std::uint64_t* id) {
  if (value.size() != 8) return false;
  *id = decode_u64(value) & ~kOutOfLineTag;
  return true;
}

struct OpRec {
  Kind kind = Kind::find;
  std::uint8_t thread = 0;
  std::uint64_t key = 0;
  std::uint64_t id = 0;    // writes: the id in the value written (unique)
  std::uint64_t inv = 0;   // logical time of the invocation, 0 = not invoked
  std::uint64_t ret = 0;   // logical time of the response, 0 = in flight / not invoked
  Code result = Code::ok;
  std::uint64_t seen = 0;  // find: id of the value returned, 0 = not found

  bool invoked() const { return inv != 0; }
  bool returned() const { return ret != 0; }
  bool effective_write() const {
    return (kind == Kind::insert || kind == Kind::update) && invoked() &&
           (!returned() || result == Code::ok);
  }
  bool effective_delete() const {
    return kind == Kind::remove && invoked() && (!returned() || result == Code::ok);
  }
  // A returned operation that found the key present (a write that succeeded, a read of a
  // value, an insert refused because the key exists).
  bool saw_present() const {
    if (!returned()) return false;
    switch (kind) {
      case Kind::insert: return result == Code::ok || result == Code::already_present;
      case Kind::update: return result == Code::ok;
      case Kind::remove: return false;
      case Kind::find: return result == Code::ok;
    }
    return false;
  }
  std::string describe() const {
    std::string s = std::string(name_of(kind)) + "(" + std::to_string(key);
    if (kind == Kind::insert || kind == Kind::update) s += ", v" + std::to_string(id);
    s += ") by thread " + std::to_string(thread) + " [" + std::to_string(inv) + ", ";
    s += returned() ? std::to_string(ret) + "] -> " + std::string(to_string(result))
                    : std::string("in flight]");
    if (kind == Kind::find && returned() && result == Code::ok) s += " v" + std::to_string(seen);
    return s;
  }
};

// a's response came before b's invocation (real-time order).
bool precedes(const OpRec& a, const OpRec& b) {
  return a.returned() && b.invoked() && a.ret < b.inv;
}

class ConcurrentIndexScenario final : public ConcurrentScenario {
 public:
  ConcurrentIndexScenario(const ConcurrentCrashConfig& cfg, const ExploreOptions& opt)
      : cfg_(cfg), mode_(opt.mode), seed_(opt.seed) {
    options_ = cfg.options;
    options_.persistence = opt.mode;
    options_.pool_size = cfg.pool_size;
    options_.path.clear();
    entry_ = IndexRegistry::find(options_.kind);
  }

  Result<Region> setup() override {
    index_.reset();
    pool_.reset();
    if (entry_ == nullptr)
      return Status(Code::invalid_argument, "unknown index kind '" + options_.kind + "'");
    if (cfg_.threads < 1 || cfg_.threads > 3)
      return Status(Code::invalid_argument, "the concurrent driver runs 1 to 3 threads");
    make_history();
    auto pool = create_run_pool(*entry_, options_, cfg_.pool_size, mode_);
    if (!pool.ok()) return pool.status();
    pool_ = std::move(pool).value();
    Region region{pool_->base(), pool_->size()};
    auto idx = cfg_.create ? cfg_.create(std::move(pool_), options_)
                           : entry_->create(std::move(pool_), options_);
    if (!idx.ok()) return idx.status();
    index_ = std::move(idx).value();
    if (cfg_.prepare) cfg_.prepare(*index_);
    // Preload (traced, no crash points): completed inserts before everything else.
    for (std::size_t i = 0; i < cfg_.preload; ++i) {
      OpRec& r = ops_[i];
      r.inv = tick();
      r.result = index_->insert(encode_u64(r.key), value_for(r.id));
      r.ret = tick();
      if (r.result != Code::ok)
        return Status(Code::corrupted, "preload " + r.describe());
    }
    finished_.store(0, std::memory_order_relaxed);
    returned_.store(0, std::memory_order_relaxed);
    // Op 0 after the preload: an SMO the preload ran has no crash point, so it is not counted.
    if (cfg_.observe) cfg_.observe(*index_, 0);
    return region;
  }

  std::size_t threads() const override { return cfg_.threads + (cfg_.background ? 1 : 0); }

  void run_thread(std::size_t t, OpContext& ctx) override {
    if (t == cfg_.threads) {  // the index's background work (ConcurrentCrashConfig::background)
      // acquire: pairs with the last operation thread's fetch_add (its verify() is done).
      cfg_.background(*index_, [this] {
        return finished_.load(std::memory_order_acquire) == cfg_.threads + 1;
      });
      return;
    }
    Index::ThreadScope scope = index_->attach_thread();
    const std::size_t first = cfg_.preload + t * cfg_.ops_per_thread;
    std::string value;
    for (std::size_t i = 0; i < cfg_.ops_per_thread; ++i) {
      OpRec& r = ops_[first + i];
      const std::string key = encode_u64(r.key);
      r.inv = tick();
      switch (r.kind) {
        case Kind::insert: r.result = index_->insert(key, value_for(r.id)); break;
        case Kind::update: r.result = index_->update(key, value_for(r.id)); break;
        case Kind::remove: r.result = index_->remove(key); break;
        case Kind::find: {
          r.result = index_->find(key, &value);
          if (r.result == Code::ok && !id_of(value, &r.seen)) {
            ctx.fail(Status(Code::corrupted, "find returned a value of " +
                                                 std::to_string(value.size()) + " bytes"));
          }
          break;
        }
      }
      r.ret = tick();
      const bool expected = r.result == Code::ok || r.result == Code::not_found ||
                            (r.kind == Kind::insert && r.result == Code::already_present);
      if (!expected) ctx.fail(Status(Code::corrupted, "unexpected result: " + r.describe()));
      if (r.kind == Kind::find && r.result == Code::ok && !writer_plausible(r)) {
        ctx.fail(Status(Code::corrupted, "read returned a value no write of that key wrote: " +
                                             r.describe()));
      }
      ctx.op_returned();
      observe(returned_.fetch_add(1, std::memory_order_relaxed) + 1);
    }
    // The last thread to finish checks the live structure.
    if (finished_.fetch_add(1, std::memory_order_acq_rel) + 1 == cfg_.threads) {
      if (Status s = index_->verify(); !s.ok()) ctx.fail(s);
      observe(kObserveEnd);
      finished_.fetch_add(1, std::memory_order_acq_rel);  // the background thread may stop
    }
  }

  Status check_image(std::span<char> image, const CrashPoint&, std::uint64_t salt) override {
    auto pool = pm::Pool::open_image(image.data(), image.size(), mode_, entry_->layout(options_),
                                     "crash image");
    if (!pool.ok())
      return Status(pool.status().code(), "image does not open: " + pool.status().message());
    auto rec = entry_->recover(std::move(pool).value(), options_);
    if (!rec.ok()) return Status(rec.status().code(), "recovery failed: " + rec.status().message());
    std::unique_ptr<Index> idx = std::move(rec).value();
    if (Status s = idx->verify(); !s.ok())
      return Status(s.code(), "verify after recovery: " + s.message());
    std::string value;
    for (std::uint64_t k = 1; k <= cfg_.key_space; ++k) {
      const Code c = idx->find(encode_u64(k), &value);
      std::uint64_t id = 0;
      if (c == Code::ok && !id_of(value, &id))
        return Status(Code::corrupted, "key " + std::to_string(k) + ": malformed value");
      if (c != Code::ok && c != Code::not_found)
        return Status(c, "key " + std::to_string(k) + ": find failed after recovery");
      if (Status s = judge(k, c == Code::ok, id); !s.ok()) return s;
    }
    // No key outside the key space, and the recovered index keeps working.
    ScanBuffer buf;
    const std::size_t n = idx->scan(encode_u64(0), 4 * cfg_.key_space, buf);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t k = decode_u64(buf.key(i));
      if (k == 0 || k > cfg_.key_space)
        return Status(Code::corrupted, "scan after recovery: unexpected key " + std::to_string(k));
    }
    const std::string extra = encode_u64(cfg_.key_space + 1 + salt % 7);
    if (idx->insert(extra, encode_u64(1)) != Code::ok || idx->find(extra, &value) != Code::ok ||
        idx->remove(extra) != Code::ok) {
      return Status(Code::corrupted, "the recovered index does not take a new key");
    }
    if (Status s = idx->verify(); !s.ok())
      return Status(s.code(), "verify after post-recovery ops: " + s.message());
    return Status::Ok();
  }

  void teardown() override {
    index_.reset();
    pool_.reset();
  }

 private:
  std::uint64_t tick() { return clock_.fetch_add(1, std::memory_order_relaxed); }

  // ConcurrentCrashConfig::observe during the run: by the simulated thread whose operation
  // just returned, at its own quiescent point (it holds no lock of the index), while the other
  // threads may be parked anywhere inside theirs; so the observer reads only what the index lets
  // a concurrent reader read (counters, an epoch-pinned walk). One observer runs at a time: the
  // probe may reach scheduling points (an epoch pin), and another thread's observer must not
  // interleave with it. Not a std::mutex, which held across a scheduling point would stop the
  // baton: a flag, waited for at a scheduling point (uncontended, it adds none, so a suite's
  // schedules change only by the scheduling points its probe itself reaches).
  void observe(std::size_t op) {
    if (!cfg_.observe) return;
    // acquire / release: one observer's reads and tally happen before the next one's.
    while (observing_.exchange(true, std::memory_order_acquire)) pm::yield_point("crash.observe");
    cfg_.observe(*index_, op);
    observing_.store(false, std::memory_order_release);
  }

  void make_history() {
    ops_.clear();
    clock_.store(1, std::memory_order_relaxed);
    std::uint64_t id = 1;
    for (std::size_t i = 0; i < cfg_.preload; ++i) {
      OpRec r;
      r.kind = Kind::insert;
      r.thread = 0xff;
      r.key = 1 + i % cfg_.key_space;
      r.id = id++;
      ops_.push_back(r);
    }
    for (std::size_t t = 0; t < cfg_.threads; ++t) {
      std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ull + t + 1);
      for (std::size_t i = 0; i < cfg_.ops_per_thread; ++i) {
        OpRec r;
        r.thread = static_cast<std::uint8_t>(t);
        r.key = 1 + rng() % cfg_.key_space;
        const unsigned p = static_cast<unsigned>(rng() % 100);
        r.kind = p < 40 ? Kind::insert : p < 60 ? Kind::update : p < 80 ? Kind::remove
                                                                       : Kind::find;
        r.id = id++;
        ops_.push_back(r);
      }
    }
  }

  // A read's value must come from an invoked write of the same key.
  bool writer_plausible(const OpRec& read) const {
    for (const OpRec& w : ops_) {
      if (w.id == read.seen && w.key == read.key && w.effective_write()) return true;
    }
    return false;
  }

  // Durable linearizability of one key (the rules in index_driver.h).
  Status judge(std::uint64_t key, bool present, std::uint64_t id) const {
    auto bad = [&](const std::string& what) {
      return Status(Code::corrupted, "key " + std::to_string(key) + " " +
                                         (present ? "holds v" + std::to_string(id)
                                                  : std::string("is absent")) +
                                         " after recovery: " + what);
    };
    if (present) {
      const OpRec* w = nullptr;
      for (const OpRec& r : ops_) {
        if (r.id == id && (r.kind == Kind::insert || r.kind == Kind::update)) w = &r;
      }
      if (w == nullptr || w->key != key || !w->effective_write())
        return bad(w == nullptr ? "no operation wrote that value"
                                : "written by " + w->describe() + ", which did not take effect");
      for (const OpRec& r : ops_) {
        if (&r == w || r.key != key || !precedes(*w, r)) continue;
        // r started after w returned, so r is linearised after w.
        const bool changed = r.returned() && r.result == Code::ok && r.kind != Kind::find;
        const bool saw_other = r.returned() && r.kind == Kind::find &&
                               (r.result != Code::ok || r.seen != id);
        const bool saw_absent = r.returned() && r.result == Code::not_found;
        if (changed || saw_other || saw_absent) {
          return bad("lost: " + r.describe() + " completed after " + w->describe() +
                     " returned");
        }
      }
      return Status::Ok();
    }
    for (const OpRec& p : ops_) {
      if (p.key != key || !p.saw_present()) continue;
      bool explained = false;
      for (const OpRec& d : ops_) {
        if (d.key == key && d.effective_delete() && !precedes(d, p)) explained = true;
      }
      if (!explained) {
        return bad("lost: " + p.describe() +
                   " saw it present and no delete can be ordered after it");
      }
    }
    return Status::Ok();
  }

  ConcurrentCrashConfig cfg_;
  Options options_;
  pm::Mode mode_;
  std::uint64_t seed_;
  const IndexRegistry::Entry* entry_ = nullptr;
  std::unique_ptr<pm::Pool> pool_;
  std::unique_ptr<Index> index_;
  std::vector<OpRec> ops_;
  std::atomic<std::uint64_t> clock_{1};    // relaxed: one simulated thread runs at a time
  std::atomic<std::size_t> finished_{0};
  std::atomic<std::size_t> returned_{0};  // relaxed: one simulated thread runs at a time
  std::atomic<bool> observing_{false};
};

}  // namespace

ExploreReport run_index_crash_concurrent(const ConcurrentCrashConfig& config,
                                         const ExploreOptions& options) {
  ConcurrentIndexScenario scenario(config, options);
  return explore_concurrent(scenario, options);
}

}  // namespace pmindex::crash

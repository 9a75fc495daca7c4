// Shared-key counting test (INDEX-CHECKLIST.md, "Two-thread stress ... shared-key test"), for
// any index kind: N threads (2 by default) insert, remove, update, upsert, find and scan ONE
// shared set of ~64 keys for PMINDEX_STRESS_SECONDS. Per-thread key ranges cannot see a
// linearizability bug between two writers of the same key; this test can:
//   * per key, every thread tallies its successful inserts and removes. A linearizable index
//     alternates absent -> present -> absent for a key, so at the end
//         sum over threads (inserts_ok - removes_ok) == presence (0 or 1)
//     after verify(), and again after close + reopen of the pool file. Keys that also take
//     upserts cannot be tallied exactly (an `ok` from upsert may have inserted or updated):
//     for them  0 <= presence - inserts_ok + removes_ok <= upserts_ok  (each upsert inserts at
//     most once) -- and a remove that succeeded with nothing to remove still shows.
//   * every value a thread writes encodes (key id, thread, sequence), so a find or scan that
//     returns a value no thread wrote for that key (torn, foreign, from the future) is caught.
// Checker self-tests feed it known-bad runs through SharedKeyConfig::fault (test-only: the
// driver miscounts or writes a foreign value; the index is never touched).
//
// Thread safety: run_shared_key_test() owns its threads; call it from one test thread.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "pmindex/index.h"
#include "support/temp_dir.h"

namespace pmindex::index_test {

// PMINDEX_SHARED_KEY_SECONDS, else PMINDEX_STRESS_SECONDS: the test runs once per kind and
// mode (30 runs), so CI gives it a shorter slice than the per-index stress tests.
inline double shared_key_seconds() {
  const char* s = std::getenv("PMINDEX_SHARED_KEY_SECONDS");
  if (s == nullptr) s = std::getenv("PMINDEX_STRESS_SECONDS");
  return s != nullptr ? std::max(0.1, std::atof(s)) : 2.0;
}

struct SharedKeyConfig {
  Options options;          // kind, node_size (small: SMOs every few operations), persistence
  int threads = 2;
  std::uint64_t keys = 64;  // key ids 0..keys-1 (id 0 is key 0)
  std::uint64_t upsert_keys = 8;  // the first ids take upserts too (weaker tally, see above)
  double seconds = shared_key_seconds();
  std::uint64_t seed = 1;
  // Known-bad drivers for the checker's own tests (never a change to the index).
  enum class Fault { none, untallied_remove, foreign_value };
  Fault fault = Fault::none;
  // Optional, around the concurrent phase only (e.g. install and remove an index's test
  // hooks that inject delays; the checks run on a quiescent index after after_run).
  std::function<void(Index&)> before_run, after_run;
};

// Key id -> key: spread over the whole 64-bit space (top bits set, key 0 included).
inline std::uint64_t shared_key_word(std::uint64_t id) {
  return id * ((std::uint64_t{1} << 58) + 1);
}
inline std::string shared_key(std::uint64_t id) { return encode_u64(shared_key_word(id)); }

// Value words: id << 40 | thread << 32 | sequence (sequence from 1, per thread).
inline std::string shared_value(std::uint64_t id, int thread, std::uint32_t seq) {
  return encode_u64((id << 40) | (std::uint64_t(thread) << 32) | seq);
}

class SharedKeyRun {
 public:
  explicit SharedKeyRun(const SharedKeyConfig& cfg)
      : cfg_(cfg),
        tally_(cfg.threads, std::vector<Tally>(cfg.keys)),
        issued_(static_cast<std::size_t>(cfg.threads)) {
    for (auto& s : issued_) s.store(0, std::memory_order_relaxed);
  }

  // The concurrent phase: threads run until the deadline.
  void run(Index& idx) {
    std::atomic<bool> stop{false};
    std::vector<std::thread> ts;
    for (int t = 0; t < cfg_.threads; ++t) {
      ts.emplace_back([this, &idx, &stop, t] { worker(idx, t, stop); });
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(cfg_.seconds));
    stop.store(true, std::memory_order_relaxed);
    for (auto& th : ts) th.join();
  }

  // The quiescent check: presence of every key against the tallies, values, a full scan.
  // `when` names the phase in the messages ("end", "after reopen").
  void check(const Index& idx, const char* when) {
    std::vector<bool> present(cfg_.keys, false);
    for (std::uint64_t id = 0; id < cfg_.keys; ++id) {
      std::string v;
      const Code c = idx.find(shared_key(id), &v);
      if (c == Code::ok) {
        present[id] = true;
        check_value(id, v, when, "find");
      } else if (c != Code::not_found) {
        fail(std::string(when) + ": find of key id " + std::to_string(id) + " answered " +
             std::string(to_string(c)));
      }
      long long ins = 0, rem = 0, ups = 0;
      for (int t = 0; t < cfg_.threads; ++t) {
        ins += tally_[t][id].inserts;
        rem += tally_[t][id].removes;
        ups += tally_[t][id].upserts;
      }
      const long long p = present[id] ? 1 : 0;
      const bool exact = id >= cfg_.upsert_keys;
      const long long extra = p - ins + rem;  // insertions no insert() reported
      if (exact ? extra != 0 : (extra < 0 || extra > ups)) {
        fail(std::string(when) + ": key id " + std::to_string(id) + " present=" +
             std::to_string(p) + " but inserts_ok=" + std::to_string(ins) + " removes_ok=" +
             std::to_string(rem) + " upserts_ok=" + std::to_string(ups) +
             (exact ? " (must be inserts - removes)" : " (upsert key)"));
      }
    }
    ScanBuffer buf;
    idx.scan(encode_u64(0), cfg_.keys + 10, buf);  // every key is 8 bytes
    std::vector<bool> scanned(cfg_.keys, false);
    for (std::size_t i = 0; i < buf.size(); ++i) {
      const std::uint64_t id = id_of_key(buf.key(i));
      if (id == kNoId) {
        fail(std::string(when) + ": scan returned a key no thread wrote");
        continue;
      }
      scanned[id] = true;
      check_value(id, std::string(buf.value(i)), when, "scan");
    }
    for (std::uint64_t id = 0; id < cfg_.keys; ++id) {
      if (scanned[id] != present[id]) {
        fail(std::string(when) + ": key id " + std::to_string(id) + (present[id] ? "" : " not") +
             " found but" + (scanned[id] ? "" : " not") + " scanned");
      }
    }
  }

  const std::vector<std::string>& failures() const { return failures_; }
  std::uint64_t operations() const { return ops_.load(); }
  std::uint64_t upsert_not_found() const { return upsert_not_found_.load(); }

 private:
  struct Tally {
    long long inserts = 0, removes = 0, upserts = 0;
  };
  static constexpr std::uint64_t kNoId = ~std::uint64_t{0};

  std::uint64_t id_of_key(std::string_view key) const {
    if (key.size() != 8) return kNoId;
    const std::uint64_t w = decode_u64(key);
    const std::uint64_t id = w / ((std::uint64_t{1} << 58) + 1);
    return id < cfg_.keys && shared_key_word(id) == w ? id : kNoId;
  }

  void worker(Index& idx, int t, const std::atomic<bool>& stop) {
    Index::ThreadScope scope = idx.attach_thread();
    std::mt19937_64 rng(cfg_.seed * 7919 + static_cast<std::uint64_t>(t));
    ScanBuffer buf;
    std::string got;
    std::uint64_t n = 0;
    bool untallied = false;
    while (!stop.load(std::memory_order_relaxed)) {
      const std::uint64_t id = rng() % cfg_.keys;
      const std::string k = shared_key(id);
      const unsigned op = static_cast<unsigned>(rng() % 100);
      Tally& ty = tally_[t][id];
      if (op < 30) {
        const Code c = idx.insert(k, next_value(id, t));
        if (c == Code::ok) ++ty.inserts;
        else expect_code(c, Code::already_present, "insert", id);
      } else if (op < 60) {
        const Code c = idx.remove(k);
        if (c == Code::ok) {
          if (cfg_.fault == SharedKeyConfig::Fault::untallied_remove && !untallied) {
            untallied = true;  // known-bad driver: one success is not counted
          } else {
            ++ty.removes;
          }
        } else {
          expect_code(c, Code::not_found, "remove", id);
        }
      } else if (op < 70) {
        std::string v = next_value(id, t);
        if (cfg_.fault == SharedKeyConfig::Fault::foreign_value) {
          v = shared_value((id + 1) % cfg_.keys, t, 1);  // known-bad: another key's value
        }
        const Code c = idx.update(k, v);
        if (c != Code::ok) expect_code(c, Code::not_found, "update", id);
      } else if (op < 80 && id < cfg_.upsert_keys) {
        // An ok from upsert means "present afterwards", not "inserted": tallied apart.
        const Code c = idx.upsert(k, next_value(id, t));
        if (c == Code::ok) {
          ++ty.upserts;
        } else if (c == Code::not_found) {
          // Base Index::upsert (insert, then update on already_present) answers not_found
          // when a remove lands in between; it then changed nothing. Accepted and counted.
          upsert_not_found_.fetch_add(1, std::memory_order_relaxed);
        } else {
          expect_code(c, Code::ok, "upsert", id);
        }
      } else if (op < 95) {
        const Code c = idx.find(k, &got);
        if (c == Code::ok) check_value(id, got, "run", "find");
        else expect_code(c, Code::not_found, "find", id);
      } else {
        idx.scan(k, 8, buf);
        std::uint64_t prev = 0;
        for (std::size_t i = 0; i < buf.size(); ++i) {
          const std::uint64_t sid = id_of_key(buf.key(i));
          if (sid == kNoId || sid < id || (i > 0 && sid <= prev)) {
            fail("run: scan from key id " + std::to_string(id) + " returned key " +
                 std::to_string(sid) + " out of order or foreign");
            break;
          }
          prev = sid;
          check_value(sid, std::string(buf.value(i)), "run", "scan");
        }
      }
      ++n;
    }
    ops_.fetch_add(n);
  }

  std::string next_value(std::uint64_t id, int t) {
    // relaxed: only this thread writes its counter; readers need an upper bound that is at
    // least every sequence already written, which the write's own synchronisation provides.
    const std::uint32_t seq =
        static_cast<std::uint32_t>(issued_[t].fetch_add(1, std::memory_order_relaxed) + 1);
    return shared_value(id, t, seq);
  }

  void check_value(std::uint64_t id, const std::string& v, const char* when, const char* op) {
    bool good = v.size() == 8;
    if (good) {
      const std::uint64_t w = decode_u64(v);
      const std::uint64_t vid = w >> 40;
      const std::uint64_t vt = (w >> 32) & 0xff;
      const std::uint64_t seq = w & 0xffffffffu;
      good = vid == id && (w >> 40 << 40 | vt << 32 | seq) == w &&
             vt < static_cast<std::uint64_t>(cfg_.threads) && seq >= 1 &&
             seq <= issued_[vt].load(std::memory_order_relaxed);
    }
    if (!good) {
      fail(std::string(when) + ": " + op + " of key id " + std::to_string(id) +
           " returned a value no thread wrote for it (" + std::to_string(v.size()) + " bytes)");
    }
  }

  void expect_code(Code c, Code want, const char* op, std::uint64_t id) {
    if (c != want) {
      fail(std::string("run: ") + op + " of key id " + std::to_string(id) + " answered " +
           std::string(to_string(c)));
    }
  }

  void fail(std::string msg) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failures_.size() < 20) failures_.push_back(std::move(msg));
    else if (failures_.size() == 20) failures_.push_back("...");
  }

  const SharedKeyConfig cfg_;
  std::vector<std::vector<Tally>> tally_;  // [thread][key id], written by its thread only
  std::vector<std::atomic<std::uint64_t>> issued_;  // per thread: highest sequence issued
  std::atomic<std::uint64_t> ops_{0};
  std::atomic<std::uint64_t> upsert_not_found_{0};
  std::mutex mu_;
  std::vector<std::string> failures_;
};

// The whole test: create a pool file under a temp dir, run, verify, check, close, reopen,
// verify, check. Returns the failures (empty: the index passed).
inline std::vector<std::string> run_shared_key_test(SharedKeyConfig cfg,
                                                    std::uint64_t* ops = nullptr) {
  testing::TempDir dir;
  cfg.options.path = dir.file("shared.pool");
  cfg.options.open_mode = OpenMode::create;
  SharedKeyRun run(cfg);
  std::vector<std::string> out;
  {
    auto r = Index::open(cfg.options);
    if (!r.ok()) return {"open: " + r.status().to_string()};
    std::unique_ptr<Index> idx = std::move(r).value();
    if (cfg.before_run) cfg.before_run(*idx);
    run.run(*idx);
    if (cfg.after_run) cfg.after_run(*idx);
    if (Status s = idx->verify(); !s.ok()) out.push_back("verify at the end: " + s.to_string());
    run.check(*idx, "end");
    if (Status s = idx->close(); !s.ok()) out.push_back("close: " + s.to_string());
  }
  cfg.options.open_mode = OpenMode::open;
  auto r = Index::open(cfg.options);
  if (!r.ok()) {
    out.push_back("reopen: " + r.status().to_string());
  } else {
    std::unique_ptr<Index> idx = std::move(r).value();
    if (Status s = idx->verify(); !s.ok()) out.push_back("verify after reopen: " + s.to_string());
    run.check(*idx, "after reopen");
    (void)idx->close();
  }
  out.insert(out.end(), run.failures().begin(), run.failures().end());
  if (ops != nullptr) *ops = run.operations();
  if (run.upsert_not_found() != 0) {
    std::printf("[shared-key] %s: upsert answered not_found %llu times (accepted)\n",
                cfg.options.kind.c_str(),
                static_cast<unsigned long long>(run.upsert_not_found()));
  }
  return out;
}

}  // namespace pmindex::index_test

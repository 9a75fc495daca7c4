// The kill -9 harness (include/pmindex/crash/kill_harness.h).
#include "pmindex/crash/kill_harness.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <sstream>
#include <thread>

#include "crash/workload.h"
#include "pmindex/pm/persist.h"

namespace pmindex::crash {

namespace {

// Shared between parent and child (MAP_SHARED anonymous). Writer thread t of the child writes
// `started[t]` before and `acked[t]` after each of its operations, with release order so the
// parent (which reads them only after waitpid) sees a consistent pair per writer.
struct SharedLog {
  std::atomic<std::uint64_t> started[KillConfig::kMaxWriters];
  std::atomic<std::uint64_t> acked[KillConfig::kMaxWriters];
  std::atomic<std::uint32_t> child_error;  // 0 ok, else the child's exit reason
  std::atomic<std::uint32_t> opened;       // the child finished Index::open
  std::atomic<std::uint32_t> failing;      // one writer claims `message` (CAS 0 -> 1)
  char message[512];
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);

// Child side, tracing flavour: kills the process at the k-th persistence-API call, counted
// over all writer threads.
class KillSink final : public pm::TraceSink {
 public:
  explicit KillSink(std::uint64_t k) : k_(k) {}
  void on_store(const void*, std::size_t) override { tick(); }
  void on_flush(const void*, std::size_t) override { tick(); }
  void on_fence() override { tick(); }
  void on_yield_point(std::string_view) override {}

 private:
  void tick() {
    // relaxed: only the count matters; the kill ends every thread at once.
    if (count_.fetch_add(1, std::memory_order_relaxed) + 1 == k_) raise(SIGKILL);
  }
  std::uint64_t k_;
  std::atomic<std::uint64_t> count_{0};
};

// Writer t of `writers` owns the keys k with (k - 1) % writers == t.
unsigned owner_of(std::uint64_t key, unsigned writers) {
  return static_cast<unsigned>((key - 1) % writers);
}

// One writer's share of a cycle: its operations (keys already mapped into its share) and the
// oracle of its keys.
struct WriterPlan {
  std::vector<WorkOp> ops;
  Oracle oracle;
};

// Writer t's operations: a workload over its own dense key range 1..n, mapped to its keys.
std::vector<WorkOp> writer_ops(std::uint64_t seed, std::size_t count, std::uint64_t key_space,
                               unsigned writers, unsigned t) {
  const std::uint64_t share = (key_space - t + writers - 1) / writers;  // keys k <= key_space
  std::vector<WorkOp> ops = make_workload(seed, count, share);
  for (WorkOp& op : ops) op.key = (op.key - 1) * writers + t + 1;
  return ops;
}

std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  std::uint64_t z = h + 0x9e3779b97f4a7c15ull + v;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

struct KillPlan {
  bool by_event = false;
  bool before_open = false;
  std::uint64_t event = 0;
  unsigned delay_us = 0;
  bool from_start = false;   // random-time kill: delay counted from the writers' first ops
                             // (else from the fork, so some land inside recovery)
  bool clean_close = false;  // the child closes cleanly if it finishes

  std::string describe() const {
    if (!by_event)
      return "kill at " + std::to_string(delay_us) + " us after the " +
             (from_start ? "writers started" : "fork");
    return "kill at persistence call " + std::to_string(event) +
           (before_open ? " counted from before the open (inside recovery)" : " after the open");
  }
};

[[noreturn]] void child_fail(SharedLog* log, std::uint32_t code, const std::string& what) {
  std::uint32_t none = 0;
  // The first failing writer writes the message; acq_rel so a second one waits for nothing.
  if (log->failing.compare_exchange_strong(none, 1, std::memory_order_acq_rel)) {
    const std::size_t n = std::min(what.size(), sizeof log->message - 1);
    std::memcpy(log->message, what.data(), n);
    log->message[n] = '\0';
    log->child_error.store(code, std::memory_order_release);
  }
  _exit(static_cast<int>(code));
}

// One writer thread of the child: its operations in order, each acknowledged after it returns.
void run_writer(Index& idx, unsigned t, unsigned writers, const WriterPlan& plan,
                std::atomic<unsigned>* arrived, SharedLog* log) {
  // Start together, so a kill finds every writer under way (thread start-up can take
  // milliseconds on a loaded machine). acq_rel/acquire: only the count matters.
  arrived->fetch_add(1, std::memory_order_acq_rel);
  while (arrived->load(std::memory_order_acquire) < writers) std::this_thread::yield();
  Oracle oracle = plan.oracle;
  const auto owns = [t, writers](std::uint64_t key) {
    return key >= 1 && owner_of(key, writers) == t;
  };
  for (std::size_t i = 0; i < plan.ops.size(); ++i) {
    log->started[t].store(i + 1, std::memory_order_release);
    if (Status s = apply_checked(idx, plan.ops[i], oracle, 8, owns); !s.ok())
      child_fail(log, 3, "child: writer " + std::to_string(t) + ", op " + std::to_string(i) +
                             ": " + s.to_string());
    log->acked[t].store(i + 1, std::memory_order_release);
  }
}

[[noreturn]] void run_child(const KillConfig& cfg, const KillPlan& plan,
                            const std::vector<WriterPlan>& writers, SharedLog* log) {
  KillSink sink(plan.event);
  if (plan.by_event && plan.before_open) pm::Runtime::set_trace_sink(&sink);
  Options o = cfg.options;
  o.open_mode = OpenMode::open;
  auto opened = Index::open(o);
  if (!opened.ok()) child_fail(log, 2, "child: open failed: " + opened.status().to_string());
  std::unique_ptr<Index> idx = std::move(opened).value();
  log->opened.store(1, std::memory_order_release);
  if (plan.by_event && !plan.before_open) pm::Runtime::set_trace_sink(&sink);
  const unsigned n = static_cast<unsigned>(writers.size());
  std::atomic<unsigned> arrived{0};
  std::vector<std::thread> threads;
  for (unsigned t = 1; t < n; ++t)
    threads.emplace_back(run_writer, std::ref(*idx), t, n, std::cref(writers[t]), &arrived, log);
  run_writer(*idx, 0, n, writers[0], &arrived, log);
  for (std::thread& th : threads) th.join();
  pm::Runtime::set_trace_sink(nullptr);
  if (plan.clean_close) (void)idx->close();
  _exit(0);
}

}  // namespace

KillConfig KillConfig::from_env(std::size_t default_cycles) {
  KillConfig c;
  c.cycles = default_cycles;
  if (const char* s = std::getenv("PMINDEX_KILL_CYCLES"); s != nullptr && *s != '\0')
    c.cycles = std::strtoull(s, nullptr, 10);
  if (const char* s = std::getenv("PMINDEX_KILL_SEED"); s != nullptr && *s != '\0')
    c.seed = std::strtoull(s, nullptr, 0);
  return c;
}

std::string KillReport::to_string() const {
  std::ostringstream out;
  out << cycles << " cycles (" << random_kills << " random-time kills, " << event_kills
      << " kills at a persistence call, " << kills_in_recovery << " landed inside open/recovery, "
      << finished_unkilled << " children finished unkilled), " << acknowledged
      << " acknowledged ops (per writer:";
  for (std::size_t a : acknowledged_by_writer) out << " " << a;
  out << "), in-flight writes present " << in_flight_present << " / absent " << in_flight_absent;
  for (const std::string& f : failures) out << "\nFAILURE: " << f;
  return out.str();
}

namespace {

KillPlan plan_cycle(const KillConfig& cfg, std::size_t cycle, std::mt19937_64& rng) {
  KillPlan plan;
  plan.by_event = pm::kTracing && cycle % 2 == 1;
  plan.before_open = plan.by_event && rng() % 4 == 0;
  plan.event = plan.before_open ? 1 + rng() % std::max<std::uint64_t>(cfg.max_open_event, 1)
                                : 1 + rng() % std::max<std::uint64_t>(cfg.max_kill_event, 1);
  plan.delay_us = static_cast<unsigned>(rng() % std::max(cfg.max_kill_delay_us, 1u));
  plan.from_start = rng() % 2 == 0;
  plan.clean_close = rng() % 8 == 0;
  return plan;
}

// Forks the child, kills it as planned and reaps it. Returns "" or what went wrong; *killed
// says whether the child died of SIGKILL (rather than finishing its operations).
std::string run_and_reap(const KillConfig& cfg, const KillPlan& plan,
                         const std::vector<WriterPlan>& writers, SharedLog* log, bool* killed) {
  for (unsigned t = 0; t < KillConfig::kMaxWriters; ++t) {
    log->started[t].store(0, std::memory_order_relaxed);
    log->acked[t].store(0, std::memory_order_relaxed);
  }
  log->child_error.store(0, std::memory_order_relaxed);
  log->opened.store(0, std::memory_order_relaxed);
  log->failing.store(0, std::memory_order_relaxed);
  log->message[0] = '\0';
  const pid_t pid = fork();
  if (pid < 0) return "fork failed";
  if (pid == 0) run_child(cfg, plan, writers, log);

  int wstatus = 0;
  bool reaped = false;
  if (!plan.by_event) {
    // acquire: pairs with the writers' release stores of started[].
    const auto all_started = [&] {
      for (unsigned t = 0; t < writers.size(); ++t)
        if (log->started[t].load(std::memory_order_acquire) == 0) return false;
      return true;
    };
    const auto give_up =
        std::chrono::steady_clock::now() + std::chrono::seconds(cfg.child_timeout_s);
    while (plan.from_start && !all_started() && std::chrono::steady_clock::now() < give_up) {
      if (waitpid(pid, &wstatus, WNOHANG) != 0) {  // the child ended (failed) before
        reaped = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (!reaped) {
      std::this_thread::sleep_for(std::chrono::microseconds(plan.delay_us));
      kill(pid, SIGKILL);
    }
  }
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(cfg.child_timeout_s);
  while (!reaped && waitpid(pid, &wstatus, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &wstatus, 0);
      return "the child did not finish within " + std::to_string(cfg.child_timeout_s) + " s";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) != 0) {
    if (log->message[0] != '\0') return log->message;
    return "the child exited with status " + std::to_string(WEXITSTATUS(wstatus));
  }
  if (WIFSIGNALED(wstatus) && WTERMSIG(wstatus) != SIGKILL)
    return "the child died of signal " + std::to_string(WTERMSIG(wstatus));
  *killed = WIFSIGNALED(wstatus);
  return "";
}

// The first key where two states differ, for failure messages.
std::string first_difference(const Oracle& got, const Oracle& want) {
  auto g = got.begin();
  auto w = want.begin();
  while (g != got.end() && w != want.end() && *g == *w) ++g, ++w;
  if (g == got.end() && w == want.end()) return "none";
  if (w == want.end() || (g != got.end() && g->first < w->first))
    return "key " + std::to_string(decode_u64(g->first)) + " recovered but not expected";
  if (g == got.end() || w->first < g->first)
    return "key " + std::to_string(decode_u64(w->first)) + " expected but not recovered";
  return "key " + std::to_string(decode_u64(g->first)) + " has another value";
}

// Reopens and recovers the pool and checks it against the writers' oracles: every acknowledged
// op durable, each writer's op in flight either way, judged on that writer's keys alone (the
// writers' shares are disjoint, so their in-flight choices are independent). On success each
// writer's oracle becomes the state that matched.
std::string check_recovered(const KillConfig& cfg, std::vector<WriterPlan>& writers,
                            const SharedLog& log, KillReport* report) {
  const unsigned n = static_cast<unsigned>(writers.size());
  std::vector<Oracle> without(n), with(n);
  std::vector<bool> in_flight(n);
  for (unsigned t = 0; t < n; ++t) {
    // acquire: pairs with the child's release stores (the child is dead by now anyway).
    const std::uint64_t acked = log.acked[t].load(std::memory_order_acquire);
    const std::uint64_t started = log.started[t].load(std::memory_order_acquire);
    report->acknowledged += acked;
    report->acknowledged_by_writer[t] += acked;
    without[t] = writers[t].oracle;
    for (std::uint64_t i = 0; i < acked; ++i) apply_to_oracle(writers[t].ops[i], without[t]);
    in_flight[t] = started > acked;
    with[t] = without[t];
    if (in_flight[t]) apply_to_oracle(writers[t].ops[acked], with[t]);
  }
  if (cfg.tamper_pool) cfg.tamper_pool(cfg.options.path);
  Options o = cfg.options;
  o.open_mode = OpenMode::open;
  auto reopened = Index::open(o);
  if (!reopened.ok()) return "reopen failed: " + reopened.status().to_string();
  std::unique_ptr<Index> idx = std::move(reopened).value();
  if (Status s = idx->verify(); !s.ok()) return "verify after recovery: " + s.to_string();
  // What the index holds, by scan, split into the writers' shares.
  std::vector<Oracle> got(n);
  ScanBuffer buf;
  idx->scan(encode_u64(0), static_cast<std::size_t>(cfg.key_space) + 16, buf);
  for (std::size_t i = 0; i < buf.size(); ++i) {
    const std::uint64_t key = decode_u64(buf.key(i));
    if (key < 1 || key > cfg.key_space)
      return "recovered key " + std::to_string(key) + " that no writer ever wrote";
    if (!got[owner_of(key, n)].emplace(buf.key(i), buf.value(i)).second)
      return "scan returned key " + std::to_string(key) + " twice";
  }
  for (unsigned t = 0; t < n; ++t) {
    const std::uint64_t acked = log.acked[t].load(std::memory_order_acquire);
    if (got[t] == without[t] || (in_flight[t] && got[t] == with[t])) continue;
    return "writer " + std::to_string(t) + " after " + std::to_string(acked) +
           " acknowledged ops (" +
           (in_flight[t] ? "op " + std::to_string(acked) + " " +
                               describe(writers[t].ops[acked]) + " in flight"
                         : std::string("none in flight")) +
           "): recovered contents match no acceptable state (" +
           first_difference(got[t], without[t]) + ")";
  }
  // Point lookups take other paths than scans in most indexes: every key, absent ones too.
  std::string value;
  for (std::uint64_t key = 0; key <= cfg.key_space + 1; ++key) {
    const std::string k = encode_u64(key);
    const Oracle* share = key >= 1 && key <= cfg.key_space ? &got[owner_of(key, n)] : nullptr;
    const auto it = share != nullptr ? share->find(k) : Oracle::const_iterator{};
    const bool want = share != nullptr && it != share->end();
    const Code c = idx->find(k, &value);
    if ((c == Code::ok) != want || (want && value != it->second))
      return "find(" + std::to_string(key) + ") disagrees with the recovered scan";
  }
  for (unsigned t = 0; t < n; ++t) {
    if (in_flight[t] && with[t] != without[t]) {
      if (got[t] == with[t]) ++report->in_flight_present;
      else ++report->in_flight_absent;
    }
    writers[t].oracle = std::move(got[t]);
  }
  // The parent's own session ends like a crash most of the time, cleanly sometimes.
  if (report->acknowledged % 4 == 0) (void)idx->close();
  return "";
}

}  // namespace

KillReport run_kill_cycles(const KillConfig& cfg) {
  KillReport report;
  if (cfg.options.path.empty()) {
    report.failures.push_back("the kill harness needs a pool file path");
    return report;
  }
  if (cfg.writers < 1 || cfg.writers > KillConfig::kMaxWriters || cfg.key_space < cfg.writers) {
    report.failures.push_back("writers must be 1.." + std::to_string(KillConfig::kMaxWriters) +
                              " and at most key_space");
    return report;
  }
  std::error_code ec;
  std::filesystem::remove(cfg.options.path, ec);
  {
    Options o = cfg.options;
    o.open_mode = OpenMode::create;
    auto created = Index::open(o);
    if (!created.ok()) {
      report.failures.push_back("cannot create the pool: " + created.status().to_string());
      return report;
    }
  }  // dropped without close(): the first child already recovers

  void* mem = mmap(nullptr, sizeof(SharedLog), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    report.failures.push_back("cannot map the shared log");
    return report;
  }
  auto* log = new (mem) SharedLog{};
  std::mt19937_64 rng(cfg.seed);
  const unsigned n = cfg.writers;
  report.acknowledged_by_writer.assign(n, 0);
  std::vector<WriterPlan> writers(n);
  for (std::size_t cycle = 0; cycle < cfg.cycles; ++cycle) {
    const KillPlan plan = plan_cycle(cfg, cycle, rng);
    for (unsigned t = 0; t < n; ++t)
      writers[t].ops = writer_ops(mix(mix(cfg.seed, cycle), t), cfg.max_ops_per_cycle / n,
                                  cfg.key_space, n, t);
    auto fail = [&](const std::string& what) {
      report.failures.push_back("seed " + std::to_string(cfg.seed) + ", cycle " +
                                std::to_string(cycle) + " (" + plan.describe() + ", " +
                                std::to_string(n) + " writers): " + what +
                                " [replay: PMINDEX_KILL_SEED=" + std::to_string(cfg.seed) +
                                "; kills are not deterministic with several writers]");
    };
    bool killed = false;
    if (std::string e = run_and_reap(cfg, plan, writers, log, &killed); !e.empty()) {
      ++report.cycles;
      fail(e);
      break;
    }
    ++report.cycles;
    if (!killed) ++report.finished_unkilled;
    else if (!plan.by_event) ++report.random_kills;
    else ++report.event_kills;
    if (killed && log->opened.load(std::memory_order_acquire) == 0) ++report.kills_in_recovery;
    if (std::string e = check_recovered(cfg, writers, *log, &report); !e.empty()) {
      fail(e);
      break;
    }
  }
  munmap(mem, sizeof(SharedLog));
  std::filesystem::remove(cfg.options.path, ec);
  return report;
}

}  // namespace pmindex::crash

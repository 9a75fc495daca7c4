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
#include <random>
#include <sstream>
#include <thread>

#include "crash/workload.h"
#include "pmindex/pm/persist.h"

namespace pmindex::crash {

namespace {

// Shared between parent and child (MAP_SHARED anonymous). The child writes `started` before
// and `acked` after each operation, with release order so the parent (which reads them only
// after waitpid) sees a consistent pair.
struct SharedLog {
  std::atomic<std::uint64_t> started;
  std::atomic<std::uint64_t> acked;
  std::atomic<std::uint32_t> child_error;  // 0 ok, else the child's exit reason
  std::atomic<std::uint32_t> opened;       // the child finished Index::open
  char message[512];
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);

// Child side, tracing flavour: kills the process at the k-th persistence-API call.
class KillSink final : public pm::TraceSink {
 public:
  explicit KillSink(std::uint64_t k) : k_(k) {}
  void on_store(const void*, std::size_t) override { tick(); }
  void on_flush(const void*, std::size_t) override { tick(); }
  void on_fence() override { tick(); }
  void on_yield_point(std::string_view) override {}

 private:
  void tick() {
    if (++count_ == k_) raise(SIGKILL);
  }
  std::uint64_t k_;
  std::uint64_t count_ = 0;
};

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
  bool clean_close = false;  // the child closes cleanly if it finishes

  std::string describe() const {
    if (!by_event) return "kill at " + std::to_string(delay_us) + " us";
    return "kill at persistence call " + std::to_string(event) +
           (before_open ? " counted from before the open (inside recovery)" : " after the open");
  }
};

void child_fail(SharedLog* log, std::uint32_t code, const std::string& what) {
  const std::size_t n = std::min(what.size(), sizeof log->message - 1);
  std::memcpy(log->message, what.data(), n);
  log->message[n] = '\0';
  log->child_error.store(code, std::memory_order_release);
  _exit(static_cast<int>(code));
}

[[noreturn]] void run_child(const KillConfig& cfg, const KillPlan& plan,
                            const std::vector<WorkOp>& ops, Oracle oracle, SharedLog* log) {
  KillSink sink(plan.event);
  if (plan.by_event && plan.before_open) pm::Runtime::set_trace_sink(&sink);
  Options o = cfg.options;
  o.open_mode = OpenMode::open;
  auto opened = Index::open(o);
  if (!opened.ok()) child_fail(log, 2, "child: open failed: " + opened.status().to_string());
  std::unique_ptr<Index> idx = std::move(opened).value();
  log->opened.store(1, std::memory_order_release);
  if (plan.by_event && !plan.before_open) pm::Runtime::set_trace_sink(&sink);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    log->started.store(i + 1, std::memory_order_release);
    if (Status s = apply_checked(*idx, ops[i], oracle, 8); !s.ok())
      child_fail(log, 3, "child: op " + std::to_string(i) + ": " + s.to_string());
    log->acked.store(i + 1, std::memory_order_release);
  }
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
      << " acknowledged ops, in-flight writes present " << in_flight_present << " / absent "
      << in_flight_absent;
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
  plan.clean_close = rng() % 8 == 0;
  return plan;
}

// Forks the child, kills it as planned and reaps it. Returns "" or what went wrong; *killed
// says whether the child died of SIGKILL (rather than finishing its operations).
std::string run_and_reap(const KillConfig& cfg, const KillPlan& plan,
                         const std::vector<WorkOp>& ops, const Oracle& oracle, SharedLog* log,
                         bool* killed) {
  log->started.store(0, std::memory_order_relaxed);
  log->acked.store(0, std::memory_order_relaxed);
  log->child_error.store(0, std::memory_order_relaxed);
  log->opened.store(0, std::memory_order_relaxed);
  log->message[0] = '\0';
  const pid_t pid = fork();
  if (pid < 0) return "fork failed";
  if (pid == 0) run_child(cfg, plan, ops, oracle, log);

  if (!plan.by_event) {
    std::this_thread::sleep_for(std::chrono::microseconds(plan.delay_us));
    kill(pid, SIGKILL);
  }
  int wstatus = 0;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(cfg.child_timeout_s);
  while (waitpid(pid, &wstatus, WNOHANG) == 0) {
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

// Reopens and recovers the pool and checks it against the oracle: every acknowledged op
// durable, the one in flight either way. On success *oracle becomes the state that matched.
std::string check_recovered(const KillConfig& cfg, const std::vector<WorkOp>& ops,
                            std::uint64_t acked, std::uint64_t started, Oracle* oracle,
                            KillReport* report) {
  for (std::uint64_t i = 0; i < acked; ++i) apply_to_oracle(ops[i], *oracle);
  const bool in_flight = started > acked;
  Oracle with_in_flight;
  if (in_flight) {
    with_in_flight = *oracle;
    apply_to_oracle(ops[acked], with_in_flight);
  }
  if (cfg.tamper_pool) cfg.tamper_pool(cfg.options.path);
  Options o = cfg.options;
  o.open_mode = OpenMode::open;
  auto reopened = Index::open(o);
  if (!reopened.ok()) return "reopen failed: " + reopened.status().to_string();
  std::unique_ptr<Index> idx = std::move(reopened).value();
  if (Status s = idx->verify(); !s.ok()) return "verify after recovery: " + s.to_string();
  Oracle matched;
  if (Status s = match_contents(*idx, cfg.key_space, *oracle,
                                in_flight ? &with_in_flight : nullptr, &matched);
      !s.ok()) {
    return "after " + std::to_string(acked) + " acknowledged ops (" +
           (in_flight ? "op " + std::to_string(acked) + " " + describe(ops[acked]) + " in flight"
                      : std::string("none in flight")) +
           "): " + s.to_string();
  }
  if (in_flight && with_in_flight != *oracle) {
    if (matched == with_in_flight) ++report->in_flight_present;
    else ++report->in_flight_absent;
  }
  *oracle = std::move(matched);
  // The parent's own session ends like a crash most of the time, cleanly sometimes.
  if (acked % 4 == 0) (void)idx->close();
  return "";
}

}  // namespace

KillReport run_kill_cycles(const KillConfig& cfg) {
  KillReport report;
  if (cfg.options.path.empty()) {
    report.failures.push_back("the kill harness needs a pool file path");
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
  Oracle oracle;
  for (std::size_t cycle = 0; cycle < cfg.cycles; ++cycle) {
    const KillPlan plan = plan_cycle(cfg, cycle, rng);
    const std::vector<WorkOp> ops =
        make_workload(mix(cfg.seed, cycle), cfg.max_ops_per_cycle, cfg.key_space);
    auto fail = [&](const std::string& what) {
      report.failures.push_back("seed " + std::to_string(cfg.seed) + ", cycle " +
                                std::to_string(cycle) + " (" + plan.describe() + "): " + what +
                                " [replay: PMINDEX_KILL_SEED=" + std::to_string(cfg.seed) +
                                "; event kills are deterministic, random-time kills are not]");
    };
    bool killed = false;
    if (std::string e = run_and_reap(cfg, plan, ops, oracle, log, &killed); !e.empty()) {
      ++report.cycles;
      fail(e);
      break;
    }
    ++report.cycles;
    if (!killed) ++report.finished_unkilled;
    else if (!plan.by_event) ++report.random_kills;
    else ++report.event_kills;
    if (killed && log->opened.load(std::memory_order_acquire) == 0) ++report.kills_in_recovery;
    // acquire: pairs with the child's release stores (the child is dead by now anyway).
    const std::uint64_t acked = log->acked.load(std::memory_order_acquire);
    const std::uint64_t started = log->started.load(std::memory_order_acquire);
    report.acknowledged += acked;
    if (std::string e = check_recovered(cfg, ops, acked, started, &oracle, &report); !e.empty()) {
      fail(e);
      break;
    }
  }
  munmap(mem, sizeof(SharedLog));
  std::filesystem::remove(cfg.options.path, ec);
  return report;
}

}  // namespace pmindex::crash

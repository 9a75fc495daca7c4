// The crash explorer: plan pass, check pass, replay (include/pmindex/crash/explorer.h).
#include "pmindex/crash/explorer.h"

#include "pmindex/crash/scheduler.h"
#include "pmindex/pm/image_bytes.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>
#include <thread>
#include <unordered_set>

// Present only in sanitizer builds: lets us name the image being checked when a check dies.
extern "C" void __sanitizer_set_death_callback(void (*callback)()) __attribute__((weak));

namespace pmindex::crash {

namespace {

std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  std::uint64_t z = h + 0x9e3779b97f4a7c15ull + v;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// --- naming the image under check if the process dies -----------------------------------------
// A recovery that crashes on a bad image must still print its replay token. The thread that
// runs a check writes the token into its own fixed buffer first; the death callback / signal
// handler, which runs on the thread that died, writes that thread's buffer out with write(2)
// (async-signal-safe). Thread-local, so explorations on several threads (and a nested
// exploration of a crash during recovery, whose checks run on a worker of its own) never share
// or overwrite each other's text.
thread_local char g_current[512];
thread_local std::size_t g_current_len = 0;

void print_current() {
  if (g_current_len == 0) return;
  static const char kPrefix[] = "\n[crash simulator] died while checking image ";
  (void)!write(2, kPrefix, sizeof kPrefix - 1);
  (void)!write(2, g_current, g_current_len);
  (void)!write(2, "\n", 1);
}

void on_fatal_signal(int sig) {
  print_current();
  signal(sig, SIG_DFL);
  raise(sig);
}

void install_death_reporting() {
  static std::once_flag once;
  std::call_once(once, [] {
    // abort() (a failed assert in recovery) is not the sanitizers' business: always ours.
    signal(SIGABRT, &on_fatal_signal);
    if (__sanitizer_set_death_callback != nullptr) {
      __sanitizer_set_death_callback(&print_current);  // they own SIGSEGV/SIGBUS/SIGFPE
      return;
    }
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL}) signal(sig, &on_fatal_signal);
  });
}

void set_current(const std::string& text) {
  const std::string line = "PMINDEX_CRASH_REPLAY='" + text + "'";
  g_current_len = std::min(line.size(), sizeof g_current);
  std::memcpy(g_current, line.data(), g_current_len);
}

// --- the worker thread that runs image checks --------------------------------------------------
// Checks run on their own thread so that a recovering index never shares thread-local state
// (thread slots, epoch attachments) with the index that is stopped at the crash point.
class Worker {
 public:
  Worker() : thread_([this] { loop(); }) {}
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void run(const std::function<void()>& job) {
    std::unique_lock<std::mutex> lock(mu_);
    job_ = &job;
    cv_.notify_all();
    cv_.wait(lock, [this] { return job_ == nullptr; });
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return quit_ || job_ != nullptr; });
      if (job_ == nullptr) return;
      const std::function<void()>* job = job_;
      lock.unlock();  // the caller is parked until job_ is cleared; nothing else needs mu_
      (*job)();
      lock.lock();
      job_ = nullptr;
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void()>* job_ = nullptr;
  bool quit_ = false;
  std::thread thread_;
};

std::string choice_text(std::span<const std::uint32_t> c) {
  if (c.empty()) return "-";
  std::string s;
  for (std::size_t i = 0; i < c.size(); ++i) {
    if (i != 0) s += '.';
    s += std::to_string(c[i]);
  }
  return s;
}

std::uint64_t parse_seed(const char* text) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text, &end, 0);
  if (errno == 0 && end != text && *end == '\0') return v;
  // Not a number (e.g. a commit hash given verbatim): FNV-1a of the text.
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const char* p = text; *p; ++p) h = (h ^ static_cast<unsigned char>(*p)) * 0x100000001b3ull;
  return h;
}

// The per-run state both passes share.
struct Run {
  using CheckFn = std::function<Status(std::span<char>, const CrashPoint&, std::uint64_t)>;
  using PassFn = std::function<void(const Tracer::CrashHook&, Tracer&)>;
  const ExploreOptions& opt;
  ExploreReport& report;
  Worker& worker;
  CheckFn check_image;
  bool stop = false;

  void fail(std::string message, ReplayToken token, bool image = true) {
    report.failures.push_back({std::move(message), std::move(token), image});
    if (report.failures.size() >= std::max<std::size_t>(opt.max_failures, 1)) stop = true;
  }
  ReplayToken token(const CrashPoint& at, std::span<const std::uint32_t> choice) const {
    return {opt.label, opt.seed, at.op, at.index, {choice.begin(), choice.end()}};
  }

  // Runs setup and every operation with `hook` at each crash point.
  void sequential_pass(Scenario& scenario, const Tracer::CrashHook& hook, Tracer& tracer) {
    tracer.start();
    Result<Region> region = scenario.setup();
    if (!region.ok()) {
      tracer.stop();
      fail("setup failed: " + region.status().to_string(), {opt.label, opt.seed, 0, 0, {}},
           false);
      return;
    }
    tracer.bind(region->base, region->size, region->preloaded);
    tracer.set_crash_hook(hook);
    const std::size_t n = scenario.op_count();
    std::size_t i = 0;
    for (; i < n && !stop; ++i) {
      if (opt.check_bypass) {
        if (std::string b = tracer.check_bypass(); !b.empty()) {
          fail("before op " + std::to_string(i) + ": " + b, {opt.label, opt.seed, i, 0, {}},
               false);
          break;
        }
      }
      tracer.begin_op(i);
      if (Status s = scenario.run_op(i); !s.ok()) {
        fail("op " + std::to_string(i) + " misbehaved on the live pool: " + s.to_string(),
             {opt.label, opt.seed, i, 0, {}}, false);
        break;
      }
      tracer.end_op();
    }
    if (opt.check_bypass && !stop && report.failures.empty()) {
      if (std::string b = tracer.check_bypass(); !b.empty())
        fail("after the last op: " + b, {opt.label, opt.seed, i, 0, {}}, false);
    }
    report.ops = std::max(report.ops, i);
    report.crash_points = tracer.crash_points();
    tracer.stop();
    scenario.teardown();
  }

  // The multi-threaded pass: setup on this thread, then the scenario's threads under a
  // scheduler seeded with opt.seed. Crash point numbering counts operation returns globally.
  void concurrent_pass(ConcurrentScenario& scenario, const Tracer::CrashHook& hook,
                       Tracer& tracer) {
    tracer.start();
    Result<Region> region = scenario.setup();
    if (!region.ok()) {
      tracer.stop();
      fail("setup failed: " + region.status().to_string(), {opt.label, opt.seed, 0, 0, {}},
           false);
      return;
    }
    tracer.bind(region->base, region->size, region->preloaded);
    tracer.set_crash_hook(hook);
    Scheduler scheduler(mix(opt.seed, 0x5c4e));
    tracer.set_scheduler(&scheduler);
    struct Context final : OpContext {
      Run* run;
      Tracer* tracer;
      std::size_t returned = 0;
      void op_returned() override {
        if (run->opt.check_bypass && run->report.failures.empty()) {
          if (std::string b = tracer->check_bypass(); !b.empty())
            fail(Status(Code::corrupted, b));
        }
        tracer->end_op();
        tracer->begin_op(++returned);
      }
      void fail(const Status& s) override {
        run->fail("operation " + std::to_string(returned) + " (concurrent): " + s.to_string(),
                  {run->opt.label, run->opt.seed, returned, 0, {}}, false);
      }
    } ctx;
    ctx.run = this;
    ctx.tracer = &tracer;
    tracer.begin_op(0);
    std::vector<std::function<void()>> bodies;
    for (std::size_t t = 0; t < scenario.threads(); ++t)
      bodies.push_back([&scenario, &ctx, t] { scenario.run_thread(t, ctx); });
    scheduler.run(bodies);
    tracer.set_scheduler(nullptr);
    report.ops = std::max(report.ops, ctx.returned);
    report.crash_points = tracer.crash_points();
    report.schedule_steps = scheduler.schedule().size();
    tracer.stop();
    scenario.teardown();
  }

  void check(Tracer& tracer, const CrashPoint& at, std::span<const std::uint32_t> choice,
             std::uint64_t key, pm::ImageBytes& image) {
    if (!tracer.materialize(choice, image.data())) {
      fail("choice vector " + choice_text(choice) + " does not fit the " +
               std::to_string(tracer.lanes().size()) + " pending lane(s) at op " +
               std::to_string(at.op) + " crash point " + std::to_string(at.index),
           token(at, choice));
      return;
    }
    const std::string current = token(at, choice).to_string();
    Status status;
    const std::function<void()> job = [&] {
      set_current(current);  // on the worker: the thread a failing recovery dies on
      status = check_image({image.data(), image.size()}, at, mix(opt.seed, key));
      g_current_len = 0;
    };
    worker.run(job);
    ++report.images_checked;
    if (!status.ok()) {
      fail("op " + std::to_string(at.op) + ", crash point " + std::to_string(at.index) +
               (at.completed ? " (at the op's return: it must be durable)" : " (op in flight)") +
               ", " + std::to_string(tracer.lanes().size()) + " pending lane(s): " +
               status.to_string(),
           token(at, choice));
    }
  }
};

std::uint64_t point_seed(const ExploreOptions& o, const CrashPoint& at) {
  return mix(mix(o.seed, at.op), at.index);
}

// Per crash point, which distinct candidates to check: the first `cap` (in candidate_choices'
// priority order: everything, nothing, each lane alone, all but one lane, then combinations),
// and `extra`, random indices beyond them.
struct Plan {
  std::vector<std::uint32_t> cap;
  std::vector<std::vector<std::uint32_t>> extra;
  bool wants(std::size_t point, std::uint32_t idx) const {
    return idx < cap[point] ||
           std::find(extra[point].begin(), extra[point].end(), idx) != extra[point].end();
  }
};

// Half the budget goes by water-filling to the first candidates of every point (every point
// the same cap m, the rest one by one to random points), the other half to random candidates
// of random points. Before, the whole budget was water-filled: once it exceeded the number of
// points, every point checked only its first structured candidates and no random lane
// combination at all, so a larger budget checked fewer kinds of images (APEX's known-bad
// merge, caught at 1,000 images, escaped at 10,000).
Plan make_plan(const std::vector<std::uint32_t>& counts, std::size_t budget, std::uint64_t seed) {
  Plan plan;
  plan.cap = counts;
  plan.extra.resize(counts.size());
  const std::uint64_t total = std::accumulate(counts.begin(), counts.end(), std::uint64_t{0});
  if (budget == 0 || total <= budget) return plan;
  const std::size_t structured = budget - budget / 2;
  auto used = [&](std::uint32_t m) {
    std::uint64_t s = 0;
    for (std::uint32_t c : counts) s += std::min(c, m);
    return s;
  };
  std::uint32_t lo = 0, hi = *std::max_element(counts.begin(), counts.end());
  while (lo < hi) {  // largest m with used(m) <= structured
    const std::uint32_t mid = lo + (hi - lo + 1) / 2;
    if (used(mid) <= structured) lo = mid;
    else hi = mid - 1;
  }
  const std::uint32_t m = lo;
  std::mt19937_64 rng(seed);
  std::vector<std::size_t> more;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    plan.cap[i] = std::min(counts[i], m);
    if (counts[i] > m) more.push_back(i);
  }
  std::shuffle(more.begin(), more.end(), rng);
  std::uint64_t left = structured - used(m);
  for (std::size_t i : more) {
    if (left == 0) break;
    ++plan.cap[i];
    --left;
  }
  // The random half: a point with candidates left, then one of them not yet chosen.
  std::vector<std::size_t> open;
  for (std::size_t i = 0; i < counts.size(); ++i)
    if (counts[i] > plan.cap[i]) open.push_back(i);
  for (std::uint64_t r = budget - (structured - left); r > 0 && !open.empty(); --r) {
    const std::size_t k = rng() % open.size();
    const std::size_t i = open[k];
    std::vector<std::uint32_t>& ex = plan.extra[i];
    const std::uint32_t span = counts[i] - plan.cap[i];
    std::uint32_t idx;
    do {
      idx = plan.cap[i] + static_cast<std::uint32_t>(rng() % span);
    } while (std::find(ex.begin(), ex.end(), idx) != ex.end());
    ex.push_back(idx);
    if (ex.size() == span) {  // every candidate of this point chosen
      open[k] = open.back();
      open.pop_back();
    }
  }
  return plan;
}

}  // namespace

// --- tokens and options --------------------------------------------------------------------------

std::string ReplayToken::to_string() const {
  return label + "/" + std::to_string(seed) + "/" + std::to_string(op) + "/" +
         std::to_string(point) + "/" + choice_text(choice);
}

std::optional<ReplayToken> ReplayToken::parse(std::string_view text) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : text) {
    if (c == '/') {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(cur);
  if (parts.size() != 5 || parts[0].empty()) return std::nullopt;
  auto number = [](const std::string& s, std::uint64_t* out) {
    if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) return false;
    *out = std::strtoull(s.c_str(), nullptr, 10);
    return true;
  };
  ReplayToken t;
  t.label = parts[0];
  std::uint64_t op = 0, point = 0;
  if (!number(parts[1], &t.seed) || !number(parts[2], &op) || !number(parts[3], &point))
    return std::nullopt;
  t.op = op;
  t.point = point;
  if (parts[4] != "-") {
    std::string piece;
    std::istringstream in(parts[4]);
    while (std::getline(in, piece, '.')) {
      std::uint64_t v = 0;
      if (!number(piece, &v) || v > UINT32_MAX) return std::nullopt;
      t.choice.push_back(static_cast<std::uint32_t>(v));
    }
  }
  return t;
}

ExploreOptions ExploreOptions::from_env(std::string label, pm::Mode mode,
                                        std::uint64_t default_seed,
                                        std::size_t default_images) {
  ExploreOptions o;
  o.label = std::move(label);
  o.mode = mode;
  o.seed = default_seed;
  o.images_budget = default_images;
  if (const char* s = std::getenv("PMINDEX_CRASH_SEED"); s != nullptr && *s != '\0')
    o.seed = parse_seed(s);
  if (const char* s = std::getenv("PMINDEX_CRASH_IMAGES"); s != nullptr && *s != '\0')
    o.images_budget = std::strtoull(s, nullptr, 10);
  if (const char* s = std::getenv("PMINDEX_CRASH_REPLAY"); s != nullptr && *s != '\0') {
    o.replay = ReplayToken::parse(s);
    if (o.replay) o.seed = o.replay->seed;
  }
  return o;
}

std::string ExploreReport::to_string() const {
  std::ostringstream out;
  out << ops << " ops, " << crash_points << " crash points, " << candidate_images
      << " distinct candidate images, " << images_checked << " checked";
  if (inner_images > 0) out << " (+" << inner_images << " images of crashes during recovery)";
  if (replay_skipped) out << " (skipped: PMINDEX_CRASH_REPLAY names another configuration)";
  for (const Failure& f : failures) {
    out << "\nFAILURE: " << f.message;
    if (f.image) {
      out << "\n  replay: PMINDEX_CRASH_REPLAY='" << f.token.to_string()
          << "' <this test binary>";
    } else {
      out << "\n  reproduce: PMINDEX_CRASH_SEED=" << f.token.seed
          << " <this test binary> (a failure of the live run; no image involved)";
    }
  }
  return out.str();
}

ExploreReport::Coverage ExploreReport::coverage(const ExploreOptions& o) const {
  if (candidate_images > 0 && images_checked >= candidate_images) return Coverage::exhausted;
  if (o.images_budget > 0 &&
      static_cast<double>(images_checked) >= kBudgetShare * static_cast<double>(o.images_budget))
    return Coverage::budget_reached;
  return Coverage::short_of_budget;
}

std::string ExploreReport::coverage_text(const ExploreOptions& o) const {
  switch (coverage(o)) {
    case Coverage::budget_reached:
      return "budget reached: " + std::to_string(images_checked) + " of " +
             std::to_string(o.images_budget) + " images";
    case Coverage::exhausted:
      return "explored space exhausted: all " + std::to_string(candidate_images) +
             " candidate images checked (budget " + std::to_string(o.images_budget) + ")";
    case Coverage::short_of_budget:
      break;
  }
  return "SHORT of the budget: " + std::to_string(images_checked) + " of " +
         std::to_string(o.images_budget) + " images checked, " +
         std::to_string(candidate_images) + " candidates";
}

// --- candidates ----------------------------------------------------------------------------------

std::vector<std::vector<std::uint32_t>> candidate_choices(std::span<const std::uint32_t> len,
                                                          const ExploreOptions& o,
                                                          std::uint64_t rng_seed) {
  using Choice = std::vector<std::uint32_t>;
  const std::size_t lanes = len.size();
  std::vector<Choice> out;
  const Choice everything(len.begin(), len.end());
  const Choice nothing(lanes, 0);
  out.push_back(everything);
  if (lanes == 0) return out;
  out.push_back(nothing);
  for (std::size_t i = 0; i < lanes; ++i) {  // each lane alone
    Choice c = nothing;
    c[i] = len[i];
    out.push_back(std::move(c));
  }
  if (lanes > 1) {
    for (std::size_t i = 0; i < lanes; ++i) {  // all but one lane
      Choice c = everything;
      c[i] = 0;
      out.push_back(std::move(c));
    }
  }
  std::uint64_t combos = 1;
  for (std::uint32_t l : len) {
    combos *= std::uint64_t{l} + 1;
    if (combos > o.exhaustive_limit) break;
  }
  if (combos <= o.exhaustive_limit) {
    Choice c = nothing;  // mixed-radix enumeration of every prefix combination
    for (;;) {
      out.push_back(c);
      std::size_t i = 0;
      while (i < lanes && c[i] == len[i]) c[i++] = 0;
      if (i == lanes) break;
      ++c[i];
    }
    return out;
  }
  std::mt19937_64 rng(rng_seed);
  const std::uint64_t pairs = lanes * (lanes - 1) / 2;
  auto pair_choice = [&](std::size_t i, std::size_t j) {
    Choice c = nothing;
    c[i] = len[i];
    c[j] = len[j];
    out.push_back(std::move(c));
  };
  if (pairs <= o.pair_cap) {
    for (std::size_t i = 0; i < lanes; ++i)
      for (std::size_t j = i + 1; j < lanes; ++j) pair_choice(i, j);
  } else {
    for (std::size_t k = 0; k < o.pair_cap; ++k) {
      const std::size_t i = rng() % lanes;
      std::size_t j = rng() % (lanes - 1);
      if (j >= i) ++j;
      pair_choice(i, j);
    }
  }
  for (std::size_t k = 0; k < o.random_images; ++k) {
    Choice c(lanes);
    for (std::size_t i = 0; i < lanes; ++i) {
      switch (rng() % 4) {
        case 0: c[i] = 0; break;
        case 1: c[i] = len[i]; break;
        default: c[i] = static_cast<std::uint32_t>(rng() % (std::uint64_t{len[i]} + 1)); break;
      }
    }
    out.push_back(std::move(c));
  }
  return out;
}

// --- explore -------------------------------------------------------------------------------------

namespace {

// Plan pass, check pass (or a single replay pass) over whichever kind of run `pass` drives.
ExploreReport explore_impl(const ExploreOptions& opt, const Run::CheckFn& check_image,
                           const std::function<void(Run&, const Tracer::CrashHook&, Tracer&)>& pass) {
  ExploreReport report;
  if (opt.replay && opt.replay->label != opt.label) {
    report.replay_skipped = true;
    return report;
  }
  if (opt.mode != pm::Mode::adr && opt.mode != pm::Mode::eadr) {
    report.failures.push_back({"the crash simulator models adr and eadr only", {}});
    return report;
  }
  install_death_reporting();
  Worker worker;
  Run run{opt, report, worker, check_image};
  pm::ImageBytes image;  // aligned: Pool::open_image refuses anything else

  if (opt.replay) {
    const ReplayToken& t = *opt.replay;
    Tracer tracer(opt.mode);
    bool found = false;
    pass(run, [&](const CrashPoint& at) {
      if (found || at.op != t.op || at.index != t.point) return;
      found = true;
      image.resize(tracer.size());
      run.check(tracer, at, t.choice, tracer.image_key(t.choice, at), image);
      run.stop = true;
    }, tracer);
    if (!found && report.failures.empty())
      run.fail("replay token names a crash point the run never reached", t);
    return report;
  }

  // Pass 1: count the distinct candidates at every crash point, to spread the budget.
  std::vector<std::uint32_t> counts;
  {
    Tracer tracer(opt.mode);
    std::unordered_set<std::uint64_t> seen;
    pass(run, [&](const CrashPoint& at) {
      std::uint32_t unique = 0;
      for (const auto& c : candidate_choices(tracer.lane_lengths(), opt, point_seed(opt, at)))
        if (seen.insert(tracer.image_key(c, at)).second) ++unique;
      counts.push_back(unique);
    }, tracer);
    if (!report.ok()) return report;
    report.candidate_images = seen.size();
  }
  const Plan plan = make_plan(counts, opt.images_budget, mix(opt.seed, 0x91a7));

  // Pass 2: the same run again, checking the planned images.
  Tracer tracer(opt.mode);
  std::unordered_set<std::uint64_t> seen;
  pass(run, [&](const CrashPoint& at) {
    if (run.stop || at.global >= plan.cap.size()) return;
    image.resize(tracer.size());
    std::uint32_t unique = 0;
    // Every candidate's key is recorded, checked or not, so that "distinct" means the same
    // thing here as in pass 1.
    for (const auto& c : candidate_choices(tracer.lane_lengths(), opt, point_seed(opt, at))) {
      const std::uint64_t key = tracer.image_key(c, at);
      if (!seen.insert(key).second) continue;
      const std::uint32_t idx = unique++;
      if (run.stop || !plan.wants(at.global, idx)) continue;
      run.check(tracer, at, c, key, image);
    }
  }, tracer);
  return report;
}

}  // namespace

ExploreReport explore(Scenario& scenario, const ExploreOptions& opt) {
  ExploreReport r = explore_impl(
      opt,
      [&](std::span<char> image, const CrashPoint& at, std::uint64_t salt) {
        return scenario.check_image(image, at, salt);
      },
      [&](Run& run, const Tracer::CrashHook& hook, Tracer& tracer) {
        run.sequential_pass(scenario, hook, tracer);
      });
  r.inner_images = scenario.inner_images_checked();
  return r;
}

ExploreReport explore_concurrent(ConcurrentScenario& scenario, const ExploreOptions& opt) {
  return explore_impl(
      opt,
      [&](std::span<char> image, const CrashPoint& at, std::uint64_t salt) {
        return scenario.check_image(image, at, salt);
      },
      [&](Run& run, const Tracer::CrashHook& hook, Tracer& tracer) {
        run.concurrent_pass(scenario, hook, tracer);
      });
}

}  // namespace pmindex::crash

// One generic tree_api wrapper over pmindex::Index, compiled once per built-in kind
// (PMINDEX_TREE_KIND, set by bench/CMakeLists.txt) into libpmindex_<kind>_tree.so, so the
// original PiBench (and pmbench, by path) can load every built-in index.
//
//   pool          tree_options_t::pool_path if not empty: opened if it holds a pool of this
//                 layout (recovering it), created otherwise; a pool of another layout is
//                 refused (create_tree returns nullptr and prints why).
//                 Empty: /dev/shm/pmindex/<kind>-tree-<pid>.pool, removed when the tree is
//                 destroyed, the process exits, or it dies of SIGINT, SIGTERM, SIGHUP,
//                 SIGQUIT or SIGABRT (the host's own handlers for those still run after).
//   pool size     tree_options_t::pool_size; 0: the index's default for
//                 $PMINDEX_EXPECTED_RECORDS records (default 10,000,000)
//   persistence   $PMINDEX_PERSISTENCE = adr | eadr | dram (default adr)
//   keys          key_size 8: KeyType::u64 (PiBench's keys, compared by memcmp); larger:
//                 KeyType::bytes with max_key_size = key_size.
//                 $PMINDEX_TREE_VARIABLE_KEYS=1: KeyType::bytes whatever key_size, keys of
//                 1..key_size bytes, scan records <u32 key length LE><key><value> (tree_api.h)
//   scan buffer   per thread, valid until the same thread's next scan (on any tree)
#include <signal.h>
#include <unistd.h>

#include <atomic>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "pmindex/index.h"
#include "tree_api.h"

#ifndef PMINDEX_TREE_KIND
#error "PMINDEX_TREE_KIND must name the built-in index (set by CMake)"
#endif

namespace {

std::vector<std::string>& temporary_pools() {
  static std::vector<std::string> pools;
  return pools;
}
std::mutex temporary_mutex;

void remove_temporary_pools() {
  std::lock_guard lock(temporary_mutex);
  for (const auto& p : temporary_pools()) {
    std::error_code ec;
    std::filesystem::remove(p, ec);
  }
  temporary_pools().clear();
}

// The signal path: a process has one temporary pool path per kind (<kind>-tree-<pid>), kept
// in a plain buffer a handler may read, and armed while a tree uses it.
char g_temp_path[256];
std::atomic<bool> g_temp_armed{false};
constexpr int kCleanupSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGABRT};
struct sigaction g_previous[std::size(kCleanupSignals)];

// Removes the temporary pool, then does what the host had set up for the signal: its handler,
// ignoring it, or the default action (the process dies of the signal, so its exit status says
// which). A library must not take a host's signals from it, only add its clean-up in front.
extern "C" void remove_temp_pool_then_chain(int sig, siginfo_t* info, void* context) {
  // acquire: pairs with the release that armed the path, so its bytes are complete.
  if (g_temp_armed.load(std::memory_order_acquire)) ::unlink(g_temp_path);
  for (std::size_t i = 0; i < std::size(kCleanupSignals); ++i) {
    if (kCleanupSignals[i] != sig) continue;
    const struct sigaction& prev = g_previous[i];
    if (prev.sa_flags & SA_SIGINFO) {
      prev.sa_sigaction(sig, info, context);
    } else if (prev.sa_handler == SIG_IGN) {
      return;
    } else if (prev.sa_handler != SIG_DFL) {
      prev.sa_handler(sig);
    } else {
      ::signal(sig, SIG_DFL);
      ::raise(sig);
    }
  }
}

void arm_temp_pool_signals(const std::string& path) {
  if (path.size() >= sizeof g_temp_path) return;  // the atexit and destructor paths remain
  std::memcpy(g_temp_path, path.c_str(), path.size() + 1);
  g_temp_armed.store(true, std::memory_order_release);  // publishes the path bytes
  static const bool installed = [] {
    for (std::size_t i = 0; i < std::size(kCleanupSignals); ++i) {
      struct sigaction sa{};
      sa.sa_sigaction = remove_temp_pool_then_chain;
      sa.sa_flags = SA_SIGINFO;
      sigemptyset(&sa.sa_mask);
      ::sigaction(kCleanupSignals[i], &sa, &g_previous[i]);
    }
    return true;
  }();
  (void)installed;
}

class PmindexTree final : public tree_api {
 public:
  PmindexTree(std::unique_ptr<pmindex::Index> index, std::string temp_pool, std::size_t value_size,
              bool variable_keys, bool blind_inserts)
      : index_(std::move(index)), temp_pool_(std::move(temp_pool)), value_size_(value_size),
        variable_keys_(variable_keys), blind_inserts_(blind_inserts) {}
  ~PmindexTree() override {
    // PiBench's OpenMP pool threads may still be alive (idle) here: the epoch manager takes
    // over their pending items when the index goes (include/pmindex/sync/epoch.h, "Lifetime").
    // Drop the destroying thread's own scope so that it does not outlive the index.
    if (tls().tree == this) {
      tls().scope = pmindex::Index::ThreadScope();
      tls().tree = nullptr;
    }
    if (index_) (void)index_->close();
    index_.reset();
    if (!temp_pool_.empty()) {
      g_temp_armed.store(false, std::memory_order_release);
      std::error_code ec;
      std::filesystem::remove(temp_pool_, ec);
    }
  }
  bool find(const char* key, size_t sz, char* value_out) override {
    std::string& v = attached().value;
    if (index_->find({key, sz}, &v) != pmindex::Code::ok) return false;
    std::memcpy(value_out, v.data(), std::min(v.size(), value_size_));
    return true;
  }
  bool insert(const char* key, size_t key_sz, const char* value, size_t value_sz) override {
    attached();
    if (blind_inserts_) return written(index_->upsert({key, key_sz}, {value, value_sz}));
    return written(index_->insert({key, key_sz}, {value, value_sz}));
  }
  bool update(const char* key, size_t key_sz, const char* value, size_t value_sz) override {
    attached();
    return written(index_->update({key, key_sz}, {value, value_sz}));
  }
  bool remove(const char* key, size_t key_sz) override {
    attached();
    return written(index_->remove({key, key_sz}));
  }
  int scan(const char* key, size_t key_sz, int scan_sz, char*& values_out) override {
    Tls& t = attached();
    const std::size_t n = index_->scan({key, key_sz}, scan_sz < 0 ? 0 : scan_sz, t.scan);
    t.out.clear();
    for (std::size_t i = 0; i < n; ++i) {
      const auto k = t.scan.key(i), v = t.scan.value(i);
      if (variable_keys_) {
        const auto len = static_cast<std::uint32_t>(k.size());
        for (int b = 0; b < 4; ++b) t.out.push_back(static_cast<char>((len >> (8 * b)) & 0xff));
      }
      t.out.insert(t.out.end(), k.begin(), k.end());
      t.out.insert(t.out.end(), v.begin(), v.end());
    }
    values_out = t.out.data();
    return static_cast<int>(n);
  }

 private:
  // A write's answer for PiBench. PiBench reports refused writes under "Completed" (only its
  // "Succeeded" line leaves them out), so the first write refused for a full pool is said on
  // stderr, with how to size the pool: a throughput figure otherwise hides it (it did, for
  // DPTree's upserts beyond the 10M records the pool was sized for).
  bool written(pmindex::Code c) {
    if (c == pmindex::Code::pool_full && !pool_full_said_.exchange(true, std::memory_order_relaxed))
      std::fprintf(stderr,
                   "pmindex tree_api: a write was refused: the pool is full; PiBench counts "
                   "refused writes as completed (see its Succeeded line). Size the pool for the "
                   "records of the whole run: PMINDEX_EXPECTED_RECORDS=N (default 10000000) or "
                   "PiBench's --pool_size\n");
    return c == pmindex::Code::ok;
  }
  struct Tls {
    const PmindexTree* tree = nullptr;
    pmindex::Index::ThreadScope scope;
    pmindex::ScanBuffer scan;
    std::vector<char> out;
    std::string value;
  };
  static Tls& tls() {
    thread_local Tls t;
    return t;
  }
  // The calling thread's state, attached to this tree. One thread_local access per operation:
  // in a shared library each is a __tls_get_addr call plus the initialisation guard, and
  // PiBench's loop pays for every instruction between two operations (issue 16).
  Tls& attached() {
    Tls& t = tls();
    if (t.tree != this) [[unlikely]] attach(t);
    return t;
  }
  [[gnu::noinline]] void attach(Tls& t) {
    t.scope = pmindex::Index::ThreadScope();  // detach from a previous tree first
    t.scope = index_->attach_thread();
    t.tree = this;
  }
  std::unique_ptr<pmindex::Index> index_;
  std::string temp_pool_;
  std::size_t value_size_;
  bool variable_keys_;
  bool blind_inserts_;  // PMINDEX_TREE_INSERT=upsert
  std::atomic<bool> pool_full_said_{false};
};

// An environment switch with two spellings: unset, one of them (*first says which), or bad
// (a message on stderr: create_tree then fails).
enum class EnvChoice { unset, set, bad };
EnvChoice env_choice(const char* var, std::string_view a, std::string_view b, bool* first) {
  const char* u = std::getenv(var);
  if (u == nullptr) return EnvChoice::unset;
  const std::string_view v(u);
  if (v != a && v != b) {
    std::fprintf(stderr, "pmindex tree_api: %s must be %s or %s, got '%s'\n", var,
                 std::string(a).c_str(), std::string(b).c_str(), u);
    return EnvChoice::bad;
  }
  *first = v == a;
  return EnvChoice::set;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) tree_api* create_tree(const tree_options_t& opt) {
  pmindex::Options o;
  o.kind = PMINDEX_TREE_KIND;
  o.pool_size = opt.pool_size;
  const char* records = std::getenv("PMINDEX_EXPECTED_RECORDS");
  o.expected_records = records != nullptr ? std::strtoull(records, nullptr, 10) : 10'000'000;
  const char* mode = std::getenv("PMINDEX_PERSISTENCE");
  if (mode != nullptr && !pmindex::pm::parse_mode(mode, &o.persistence)) {
    std::fprintf(stderr, "pmindex tree_api: PMINDEX_PERSISTENCE must be adr, eadr or dram, got '%s'\n", mode);
    return nullptr;
  }
  // PiBench passes no per-index options: PACTree's switches (Options::pactree) come from the
  // environment here, and only here.
  using pmindex::PacTreeOptions;
  bool first = false;
  switch (env_choice("PMINDEX_PACTREE_UPDATER", "sync", "background", &first)) {
    case EnvChoice::bad: return nullptr;
    case EnvChoice::unset: break;
    case EnvChoice::set:
      o.pactree.updater =
          first ? PacTreeOptions::Updater::synchronous : PacTreeOptions::Updater::background;
  }
  switch (env_choice("PMINDEX_PACTREE_SEARCH", "dram", "pm", &first)) {
    case EnvChoice::bad: return nullptr;
    case EnvChoice::unset: break;
    case EnvChoice::set:
      o.pactree.search_layer =
          first ? PacTreeOptions::SearchLayer::dram : PacTreeOptions::SearchLayer::pm;
  }
  const char* stats = std::getenv("PMINDEX_PACTREE_STATS");
  o.pactree.stats = stats != nullptr && std::strcmp(stats, "1") == 0;
  // DPTree's merge mode comes from PMINDEX_DPTREE_MERGE (the registry reads it); its stats:
  const char* dp_stats = std::getenv("PMINDEX_DPTREE_STATS");
  o.dptree.stats = dp_stats != nullptr && std::strcmp(dp_stats, "1") == 0;
  // Originals whose insert is a blind upsert (DPTree's) compare with ours through upsert.
  bool upsert_inserts = false;
  switch (env_choice("PMINDEX_TREE_INSERT", "upsert", "insert", &upsert_inserts)) {
    case EnvChoice::bad: return nullptr;
    case EnvChoice::unset: upsert_inserts = false; break;
    case EnvChoice::set: break;
  }
  const char* variable = std::getenv("PMINDEX_TREE_VARIABLE_KEYS");
  const bool variable_keys = variable != nullptr && std::strcmp(variable, "1") == 0;
  o.key_type = opt.key_size == 8 && !variable_keys ? pmindex::KeyType::u64 : pmindex::KeyType::bytes;
  o.max_key_size = static_cast<std::uint32_t>(opt.key_size);
  o.max_value_size = static_cast<std::uint32_t>(opt.value_size);
  std::string temp;
  if (opt.pool_path.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(std::string(pmindex::pm::kDefaultPoolDir), ec);
    temp = std::string(pmindex::pm::kDefaultPoolDir) + "/" + PMINDEX_TREE_KIND + "-tree-" +
           std::to_string(::getpid()) + ".pool";
    o.path = temp;
    o.open_mode = pmindex::OpenMode::create;
    o.overwrite = true;
    std::lock_guard lock(temporary_mutex);
    if (temporary_pools().empty()) std::atexit(remove_temporary_pools);
    temporary_pools().push_back(temp);
    arm_temp_pool_signals(temp);  // before the file exists: a signal during creation removes it
  } else {
    o.path = opt.pool_path;
    o.open_mode = pmindex::OpenMode::open_or_create;
  }
  auto index = pmindex::Index::open(o);
  if (!index.ok()) {
    std::fprintf(stderr, "pmindex tree_api (%s): %s\n", PMINDEX_TREE_KIND,
                 index.status().to_string().c_str());
    return nullptr;
  }
  return new PmindexTree(std::move(index).value(), temp, opt.value_size, variable_keys,
                         upsert_inserts);
}

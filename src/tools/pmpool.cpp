// pmpool: inspect, check, list and remove pmindex pools. Neither `info` nor `check` ever
// modifies a pool: info reads the header with pread, check recovers and verifies the index on a
// copy-on-write (MAP_PRIVATE) mapping.
//
//   pmpool info PATH      header, layout, backing and usage
//   pmpool check PATH     exit 0 if the pool is consistent, 1 (with a message naming the file)
//                         if not
//   pmpool list [DIR]     pools under DIR (default /dev/shm/pmindex) and whether they are in use;
//                         exit 2 if DIR is not a directory
//   pmpool rm PATH...     remove pools (refuses files that are not pools and pools in use)
//   pmpool rm --stale [--dir DIR] [--recent SECONDS]
//                         remove the abandoned pools under DIR (default /dev/shm/pmindex): those
//                         no process has open and that no clean shutdown closed in the last
//                         SECONDS (default 86400; a crashed pool counts as abandoned)
//   pmpool upgrade PATH   rewrite a format-version-1 pool as version 2 (crash-safe: copy, rename)
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <string>

#include "pmindex/index.h"
#include "pmindex/pm/pool.h"

namespace {

namespace fs = std::filesystem;
using pmindex::Status;
using pmindex::pm::HeaderInfo;
using pmindex::pm::Pool;

// Whether another process holds the pool's lock (an open pool).
bool in_use(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool busy = flock(fd, LOCK_SH | LOCK_NB) != 0;
  ::close(fd);
  return busy;
}

std::string human_bytes(std::uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

std::string time_text(std::uint64_t secs) {
  const std::time_t t = static_cast<std::time_t>(secs);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&t));
  return buf;
}

int fail(const Status& s) {
  std::cerr << "pmpool: " << s.to_string() << "\n";
  return 1;
}

// Recovers the pool's index on a private mapping and runs verify().
Status check_index(const std::string& path, const HeaderInfo& info, pmindex::Footprint* fp) {
  pmindex::Options o;
  o.kind = info.layout.kind;
  o.path = path;
  o.open_mode = pmindex::OpenMode::open;
  o.layout_from_pool = true;
  o.private_mapping = true;
  o.persistence = pmindex::pm::Mode::dram;  // a private copy: nothing to persist
  auto idx = pmindex::Index::open(o);
  if (!idx.ok()) return idx.status();
  if (Status s = (*idx)->verify(); !s.ok()) return s;
  if (fp != nullptr) *fp = (*idx)->footprint();
  return Status::Ok();
}

std::string last_mode_text(std::uint32_t last_mode) {
  if (last_mode == 0) return "an unknown";  // upgraded from format version 1
  return std::string(pmindex::pm::to_string(static_cast<pmindex::pm::Mode>(last_mode - 1)));
}

int cmd_info(const std::string& path) {
  auto info = Pool::inspect(path);
  if (!info.ok()) return fail(info.status());
  const HeaderInfo& h = *info;
  std::error_code ec;
  const std::uint64_t file_bytes = fs::file_size(path, ec);
  std::cout << "pool:            " << path << "\n"
            << "format version:  " << h.format_version << "\n"
            << "layout:          " << h.layout.describe() << "\n"
            << "maximum size:    " << h.pool_size << " (" << human_bytes(h.pool_size) << ")\n"
            << "file size:       " << file_bytes << " (" << human_bytes(file_bytes)
            << "; grows up to the maximum)\n"
            << "uuid:            " << h.uuid << "\n"
            << "created:         " << time_text(h.creation_time) << "\n"
            << "generation:      " << h.generation << " (opens so far)\n"
            << "clean shutdown:  " << (h.clean_shutdown ? "yes" : "no (recovery runs at next open)")
            << "\n"
            << "root offset:     " << h.root << "\n"
            << "counted at close: "
            << (h.records_at_close == pmindex::pm::kNoCount
                    ? std::string("none")
                    : std::to_string(h.records_at_close) + " records in " +
                          std::to_string(h.nodes_at_close) + " leaves")
            << "\n"
            << "last written in: " << last_mode_text(h.last_mode) << " mode\n"
            << "header state:    sequence " << h.state_sequence
            << (h.state_note.empty() ? std::string(", both copies valid") : "; " + h.state_note)
            << "\n"
            << "heap:            " << human_bytes(h.heap_high_water - h.heap_offset)
            << " touched of " << human_bytes(h.pool_size - h.heap_offset) << "\n"
            << "in use by a process: " << (in_use(path) ? "yes" : "no") << "\n";
  if (pmindex::IndexRegistry::find(h.layout.kind) == nullptr) {
    std::cout << "index:           '" << h.layout.kind << "' is not built into this pmpool\n";
    return 0;
  }
  if (in_use(path)) return 0;
  pmindex::Footprint fp;
  if (Status s = check_index(path, h, &fp); s.ok()) {
    std::cout << "PM in use:       " << human_bytes(fp.pm_bytes) << " in allocated blocks\n";
  }
  return 0;
}

int cmd_check(const std::string& path) {
  auto info = Pool::inspect(path);
  if (!info.ok()) return fail(info.status());
  if (pmindex::IndexRegistry::find(info->layout.kind) == nullptr) {
    return fail(Status(pmindex::Code::unsupported,
                       path + ": index kind '" + info->layout.kind + "' is not built in"));
  }
  if (Status s = check_index(path, *info, nullptr); !s.ok()) return fail(s);
  std::cout << path << ": consistent (" << info->layout.describe() << ")\n";
  return 0;
}

std::vector<std::string> pools_under(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.is_regular_file() && Pool::inspect(e.path().string()).ok()) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

int cmd_list(const std::string& dir, bool named) {
  std::error_code ec;
  // The default directory appears with the first pool: before that there is nothing to list,
  // which is not an error. A directory the user named must exist.
  if (!named && !fs::exists(dir, ec)) return 0;
  if (!fs::is_directory(dir, ec)) {
    std::cerr << "pmpool list: " << dir << ": "
              << (fs::exists(dir, ec) ? "not a directory" : "no such directory") << "\n";
    return 2;
  }
  for (const auto& path : pools_under(dir)) {
    auto info = Pool::inspect(path);
    std::cout << path << "  " << info->layout.describe() << "  " << human_bytes(info->pool_size)
              << "  " << (in_use(path) ? "in use" : "not in use") << "\n";
  }
  return 0;
}

// Abandoned: no process holds it, and no clean shutdown closed it within `recent` seconds (a
// clean close sets the file's mtime, Pool::close_clean). A crashed pool is abandoned; a pool a
// user closed an hour ago is not.
bool stale_pool(const std::string& path, std::uint64_t recent) {
  if (in_use(path)) return false;
  auto info = Pool::inspect(path);
  if (!info.ok() || !info->clean_shutdown) return info.ok();
  std::error_code ec;
  const auto closed = fs::last_write_time(path, ec);
  if (ec) return false;
  const auto age = fs::file_time_type::clock::now() - closed;
  return age > std::chrono::seconds(recent);
}

int cmd_rm(const std::vector<std::string>& paths, bool stale, const std::string& dir,
           std::uint64_t recent) {
  std::vector<std::string> targets = paths;
  if (stale) {
    for (const auto& p : pools_under(dir))
      if (stale_pool(p, recent)) targets.push_back(p);
  }
  int rc = 0;
  for (const auto& path : targets) {
    if (auto info = Pool::inspect(path); !info.ok()) {
      std::cerr << "pmpool: refusing to remove " << path << ": " << info.status().to_string()
                << "\n";
      rc = 1;
      continue;
    }
    if (in_use(path)) {
      std::cerr << "pmpool: refusing to remove " << path << ": in use by a process\n";
      rc = 1;
      continue;
    }
    if (::unlink(path.c_str()) != 0) {
      std::perror(("pmpool: " + path).c_str());
      rc = 1;
      continue;
    }
    std::cout << "removed " << path << "\n";
  }
  return rc;
}

// CLI11 answers a word that is not a subcommand with "A subcommand is required"; name it.
bool refuse_unknown_subcommand(const std::vector<CLI::App*>& subs, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word.empty() || word[0] == '-') continue;
    for (const CLI::App* s : subs)
      if (s->get_name() == word) return false;
    std::cerr << "pmpool: unknown subcommand '" << word << "' (info, check, list, rm, upgrade; see --help)\n";
    return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pmpool: inspect, check, list and remove pmindex pools"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("pmpool ") + PMINDEX_VERSION_STRING + " (" +
                                        std::string(pmindex::isa_level()) + ")");
  std::string path;
  auto* info = app.add_subcommand("info", "print the header, layout, backing and usage");
  info->add_option("PATH", path, "pool file")->required();
  auto* check = app.add_subcommand("check", "recover and verify on a private copy; exit 0 if consistent");
  check->add_option("PATH", path, "pool file")->required();
  std::string dir(pmindex::pm::kDefaultPoolDir);
  auto* list = app.add_subcommand("list", "list pools under a directory");
  auto* list_dir = list->add_option("DIR", dir, "directory (default /dev/shm/pmindex)");
  std::vector<std::string> rm_paths;
  bool stale = false;
  std::string stale_dir(pmindex::pm::kDefaultPoolDir);
  std::uint64_t recent = 86400;
  auto* rm = app.add_subcommand("rm", "remove pools that no process has open");
  rm->add_option("PATH", rm_paths, "pool files");
  rm->add_flag("--stale", stale,
               "remove abandoned pools under --dir: held by no process and not closed cleanly "
               "within --recent seconds (a crashed pool is abandoned)");
  rm->add_option("--dir", stale_dir, "directory for --stale (default /dev/shm/pmindex)");
  rm->add_option("--recent", recent, "--stale keeps pools closed cleanly this recently (s)")
      ->check(CLI::Range(std::uint64_t{0}, std::uint64_t{1} << 40));
  auto* upgrade = app.add_subcommand("upgrade", "upgrade a format-version-1 pool to version 2");
  upgrade->add_option("PATH", path, "pool file")->required();
  if (refuse_unknown_subcommand({info, check, list, rm, upgrade}, argc, argv)) return 2;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (*info) return cmd_info(path);
  if (*check) return cmd_check(path);
  if (*list) return cmd_list(dir, list_dir->count() > 0);
  if (*upgrade) {
    if (Status s = pmindex::pm::upgrade_pool_file(path); !s.ok()) return fail(s);
    std::cout << path << ": upgraded to pool format version " << pmindex::pm::kFormatVersion
              << "\n";
    return 0;
  }
  if (*rm) {
    if (rm_paths.empty() && !stale) {
      std::cerr << "pmpool rm: give PATH... or --stale\n";
      return 2;
    }
    return cmd_rm(rm_paths, stale, stale_dir, recent);
  }
  return 2;
}

// What survives a crash: a child process inserts keys and reports each acknowledged insert
// through a pipe; the parent kills it with SIGKILL mid-stream, reopens the pool (recovery runs)
// and checks that every acknowledged key is there. On a tmpfs pool this is a process crash;
// on a DAX pool in adr mode the same protocol survives power failure (the crash simulator,
// docs/crash-simulator.md, proves that part).
//
//   crash_and_recover [KIND] [POOL_PATH]   defaults: nbtree, /dev/shm/pmindex-examples/crash.pool
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "pmindex/index.h"

namespace {

pmindex::Options options(const char* kind, const std::string& path) {
  pmindex::Options o;
  o.kind = kind;
  o.path = path;
  o.expected_records = 1'000'000;
  return o;
}

[[noreturn]] void child(const pmindex::Options& o, int ack_fd) {
  auto idx = pmindex::Index::open(o);
  if (!idx.ok()) _exit(1);
  pmindex::Index::ThreadScope scope = (*idx)->attach_thread();
  for (std::uint64_t k = 1;; ++k) {
    if ((*idx)->insert(pmindex::encode_u64(k), pmindex::encode_u64(k * 7)) != pmindex::Code::ok)
      _exit(1);
    // Acknowledged: insert returned, so the record is durable.
    if (write(ack_fd, &k, sizeof k) != sizeof k) _exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const char* kind = argc > 1 ? argv[1] : "nbtree";
  const std::string path = argc > 2 ? argv[2] : "/dev/shm/pmindex-examples/crash.pool";
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::filesystem::remove(path);
  const pmindex::Options o = options(kind, path);

  int fds[2];
  if (pipe(fds) != 0) return 1;
  const pid_t pid = fork();
  if (pid < 0) return 1;
  if (pid == 0) {
    close(fds[0]);
    child(o, fds[1]);
  }
  close(fds[1]);
  std::uint64_t acked = 0, k = 0;
  while (acked < 20'000 && read(fds[0], &k, sizeof k) == sizeof k) acked = k;
  kill(pid, SIGKILL);  // no close(), no destructor: a crash
  waitpid(pid, nullptr, 0);
  close(fds[0]);
  std::printf("killed the writer after %llu acknowledged inserts\n",
              static_cast<unsigned long long>(acked));

  auto idx = pmindex::Index::open(o);  // recovery
  if (!idx.ok()) {
    std::fprintf(stderr, "reopen: %s\n", idx.status().to_string().c_str());
    return 1;
  }
  std::string v;
  for (std::uint64_t key = 1; key <= acked; ++key) {
    if ((*idx)->find(pmindex::encode_u64(key), &v) != pmindex::Code::ok ||
        pmindex::decode_u64(v) != key * 7) {
      std::fprintf(stderr, "acknowledged key %llu lost\n", static_cast<unsigned long long>(key));
      return 1;
    }
  }
  const pmindex::Status verified = (*idx)->verify();
  std::printf("recovered in %.2f ms: all %llu acknowledged keys present, verify %s\n",
              (*idx)->recovery_stats().seconds * 1e3, static_cast<unsigned long long>(acked),
              verified.ok() ? "ok" : verified.to_string().c_str());
  return verified.ok() && (*idx)->close().ok() ? 0 : 1;
}

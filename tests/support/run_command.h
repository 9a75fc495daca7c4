// Runs a command line through the shell (stderr folded into stdout) for tests of the CLI
// tools; the exit code is -1 if the command did not exit normally.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace pmindex::testing {

struct CmdResult {
  int rc;
  std::string out;
};

inline CmdResult run_command(const std::string& command_line) {
  const std::string cmd = command_line + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return {-1, "popen failed"};
  std::string out;
  std::array<char, 512> buf{};
  while (fgets(buf.data(), buf.size(), p) != nullptr) out += buf.data();
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace pmindex::testing

// A per-test scratch directory under /dev/shm, removed with its contents at scope exit.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

namespace pmindex::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = "/dev/shm/pmindex-test-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace pmindex::testing

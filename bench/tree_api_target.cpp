// TreeApiTarget: a PiBench tree_api wrapper loaded by path.
#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "config.h"
#include "target.h"
#include "tree_api.h"

namespace pmbench {
namespace {

class TreeApiSession final : public Session {
 public:
  TreeApiSession(tree_api& tree, std::size_t key_size, std::size_t value_size, bool variable)
      : tree_(tree), key_size_(key_size), variable_(variable), value_(value_size, '\0') {}
  bool find(std::string_view key, std::string_view* value) override {
    const bool ok = tree_.find(key.data(), key.size(), value_.data());
    if (value != nullptr) *value = value_;
    return ok;
  }
  bool insert(std::string_view key, std::string_view value) override {
    return tree_.insert(key.data(), key.size(), value.data(), value.size());
  }
  bool update(std::string_view key, std::string_view value) override {
    return tree_.update(key.data(), key.size(), value.data(), value.size());
  }
  bool remove(std::string_view key) override { return tree_.remove(key.data(), key.size()); }
  std::size_t scan(std::string_view start, int count, ScanResult* out) override {
    char* records = nullptr;
    const int n = tree_.scan(start.data(), start.size(), count, records);
    if (out != nullptr) {
      out->records.clear();
      out->records_returned = n <= 0 || records != nullptr;
      const std::size_t vs = value_.size();
      std::size_t off = 0;
      for (int i = 0; i < n && records != nullptr; ++i) {
        std::size_t klen = key_size_;
        if (variable_) {  // <u32 key length, little-endian><key><value> (tree_api.h)
          klen = 0;
          for (int b = 0; b < 4; ++b)
            klen |= std::size_t{static_cast<unsigned char>(records[off + b])} << (8 * b);
          off += 4;
        }
        out->records.emplace_back(std::string_view(records + off, klen),
                                  std::string_view(records + off + klen, vs));
        off += klen + vs;
      }
    }
    return n < 0 ? 0 : static_cast<std::size_t>(n);
  }

 private:
  tree_api& tree_;
  std::size_t key_size_;
  bool variable_;
  std::string value_;
};

class TreeApiTarget final : public Target {
 public:
  TreeApiTarget(void* handle, tree_api* tree, std::size_t key_size, std::size_t value_size,
                bool variable, TargetInfo info)
      : handle_(handle), tree_(tree), key_size_(key_size), value_size_(value_size),
        variable_(variable), info_(std::move(info)) {}
  ~TreeApiTarget() override {
    delete tree_;
    // The library is not dlclose()d: a wrapper may still have thread-local destructors queued.
    (void)handle_;
  }
  std::unique_ptr<Session> session() override {
    return std::make_unique<TreeApiSession>(*tree_, key_size_, value_size_, variable_);
  }
  const TargetInfo& info() const override { return info_; }

 private:
  void* handle_;
  tree_api* tree_;
  std::size_t key_size_, value_size_;
  bool variable_;
  TargetInfo info_;
};

}  // namespace

std::unique_ptr<Target> make_tree_api_target(const Config& c, const std::string& pool_path,
                                             std::string* error, bool* usage_error) {
  void* handle = ::dlopen(c.target.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    *error = std::string("cannot load tree_api library: ") + ::dlerror();
    return nullptr;
  }
  using Create = tree_api* (*)(const tree_options_t&);
  auto create = reinterpret_cast<Create>(::dlsym(handle, "create_tree"));
  if (create == nullptr) {
    *error = c.target + ": no create_tree symbol (not a tree_api library)";
    return nullptr;
  }
  tree_options_t opt;
  opt.key_size = c.key_size;
  opt.value_size = c.value_size;
  opt.pool_path = pool_path;
  opt.pool_size = c.pool_size;
  opt.num_threads = c.threads;
  // Variable-length keys: ask the library for length-prefixed scan records. The variable is
  // read by create_tree only, so it is set just around the call.
  if (c.variable_keys) ::setenv("PMINDEX_TREE_VARIABLE_KEYS", "1", 1);
  tree_api* tree = create(opt);
  if (c.variable_keys) ::unsetenv("PMINDEX_TREE_VARIABLE_KEYS");
  if (tree == nullptr) {
    *error = c.target + ": create_tree returned null";
    if (c.variable_keys || c.key_size != 8) {
      *error += " for key_size " + std::to_string(c.key_size) +
                (c.variable_keys ? " with variable-length keys" : "") +
                " (the library's message above says why; it may not support such keys)";
      if (usage_error != nullptr) *usage_error = true;
    }
    return nullptr;
  }
  TargetInfo info;
  info.name = c.target;
  info.kind = "tree_api";
  info.load_method = "insert";
  info.pool_path = pool_path;
  info.emulated_pm = true;  // pmbench cannot see the wrapper's pool; no DAX claim is made
  info.backing = "unknown (external wrapper)";
  return std::make_unique<TreeApiTarget>(handle, tree, c.key_size, c.value_size, c.variable_keys,
                                         std::move(info));
}

}  // namespace pmbench

#include "pmindex/status.h"

namespace pmindex {

std::string_view to_string(Code code) {
  switch (code) {
    case Code::ok: return "ok";
    case Code::not_found: return "not found";
    case Code::already_present: return "already present";
    case Code::pool_full: return "pool full";
    case Code::key_too_large: return "key too large";
    case Code::value_too_large: return "value too large";
    case Code::invalid_argument: return "invalid argument";
    case Code::corrupted: return "pool corrupted";
    case Code::io_error: return "I/O error";
    case Code::wrong_layout: return "wrong layout";
    case Code::busy: return "busy";
    case Code::unsupported: return "unsupported";
  }
  return "unknown";
}

std::string Status::to_string() const {
  std::string out(pmindex::to_string(code_));
  if (!message_.empty()) {
    out += ": ";
    out += message_;
  }
  return out;
}

}  // namespace pmindex

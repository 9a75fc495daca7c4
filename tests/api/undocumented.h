/// \file
/// A fixture for tools/api-docs.sh's own test: one documented and one undocumented function.
#pragma once

namespace fixture {

/// Documented: the script must not complain about this one.
int documented();

int undocumented();

}  // namespace fixture

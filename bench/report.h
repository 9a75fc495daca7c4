// pmbench's output: the environment block, a human summary like PiBench's, JSON and CSV.
// The JSON and CSV hold every number; plots and reports read those, never the human text.
#pragma once

#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "config.h"
#include "driver.h"

namespace pmbench {

// CPU, cores, kernel, build type, git revision, pmindex flavour, clock.
nlohmann::ordered_json environment(const Config& c, const RunResult* first);
nlohmann::ordered_json to_json(const Config& c, const RunResult& r);
// The whole output document: config, environment, the first repeat's numbers at top level,
// every repeat under "repeats" and their mean/stdev under "summary".
nlohmann::ordered_json document(const Config& c, const std::vector<RunResult>& runs);
void write_human(std::ostream& out, const Config& c, const std::vector<RunResult>& runs,
                 const nlohmann::ordered_json& env);
// One row per repeat and operation type (plus "all").
void write_csv(std::ostream& out, const Config& c, const std::vector<RunResult>& runs);

}  // namespace pmbench

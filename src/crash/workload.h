// The seeded key-value workload shared by the crash driver and the kill harness, and the
// std::map oracle it is checked against. Internal to pmindex_crashsim.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "pmindex/index.h"
#include "pmindex/pm/pool.h"

namespace pmindex::crash {

enum class OpKind : std::uint8_t { insert, update, upsert, remove, find, scan };

struct WorkOp {
  OpKind kind = OpKind::find;
  std::uint64_t key = 0;    // 1..key_space, encoded with encode_u64
  std::uint64_t value = 0;  // random per operation, so an image shows which write it holds
};

using Oracle = std::map<std::string, std::string>;

// n operations over keys 1..key_space; the mix favours writes (insert 30%, update 20%,
// upsert 10%, remove 20%, find 10%, scan 10%).
std::vector<WorkOp> make_workload(std::uint64_t seed, std::size_t n, std::uint64_t key_space);
std::string describe(const WorkOp& op);

// The oracle's effect of a successful op (no-op for reads and for ops that fail by contract).
void apply_to_oracle(const WorkOp& op, Oracle& oracle);
// Runs op on the index, checks its result against the oracle, then applies it to the oracle.
// With `owns`, the oracle holds only the keys it accepts (one writer's share while other
// threads write the rest): a scan's other records are skipped, not compared.
Status apply_checked(Index& index, const WorkOp& op, Oracle& oracle, std::size_t scan_length,
                     const std::function<bool(std::uint64_t key)>& owns = {});
// Reads the whole index (scan and find of every key) and compares with `a`, or with `b` when
// given; *matched receives the state that matched. The message names the first difference.
Status match_contents(const Index& index, std::uint64_t key_space, const Oracle& a,
                      const Oracle* b, Oracle* matched);

// The scratch pool (anonymous, not file-backed) one traced run of a driver creates its index
// in: `size` bytes, persistence `mode`, the layout the registry entry gives for `options`.
Result<std::unique_ptr<pm::Pool>> create_run_pool(const IndexRegistry::Entry& entry,
                                                  const Options& options, std::size_t size,
                                                  pm::Mode mode);

}  // namespace pmindex::crash

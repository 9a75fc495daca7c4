// Damage detection that keeps recovery instant (issue 18 item 4): every PM kind counts its
// records and leaves/nodes at a clean close and passes them to pm::Pool::close_clean; its next
// recovery walk compares what it found with them (before it commits the open where the walk
// runs at open; in the background walk or verify() for the lazy kinds, below). A chain that
// lost leaves to a zeroed page or a misdirected write, after a clean close, is then refused as
// corrupted instead of opening with the data silently gone. After an unclean end there are no
// counts (commit_open clears them) and nothing is compared (docs/pool-format.md).
#pragma once

#include <cstdint>
#include <string>

#include "pmindex/pm/pool.h"
#include "pmindex/status.h"

namespace pmindex::index_common {

inline Status check_close_counts(const pm::Pool& pool, const char* index, std::uint64_t records,
                                 std::uint64_t nodes) {
  const std::uint64_t want_records = pool.records_at_close();
  const std::uint64_t want_nodes = pool.nodes_at_close();
  if (!pool.was_clean()) return Status::Ok();
  const bool records_ok = want_records == pm::kNoCount || want_records == records;
  const bool nodes_ok = want_nodes == pm::kNoCount || want_nodes == nodes;
  if (records_ok && nodes_ok) return Status::Ok();
  return pool.error(Code::corrupted,
                    std::string(index) + ": recovery found " + std::to_string(records) +
                        " records in " + std::to_string(nodes) + " leaves, but the last clean " +
                        "close counted " + std::to_string(want_records) + " in " +
                        std::to_string(want_nodes) + " (damaged leaf chain: data lost)");
}

// Lazy (background) recovery: the walk runs beside the session's writes, so its record count
// may or may not include a write in flight. Where the node set is frozen during the walk
// (APEX: SMOs wait for it) the walk compares its node count alone ...
inline Status check_close_nodes(const pm::Pool& pool, const char* index, std::uint64_t nodes) {
  const std::uint64_t want = pool.nodes_at_close();
  if (!pool.was_clean() || want == pm::kNoCount || want == nodes) return Status::Ok();
  return pool.error(Code::corrupted,
                    std::string(index) + ": recovery found " + std::to_string(nodes) +
                        " nodes, but the last clean close counted " + std::to_string(want) +
                        " (damaged tree: data lost)");
}

// ... and the records are compared where the index is quiescent (verify(), which pmpool check
// runs): the records the tree holds now must be the last clean close's count plus the net
// successful inserts and removes this session answered (`net`, from Index::size()'s counters).
inline Status check_close_records_since(const pm::Pool& pool, const char* index,
                                        std::uint64_t records_now, std::int64_t net) {
  const std::uint64_t want = pool.records_at_close();
  if (!pool.was_clean() || want == pm::kNoCount) return Status::Ok();
  const std::int64_t expect = static_cast<std::int64_t>(want) + net;
  if (expect == static_cast<std::int64_t>(records_now)) return Status::Ok();
  return pool.error(Code::corrupted,
                    std::string(index) + ": the tree holds " + std::to_string(records_now) +
                        " records, but the last clean close counted " + std::to_string(want) +
                        " and this session added " + std::to_string(net) +
                        " (damaged tree: data lost)");
}

}  // namespace pmindex::index_common

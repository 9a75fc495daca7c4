// uTree: the production instantiation and the registry entry points. Operations:
// utree_impl.h; recovery, bulk load and verify(): utree_recovery.h.
#include "index/utree/utree_recovery.h"

namespace pmindex::utree {

template class UTree<Protocol>;

namespace {
std::uint32_t node_size_of(const Options& o) {
  return o.node_size == 0 ? kDefaultNodeSize : o.node_size;
}
}  // namespace

pm::Layout layout_for(const Options& o) {
  return pm::Layout{"utree", node_size_of(o), o.key_type, 0};
}

std::size_t default_pool_size(const Options& o) {
  // A node is one 64 B block with today's smallest class (24 or 32 B once smaller classes
  // exist), plus records; twice that, for allocator slack and out-of-place updates.
  std::size_t per_record = 64;
  if (o.key_type == KeyType::bytes) per_record += 64 + o.max_key_size;
  if (o.max_value_size > 8) per_record += 64 + o.max_value_size;
  return std::max<std::size_t>(std::size_t{16} << 20, o.expected_records * per_record * 2);
}

Status validate(const Options& o) {
  const std::uint32_t ns = node_size_of(o);
  if (ns < kMinNodeSize || ns > kMaxNodeSize || ns % 64 != 0)
    return Status(Code::invalid_argument,
                  "utree node_size (DRAM leaf bytes) must be a multiple of 64 in 64..65536");
  if (o.key_type == KeyType::bytes && o.max_key_size > kMaxKeyBytes)
    return Status(Code::invalid_argument, "utree keys are limited to 8192 bytes");
  if (!index_common::ValueCodec::valid_limit(o.max_value_size))
    return Status(Code::invalid_argument,
                  "utree max_value_size must be 8 (inline) or 9..65536 (out of line)");
  const std::size_t size = o.pool_size != 0 ? o.pool_size : default_pool_size(o);
  if (size > kMaxPoolBytes)
    return Status(Code::invalid_argument,
                  "utree pools are limited to 64 GiB (DRAM leaves hold 32-bit node indexes)");
  return Status::Ok();
}

Result<std::unique_ptr<Index>> create(std::unique_ptr<pm::Pool> pool, const Options& o) {
  return UTree<Protocol>::create(std::move(pool), o);
}

Result<std::unique_ptr<Index>> recover(std::unique_ptr<pm::Pool> pool, const Options& o) {
  return UTree<Protocol>::recover(std::move(pool), o);
}

}  // namespace pmindex::utree

#include "ringrun/common/peer_table.h"

#include <zlib.h>

#include <string>

namespace ringrun {

Status PackPeerColumns(v1::JoinReply* reply) {
  v1::JoinReply cols;
  cols.mutable_addresses()->Swap(reply->mutable_addresses());
  cols.mutable_address_of_rank()->Swap(reply->mutable_address_of_rank());
  cols.mutable_port_of_rank()->Swap(reply->mutable_port_of_rank());
  const std::string raw = cols.SerializeAsString();
  uLongf len = compressBound(raw.size());
  std::string packed(len, '\0');
  int rc = compress2(reinterpret_cast<Bytef*>(packed.data()), &len,
                     reinterpret_cast<const Bytef*>(raw.data()), raw.size(), Z_BEST_SPEED);
  if (rc != Z_OK) return Internal("zlib compress2 failed: " + std::to_string(rc));
  packed.resize(len);
  reply->set_packed_peers(std::move(packed));
  reply->set_packed_size(static_cast<uint32_t>(raw.size()));
  return Status::Ok();
}

Status UnpackPeerColumns(v1::JoinReply* reply) {
  if (reply->packed_peers().empty()) return Status::Ok();
  constexpr uint32_t kMaxPacked = 1u << 30;
  if (reply->packed_size() > kMaxPacked) return Internal("Join reply: packed peer table too large");
  std::string raw(reply->packed_size(), '\0');
  uLongf len = raw.size();
  int rc = uncompress(reinterpret_cast<Bytef*>(raw.data()), &len,
                      reinterpret_cast<const Bytef*>(reply->packed_peers().data()),
                      reply->packed_peers().size());
  if (rc != Z_OK || len != raw.size()) {
    return Internal("Join reply: the packed peer table does not inflate (zlib " +
                    std::to_string(rc) + ")");
  }
  v1::JoinReply cols;
  if (!cols.ParseFromString(raw)) return Internal("Join reply: malformed packed peer table");
  reply->mutable_addresses()->Swap(cols.mutable_addresses());
  reply->mutable_address_of_rank()->Swap(cols.mutable_address_of_rank());
  reply->mutable_port_of_rank()->Swap(cols.mutable_port_of_rank());
  reply->clear_packed_peers();
  reply->clear_packed_size();
  return Status::Ok();
}

}  // namespace ringrun

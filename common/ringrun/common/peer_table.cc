#include "ringrun/common/peer_table.h"

#include <cstring>
#include <string>

namespace ringrun {
namespace {

// Little-endian fixed-width fields; the format is ours on both ends (proto/ringrun/job.proto).
void PutU32(std::string* out, uint32_t v) {
  char b[4] = {char(v), char(v >> 8), char(v >> 16), char(v >> 24)};
  out->append(b, 4);
}

class Reader {
 public:
  explicit Reader(const std::string& s) : p_(s.data()), end_(s.data() + s.size()) {}
  bool U32(uint32_t* v) {
    if (end_ - p_ < 4) return false;
    const auto* u = reinterpret_cast<const unsigned char*>(p_);
    *v = uint32_t(u[0]) | uint32_t(u[1]) << 8 | uint32_t(u[2]) << 16 | uint32_t(u[3]) << 24;
    p_ += 4;
    return true;
  }
  bool Bytes(size_t n, const char** out) {
    if (size_t(end_ - p_) < n) return false;
    *out = p_;
    p_ += n;
    return true;
  }
  bool done() const { return p_ == end_; }

 private:
  const char* p_;
  const char* end_;
};

}  // namespace

// Layout: u32 address count, then each address as u32 length + bytes; u32 run count, then
// runs of (u32 address index, u32 rank count) in rank order; then one u16 port per rank.
// Ranks of a host are contiguous under ringrun's placement, so a job is a few runs and two
// bytes a rank: 16 KB for 8,000 ranks, decoded with one pass and no allocation per rank.
Status PackPeerColumns(v1::JoinReply* reply) {
  const int n = reply->port_of_rank_size();
  if (reply->address_of_rank_size() != n) return Internal("peer columns of different lengths");
  std::string out;
  out.reserve(16 + size_t(n) * 2);
  PutU32(&out, static_cast<uint32_t>(reply->addresses_size()));
  for (const auto& a : reply->addresses()) {
    PutU32(&out, static_cast<uint32_t>(a.size()));
    out += a;
  }
  std::string runs;
  uint32_t nruns = 0;
  for (int r = 0; r < n;) {
    int e = r;
    while (e < n && reply->address_of_rank(e) == reply->address_of_rank(r)) ++e;
    PutU32(&runs, reply->address_of_rank(r));
    PutU32(&runs, static_cast<uint32_t>(e - r));
    ++nruns;
    r = e;
  }
  PutU32(&out, nruns);
  out += runs;
  for (int r = 0; r < n; ++r) {
    const uint32_t port = reply->port_of_rank(r);
    if (port > 0xffff) return Internal("port " + std::to_string(port) + " out of range");
    char b[2] = {char(port), char(port >> 8)};
    out.append(b, 2);
  }
  reply->clear_addresses();
  reply->clear_address_of_rank();
  reply->clear_port_of_rank();
  reply->set_packed_peers(std::move(out));
  reply->set_packed_size(static_cast<uint32_t>(n));
  return Status::Ok();
}

Status UnpackPeerColumns(v1::JoinReply* reply) {
  if (reply->packed_peers().empty()) return Status::Ok();
  const std::string packed = std::move(*reply->mutable_packed_peers());
  const uint32_t n = reply->packed_size();
  const Status bad = Internal("Join reply: malformed packed peer table");
  Reader in(packed);
  uint32_t naddr = 0, nruns = 0;
  if (!in.U32(&naddr)) return bad;
  reply->clear_addresses();
  for (uint32_t i = 0; i < naddr; ++i) {
    uint32_t len = 0;
    const char* p = nullptr;
    if (!in.U32(&len) || !in.Bytes(len, &p)) return bad;
    reply->add_addresses(std::string(p, len));
  }
  if (!in.U32(&nruns)) return bad;
  auto* addr = reply->mutable_address_of_rank();
  addr->Clear();
  addr->Reserve(static_cast<int>(n));
  for (uint32_t i = 0; i < nruns; ++i) {
    uint32_t idx = 0, count = 0;
    if (!in.U32(&idx) || !in.U32(&count) || idx >= naddr || addr->size() + uint64_t(count) > n) {
      return bad;
    }
    for (uint32_t k = 0; k < count; ++k) addr->Add(idx);
  }
  const char* ports = nullptr;
  if (uint32_t(addr->size()) != n || !in.Bytes(size_t(n) * 2, &ports) || !in.done()) return bad;
  auto* port = reply->mutable_port_of_rank();
  port->Resize(static_cast<int>(n), 0);
  const auto* u = reinterpret_cast<const unsigned char*>(ports);
  for (uint32_t r = 0; r < n; ++r)
    port->Set(static_cast<int>(r), uint32_t(u[2 * r]) | uint32_t(u[2 * r + 1]) << 8);
  reply->clear_packed_peers();
  reply->clear_packed_size();
  return Status::Ok();
}

}  // namespace ringrun

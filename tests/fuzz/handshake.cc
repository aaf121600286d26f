// Fuzz target: the data plane's handshake messages and checks (runtime/src/transport/handshake.*).
//
// Input: the whole input is offered to DecodeConnectHello and DecodeAcceptHello as a message
// off the wire. Its first 120 bytes (zero-padded) also make up a handshake: a connector's hello
// (rank, to_rank, tag, ring size, nonce: 56 bytes), the acceptor's context (rank, size, local,
// segment fd), its nonce (32 bytes) and a candidate proof (32 bytes); the rest is a candidate
// secret.
//
// Properties: a decoder accepts exactly its message size with its magic (and the connect
// hello's reserved word 0), and then re-encoding gives back the very bytes; CheckConnectHello
// accepts exactly the hellos its contract describes (this job's tag, addressed to this rank from
// a lower rank of the job, a segment exactly on the local socket with a power-of-two ring size
// in [4096, kMaxShmRingBytes], no ring size on TCP), and says why otherwise; a proof is accepted
// only if it is the HMAC made with the job's secret: a candidate proof, a proof made with any
// other secret, a proof for the other role, or for a transcript with any field changed, is not.
#include "runtime/src/transport/handshake.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "runtime/src/transport/shm_pair.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using namespace ringrun::runtime;
using namespace ringrun::runtime::transport;

const std::string kSecret(64, 'a');  // 64 hex characters, as RINGRUN_SECRET

uint64_t Get(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

void CheckDecoders(const uint8_t* data, size_t size) {
  auto hello = DecodeConnectHello(data, size);
  const bool connect_shape =
      size == kConnectHelloBytes && Get(data, 4) == 0x31435252 && Get(data + 12, 4) == 0;
  FUZZ_CHECK(hello.ok() == connect_shape);
  if (hello.ok()) {
    uint8_t again[kConnectHelloBytes];
    EncodeConnectHello(*hello, again);
    FUZZ_CHECK(std::memcmp(again, data, kConnectHelloBytes) == 0);
  } else {
    FUZZ_CHECK(!hello.status().message().empty());
  }
  auto reply = DecodeAcceptHello(data, size);
  FUZZ_CHECK(reply.ok() == (size == kAcceptHelloBytes && Get(data, 4) == 0x31415252));
  if (reply.ok()) {
    uint8_t again[kAcceptHelloBytes];
    EncodeAcceptHello(*reply, again);
    FUZZ_CHECK(std::memcmp(again, data, kAcceptHelloBytes) == 0);
  } else {
    FUZZ_CHECK(!reply.status().message().empty());
  }
}

bool Admissible(const ConnectHello& h, const HelloContext& ctx) {
  const uint64_t ring = h.ring_bytes;
  const bool ring_ok =
      ctx.local ? ring >= 4096 && ring <= kMaxShmRingBytes && (ring & (ring - 1)) == 0 : ring == 0;
  return h.job_tag == ctx.job_tag && h.to_rank == static_cast<uint32_t>(ctx.my_rank) &&
         h.rank < static_cast<uint32_t>(ctx.my_rank) && h.rank < static_cast<uint32_t>(ctx.size) &&
         ctx.local == ctx.has_fd && ring_ok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  CheckDecoders(data, size);

  uint8_t b[120] = {};
  std::memcpy(b, data, size < sizeof(b) ? size : sizeof(b));
  const std::string_view other_secret(
      reinterpret_cast<const char*>(data) + (size < sizeof(b) ? size : sizeof(b)),
      size < sizeof(b) ? 0 : size - sizeof(b));

  ConnectHello h;
  h.rank = static_cast<uint32_t>(Get(b, 4));
  h.to_rank = static_cast<uint32_t>(Get(b + 4, 4));
  h.job_tag = Get(b + 8, 8);
  h.ring_bytes = Get(b + 16, 8);
  std::memcpy(h.nonce.data(), b + 24, kNonceBytes);
  // Small ranks and the hello's own tag are likely, so that accepted hellos are common.
  HelloContext ctx;
  ctx.my_rank = static_cast<int>(Get(b + 56, 2) & 0x7fff);
  ctx.size = static_cast<int>(Get(b + 58, 2) & 0x7fff);
  ctx.job_tag = (b[60] & 1) ? h.job_tag : Get(b + 8, 8) ^ Get(b + 60, 1);
  ctx.local = b[61] & 1;
  ctx.has_fd = b[61] & 2;
  Nonce acceptor_nonce;
  std::memcpy(acceptor_nonce.data(), b + 56, kNonceBytes);  // overlaps the context: any bytes
  Proof candidate;
  std::memcpy(candidate.data(), b + 88, kProofBytes);

  // Encode/decode round trip of the hello as built.
  uint8_t wire[kConnectHelloBytes];
  EncodeConnectHello(h, wire);
  auto decoded = DecodeConnectHello(wire, sizeof(wire));
  FUZZ_CHECK(decoded.ok() && decoded->rank == h.rank && decoded->to_rank == h.to_rank &&
             decoded->job_tag == h.job_tag && decoded->ring_bytes == h.ring_bytes &&
             decoded->nonce == h.nonce);

  const ringrun::Status check = CheckConnectHello(h, ctx);
  FUZZ_CHECK(check.ok() == Admissible(h, ctx));
  if (!check.ok()) FUZZ_CHECK(!check.message().empty());

  // The acceptor admits a connector whose proof equals this one, and nothing else.
  const uint32_t a = static_cast<uint32_t>(ctx.my_rank);
  const Proof expected = HandshakeProof(kSecret, ProofRole::kConnector, h, a, acceptor_nonce);
  FUZZ_CHECK(ProofEquals(expected, expected));
  FUZZ_CHECK(!ProofEquals(expected, candidate));  // a guess is never the HMAC
  if (other_secret != kSecret) {
    FUZZ_CHECK(!ProofEquals(
        expected, HandshakeProof(other_secret, ProofRole::kConnector, h, a, acceptor_nonce)));
  }
  FUZZ_CHECK(
      !ProofEquals(expected, HandshakeProof(kSecret, ProofRole::kAcceptor, h, a, acceptor_nonce)));
  // Change one field of the transcript (which, and how, from the input): no longer the proof.
  ConnectHello changed = h;
  uint32_t changed_a = a;
  Nonce changed_nonce = acceptor_nonce;
  const uint8_t flip = static_cast<uint8_t>(b[62] | 1);  // never 0
  switch (b[63] % 6) {
    case 0:
      changed.rank ^= flip;
      break;
    case 1:
      changed_a ^= flip;
      break;
    case 2:
      changed.job_tag ^= flip;
      break;
    case 3:
      changed.ring_bytes ^= flip;
      break;
    case 4:
      changed.nonce[b[64] % kNonceBytes] ^= flip;
      break;
    default:
      changed_nonce[b[64] % kNonceBytes] ^= flip;
      break;
  }
  FUZZ_CHECK(!ProofEquals(
      expected, HandshakeProof(kSecret, ProofRole::kConnector, changed, changed_a, changed_nonce)));
  return 0;
}

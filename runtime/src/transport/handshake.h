// The data plane's door: how a connection to a rank's listener becomes a pair.
//
// Only the job's ranks get in. Both sides prove that they hold the job's secret (the 64 hex
// characters of RINGRUN_SECRET) with a mutual challenge-response; only proofs cross the wire:
//
//   connector C -> acceptor A   ConnectHello: C's rank, the rank it means to reach (A), the job
//                               tag, the shared-memory ring size (0 on TCP) and a fresh nonce Nc
//                               (on the local Unix socket, the memfd segment rides along)
//   A -> C                      AcceptHello: A's rank, a fresh nonce Na, and
//                               proof_A = HMAC-SHA-256(secret, "accept" | transcript)
//   C -> A                      proof_C = HMAC-SHA-256(secret, "connect" | transcript)
//   A -> C                      one byte: admitted
//
// where the transcript is (job tag, C's rank, A's rank, ring size, Nc, Na). A uses the pair only
// after checking proof_C, C only after checking proof_A and being told it is admitted. So:
//   - without the secret nobody gets in or poses as a rank, whatever else they know (the job id
//     and its tag are identifiers, not credentials);
//   - a recorded handshake replays to nothing (Na is fresh for each connection);
//   - a proof made for one claimed rank, direction or ring size is no proof for another, so a
//     relay cannot rewrite who is connecting to whom;
//   - the acceptor also refuses a TCP connection whose source address is not the claimed rank's
//     host, unless NAT is allowed (RINGRUN_ALLOW_NAT=1).
// What it does not do: encrypt or authenticate the bytes after the handshake (docs/security.md).
//
// The wire formats are fixed-size and little-endian; Decode* are pure functions of their bytes
// (no I/O, no allocation), which a fuzz target can call directly.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "ringrun/common/fd.h"
#include "ringrun/common/status.h"

namespace ringrun::runtime::transport {

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kProofBytes = 32;  // HMAC-SHA-256
using Nonce = std::array<uint8_t, kNonceBytes>;
using Proof = std::array<uint8_t, kProofBytes>;

// Connector -> acceptor, first.
struct ConnectHello {
  uint32_t rank = 0;        // the connector's rank (claimed until proven)
  uint32_t to_rank = 0;     // the rank it means to reach
  uint64_t job_tag = 0;     // JobTag(job id): tells jobs apart, proves nothing
  uint64_t ring_bytes = 0;  // local socket: the passed segment's ring size; TCP: 0
  Nonce nonce{};
};
inline constexpr size_t kConnectHelloBytes = 64;

// Acceptor -> connector.
struct AcceptHello {
  uint32_t rank = 0;  // the acceptor's rank
  Nonce nonce{};
  Proof proof{};  // HandshakeProof(kAcceptor, ...)
};
inline constexpr size_t kAcceptHelloBytes = 72;

// Connector -> acceptor: HandshakeProof(kConnector, ...), kProofBytes raw.
// Acceptor -> connector, last: this one byte once the proof checks out. Until it arrives the
// connector does not use the connection; a connection closed before it is worth another try
// (the acceptor may have closed it to make room).
inline constexpr uint8_t kAdmittedByte = 0x5a;

void EncodeConnectHello(const ConnectHello& h, uint8_t out[kConnectHelloBytes]);
// Parses exactly kConnectHelloBytes. kInvalidArgument for any other length or a wrong magic.
// Fields are returned as sent: the caller checks them against its job (CheckConnectHello).
Result<ConnectHello> DecodeConnectHello(const uint8_t* data, size_t len);
void EncodeAcceptHello(const AcceptHello& h, uint8_t out[kAcceptHelloBytes]);
// Parses exactly kAcceptHelloBytes. kInvalidArgument for any other length or a wrong magic.
Result<AcceptHello> DecodeAcceptHello(const uint8_t* data, size_t len);

// What the acceptor knows when a hello arrives, to judge it by.
struct HelloContext {
  int my_rank = 0;
  int size = 0;
  uint64_t job_tag = 0;
  bool local = false;   // arrived on the local Unix socket
  bool has_fd = false;  // a segment fd came with it
};
// OK when the hello fits this acceptor: its tag, a lower rank that exists, addressed to this
// rank, and a segment with a valid ring size exactly on the local socket. The reason otherwise.
Status CheckConnectHello(const ConnectHello& h, const HelloContext& ctx);

enum class ProofRole { kAcceptor, kConnector };
// HMAC-SHA-256 keyed by `secret` over the role and the transcript (see the top of this file).
Proof HandshakeProof(std::string_view secret, ProofRole role, const ConnectHello& hello,
                     uint32_t acceptor_rank, const Nonce& acceptor_nonce);
// Constant-time comparison.
bool ProofEquals(const Proof& a, const Proof& b);
// kNonceBytes from getrandom(2).
Result<Nonce> FreshNonce();
// The job tag: the first 8 bytes of SHA-256(job id), never 0.
uint64_t JobTag(std::string_view job_id);

// The abstract Unix socket name (no file) of the local listener of the rank at address:port.
// Abstract names belong to a network namespace, as the TCP port does, and the port is this
// rank's while it runs, so among ringrun's ranks the name is unique. Anyone may bind an
// abstract name, so both ends also check that the other runs as the same user (SameUser), on
// top of the handshake.
sockaddr_un LocalName(const std::string& address, uint16_t port, socklen_t* len);
// Whether the process at the other end of a Unix socket runs as this process's user.
bool SameUser(int fd);

// Non-blocking I/O of handshake messages. Each moves what it can now: *done grows by the
// bytes moved (a message may take several calls). kUnavailable when the other end closed.
// SendSome attaches `pass_fd` (when >= 0) to the first byte; RecvSome keeps a passed fd in
// *passed.
Status SendSome(int fd, const uint8_t* data, size_t len, size_t* done, int pass_fd);
Status RecvSome(int fd, uint8_t* data, size_t len, size_t* done, UniqueFd* passed);

}  // namespace ringrun::runtime::transport

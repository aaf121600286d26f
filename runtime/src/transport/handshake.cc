#include "runtime/src/transport/handshake.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "runtime/src/transport/shm_pair.h"

namespace ringrun::runtime::transport {

namespace {

constexpr uint32_t kConnectMagic = 0x31435252;  // "RRC1"
constexpr uint32_t kAcceptMagic = 0x31415252;   // "RRA1"

void Put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void Put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t Get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{p[i]} << (8 * i);
  return v;
}
uint64_t Get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

}  // namespace

void EncodeConnectHello(const ConnectHello& h, uint8_t out[kConnectHelloBytes]) {
  Put32(out, kConnectMagic);
  Put32(out + 4, h.rank);
  Put32(out + 8, h.to_rank);
  Put32(out + 12, 0);
  Put64(out + 16, h.job_tag);
  Put64(out + 24, h.ring_bytes);
  std::memcpy(out + 32, h.nonce.data(), kNonceBytes);
}

Result<ConnectHello> DecodeConnectHello(const uint8_t* data, size_t len) {
  if (len != kConnectHelloBytes)
    return InvalidArgument("hello of " + std::to_string(len) + " bytes");
  if (Get32(data) != kConnectMagic || Get32(data + 12) != 0) {
    return InvalidArgument("not a ringrun hello");
  }
  ConnectHello h;
  h.rank = Get32(data + 4);
  h.to_rank = Get32(data + 8);
  h.job_tag = Get64(data + 16);
  h.ring_bytes = Get64(data + 24);
  std::memcpy(h.nonce.data(), data + 32, kNonceBytes);
  return h;
}

void EncodeAcceptHello(const AcceptHello& h, uint8_t out[kAcceptHelloBytes]) {
  Put32(out, kAcceptMagic);
  Put32(out + 4, h.rank);
  std::memcpy(out + 8, h.nonce.data(), kNonceBytes);
  std::memcpy(out + 8 + kNonceBytes, h.proof.data(), kProofBytes);
}

Result<AcceptHello> DecodeAcceptHello(const uint8_t* data, size_t len) {
  if (len != kAcceptHelloBytes)
    return InvalidArgument("reply of " + std::to_string(len) + " bytes");
  if (Get32(data) != kAcceptMagic) return InvalidArgument("not a ringrun reply");
  AcceptHello h;
  h.rank = Get32(data + 4);
  std::memcpy(h.nonce.data(), data + 8, kNonceBytes);
  std::memcpy(h.proof.data(), data + 8 + kNonceBytes, kProofBytes);
  return h;
}

Status CheckConnectHello(const ConnectHello& h, const HelloContext& ctx) {
  if (h.job_tag != ctx.job_tag) return PermissionDenied("another job's tag");
  if (h.to_rank != static_cast<uint32_t>(ctx.my_rank)) {
    return PermissionDenied("addressed to rank " + std::to_string(h.to_rank));
  }
  // The lower rank connects to the higher one.
  if (h.rank >= static_cast<uint32_t>(ctx.my_rank) || h.rank >= static_cast<uint32_t>(ctx.size)) {
    return PermissionDenied("claims rank " + std::to_string(h.rank));
  }
  if (ctx.local != ctx.has_fd) return InvalidArgument("a segment on the wrong socket");
  const uint64_t ring = h.ring_bytes;
  if (!ctx.local && ring != 0) return InvalidArgument("a ring size on TCP");
  if (ctx.local && (ring < 4096 || ring > kMaxShmRingBytes || (ring & (ring - 1)) != 0)) {
    return InvalidArgument("ring size " + std::to_string(ring));
  }
  return Status::Ok();
}

Proof HandshakeProof(std::string_view secret, ProofRole role, const ConnectHello& hello,
                     uint32_t acceptor_rank, const Nonce& acceptor_nonce) {
  // "ringrun accept 1" / "ringrun connect" (16 bytes each) | tag | C | A | ring | Nc | Na
  uint8_t msg[16 + 8 + 4 + 4 + 8 + 2 * kNonceBytes];
  std::memcpy(msg, role == ProofRole::kAcceptor ? "ringrun accept 1" : "ringrun connect1", 16);
  Put64(msg + 16, hello.job_tag);
  Put32(msg + 24, hello.rank);
  Put32(msg + 28, acceptor_rank);
  Put64(msg + 32, hello.ring_bytes);
  std::memcpy(msg + 40, hello.nonce.data(), kNonceBytes);
  std::memcpy(msg + 40 + kNonceBytes, acceptor_nonce.data(), kNonceBytes);
  Proof out{};
  unsigned int out_len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), msg, sizeof(msg), out.data(),
       &out_len);
  return out;
}

bool ProofEquals(const Proof& a, const Proof& b) {
  return CRYPTO_memcmp(a.data(), b.data(), kProofBytes) == 0;
}

Result<Nonce> FreshNonce() {
  Nonce n{};
  size_t got = 0;
  while (got < n.size()) {
    ssize_t r = ::getrandom(n.data() + got, n.size() - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("getrandom", errno);
    }
    got += static_cast<size_t>(r);
  }
  return n;
}

uint64_t JobTag(std::string_view job_id) {
  uint8_t md[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const uint8_t*>(job_id.data()), job_id.size(), md);
  return Get64(md) | 1;
}

sockaddr_un LocalName(const std::string& address, uint16_t port, socklen_t* len) {
  sockaddr_un un{};
  un.sun_family = AF_UNIX;
  const int n = std::snprintf(un.sun_path + 1, sizeof(un.sun_path) - 1, "ringrun/%s:%u",
                              address.c_str(), static_cast<unsigned>(port));
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 +
                                std::min<size_t>(n, sizeof(un.sun_path) - 2));
  return un;
}

bool SameUser(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  return ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.uid == ::getuid();
}

Status SendSome(int fd, const uint8_t* data, size_t len, size_t* done, int pass_fd) {
  while (*done < len) {
    iovec iov{const_cast<uint8_t*>(data + *done), len - *done};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov, msg.msg_iovlen = 1;
    if (pass_fd >= 0 && *done == 0) {
      msg.msg_control = control, msg.msg_controllen = sizeof(control);
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET, c->cmsg_type = SCM_RIGHTS, c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
    }
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      *done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Status::Ok();
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) return Unavailable("connection closed");
    return ErrnoStatus("sendmsg", errno);
  }
  return Status::Ok();
}

Status RecvSome(int fd, uint8_t* data, size_t len, size_t* done, UniqueFd* passed) {
  while (*done < len) {
    iovec iov{data + *done, len - *done};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov, msg.msg_iovlen = 1;
    msg.msg_control = control, msg.msg_controllen = sizeof(control);
    ssize_t n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n > 0) {
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        const size_t fds = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < fds; ++i) {
          int received;
          std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
          // Only the first passed fd is kept; any other is closed at once.
          if (passed != nullptr && !passed->valid()) {
            *passed = UniqueFd(received);
          } else {
            ::close(received);
          }
        }
      }
      *done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return Unavailable("connection closed");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::Ok();
    if (errno == ECONNRESET) return Unavailable("connection reset");
    return ErrnoStatus("recvmsg", errno);
  }
  return Status::Ok();
}

}  // namespace ringrun::runtime::transport

#include "runtime/src/transport/acceptor.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <cerrno>

#include "runtime/src/transport/socket_util.h"

namespace ringrun::runtime::transport {

namespace {

// At most this many connections are taken from a listener per Service call, so that one call
// never accepts and then evicts the same connection (it is below max_pending / 2).
constexpr int kAcceptBatch = 16;
constexpr size_t kMaxLoggedAddresses = 1024;

}  // namespace

struct Acceptor::Pending {
  UniqueFd fd;
  bool local = false;
  in_addr addr{};    // TCP: the source address
  std::string from;  // for logs: "1.2.3.4:5678" or "local socket"
  Deadline deadline;
  enum Stage { kHello, kReply, kProof, kAck } stage = kHello;
  uint8_t in[kConnectHelloBytes];
  size_t got = 0;
  UniqueFd segment;
  ConnectHello hello;
  Nonce nonce{};
  uint8_t out[kAcceptHelloBytes];
  size_t sent = 0;
  Proof proof{};
  size_t proof_got = 0;
  size_t ack_sent = 0;
};

Acceptor::Acceptor(AcceptorOptions options, int tcp, int local)
    : options_(std::move(options)),
      tcp_(tcp),
      local_(local),
      job_tag_(JobTag(options_.peers->job_id)) {}

Acceptor::~Acceptor() = default;

void Acceptor::AddPollFds(std::vector<pollfd>* fds) const {
  fds->push_back(pollfd{tcp_, POLLIN, 0});
  if (local_ >= 0) fds->push_back(pollfd{local_, POLLIN, 0});
  for (const auto& p : pending_) {
    fds->push_back(pollfd{
        p->fd.get(),
        static_cast<short>(p->stage == Pending::kReply || p->stage == Pending::kAck ? POLLOUT
                                                                                    : POLLIN),
        0});
  }
}

void Acceptor::Clear() { pending_.clear(); }

void Acceptor::Refuse(Pending& p, const std::string& why, uint64_t* counter) {
  ++*counter;
  if (logged_.size() < kMaxLoggedAddresses && logged_.insert(p.from).second) {
    spdlog::debug(
        "rank {}: refused a data-plane connection from {}: {} (further refusals from "
        "this address are counted, not logged)",
        options_.rank, p.from, why);
  }
  p.fd.Reset();
}

void Acceptor::MakeRoom() {
  while (pending_.size() >= options_.max_pending && !pending_.empty()) {
    auto victim = pending_.begin();
    for (auto it = pending_.begin(); it != pending_.end(); ++it) {
      if ((*it)->stage == Pending::kHello) {
        victim = it;
        break;
      }
    }
    Refuse(**victim, "too many pending connections", &counters_.evicted);
    pending_.erase(victim);
  }
}

Status Acceptor::AcceptFrom(int listener, bool local) {
  for (int i = 0; i < kAcceptBatch; ++i) {
    sockaddr_in sa{};
    socklen_t len = sizeof(sa);
    UniqueFd fd(::accept4(listener, local ? nullptr : reinterpret_cast<sockaddr*>(&sa),
                          local ? nullptr : &len, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd.valid()) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED ||
          errno == EPERM || errno == EPROTO) {
        return Status::Ok();
      }
      // EMFILE/ENFILE/ENOBUFS/ENOMEM: this rank is short of resources. The connection stays in
      // the backlog; a later call tries again once pending ones are gone.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        return Status::Ok();
      }
      return ErrnoStatus("accept", errno);
    }
    MakeRoom();
    auto p = std::make_unique<Pending>();
    p->fd = std::move(fd);
    p->local = local;
    p->deadline = DeadlineAfter(options_.handshake_timeout_ms);
    if (local) {
      p->from = "the local socket";
      if (!SameUser(p->fd.get())) {
        Refuse(*p, "another user", &counters_.refused);
        continue;
      }
    } else {
      TuneSocket(p->fd.get());
      p->addr = sa.sin_addr;
      char text[INET_ADDRSTRLEN] = "?";
      ::inet_ntop(AF_INET, &sa.sin_addr, text, sizeof(text));
      p->from = text;
    }
    pending_.push_back(std::move(p));
  }
  return Status::Ok();
}

bool Acceptor::Advance(Pending& p, const std::function<bool(int)>& admissible,
                       std::vector<AdmittedPeer>* admitted) {
  if (p.stage == Pending::kHello) {
    Status st = RecvSome(p.fd.get(), p.in, sizeof(p.in), &p.got, p.local ? &p.segment : nullptr);
    if (!st.ok()) return Refuse(p, "before its hello: " + st.message(), &counters_.refused), true;
    if (p.got < sizeof(p.in)) return false;
    Result<ConnectHello> hello = DecodeConnectHello(p.in, sizeof(p.in));
    if (!hello.ok()) return Refuse(p, hello.status().message(), &counters_.refused), true;
    HelloContext ctx;
    ctx.my_rank = options_.rank;
    ctx.size = options_.peers->size();
    ctx.job_tag = job_tag_;
    ctx.local = p.local;
    ctx.has_fd = p.segment.valid();
    Status ok = CheckConnectHello(*hello, ctx);
    if (!ok.ok()) return Refuse(p, ok.message(), &counters_.refused), true;
    const int claimed = static_cast<int>(hello->rank);
    if (!p.local && !options_.allow_nat) {
      in_addr expected{};
      if (::inet_pton(AF_INET, options_.peers->address(claimed).c_str(), &expected) != 1 ||
          expected.s_addr != p.addr.s_addr) {
        return Refuse(p,
                      "claims rank " + std::to_string(claimed) + ", whose host is " +
                          options_.peers->address(claimed) + " (RINGRUN_ALLOW_NAT=1 allows NAT)",
                      &counters_.refused),
               true;
      }
    }
    if (!admissible(claimed)) {
      return Refuse(p, "rank " + std::to_string(claimed) + " is connected already",
                    &counters_.refused),
             true;
    }
    Result<Nonce> nonce = FreshNonce();
    if (!nonce.ok()) return Refuse(p, nonce.status().message(), &counters_.refused), true;
    p.hello = *hello;
    p.nonce = *nonce;
    AcceptHello reply;
    reply.rank = static_cast<uint32_t>(options_.rank);
    reply.nonce = p.nonce;
    reply.proof =
        HandshakeProof(options_.secret, ProofRole::kAcceptor, p.hello, reply.rank, p.nonce);
    EncodeAcceptHello(reply, p.out);
    p.stage = Pending::kReply;
  }
  if (p.stage == Pending::kReply) {
    Status st = SendSome(p.fd.get(), p.out, sizeof(p.out), &p.sent, -1);
    if (!st.ok()) return Refuse(p, "while replying: " + st.message(), &counters_.refused), true;
    if (p.sent < sizeof(p.out)) return false;
    p.stage = Pending::kProof;
  }
  const int rank = static_cast<int>(p.hello.rank);
  if (p.stage == Pending::kProof) {
    Status st = RecvSome(p.fd.get(), p.proof.data(), p.proof.size(), &p.proof_got, nullptr);
    if (!st.ok()) return Refuse(p, "before its proof: " + st.message(), &counters_.refused), true;
    if (p.proof_got < p.proof.size()) return false;
    const Proof expected = HandshakeProof(options_.secret, ProofRole::kConnector, p.hello,
                                          static_cast<uint32_t>(options_.rank), p.nonce);
    if (!ProofEquals(expected, p.proof)) {
      return Refuse(p, "a wrong proof for rank " + std::to_string(rank), &counters_.refused), true;
    }
    p.stage = Pending::kAck;
  }
  if (!admissible(rank)) {
    return Refuse(p, "rank " + std::to_string(rank) + " is connected already", &counters_.refused),
           true;
  }
  Status st = SendSome(p.fd.get(), &kAdmittedByte, 1, &p.ack_sent, -1);
  if (!st.ok()) return Refuse(p, "while admitting: " + st.message(), &counters_.refused), true;
  if (p.ack_sent < 1) return false;
  AdmittedPeer peer;
  peer.rank = rank;
  peer.fd = std::move(p.fd);
  peer.local = p.local;
  peer.segment = std::move(p.segment);
  peer.ring_bytes = p.hello.ring_bytes;
  admitted->push_back(std::move(peer));
  ++counters_.admitted;
  return true;
}

Result<std::vector<AdmittedPeer>> Acceptor::Service(const std::function<bool(int)>& admissible) {
  std::vector<AdmittedPeer> admitted;
  RINGRUN_RETURN_IF_ERROR(AcceptFrom(tcp_, false));
  if (local_ >= 0) RINGRUN_RETURN_IF_ERROR(AcceptFrom(local_, true));
  const Deadline now = std::chrono::steady_clock::now();
  for (auto it = pending_.begin(); it != pending_.end();) {
    Pending& p = **it;
    bool done = p.fd.valid() ? Advance(p, admissible, &admitted) : true;
    if (!done && now >= p.deadline) {
      Refuse(p, "no complete handshake in time", &counters_.timed_out);
      done = true;
    }
    it = done ? pending_.erase(it) : it + 1;
  }
  return admitted;
}

}  // namespace ringrun::runtime::transport

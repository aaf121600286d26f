// The data plane's door (handshake.h, acceptor.h): only the job's ranks get in, and hostile
// connections cost nothing. Real loopback sockets; attackers are plain sockets in this process.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <thread>

#include "runtime/src/transport/acceptor.h"
#include "runtime/src/transport/handshake.h"
#include "runtime/src/transport/transport.h"

namespace ringrun::runtime {
namespace {

using namespace ringrun::runtime::transport;

constexpr char kSecret[] = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

// A blocking TCP connection to addr:port, from `from` when it is not empty.
UniqueFd Dial(const std::string& addr, uint16_t port, const std::string& from = "") {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(fd.valid());
  timeval tv{5, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (!from.empty()) {
    sockaddr_in me{};
    me.sin_family = AF_INET;
    ::inet_pton(AF_INET, from.c_str(), &me.sin_addr);
    REQUIRE(::bind(fd.get(), reinterpret_cast<sockaddr*>(&me), sizeof(me)) == 0);
  }
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  ::inet_pton(AF_INET, addr.c_str(), &sa.sin_addr);
  REQUIRE(::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0);
  return fd;
}

// Returns whether all n bytes went out. No Catch2 assertion here: client threads call it, and
// Catch2's assertion macros are not thread-safe (ThreadSanitizer reports them); the test
// thread checks the result.
bool WriteAll(int fd, const void* p, size_t n) {
  return ::send(fd, p, n, MSG_NOSIGNAL) == static_cast<ssize_t>(n);
}

// Reads exactly n bytes; false at EOF, an error or the 5 s receive timeout.
bool ReadAll(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t k = ::recv(fd, c, n, 0);
    if (k <= 0) return false;
    c += k, n -= static_cast<size_t>(k);
  }
  return true;
}

// True once the other end has closed the connection (within 5 s).
bool ClosedByPeer(int fd) {
  char c;
  return ::recv(fd, &c, 1, 0) == 0;
}

// A connector's side of the handshake, done by hand, on a thread of its own (so it asserts
// nothing: the test thread checks what it returns). `proof_rank` is the rank the proof is made
// for (normally the claimed one). Returns every byte it sent, for replaying.
struct ClientRun {
  std::vector<uint8_t> sent;
  bool bad_reply = false;  // a reply came that is not an AcceptHello
  bool acceptor_proved = false;
  bool admitted = false;  // the acceptor said so
};
ClientRun RunClient(int fd, const std::string& secret, uint32_t rank, uint32_t to_rank,
                    const std::string& job_id, uint32_t proof_rank) {
  ClientRun run;
  ConnectHello h;
  h.rank = rank, h.to_rank = to_rank, h.job_tag = JobTag(job_id);
  h.nonce = FreshNonce().value();
  uint8_t out[kConnectHelloBytes];
  EncodeConnectHello(h, out);
  if (!WriteAll(fd, out, sizeof(out))) return run;
  run.sent.assign(out, out + sizeof(out));
  uint8_t in[kAcceptHelloBytes];
  if (!ReadAll(fd, in, sizeof(in))) return run;
  Result<AcceptHello> reply = DecodeAcceptHello(in, sizeof(in));
  if (!reply.ok()) {
    run.bad_reply = true;
    return run;
  }
  run.acceptor_proved = ProofEquals(
      reply->proof, HandshakeProof(secret, ProofRole::kAcceptor, h, to_rank, reply->nonce));
  ConnectHello as = h;
  as.rank = proof_rank;
  const Proof proof = HandshakeProof(secret, ProofRole::kConnector, as, to_rank, reply->nonce);
  if (!WriteAll(fd, proof.data(), proof.size())) return run;
  run.sent.insert(run.sent.end(), proof.begin(), proof.end());
  uint8_t admitted = 0;
  run.admitted = ReadAll(fd, &admitted, 1) && admitted == kAdmittedByte;
  return run;
}

// One acceptor over a real listener, driven by the test thread.
struct AcceptorRig {
  PeerTable table;
  Listener listener;
  std::unique_ptr<Acceptor> acceptor;
  std::vector<int> admitted;

  AcceptorRig(std::vector<std::string> hosts, int rank, bool allow_nat = false) {
    table.job_id = "admission";
    for (const std::string& h : hosts) {
      table.address_of_rank.push_back(static_cast<uint32_t>(table.addresses.size()));
      table.addresses.push_back(h);
      table.port_of_rank.push_back(0);
    }
    Result<Listener> l = Listen(hosts[rank]);
    REQUIRE(l.ok());
    listener = std::move(l.value());
    table.port_of_rank[rank] = listener.port;
    AcceptorOptions o;
    o.rank = rank, o.peers = &table, o.secret = kSecret, o.allow_nat = allow_nat;
    o.handshake_timeout_ms = 1000;
    acceptor = std::make_unique<Acceptor>(o, listener.fd.get(), -1);
  }
  // Serves until `done` or 5 s pass.
  void Drive(const std::function<bool()>& done) {
    const Deadline end = DeadlineAfter(5000);
    while (!done() && std::chrono::steady_clock::now() < end) {
      std::vector<pollfd> fds;
      acceptor->AddPollFds(&fds);
      ::poll(fds.data(), fds.size(), 10);
      Result<std::vector<AdmittedPeer>> got = acceptor->Service([](int) { return true; });
      REQUIRE(got.ok());
      for (AdmittedPeer& p : *got) admitted.push_back(p.rank);
    }
  }
  uint16_t port() const { return listener.port; }
};

TEST_CASE("handshake: the decoder takes exactly its format and nothing else", "[handshake]") {
  ConnectHello h;
  h.rank = 3, h.to_rank = 7, h.job_tag = 0x1122334455667789ull, h.ring_bytes = 1 << 20;
  for (size_t i = 0; i < kNonceBytes; ++i) h.nonce[i] = static_cast<uint8_t>(i * 13);
  uint8_t wire[kConnectHelloBytes];
  EncodeConnectHello(h, wire);
  Result<ConnectHello> back = DecodeConnectHello(wire, sizeof(wire));
  REQUIRE(back.ok());
  CHECK(back->rank == 3);
  CHECK(back->to_rank == 7);
  CHECK(back->job_tag == h.job_tag);
  CHECK(back->ring_bytes == h.ring_bytes);
  CHECK(back->nonce == h.nonce);
  for (size_t len : {size_t{0}, size_t{1}, size_t{24}, size_t{63}, size_t{65}}) {
    CHECK_FALSE(DecodeConnectHello(wire, len).ok());
  }
  uint8_t bad[kConnectHelloBytes];
  std::memcpy(bad, wire, sizeof(bad));
  bad[0] ^= 1;  // magic
  CHECK_FALSE(DecodeConnectHello(bad, sizeof(bad)).ok());
  std::memcpy(bad, wire, sizeof(bad));
  bad[12] = 1;  // reserved
  CHECK_FALSE(DecodeConnectHello(bad, sizeof(bad)).ok());
  CHECK_FALSE(DecodeAcceptHello(wire, sizeof(wire)).ok());

  HelloContext ctx;
  ctx.my_rank = 7, ctx.size = 8, ctx.job_tag = h.job_tag, ctx.local = true, ctx.has_fd = true;
  CHECK(CheckConnectHello(*back, ctx).ok());
  ConnectHello other = *back;
  other.job_tag ^= 2;
  CHECK_FALSE(CheckConnectHello(other, ctx).ok());
  other = *back, other.rank = 7;  // not a lower rank
  CHECK_FALSE(CheckConnectHello(other, ctx).ok());
  other = *back, other.to_rank = 6;  // meant for another rank
  CHECK_FALSE(CheckConnectHello(other, ctx).ok());
  other = *back, other.ring_bytes = 3 << 20;  // not a power of two
  CHECK_FALSE(CheckConnectHello(other, ctx).ok());
  ctx.has_fd = false;  // a local hello without its segment
  CHECK_FALSE(CheckConnectHello(*back, ctx).ok());
  ctx.local = false;  // a ring size on TCP
  CHECK_FALSE(CheckConnectHello(*back, ctx).ok());
}

TEST_CASE("handshake: a proof binds the secret, both ranks, the ring and both nonces",
          "[handshake]") {
  ConnectHello h;
  h.rank = 1, h.to_rank = 2, h.job_tag = 99;
  Nonce na{};
  na[0] = 5;
  const Proof p = HandshakeProof(kSecret, ProofRole::kConnector, h, 2, na);
  CHECK(ProofEquals(p, HandshakeProof(kSecret, ProofRole::kConnector, h, 2, na)));
  CHECK_FALSE(ProofEquals(p, HandshakeProof("another secret", ProofRole::kConnector, h, 2, na)));
  CHECK_FALSE(ProofEquals(p, HandshakeProof(kSecret, ProofRole::kAcceptor, h, 2, na)));
  CHECK_FALSE(ProofEquals(p, HandshakeProof(kSecret, ProofRole::kConnector, h, 3, na)));
  ConnectHello other = h;
  other.rank = 0;
  CHECK_FALSE(ProofEquals(p, HandshakeProof(kSecret, ProofRole::kConnector, other, 2, na)));
  other = h, other.ring_bytes = 4096;
  CHECK_FALSE(ProofEquals(p, HandshakeProof(kSecret, ProofRole::kConnector, other, 2, na)));
  other = h, other.nonce[31] = 1;
  CHECK_FALSE(ProofEquals(p, HandshakeProof(kSecret, ProofRole::kConnector, other, 2, na)));
  Nonce na2 = na;
  na2[1] = 1;
  CHECK_FALSE(ProofEquals(p, HandshakeProof(kSecret, ProofRole::kConnector, h, 2, na2)));
  CHECK(FreshNonce().value() != FreshNonce().value());
}

TEST_CASE("admission: a replayed handshake is refused", "[handshake][admission]") {
  AcceptorRig rig({"127.0.0.1", "127.0.0.1"}, 1);
  ClientRun first;
  UniqueFd a = Dial("127.0.0.1", rig.port());
  std::thread client([&] { first = RunClient(a.get(), kSecret, 0, 1, "admission", 0); });
  rig.Drive([&] { return rig.admitted.size() == 1; });
  client.join();
  REQUIRE(first.acceptor_proved);
  REQUIRE(first.admitted);
  REQUIRE(rig.admitted == std::vector<int>{0});

  // Every byte of that handshake, sent again on a new connection.
  UniqueFd b = Dial("127.0.0.1", rig.port());
  REQUIRE(WriteAll(b.get(), first.sent.data(), first.sent.size()));
  rig.Drive([&] { return rig.acceptor->counters().refused == 1; });
  CHECK(rig.acceptor->counters().refused == 1);
  CHECK(rig.admitted == std::vector<int>{0});
  uint8_t reply[kAcceptHelloBytes];
  CHECK(ReadAll(b.get(), reply, sizeof(reply)));  // a fresh challenge, which it cannot answer
  CHECK(ClosedByPeer(b.get()));
}

TEST_CASE("admission: a peer without the secret is refused and learns nothing it can use",
          "[handshake][admission]") {
  AcceptorRig rig({"127.0.0.1", "127.0.0.1"}, 1);
  UniqueFd a = Dial("127.0.0.1", rig.port());
  ClientRun run;
  std::thread client([&] { run = RunClient(a.get(), "a guessed secret", 0, 1, "admission", 0); });
  rig.Drive([&] { return rig.acceptor->counters().refused == 1; });
  client.join();
  CHECK_FALSE(run.acceptor_proved);  // the acceptor's proof is of the real secret
  CHECK_FALSE(run.admitted);
  CHECK(rig.admitted.empty());
  CHECK(ClosedByPeer(a.get()));
}

TEST_CASE("admission: a real rank that claims another rank's index is refused",
          "[handshake][admission]") {
  // Ranks 0, 1, 2 on hosts 127.0.0.2, .3, .4; the acceptor is rank 2.
  const std::vector<std::string> hosts = {"127.0.0.2", "127.0.0.3", "127.0.0.4"};
  SECTION("from another rank's host") {
    AcceptorRig rig(hosts, 2);
    UniqueFd fd = Dial(hosts[2], rig.port(), hosts[1]);  // rank 1's host, claiming rank 0
    std::thread client([&] { RunClient(fd.get(), kSecret, 0, 2, "admission", 0); });
    rig.Drive([&] { return rig.acceptor->counters().refused == 1; });
    client.join();
    CHECK(rig.admitted.empty());
    CHECK(rig.acceptor->counters().refused == 1);
  }
  SECTION("with a proof made for its own index (a relay rewriting the hello)") {
    AcceptorRig rig(hosts, 2);
    UniqueFd fd = Dial(hosts[2], rig.port(), hosts[0]);  // claims rank 0 from its host...
    // ...but the proof is rank 1's.
    std::thread client([&] { RunClient(fd.get(), kSecret, 0, 2, "admission", 1); });
    rig.Drive([&] { return rig.acceptor->counters().refused == 1; });
    client.join();
    CHECK(rig.admitted.empty());
  }
  SECTION("its own index from its own host is admitted; another's only where NAT is allowed") {
    AcceptorRig rig(hosts, 2);
    UniqueFd fd = Dial(hosts[2], rig.port(), hosts[1]);
    std::thread client([&] { RunClient(fd.get(), kSecret, 1, 2, "admission", 1); });
    rig.Drive([&] { return rig.admitted.size() == 1; });
    client.join();
    CHECK(rig.admitted == std::vector<int>{1});
    AcceptorRig nat(hosts, 2, /*allow_nat=*/true);
    UniqueFd fd2 = Dial(hosts[2], nat.port(), hosts[1]);
    std::thread client2([&] { RunClient(fd2.get(), kSecret, 0, 2, "admission", 0); });
    nat.Drive([&] { return nat.admitted.size() == 1; });
    client2.join();
    CHECK(nat.admitted == std::vector<int>{0});
  }
}

TEST_CASE("admission: pending connections are capped, silent ones go first", "[admission]") {
  AcceptorRig rig({"127.0.0.1", "127.0.0.1"}, 1);
  std::vector<UniqueFd> silent;
  for (size_t i = 0; i < kMaxPendingConnections + 40; ++i) {
    silent.push_back(Dial("127.0.0.1", rig.port()));
  }
  rig.Drive([&] { return rig.acceptor->counters().evicted >= 40; });
  CHECK(rig.acceptor->pending() <= kMaxPendingConnections);
  // The real peer still gets in past them.
  UniqueFd a = Dial("127.0.0.1", rig.port());
  ClientRun run;
  std::thread client([&] { run = RunClient(a.get(), kSecret, 0, 1, "admission", 0); });
  rig.Drive([&] { return rig.admitted.size() == 1; });
  client.join();
  CHECK(run.acceptor_proved);
  CHECK(run.admitted);
  CHECK(rig.admitted == std::vector<int>{0});
  // Silent connections are closed at their deadline.
  rig.Drive([&] { return rig.acceptor->pending() == 0; });
  CHECK(rig.acceptor->pending() == 0);
}

// Two ranks exchange 1 MiB each way through real transports.
Status Exchange(Transport& t, int peer, int seed) {
  std::vector<char> out(1 << 20), in(1 << 20);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(seed * 7 + i % 251);
  std::vector<Op> ops = {Op::Send(peer, out.data(), out.size()),
                         Op::Recv(peer, in.data(), in.size())};
  RINGRUN_RETURN_IF_ERROR(t.Run(ops, DeadlineAfter(10000)));
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != static_cast<char>(peer * 7 + i % 251)) return Internal("wrong bytes");
  }
  return Status::Ok();
}

TEST_CASE("transport: a forger first in line and hundreds of silent connections change nothing",
          "[handshake][admission][transport]") {
  for (bool shm : {false, true}) {
    DYNAMIC_SECTION("shm=" << shm) {
      PeerTable table;
      table.job_id = "forged";
      table.addresses = {"127.0.0.1"};
      std::vector<Listener> listeners;
      for (int r = 0; r < 2; ++r) {
        Result<Listener> l = Listen("127.0.0.1");
        REQUIRE(l.ok());
        table.address_of_rank.push_back(0);
        table.port_of_rank.push_back(l->port);
        listeners.push_back(std::move(l.value()));
      }
      // Before either rank runs: a forger that knows the job id (so its tag) poses as rank 0 on
      // rank 1's port, and 200 silent connections and some junk queue up behind it.
      UniqueFd forger = Dial("127.0.0.1", table.port_of_rank[1]);
      ConnectHello h;
      h.rank = 0, h.to_rank = 1, h.job_tag = JobTag("forged");
      uint8_t hello[kConnectHelloBytes];
      EncodeConnectHello(h, hello);
      REQUIRE(WriteAll(forger.get(), hello, sizeof(hello)));
      std::vector<UniqueFd> silent;
      for (int i = 0; i < 200; ++i) silent.push_back(Dial("127.0.0.1", table.port_of_rank[1]));
      for (int i = 0; i < 20; ++i) {
        UniqueFd junk = Dial("127.0.0.1", table.port_of_rank[1]);
        REQUIRE(WriteAll(junk.get(), "GET / HTTP/1.0\r\n\r\n", 18));
      }
      TransportOptions topts;
      topts.use_shm = shm, topts.spin = false, topts.secret = kSecret;
      std::vector<std::unique_ptr<Transport>> ts;
      for (int r = 0; r < 2; ++r) {
        ts.push_back(MakeSocketTransport(r, table, std::move(listeners[r]), topts).value());
      }
      std::vector<Status> st(2);
      const auto t0 = std::chrono::steady_clock::now();
      std::thread r0([&] { st[0] = Exchange(*ts[0], 1, 0); });
      std::thread r1([&] { st[1] = Exchange(*ts[1], 0, 1); });
      r0.join();
      r1.join();
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      CHECK(st[0].ok());
      CHECK(st[1].ok());
      INFO(st[0].ToString() << " / " << st[1].ToString());
      CHECK(secs < 2.0);  // silent connections must not hold the door until their 10 s timeout
      // The forger got a challenge it cannot answer, and no job data.
      uint8_t reply[kAcceptHelloBytes];
      CHECK(ReadAll(forger.get(), reply, sizeof(reply)));
      ts.clear();
      CHECK(ClosedByPeer(forger.get()));
    }
  }
}

}  // namespace
}  // namespace ringrun::runtime

namespace ringrun::runtime {
namespace {

using namespace ringrun::runtime::transport;

TEST_CASE("transport: a rank in the middle of a Run answers a peer connecting for a later one",
          "[handshake][transport]") {
  // Rank 2 waits for data from rank 1; rank 1 waits for rank 0; rank 0 first connects to rank 2.
  // Unless rank 2 answers rank 0's handshake while it waits, all three wait for their deadline.
  for (bool shm : {false, true}) {
    DYNAMIC_SECTION("shm=" << shm) {
      PeerTable table;
      table.job_id = "later";
      table.addresses = {"127.0.0.1"};
      std::vector<Listener> listeners;
      for (int r = 0; r < 3; ++r) {
        Result<Listener> l = Listen("127.0.0.1");
        REQUIRE(l.ok());
        table.address_of_rank.push_back(0);
        table.port_of_rank.push_back(l->port);
        listeners.push_back(std::move(l.value()));
      }
      TransportOptions topts;
      topts.use_shm = shm, topts.spin = false, topts.secret = kSecret;
      std::vector<std::unique_ptr<Transport>> ts;
      for (int r = 0; r < 3; ++r) {
        ts.push_back(MakeSocketTransport(r, table, std::move(listeners[r]), topts).value());
      }
      auto run = [](Transport& t, std::vector<Op> ops) { return t.Run(ops, DeadlineAfter(5000)); };
      char a = 1, b = 0, x = 7, x_in = 0, y = 8, y_in = 0, z = 9, z_in = 0;
      // Ranks 1 and 2 are connected first.
      std::vector<Status> st(3);
      std::thread warm([&] { st[2] = run(*ts[2], {Op::Recv(1, &b, 1)}); });
      st[1] = run(*ts[1], {Op::Send(2, &a, 1)});
      warm.join();
      REQUIRE(st[1].ok());
      REQUIRE(st[2].ok());
      const auto t0 = std::chrono::steady_clock::now();
      std::thread r2([&] {
        st[2] = run(*ts[2], {Op::Recv(1, &z_in, 1)});
        if (st[2].ok()) st[2] = run(*ts[2], {Op::Recv(0, &x_in, 1)});
      });
      std::thread r1([&] {
        st[1] = run(*ts[1], {Op::Recv(0, &y_in, 1)});
        if (st[1].ok()) st[1] = run(*ts[1], {Op::Send(2, &z, 1)});
      });
      st[0] = run(*ts[0], {Op::Send(2, &x, 1)});
      if (st[0].ok()) st[0] = run(*ts[0], {Op::Send(1, &y, 1)});
      r1.join();
      r2.join();
      for (int r = 0; r < 3; ++r) CHECK(st[r].ok());
      CHECK(x_in == 7);
      CHECK(y_in == 8);
      CHECK(z_in == 9);
      CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
    }
  }
}

}  // namespace
}  // namespace ringrun::runtime

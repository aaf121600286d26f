// ringrun-test-attack: what an outsider can do to a running job, for the security tests.
// It knows what leaks (the job id, from a rank's environment) and what anyone can see (a rank's
// listening sockets, from /proc/PID/net), but not the job's secret.
//
//   forge SECONDS PID...     on every TCP listener of each rank PID, pose as rank 0 in every
//                            hello format: a bare hello (magic, rank, tag; no proof) and the
//                            handshake's ConnectHello with a made-up proof. Holds the
//                            connections SECONDS and prints "forged: N connections, M bytes of
//                            job data received" (M > 0: a rank took the forger for a peer).
//   flood SECONDS N PID...   on every listener of each rank (TCP, and its local Unix socket when
//                            this process shares its network namespace), N silent connections
//                            held SECONDS, while junk connections (random bytes, another job's
//                            tag, a hello for a rank that does not exist) come and go.
//   impersonate SECRET_PID TARGET_PID RANK   holding the secret (read from SECRET_PID's
//                            environment, as a real rank holds it), claims RANK to TARGET_PID
//                            and proves it; prints whether the target admitted it.
//   service-junk TARGET      unauthenticated raw calls to the job service with junk bodies of
//                            1 KiB and 5 MiB; prints each call's status code, one a line.
//   service-flood SECONDS TARGET   idle TCP connections, non-HTTP/2 bytes, and unauthenticated
//                            streams that never send, held SECONDS against the job service.
#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <openssl/sha.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ringrun/job.grpc.pb.h"
#include "runtime/src/transport/handshake.h"

namespace {

struct Target {
  int rank = -1;
  std::string job_id;
  std::vector<sockaddr_in> tcp;    // listening TCP sockets
  std::vector<std::string> local;  // abstract Unix names (without the leading NUL)
};

std::string EnvOf(int pid, const std::string& name) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  std::string entry;
  while (std::getline(f, entry, '\0')) {
    if (entry.compare(0, name.size() + 1, name + "=") == 0) return entry.substr(name.size() + 1);
  }
  return "";
}

std::set<std::string> SocketInodes(int pid) {
  std::set<std::string> inodes;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd/";
  for (int fd = 0; fd < 4096; ++fd) {
    char buf[64];
    ssize_t n = ::readlink((dir + std::to_string(fd)).c_str(), buf, sizeof(buf) - 1);
    if (n <= 0) continue;
    buf[n] = 0;
    if (std::strncmp(buf, "socket:[", 8) == 0) inodes.insert(std::string(buf + 8, n - 9));
  }
  return inodes;
}

Target DiscoverNow(int pid) {
  Target t;
  t.rank = std::atoi(EnvOf(pid, "RINGRUN_RANK").c_str());
  t.job_id = EnvOf(pid, "RINGRUN_JOB_ID");
  const std::set<std::string> inodes = SocketInodes(pid);
  std::ifstream tcp("/proc/" + std::to_string(pid) + "/net/tcp");
  std::string line;
  std::getline(tcp, line);
  while (std::getline(tcp, line)) {
    std::istringstream in(line);
    std::string sl, local, remote, st, queues, tr, retr, uid, timeout, inode;
    in >> sl >> local >> remote >> st >> queues >> tr >> retr >> uid >> timeout >> inode;
    if (st != "0A" || !inodes.count(inode)) continue;  // LISTEN, and this process's
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = static_cast<uint32_t>(std::stoul(local.substr(0, 8), nullptr, 16));
    sa.sin_port = htons(static_cast<uint16_t>(std::stoul(local.substr(9), nullptr, 16)));
    t.tcp.push_back(sa);
  }
  std::ifstream unix_("/proc/" + std::to_string(pid) + "/net/unix");
  std::getline(unix_, line);
  while (std::getline(unix_, line)) {
    std::istringstream in(line);
    std::string num, refs, proto, flags, type, st, inode, path;
    in >> num >> refs >> proto >> flags >> type >> st >> inode >> path;
    if (flags != "00010000" || !inodes.count(inode) || path.rfind("@ringrun/", 0) != 0) continue;
    t.local.push_back(path.substr(1));
  }
  return t;
}

// Waits up to 5 s for the rank to listen (ringrun_init opens its listener).
Target Discover(int pid) {
  Target t = DiscoverNow(pid);
  for (int i = 0; i < 50 && t.tcp.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    t = DiscoverNow(pid);
  }
  return t;
}

int ConnectTcp(const sockaddr_in& sa) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof(sa)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

int ConnectLocal(const std::string& name) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un un{};
  un.sun_family = AF_UNIX;
  std::memcpy(un.sun_path + 1, name.data(), std::min(name.size(), sizeof(un.sun_path) - 2));
  socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&un), len) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void SendAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t k = ::send(fd, c, n, MSG_NOSIGNAL);
    if (k <= 0) return;
    c += k, n -= static_cast<size_t>(k);
  }
}

void Put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void Put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

// A bare hello (magic, rank, job tag, no proof): a transport that took it would admit anyone.
std::vector<uint8_t> BareHello(uint32_t rank, const std::string& job_id) {
  std::vector<uint8_t> h(24);
  Put32(h.data(), 0x52475233);
  Put32(h.data() + 4, rank);
  Put64(h.data() + 8, std::hash<std::string>{}(job_id) | 1);
  Put64(h.data() + 16, 0);
  return h;
}

// The handshake's job tag (runtime/src/transport/handshake.h: JobTag).
uint64_t Sha256Tag(const std::string& job_id) {
  uint8_t md[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const uint8_t*>(job_id.data()), job_id.size(), md);
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{md[i]} << (8 * i);
  return v | 1;
}

// The handshake's ConnectHello (runtime/src/transport/handshake.h), then a made-up proof.
std::vector<uint8_t> NewHello(uint32_t rank, uint32_t to_rank, uint64_t tag, std::mt19937_64& rng) {
  std::vector<uint8_t> h(64);
  Put32(h.data(), 0x31435252);
  Put32(h.data() + 4, rank);
  Put32(h.data() + 8, to_rank);
  Put32(h.data() + 12, 0);
  Put64(h.data() + 16, tag);
  Put64(h.data() + 24, 0);
  for (int i = 32; i < 64; ++i) h[i] = static_cast<uint8_t>(rng());
  return h;
}

std::vector<int> Pids(int argc, char** argv, int first) {
  std::vector<int> pids;
  for (int i = first; i < argc; ++i) pids.push_back(std::atoi(argv[i]));
  return pids;
}

int Forge(int seconds, const std::vector<int>& pids, uint64_t (*tag_of)(const std::string&)) {
  std::mt19937_64 rng(std::random_device{}());
  std::vector<int> fds;
  for (int pid : pids) {
    Target t = Discover(pid);
    for (const sockaddr_in& sa : t.tcp) {
      int bare_fd = ConnectTcp(sa);
      if (bare_fd >= 0) {
        std::vector<uint8_t> h = BareHello(0, t.job_id);
        SendAll(bare_fd, h.data(), h.size());
        fds.push_back(bare_fd);
      }
      int new_fd = ConnectTcp(sa);
      if (new_fd >= 0) {
        std::vector<uint8_t> h = NewHello(0, static_cast<uint32_t>(t.rank), tag_of(t.job_id), rng);
        SendAll(new_fd, h.data(), h.size());
        uint8_t proof[32];
        for (auto& b : proof) b = static_cast<uint8_t>(rng());
        SendAll(new_fd, proof, sizeof(proof));
        fds.push_back(new_fd);
      }
    }
  }
  // Read what the ranks send: an AcceptHello (72 bytes) is expected where the handshake runs;
  // anything more is job data sent to the forger.
  size_t total = 0, data = 0;
  std::vector<size_t> got(fds.size(), 0);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < end) {
    std::vector<pollfd> p;
    for (int fd : fds) p.push_back(pollfd{fd, POLLIN, 0});
    if (::poll(p.data(), p.size(), 100) <= 0) continue;
    for (size_t i = 0; i < p.size(); ++i) {
      if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[65536];
      ssize_t n = ::recv(fds[i], buf, sizeof(buf), MSG_DONTWAIT);
      if (n > 0) {
        got[i] += static_cast<size_t>(n), total += static_cast<size_t>(n);
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        p[i].fd = -1;
        ::shutdown(fds[i], SHUT_RD);
      }
    }
  }
  for (size_t i = 0; i < fds.size(); ++i) {
    if (got[i] > 72) data += got[i] - 72;
    ::close(fds[i]);
  }
  std::printf("forged: %zu connections, %zu bytes of job data received\n", fds.size(), data);
  return 0;
}

int Flood(int seconds, int silent, const std::vector<int>& pids) {
  std::mt19937_64 rng(std::random_device{}());
  std::vector<Target> targets;
  for (int pid : pids) targets.push_back(Discover(pid));
  std::vector<int> held;
  size_t local_count = 0, tcp_count = 0;
  for (const Target& t : targets) {
    for (const sockaddr_in& sa : t.tcp) {
      for (int i = 0; i < silent; ++i) {
        int fd = ConnectTcp(sa);
        if (fd >= 0) held.push_back(fd), ++tcp_count;
      }
    }
    for (const std::string& name : t.local) {
      for (int i = 0; i < silent; ++i) {
        int fd = ConnectLocal(name);
        if (fd >= 0) held.push_back(fd), ++local_count;
      }
    }
  }
  std::printf("flood: %zu silent TCP and %zu silent local connections open\n", tcp_count,
              local_count);
  std::fflush(stdout);
  size_t junk = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < end) {
    for (const Target& t : targets) {
      std::vector<int> fds;
      for (const sockaddr_in& sa : t.tcp) fds.push_back(ConnectTcp(sa));
      for (const std::string& name : t.local) fds.push_back(ConnectLocal(name));
      int kind = 0;
      for (int fd : fds) {
        if (fd < 0) continue;
        std::vector<uint8_t> bytes;
        switch (kind++ % 3) {
          case 0:  // random bytes
            bytes.resize(1 + rng() % 300);
            for (auto& b : bytes) b = static_cast<uint8_t>(rng());
            break;
          case 1:  // another job's tag
            bytes = NewHello(0, static_cast<uint32_t>(t.rank), rng(), rng);
            break;
          default:  // a rank that does not exist
            bytes = NewHello(1u << 30, static_cast<uint32_t>(t.rank), Sha256Tag(t.job_id), rng);
        }
        SendAll(fd, bytes.data(), bytes.size());
        ::close(fd);
        ++junk;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int fd : held) ::close(fd);
  std::printf("flood: %zu silent TCP and %zu silent local connections held %d s, %zu junk\n",
              tcp_count, local_count, seconds, junk);
  return 0;
}

// A process that holds the job's secret (read from a real rank's environment) connects to the
// target rank claiming rank `claimed`, and answers the challenge correctly. Prints "admitted"
// when the target says so after the proof, "refused" when it closes the connection.
int Impersonate(int secret_pid, int target_pid, uint32_t claimed) {
  using namespace ringrun::runtime::transport;
  const std::string secret = EnvOf(secret_pid, "RINGRUN_SECRET");
  Target t = Discover(target_pid);
  if (secret.empty() || t.tcp.empty()) {
    std::fprintf(stderr, "impersonate: no secret or no listener\n");
    return 2;
  }
  int fd = ConnectTcp(t.tcp[0]);
  if (fd < 0) return 2;
  timeval tv{3, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ConnectHello h;
  h.rank = claimed, h.to_rank = static_cast<uint32_t>(t.rank), h.job_tag = JobTag(t.job_id);
  h.nonce = FreshNonce().value();
  uint8_t out[kConnectHelloBytes];
  EncodeConnectHello(h, out);
  SendAll(fd, out, sizeof(out));
  uint8_t in[kAcceptHelloBytes];
  size_t got = 0;
  while (got < sizeof(in)) {
    ssize_t n = ::recv(fd, in + got, sizeof(in) - got, 0);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  if (got == sizeof(in)) {
    ringrun::Result<AcceptHello> reply = DecodeAcceptHello(in, sizeof(in));
    if (reply.ok()) {
      const Proof proof = HandshakeProof(secret, ProofRole::kConnector, h, h.to_rank, reply->nonce);
      SendAll(fd, proof.data(), proof.size());
    }
  }
  char c;
  ssize_t n = ::recv(fd, &c, 1, 0);  // the admitted byte; EOF: refused
  ::close(fd);
  std::printf("impersonating rank %u to rank %d: %s\n", claimed, t.rank,
              got == sizeof(in) && n == 1 ? "admitted" : "refused");
  return 0;
}

const char* CodeName(grpc::StatusCode c) {
  switch (c) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::INTERNAL:
      return "INTERNAL";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    default:
      return "OTHER";
  }
}

grpc::StatusCode RawCall(grpc::GenericStub& stub, const std::string& method, size_t bytes) {
  std::mt19937_64 rng(bytes);
  std::string body(bytes, '\0');
  for (auto& c : body) c = static_cast<char>(rng());
  grpc::Slice slice(body);
  grpc::ByteBuffer req(&slice, 1), reply;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Status result;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &req, &reply, [&](grpc::Status s) {
    std::lock_guard<std::mutex> lock(mu);
    result = s, done = true;
    cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  return result.error_code();
}

std::shared_ptr<grpc::Channel> Channel(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

int ServiceJunk(const std::string& target) {
  grpc::GenericStub stub(Channel(target));
  for (const char* method : {"/ringrun.v1.JobService/Register", "/ringrun.v1.JobService/Join"}) {
    for (size_t bytes : {size_t{1} << 10, size_t{5} << 20}) {
      std::printf("%s %zu: %s\n", method, bytes, CodeName(RawCall(stub, method, bytes)));
    }
  }
  return 0;
}

int ServiceFlood(int seconds, const std::string& target) {
  const size_t colon = target.rfind(':');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(std::atoi(target.c_str() + colon + 1)));
  ::inet_pton(AF_INET, target.substr(0, colon).c_str(), &sa.sin_addr);
  std::vector<int> held;
  for (int i = 0; i < 200; ++i) {  // idle connections
    int fd = ConnectTcp(sa);
    if (fd >= 0) held.push_back(fd);
  }
  for (int i = 0; i < 50; ++i) {  // bytes that are not HTTP/2
    int fd = ConnectTcp(sa);
    if (fd < 0) continue;
    const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n\x01\x02\x03 not http2 at all";
    SendAll(fd, junk, sizeof(junk));
    held.push_back(fd);
  }
  // Unauthenticated streams that never send a message.
  auto channel = Channel(target);
  auto stub = ringrun::v1::JobService::NewStub(channel);
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<
      std::unique_ptr<grpc::ClientReaderWriter<ringrun::v1::AgentEvent, ringrun::v1::AgentCommand>>>
      streams;
  for (int i = 0; i < 50; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    contexts.back()->set_deadline(std::chrono::system_clock::now() +
                                  std::chrono::seconds(seconds + 5));
    streams.push_back(stub->Session(contexts.back().get()));
  }
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  for (auto& c : contexts) c->TryCancel();
  streams.clear();
  for (int fd : held) ::close(fd);
  std::printf("service-flood: %zu connections held %d s, %zu silent streams\n", held.size(),
              seconds, contexts.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "forge" && argc >= 4) {
    return Forge(std::atoi(argv[2]), Pids(argc, argv, 3), Sha256Tag);
  }
  if (mode == "flood" && argc >= 5) {
    return Flood(std::atoi(argv[2]), std::atoi(argv[3]), Pids(argc, argv, 4));
  }
  if (mode == "impersonate" && argc == 5) {
    return Impersonate(std::atoi(argv[2]), std::atoi(argv[3]),
                       static_cast<uint32_t>(std::atoi(argv[4])));
  }
  if (mode == "service-junk" && argc == 3) return ServiceJunk(argv[2]);
  if (mode == "service-flood" && argc == 4) return ServiceFlood(std::atoi(argv[2]), argv[3]);
  std::fprintf(stderr,
               "usage: ringrun-test-attack forge SECONDS PID... | flood SECONDS N PID... |\n"
               "       impersonate SECRET_PID TARGET_PID CLAIMED_RANK |\n"
               "       service-junk HOST:PORT | service-flood SECONDS HOST:PORT\n");
  return 2;
}

// The two Pairs (runtime/src/transport/pair.h) on their own, below the transport: a TcpPair on
// each end of a real loopback connection, and a ShmPair on each side of a real memfd segment
// with a Unix socketpair as the lifeline. The tests drive Progress directly, as
// SocketTransport::Run does: one op at a time per direction, never blocking.
#include "runtime/src/transport/pair.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ringrun/common/fd.h"
#include "runtime/src/reduce.h"
#include "runtime/src/transport/shm_pair.h"
#include "runtime/src/transport/socket_util.h"
#include "runtime/src/transport/tcp_pair.h"

namespace ringrun::runtime::transport {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr int kDeadlineMs = 20000;  // what a test may take before it is a hang

enum class Kind { kTcp, kShm };
const char* Name(Kind k) { return k == Kind::kTcp ? "tcp" : "shm"; }

// Two connected ends of one pair. For shared memory, end 0 is the connector's side (0).
struct Ends {
  std::unique_ptr<Pair> end[2];
  Pair& operator[](int i) { return *end[i]; }
};

// A loopback TCP connection, both sockets non-blocking and tuned as the transport's are.
void MakeTcpSockets(UniqueFd* a, UniqueFd* b) {
  UniqueFd lis(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(lis.valid());
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(lis.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::listen(lis.get(), 1) == 0);
  socklen_t len = sizeof(addr);
  REQUIRE(::getsockname(lis.get(), reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  UniqueFd c(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(c.valid());
  REQUIRE(::connect(c.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  UniqueFd s(::accept4(lis.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
  REQUIRE(s.valid());
  REQUIRE(SetNonBlocking(c.get(), true).ok());
  TuneSocket(c.get());
  TuneSocket(s.get());
  *a = std::move(c);
  *b = std::move(s);
}

Ends MakeTcp() {
  UniqueFd a, b;
  MakeTcpSockets(&a, &b);
  Ends e;
  e.end[0] = std::make_unique<TcpPair>(std::move(a));
  e.end[1] = std::make_unique<TcpPair>(std::move(b));
  return e;
}

// One segment mapped twice (as the two processes do), and a socketpair for the lifeline.
Ends MakeShm(size_t ring_bytes) {
  UniqueFd mem(::memfd_create("pair-test", MFD_CLOEXEC));
  REQUIRE(mem.valid());
  Result<std::unique_ptr<ShmSegment>> mine = MapShm(mem.get(), ring_bytes, true);
  REQUIRE(mine.ok());
  Result<std::unique_ptr<ShmSegment>> theirs = MapShm(mem.get(), ring_bytes, false);
  REQUIRE(theirs.ok());
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) == 0);
  Ends e;
  e.end[0] = std::make_unique<ShmPair>(UniqueFd(sv[0]), std::move(mine.value()), 0);
  e.end[1] = std::make_unique<ShmPair>(UniqueFd(sv[1]), std::move(theirs.value()), 1);
  return e;
}

constexpr size_t kRing = 64 << 10;  // the large rings' size in these tests, unless said

Ends Make(Kind k, size_t ring_bytes = kRing) {
  return k == Kind::kTcp ? MakeTcp() : MakeShm(ring_bytes);
}

// The bytes an op of n bytes moves on this pair (OpState::done at completion).
size_t Wire(Kind k, size_t n) { return k == Kind::kShm ? (n + 7) & ~size_t{7} : n; }

// One direction of one end: its ops complete in order, as in Transport::Run.
struct Queue {
  Pair* pair;
  std::vector<Op> ops;
  std::vector<OpState> states;
  size_t next = 0;
  Queue(Pair& p, std::vector<Op> o) : pair(&p), ops(std::move(o)) {
    for (Op& op : ops) states.push_back(OpState{&op});
  }
  bool done() const { return next == states.size(); }
};

// Progresses the queues until all are done, one fails (its status), or the deadline passes
// (kTimeout). Sleeps a little whenever nothing moved.
Status Drive(const std::vector<Queue*>& queues, int timeout_ms = kDeadlineMs) {
  const Deadline deadline = DeadlineAfter(timeout_ms);
  for (;;) {
    bool moved = false, all_done = true;
    for (Queue* q : queues) {
      while (!q->done()) {
        OpState& st = q->states[q->next];
        Result<bool> r = q->pair->Progress(st);
        if (!r.ok()) return r.status();
        moved |= *r;
        if (!st.complete) break;
        ++q->next;
      }
      all_done &= q->done();
    }
    if (all_done) return Status::Ok();
    if (steady_clock::now() >= deadline) return Timeout("Drive: deadline passed");
    if (!moved) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

std::vector<char> Pattern(size_t n, int seed) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>(seed * 131 + i * 7 + i / 251);
  return v;
}

constexpr char kCanary = static_cast<char>(0xAB);
constexpr size_t kCanaryBytes = 16;

// Sends each size from end 0 to end 1 and checks every message, and that no byte past it was
// written (shared memory pads messages to 8 bytes on the wire, never in the user's buffer).
void SendAndCheck(Kind kind, Ends& e, const std::vector<size_t>& sizes) {
  std::vector<std::vector<char>> out, in;
  std::vector<Op> sends, recvs;
  for (size_t i = 0; i < sizes.size(); ++i) {
    out.push_back(Pattern(sizes[i], static_cast<int>(i)));
    in.emplace_back(sizes[i] + kCanaryBytes, kCanary);
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    sends.push_back(Op::Send(1, out[i].data(), sizes[i]));
    recvs.push_back(Op::Recv(0, in[i].data(), sizes[i]));
  }
  Queue s(e[0], sends), r(e[1], recvs);
  Status st = Drive({&s, &r});
  INFO(st.ToString());
  REQUIRE(st.ok());
  for (size_t i = 0; i < sizes.size(); ++i) {
    INFO("message " << i << " of " << sizes[i] << " bytes");
    CHECK(s.states[i].done == Wire(kind, sizes[i]));
    CHECK(r.states[i].done == Wire(kind, sizes[i]));
    // std::equal, not memcmp: an empty vector's data() may be null, which memcmp may not take.
    CHECK(std::equal(out[i].begin(), out[i].end(), in[i].begin()));
    CHECK(std::all_of(in[i].begin() + sizes[i], in[i].end(), [](char c) { return c == kCanary; }));
  }
}

TEST_CASE("pair: 0-byte messages complete at once and take nothing from the stream", "[pair]") {
  for (Kind kind : {Kind::kTcp, Kind::kShm}) {
    DYNAMIC_SECTION(Name(kind)) {
      Ends e = Make(kind);
      char dummy = 0;
      for (Op op : {Op::Send(1, &dummy, 0), Op::Recv(0, &dummy, 0)}) {
        OpState st{&op};
        Result<bool> r = e[op.kind == Op::kSend ? 0 : 1].Progress(st);
        REQUIRE(r.ok());
        CHECK_FALSE(*r);  // nothing moved
        CHECK(st.complete);
        CHECK(st.done == 0);
      }
      // The next message is whole: the empty ones took no byte of it.
      SendAndCheck(kind, e, {0, 5, 0, 0, 3});
    }
  }
}

TEST_CASE("pair: small messages arrive whole and in order, nothing written past them", "[pair]") {
  // Around 8 (the shared-memory padding) and 8 KiB (its small-message lane).
  const std::vector<size_t> sizes = {1,    2,    7,    8,    9,    63,   64,    65,
                                     4095, 4096, 8191, 8192, 8193, 8200, 12345, 3};
  for (Kind kind : {Kind::kTcp, Kind::kShm}) {
    DYNAMIC_SECTION(Name(kind)) {
      Ends e = Make(kind);
      SendAndCheck(kind, e, sizes);
      SendAndCheck(kind, e, sizes);  // again, from where the rings' positions are now
    }
  }
}

TEST_CASE("pair: messages larger than the ring wrap around it, byte for byte", "[pair]") {
  // A 4 KiB large ring (the smallest TransportOptions allows) and sizes that are not multiples
  // of it, so that the wrap falls at a different offset in each message.
  const std::vector<size_t> sizes = {100003, (1 << 20) + 5, 20000, (3 << 20) + 1};
  for (Kind kind : {Kind::kTcp, Kind::kShm}) {
    DYNAMIC_SECTION(Name(kind)) {
      Ends e = Make(kind, 4096);
      SendAndCheck(kind, e, sizes);
    }
  }
}

TEST_CASE("pair: Progress moves what it can, never blocks, and resumes where it stopped",
          "[pair]") {
  for (Kind kind : {Kind::kTcp, Kind::kShm}) {
    DYNAMIC_SECTION(Name(kind)) {
      Ends e = Make(kind);
      const size_t n = 16 << 20;  // more than a socket's buffers or a ring hold
      std::vector<char> out = Pattern(n, 7), in(n);
      Op send = Op::Send(1, out.data(), n), recv = Op::Recv(0, in.data(), n);
      OpState s{&send}, r{&recv};

      // Nothing sent yet: a receive moves nothing and returns at once.
      auto t0 = steady_clock::now();
      Result<bool> got = e[1].Progress(r);
      REQUIRE(got.ok());
      CHECK_FALSE(*got);
      CHECK(r.done == 0);
      CHECK_FALSE(r.complete);

      // No one receiving: the send moves until the buffers are full, then returns false.
      int calls = 0;
      for (;; ++calls) {
        REQUIRE(calls < 100000);
        Result<bool> moved = e[0].Progress(s);
        REQUIRE(moved.ok());
        if (!*moved) break;
      }
      const auto ms = std::chrono::duration_cast<milliseconds>(steady_clock::now() - t0).count();
      CHECK(ms < 5000);  // none of those calls waited for the receiver
      CHECK(s.done > 0);
      CHECK(s.done < n);
      CHECK_FALSE(s.complete);
      if (kind == Kind::kShm) CHECK(s.done == kRing);  // exactly the large ring's worth
      const size_t stuck = s.done;
      Result<bool> again = e[0].Progress(s);
      REQUIRE(again.ok());
      // (TCP's buffers may still grow as the kernel tunes them; a full ring stays full.)
      if (kind == Kind::kShm) CHECK(s.done == stuck);

      // The receiver takes some; the sender can move again; both finish.
      got = e[1].Progress(r);
      REQUIRE(got.ok());
      CHECK(*got);
      CHECK(r.done > 0);
      CHECK(r.done <= s.done);
      Queue qs(e[0], {send}), qr(e[1], {recv});
      qs.states[0].done = s.done;  // resume from where the calls above stopped
      qr.states[0].done = r.done;
      Status st = Drive({&qs, &qr});
      INFO(st.ToString());
      REQUIRE(st.ok());
      CHECK((in == out));
    }
  }
}

void SubInt32(void* dst, const void* a, const void* b, size_t count) {
  auto* d = static_cast<int32_t*>(dst);
  auto* x = static_cast<const int32_t*>(a);
  auto* y = static_cast<const int32_t*>(b);
  for (size_t i = 0; i < count; ++i) d[i] = x[i] - y[i];
}

TEST_CASE("pair: a length-prefixed message arrives whole, and shm moves only its used bytes",
          "[pair]") {
  // Buffers of 1 KiB (as negotiation's heads) holding a u32 length and that many bytes, plain
  // messages between them, and more of them than the small ring holds, so that they wrap.
  constexpr size_t kBuf = 1024;
  const std::vector<uint32_t> lengths = {60, 0, 1020, 5000, 3, 100, 61, 4, 700};
  for (Kind kind : {Kind::kTcp, Kind::kShm}) {
    DYNAMIC_SECTION(Name(kind)) {
      Ends e = Make(kind);
      for (int pass = 0; pass < 60; ++pass) {
        std::vector<std::vector<char>> out, in;
        std::vector<Op> sends, recvs;
        for (size_t i = 0; i < lengths.size(); ++i) {
          out.push_back(Pattern(kBuf, pass * 16 + static_cast<int>(i)));
          std::memcpy(out.back().data(), &lengths[i], 4);
          in.emplace_back(kBuf + kCanaryBytes, kCanary);
          sends.push_back(Op::Send(1, out.back().data(), kBuf));
          recvs.push_back(Op::Recv(0, in.back().data(), kBuf));
          sends.back().length_prefixed = recvs.back().length_prefixed = true;
          // A plain message after each: the stream stays in step.
          out.push_back(Pattern(13, pass));
          in.emplace_back(13 + kCanaryBytes, kCanary);
          sends.push_back(Op::Send(1, out.back().data(), 13));
          recvs.push_back(Op::Recv(0, in.back().data(), 13));
        }
        Queue q0(e[0], sends), q1(e[1], recvs);
        // Nothing sent yet: the receive of a length-prefixed message waits for its length.
        Result<bool> early = e[1].Progress(q1.states[0]);
        REQUIRE(early.ok());
        CHECK_FALSE(*early);
        CHECK_FALSE(q1.states[0].complete);
        Status st = Drive({&q0, &q1});
        INFO("pass " << pass << ": " << st.ToString());
        REQUIRE(st.ok());
        for (size_t i = 0; i < out.size(); ++i) {
          const bool prefixed = i % 2 == 0;
          const size_t used =
              !prefixed ? out[i].size() : std::min(kBuf, 4 + size_t{lengths[i / 2]});
          const size_t moved = kind == Kind::kShm ? used : out[i].size();
          INFO("message " << i << ", " << used << " bytes used");
          CHECK(q0.states[i].done == Wire(kind, moved));
          CHECK(q1.states[i].done == Wire(kind, moved));
          CHECK(std::equal(out[i].begin(), out[i].begin() + used, in[i].begin()));
          // Shared memory leaves the receive buffer past the used bytes (rounded up to 8) as it
          // was; TCP fills it.
          const size_t filled =
              kind == Kind::kShm ? std::min(out[i].size(), Wire(kind, used)) : out[i].size();
          CHECK(std::equal(out[i].begin(), out[i].begin() + filled, in[i].begin()));
          CHECK(std::all_of(in[i].begin() + filled, in[i].end(),
                            [](char c) { return c == kCanary; }));
        }
      }
    }
  }
}

TEST_CASE("pair: RecvReduce combines what arrives with src, in the order asked", "[pair]") {
  const size_t count = (1 << 18) + 3;  // 1 MiB + 12 bytes: many rings' worth, not a whole chunk
  std::vector<int32_t> theirs(count), mine(count);
  for (size_t i = 0; i < count; ++i) {
    theirs[i] = static_cast<int32_t>(i * 3 + 1);
    mine[i] = static_cast<int32_t>(i * 5) - 7;
  }
  for (Kind kind : {Kind::kTcp, Kind::kShm}) {
    for (bool incoming_first : {false, true}) {
      for (bool in_place : {false, true}) {
        DYNAMIC_SECTION(Name(kind)
                        << " incoming_first=" << incoming_first << " in_place=" << in_place) {
          Ends e = Make(kind, 4096);
          std::vector<int32_t> src = mine, dst(count, -1);
          int32_t* out = in_place ? src.data() : dst.data();
          Queue s(e[0], {Op::Send(1, theirs.data(), count * 4)});
          Queue r(e[1],
                  {Op::RecvReduce(0, out, src.data(), count * 4, SubInt32, 4, incoming_first)});
          Status st = Drive({&s, &r});
          INFO(st.ToString());
          REQUIRE(st.ok());
          size_t wrong = 0;
          for (size_t i = 0; i < count; ++i) {
            const int32_t want = incoming_first ? theirs[i] - mine[i] : mine[i] - theirs[i];
            wrong += out[i] != want;
          }
          CHECK(wrong == 0);
          if (!in_place) CHECK((src == mine));  // src is read, never written
        }
      }
    }
  }
}

TEST_CASE("pair: RecvReduce applies the op's finish to each reduced piece", "[pair]") {
  const size_t count = 100000;
  std::vector<float> theirs(count, 3.0f), mine(count, 5.0f), dst(count, 0.0f);
  Finish average;
  average.dtype = RINGRUN_FLOAT32;
  average.divisor = 2.0;
  for (Kind kind : {Kind::kTcp, Kind::kShm}) {
    DYNAMIC_SECTION(Name(kind)) {
      Ends e = Make(kind, 4096);
      std::fill(dst.begin(), dst.end(), 0.0f);
      Op op = Op::RecvReduce(0, dst.data(), mine.data(), count * 4,
                             GetReduceFn(RINGRUN_FLOAT32, RINGRUN_SUM), 4);
      op.finish = &average;
      Queue s(e[0], {Op::Send(1, theirs.data(), count * 4)}), r(e[1], {op});
      REQUIRE(Drive({&s, &r}).ok());
      CHECK(std::count(dst.begin(), dst.end(), 4.0f) == static_cast<long>(count));
    }
  }
}

TEST_CASE("tcp pair: RecvReduce holds an element split across reads until it is whole", "[pair]") {
  // The sender is a raw socket writing 3 bytes at a time, so that nearly every read ends inside
  // an 8-byte element.
  UniqueFd raw, fd;
  MakeTcpSockets(&raw, &fd);
  TcpPair pair(std::move(fd));
  const size_t count = 1000;
  std::vector<int64_t> theirs(count), mine(count), dst(count, 0);
  for (size_t i = 0; i < count; ++i) {
    theirs[i] = static_cast<int64_t>(i) << 33 | 0x0102030405ll;
    mine[i] = static_cast<int64_t>(i) * 1000003;
  }
  Op op = Op::RecvReduce(0, dst.data(), mine.data(), count * 8,
                         GetReduceFn(RINGRUN_INT64, RINGRUN_SUM), 8);
  OpState st{&op};
  const char* bytes = reinterpret_cast<const char*>(theirs.data());
  const Deadline deadline = DeadlineAfter(kDeadlineMs);
  size_t partial_done = 0;  // times done counted part of an element
  for (size_t sent = 0; sent < count * 8;) {
    const size_t k = std::min<size_t>(3, count * 8 - sent);
    ssize_t n = ::send(raw.get(), bytes + sent, k, MSG_NOSIGNAL);
    REQUIRE(n > 0);
    sent += static_cast<size_t>(n);
    // Let the pair see this piece before the next one arrives.
    while (st.done + 8 <= sent - sent % 8 && steady_clock::now() < deadline) {
      Result<bool> r = pair.Progress(st);
      REQUIRE(r.ok());
    }
    partial_done += st.done % 8 != 0;  // only whole elements count as done
  }
  CHECK(partial_done == 0);
  while (!st.complete && steady_clock::now() < deadline) REQUIRE(pair.Progress(st).ok());
  REQUIRE(st.complete);
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) wrong += dst[i] != mine[i] + theirs[i];
  CHECK(wrong == 0);
}

TEST_CASE("pair: both directions at once, each end on its own thread", "[pair]") {
  for (Kind kind : {Kind::kTcp, Kind::kShm}) {
    DYNAMIC_SECTION(Name(kind)) {
      Ends e = Make(kind, 4096);
      // Each end sends a large message and small ones both ways; neither may wait for the
      // other to finish sending first (their buffers are far smaller than the messages).
      const std::vector<size_t> sizes = {(2 << 20) + 3, 17, 9000, 8, (1 << 20) + 1};
      std::vector<std::vector<char>> out[2], in[2];
      Status status[2];
      std::vector<std::thread> threads;
      for (int me = 0; me < 2; ++me) {
        for (size_t i = 0; i < sizes.size(); ++i) {
          out[me].push_back(Pattern(sizes[i], me * 10 + static_cast<int>(i)));
          in[me].emplace_back(sizes[i]);
        }
      }
      for (int me = 0; me < 2; ++me) {
        threads.emplace_back([&, me] {
          std::vector<Op> sends, recvs;
          for (size_t i = 0; i < sizes.size(); ++i) {
            sends.push_back(Op::Send(1 - me, out[me][i].data(), sizes[i]));
            recvs.push_back(Op::Recv(1 - me, in[me][i].data(), sizes[i]));
          }
          Queue s(e[me], sends), r(e[me], recvs);
          status[me] = Drive({&s, &r});
        });
      }
      for (auto& t : threads) t.join();
      for (int me = 0; me < 2; ++me) {
        INFO("end " << me << ": " << status[me].ToString());
        CHECK(status[me].ok());
        CHECK((in[me] == out[1 - me]));
      }
    }
  }
}

TEST_CASE("tcp pair: a peer that closes fails a receive with kUnavailable, after its bytes",
          "[pair][dead-peer]") {
  Ends e = MakeTcp();
  std::vector<char> out = Pattern(1000, 1), in(4096);
  Queue s(e[0], {Op::Send(1, out.data(), out.size())});
  REQUIRE(Drive({&s}).ok());
  e.end[0].reset();  // the peer closes its end, 1000 bytes into a 4096-byte message
  Queue r(e[1], {Op::Recv(0, in.data(), in.size())});
  const auto t0 = steady_clock::now();
  Status st = Drive({&r});
  const auto ms = std::chrono::duration_cast<milliseconds>(steady_clock::now() - t0).count();
  INFO(st.ToString());
  CHECK(st.code() == Code::kUnavailable);
  CHECK(st.message().find("closed") != std::string::npos);
  CHECK(ms < kDeadlineMs / 2);  // EOF, not the deadline
  CHECK(r.states[0].done == 1000);
  CHECK(std::memcmp(in.data(), out.data(), 1000) == 0);
}

TEST_CASE("tcp pair: a send to a peer that closed fails with kUnavailable", "[pair][dead-peer]") {
  for (bool unread : {false, true}) {
    DYNAMIC_SECTION("peer left bytes unread: " << unread) {
      Ends e = MakeTcp();
      std::vector<char> out = Pattern(8 << 20, 2);
      if (unread) {  // closing with unread bytes resets the connection at once
        Queue first(e[0], {Op::Send(1, out.data(), 100)});
        REQUIRE(Drive({&first}).ok());
      }
      e.end[1].reset();
      Queue s(e[0], {Op::Send(1, out.data(), out.size())});
      const auto t0 = steady_clock::now();
      Status st = Drive({&s});
      const auto ms = std::chrono::duration_cast<milliseconds>(steady_clock::now() - t0).count();
      INFO(st.ToString());
      CHECK(st.code() == Code::kUnavailable);  // EPIPE or ECONNRESET
      CHECK(st.message().find("send") != std::string::npos);
      CHECK(ms < kDeadlineMs / 2);
    }
  }
}

TEST_CASE("shm pair: a peer gone shows as EOF on the lifeline, and what it wrote is still read",
          "[pair][dead-peer][shm]") {
  // (Progress on a shared-memory pair does not see the peer go: the transport polls the
  // lifeline and, on EOF, drains what is left before failing the ops still open.)
  Ends e = MakeShm(kRing);
  std::vector<char> small = Pattern(3000, 3), large = Pattern(40000, 4);
  Queue s(e[0], {Op::Send(1, small.data(), small.size()), Op::Send(1, large.data(), large.size())});
  REQUIRE(Drive({&s}).ok());  // both fit in their rings: complete before anyone reads
  const int lifeline = e[1].fd();
  char c;
  CHECK(::recv(lifeline, &c, 1, MSG_DONTWAIT | MSG_PEEK) < 0);  // open, nothing to read
  e.end[0].reset();                                             // its mapping and lifeline end go
  pollfd p{lifeline, POLLIN, 0};
  CHECK(::poll(&p, 1, kDeadlineMs) == 1);
  CHECK(::recv(lifeline, &c, 1, MSG_DONTWAIT | MSG_PEEK) == 0);  // EOF
  std::vector<char> got_small(small.size()), got_large(large.size());
  Queue r(e[1], {Op::Recv(0, got_small.data(), got_small.size()),
                 Op::Recv(0, got_large.data(), got_large.size())});
  REQUIRE(Drive({&r}).ok());
  CHECK((got_small == small));
  CHECK((got_large == large));
}

TEST_CASE("shm pair: a side asleep on its bell wakes when the peer moves, else at max_us",
          "[pair][shm]") {
  Ends e = MakeShm(kRing);
  auto& waiter = static_cast<ShmPair&>(e[1]);
  auto& other = static_cast<ShmPair&>(e[0]);

  SECTION("nothing moves: WaitForBells returns at max_us") {
    const uint32_t seen = waiter.PrepareWait();
    const auto t0 = steady_clock::now();
    WaitForBells({waiter.bell()}, {seen}, 100 * 1000);
    const auto ms = std::chrono::duration_cast<milliseconds>(steady_clock::now() - t0).count();
    waiter.CancelWait();
    CHECK(ms >= 90);
    CHECK(ms < 5000);
  }
  SECTION("the bell moved after PrepareWait: WaitForBells returns at once") {
    const uint32_t seen = waiter.PrepareWait();
    char b = 1;
    Op send = Op::Send(1, &b, 1);
    OpState st{&send};
    REQUIRE(other.Progress(st).ok());
    const auto t0 = steady_clock::now();
    WaitForBells({waiter.bell()}, {seen}, 10 * 1000 * 1000);
    const auto ms = std::chrono::duration_cast<milliseconds>(steady_clock::now() - t0).count();
    waiter.CancelWait();
    CHECK(ms < 5000);
    CHECK(waiter.HasInput());
  }
  SECTION("the peer sends while it sleeps: woken well before max_us") {
    const uint32_t seen = waiter.PrepareWait();
    REQUIRE_FALSE(waiter.HasInput());  // the re-check before sleeping
    std::vector<char> msg = Pattern(20000, 5);
    const auto t0 = steady_clock::now();
    std::thread sender([&] {
      std::this_thread::sleep_for(milliseconds(50));
      Op send = Op::Send(1, msg.data(), msg.size());
      OpState st{&send};
      (void)other.Progress(st);
    });
    // Also a second bell that never moves: the sleeper waits on several pairs at once.
    std::atomic<uint32_t> quiet{0};
    WaitForBells({&quiet, waiter.bell()}, {0, seen}, 10 * 1000 * 1000);
    WaitForBells({waiter.bell()}, {seen}, 10 * 1000 * 1000);  // in case the fallback capped it
    const auto ms = std::chrono::duration_cast<milliseconds>(steady_clock::now() - t0).count();
    sender.join();
    waiter.CancelWait();
    CHECK(ms < 5000);
    CHECK(waiter.HasInput());
  }
}

TEST_CASE("shm pair: an armed idle wait gets one wake-up byte on the lifeline", "[pair][shm]") {
  Ends e = MakeShm(kRing);
  auto& idle = static_cast<ShmPair&>(e[1]);
  Pair& peer = e[0];
  CHECK_FALSE(idle.ArmIdleWake());  // nothing there yet
  pollfd p{idle.fd(), POLLIN, 0};
  CHECK(::poll(&p, 1, 0) == 0);
  char a[16] = {}, b[9000] = {};
  for (auto [buf, n] : {std::pair<char*, size_t>{a, sizeof(a)}, {b, sizeof(b)}}) {
    Op send = Op::Send(1, buf, n);
    OpState st{&send};
    REQUIRE(peer.Progress(st).ok());
    REQUIRE(st.complete);
  }
  CHECK(::poll(&p, 1, kDeadlineMs) == 1);
  char wake[8];
  CHECK(::recv(idle.fd(), wake, sizeof(wake), MSG_DONTWAIT | MSG_PEEK) == 1);  // once, not twice
  CHECK(idle.HasInput());
  idle.DisarmIdleWake();  // drains the byte, never the EOF
  CHECK(::poll(&p, 1, 0) == 0);
  // The messages are intact, and once read, HasInput says so.
  char ga[16], gb[9000];
  Queue r(idle, {Op::Recv(0, ga, sizeof(ga)), Op::Recv(0, gb, sizeof(gb))});
  REQUIRE(Drive({&r}).ok());
  CHECK_FALSE(idle.HasInput());
}

TEST_CASE("MapShm checks a peer's segment before using it", "[pair][shm]") {
  UniqueFd mem(::memfd_create("pair-test", MFD_CLOEXEC));
  REQUIRE(mem.valid());
  Result<std::unique_ptr<ShmSegment>> made = MapShm(mem.get(), 4096, true);
  REQUIRE(made.ok());
  CHECK(MapShm(mem.get(), 4096, false).ok());
  Result<std::unique_ptr<ShmSegment>> other_size = MapShm(mem.get(), 8192, false);
  CHECK_FALSE(other_size.ok());
  CHECK(other_size.status().message().find("bytes, expected") != std::string::npos);
  made.value()->header()->magic = 0;  // not a ringrun segment
  Result<std::unique_ptr<ShmSegment>> bad_magic = MapShm(mem.get(), 4096, false);
  CHECK_FALSE(bad_magic.ok());
  CHECK(bad_magic.status().message().find("layout") != std::string::npos);
  UniqueFd empty(::memfd_create("pair-test-empty", MFD_CLOEXEC));
  CHECK_FALSE(MapShm(empty.get(), 4096, false).ok());  // a peer that never sized it
}

}  // namespace
}  // namespace ringrun::runtime::transport

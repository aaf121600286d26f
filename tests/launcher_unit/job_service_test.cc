// The job service in-process, on a loopback port 0: the secret gates every call, events reach
// the job, and output routing keeps lines whole.
#include "launcher/service/job_service.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <future>
#include <thread>

#include "launcher/job/output.h"
#include "launcher/service/job_server.h"
#include "launcher/service/rendezvous.h"
#include "ringrun/common/auth.h"
#include "ringrun/common/peer_table.h"
#include "ringrun/job.grpc.pb.h"

namespace ringrun::launcher::service {
namespace {

class FakeEvents final : public JobEvents {
 public:
  grpc::Status OnRegister(const v1::RegisterRequest& req, const std::string& peer,
                          v1::RegisterReply* reply) override {
    registers++;
    last_peer = peer;
    reply->set_job_id("job-" + std::to_string(req.host_index()));
    return grpc::Status::OK;
  }
  void OnAgentEvent(int, const v1::AgentEvent&) override { events++; }
  void OnSessionEnded(int, bool, const std::string&) override { ended++; }
  std::atomic<int> registers{0}, events{0}, ended{0};
  std::string last_peer;
};

struct Server {
  explicit Server(const std::string& secret)
      : rendezvous(1, "job"), service(secret, &events, &rendezvous, 100, 1000) {
    auto started = StartJobServer("127.0.0.1:0", service);
    REQUIRE(started.ok());
    server = std::move(started->server);
    port = started->port;
    stub = v1::JobService::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                       grpc::InsecureChannelCredentials()));
  }
  ~Server() {
    service.Close();
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  FakeEvents events;
  Rendezvous rendezvous;
  JobService service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<v1::JobService::Stub> stub;
};

grpc::Status CallRegister(Server& s, const char* secret, v1::RegisterReply* reply) {
  grpc::ClientContext ctx;
  if (secret) AttachSecret(&ctx, secret);
  ctx.set_deadline(DeadlineAfterMs(5000));
  v1::RegisterRequest req;
  req.set_host_index(3);
  return s.stub->Register(&ctx, req, reply);
}

// A Session for `host`, its Hello sent.
std::unique_ptr<grpc::ClientReaderWriter<v1::AgentEvent, v1::AgentCommand>> OpenSession(
    Server& s, const std::string& secret, int host, grpc::ClientContext* ctx) {
  AttachSecret(ctx, secret);
  ctx->set_deadline(DeadlineAfterMs(5000));
  auto stream = s.stub->Session(ctx);
  v1::AgentEvent hello;
  hello.mutable_hello()->set_host_index(host);
  REQUIRE(stream->Write(hello));
  return stream;
}

TEST_CASE("job service: calls without the job's secret are refused", "[job_service]") {
  const std::string secret(64, 'a');
  Server s(secret);
  REQUIRE(s.port > 0);
  v1::RegisterReply reply;
  CHECK(CallRegister(s, nullptr, &reply).error_code() == grpc::StatusCode::UNAUTHENTICATED);
  CHECK(CallRegister(s, std::string(64, 'b').c_str(), &reply).error_code() ==
        grpc::StatusCode::UNAUTHENTICATED);
  CHECK(CallRegister(s, std::string(63, 'a').c_str(), &reply).error_code() ==
        grpc::StatusCode::UNAUTHENTICATED);
  CHECK(s.events.registers == 0);

  grpc::ClientContext jctx;
  jctx.set_deadline(DeadlineAfterMs(5000));
  v1::JoinRequest jr;
  jr.set_size(1);
  v1::JoinReply jreply;
  CHECK(s.stub->Join(&jctx, jr, &jreply).error_code() == grpc::StatusCode::UNAUTHENTICATED);
  CHECK(s.rendezvous.joined() == 0);

  grpc::ClientContext sctx;
  sctx.set_deadline(DeadlineAfterMs(5000));
  auto stream = s.stub->Session(&sctx);
  v1::AgentEvent hello;
  hello.mutable_hello()->set_host_index(0);
  stream->Write(hello);
  stream->WritesDone();
  CHECK(stream->Finish().error_code() == grpc::StatusCode::UNAUTHENTICATED);
  CHECK(s.events.ended == 0);
}

// A raw call to `method` with `bytes` of junk as its body.
grpc::StatusCode JunkCall(Server& s, const std::string& method, size_t bytes, const char* secret) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  grpc::GenericStub stub(grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(s.port),
                                                   grpc::InsecureChannelCredentials(), args));
  std::string body(bytes, '\0');
  for (size_t i = 0; i < bytes; ++i) body[i] = static_cast<char>(i * 2654435761u >> 13);
  grpc::Slice slice(body);
  grpc::ByteBuffer req(&slice, 1), reply;
  grpc::ClientContext ctx;
  if (secret) AttachSecret(&ctx, secret);
  ctx.set_deadline(DeadlineAfterMs(10000));
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &req, &reply,
                 [&](grpc::Status st) { done.set_value(st); });
  return done.get_future().get().error_code();
}

TEST_CASE("job service: junk is refused before it is parsed, and by size", "[job_service]") {
  const std::string secret(64, 'a');
  Server s(secret);
  for (const char* method : {"/ringrun.v1.JobService/Register", "/ringrun.v1.JobService/Join",
                             "/ringrun.v1.JobService/Watch"}) {
    INFO(method);
    // Without the secret: refused at the door, never INTERNAL (a parse of attacker bytes).
    CHECK(JunkCall(s, method, 1 << 10, nullptr) == grpc::StatusCode::UNAUTHENTICATED);
    // Larger than any real request: refused for its size, with or without the secret.
    CHECK(JunkCall(s, method, 5 << 20, nullptr) == grpc::StatusCode::RESOURCE_EXHAUSTED);
    CHECK(JunkCall(s, method, 5 << 20, secret.c_str()) == grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  // With the secret, junk that is not a request is an invalid argument.
  CHECK(JunkCall(s, "/ringrun.v1.JobService/Register", 1 << 10, secret.c_str()) ==
        grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(JunkCall(s, "/ringrun.v1.JobService/Watch", 1 << 10, secret.c_str()) ==
        grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(s.events.registers == 0);
  CHECK(s.service.open_watches() == 0);
}

TEST_CASE("job service: the secret admits Register, Session and Join", "[job_service]") {
  const std::string secret(64, 'c');
  Server s(secret);
  v1::RegisterReply reply;
  REQUIRE(CallRegister(s, secret.c_str(), &reply).ok());
  CHECK(reply.job_id() == "job-3");
  CHECK(s.events.last_peer == "127.0.0.1");

  {
    grpc::ClientContext ctx;
    auto stream = OpenSession(s, secret, 0, &ctx);
    v1::AgentEvent ev;
    ev.mutable_exited()->set_rank(0);
    REQUIRE(stream->Write(ev));
    v1::AgentCommand cmd;
    REQUIRE(stream->Read(&cmd));  // the service pings
    CHECK(cmd.has_ping());
    stream->WritesDone();
    while (stream->Read(&cmd)) {
    }
    CHECK(stream->Finish().ok());
  }
  for (int i = 0; i < 100 && s.events.ended == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(s.events.events == 1);
  CHECK(s.events.ended == 1);

  grpc::ClientContext jctx;
  AttachSecret(&jctx, secret);
  jctx.set_deadline(DeadlineAfterMs(5000));
  v1::JoinRequest jr;
  jr.set_size(1);
  jr.set_address("127.0.0.1");
  jr.set_port(4242);
  v1::JoinReply jreply;
  REQUIRE(s.stub->Join(&jctx, jr, &jreply).ok());
  CHECK(!jreply.packed_peers().empty());  // the table travels compressed
  REQUIRE(UnpackPeerColumns(&jreply).ok());
  REQUIRE(jreply.port_of_rank_size() == 1);
  CHECK(jreply.port_of_rank(0) == 4242);
}

// An elastic Join of `worker` asking for `generation`, answered into *reply (async).
std::future<grpc::Status> ElasticJoin(Server& s, const std::string& secret, int worker,
                                      uint32_t generation, v1::JoinReply* reply) {
  return std::async(std::launch::async, [&s, secret, worker, generation, reply] {
    grpc::ClientContext ctx;
    AttachSecret(&ctx, secret);
    ctx.set_deadline(DeadlineAfterMs(10000));
    v1::JoinRequest jr;
    jr.set_elastic(true);
    jr.set_worker_id(worker);
    jr.set_generation(generation);
    jr.set_address("127.0.0.1");
    jr.set_port(static_cast<uint32_t>(5000 + worker));
    return s.stub->Join(&ctx, jr, reply);
  });
}

TEST_CASE("job service: elastic Joins meet by worker id in the launcher's generations",
          "[job_service][elastic]") {
  const std::string secret(64, 'e');
  Server s(secret);
  std::atomic<uint32_t> completed{0};
  s.rendezvous.SetOnGenerationComplete([&](uint32_t g) { completed = g; });
  // Generation 1: workers 0..2 on two hosts.
  Rendezvous::ElasticGeneration g1;
  g1.number = 1;
  g1.workers = {0, 1, 2};
  g1.hosts = {"a", "a", "b"};
  g1.data_secret = std::string(64, '1');
  s.rendezvous.SetGeneration(g1);
  v1::JoinReply r[3];
  std::future<grpc::Status> f[3];
  for (int w = 0; w < 3; ++w) f[w] = ElasticJoin(s, secret, w, 1, &r[w]);
  for (int w = 0; w < 3; ++w) REQUIRE(f[w].get().ok());
  CHECK(completed == 1);
  CHECK(r[2].generation() == 1);
  CHECK(r[2].size() == 3);
  CHECK(r[2].data_secret() == std::string(64, '1'));
  CHECK(std::vector<int>(r[2].worker_of_rank().begin(), r[2].worker_of_rank().end()) ==
        std::vector<int>{0, 1, 2});
  CHECK(r[2].host_of_rank(2) == "b");

  // Worker 1 failed. Workers 0 and 2 ask for generation 2 before the launcher formed it: held.
  for (int w : {0, 2}) f[w] = ElasticJoin(s, secret, w, 2, &r[w]);
  f[1] = ElasticJoin(s, secret, 1, 2, &r[1]);  // the failed one, late
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK(f[0].wait_for(std::chrono::seconds(0)) == std::future_status::timeout);
  Rendezvous::ElasticGeneration g2;
  g2.number = 2;
  g2.workers = {2, 0};  // worker 2 is rank 0 now
  g2.hosts = {"b", "a"};
  g2.data_secret = std::string(64, '2');
  s.rendezvous.SetGeneration(g2);
  for (int w : {0, 2}) REQUIRE(f[w].get().ok());
  grpc::Status refused = f[1].get();
  CHECK(refused.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK_THAT(refused.error_message(),
             Catch::Contains("worker 1 asked to join generation 2, but generation 2 of the job "
                             "was formed without it"));
  CHECK(completed == 2);
  CHECK(r[0].size() == 2);
  CHECK(r[0].worker_of_rank(0) == 2);
  CHECK(r[0].data_secret() == std::string(64, '2'));
  REQUIRE(UnpackPeerColumns(&r[0]).ok());
  CHECK(r[0].port_of_rank(0) == 5002);
  // A straggler of generation 1 asking for it now is refused too.
  v1::JoinReply late;
  CHECK(ElasticJoin(s, secret, 1, 1, &late).get().error_code() ==
        grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_CASE("job service: a new worker waits in a grown generation, which its members complete",
          "[job_service][elastic]") {
  const std::string secret(64, 'g');
  Server s(secret);
  std::atomic<uint32_t> completed{0};
  s.rendezvous.SetOnGenerationComplete([&](uint32_t g) { completed = g; });
  Rendezvous::ElasticGeneration g1;
  g1.number = 1;
  g1.workers = {0, 1};
  g1.hosts = {"a", "a"};
  g1.data_secret = std::string(64, '1');
  s.rendezvous.SetGeneration(g1);
  v1::JoinReply r[4];
  std::future<grpc::Status> f[4];
  for (int w = 0; w < 2; ++w) f[w] = ElasticJoin(s, secret, w, 1, &r[w]);
  for (int w = 0; w < 2; ++w) REQUIRE(f[w].get().ok());
  CHECK(completed == 1);
  // Host b with workers 2 and 3 is added: generation 2 is formed while 0 and 1 run on in 1.
  Rendezvous::ElasticGeneration g2;
  g2.number = 2;
  g2.workers = {0, 1, 2, 3};
  g2.hosts = {"a", "a", "b", "b"};
  g2.data_secret = std::string(64, '2');
  g2.membership_epoch = 1;
  s.rendezvous.SetGeneration(g2);
  CHECK_FALSE(s.rendezvous.Holds({2, 3}));
  // The new processes ask for generation 1 (their first join): they are held for 2.
  for (int w : {2, 3}) f[w] = ElasticJoin(s, secret, w, 1, &r[w]);
  for (int i = 0; i < 200 && !s.rendezvous.Holds({2, 3}); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(s.rendezvous.Holds({2, 3}));
  CHECK_FALSE(s.rendezvous.Holds({0, 2}));
  CHECK(completed == 1);
  // The running workers leave generation 1 and ask for 2: it completes.
  for (int w : {0, 1}) f[w] = ElasticJoin(s, secret, w, 2, &r[w]);
  for (int w = 0; w < 4; ++w) REQUIRE(f[w].get().ok());
  CHECK(completed == 2);
  CHECK(r[3].generation() == 2);
  CHECK(r[3].size() == 4);
  CHECK(r[3].membership_epoch() == 1);
  CHECK(r[0].worker_of_rank(3) == 3);
  CHECK_FALSE(s.rendezvous.Holds({2}));
}

TEST_CASE("job service: a command sent before the Session opens is delivered when it does",
          "[job_service]") {
  const std::string secret(64, 'd');
  Server s(secret);
  v1::AgentCommand terminate;
  terminate.mutable_terminate()->set_grace_ms(250);
  s.service.Send(5, terminate);  // host 5 registered, its Session not open yet

  grpc::ClientContext ctx;
  auto stream = OpenSession(s, secret, 5, &ctx);
  v1::AgentCommand cmd;
  do {
    REQUIRE(stream->Read(&cmd));
  } while (cmd.has_ping());
  REQUIRE(cmd.has_terminate());
  CHECK(cmd.terminate().grace_ms() == 250);
  stream->WritesDone();
  while (stream->Read(&cmd)) {
  }
  CHECK(stream->Finish().ok());
}

// A Watch of `worker` in `generation`, knowing `epoch`, with `secret` (none: null).
std::unique_ptr<grpc::ClientReader<v1::MembershipNotice>> OpenWatch(Server& s, const char* secret,
                                                                    int worker, uint32_t generation,
                                                                    uint64_t epoch,
                                                                    grpc::ClientContext* ctx) {
  if (secret) AttachSecret(ctx, secret);
  ctx->set_deadline(DeadlineAfterMs(10000));
  v1::WatchRequest req;
  req.set_worker_id(worker);
  req.set_generation(generation);
  req.set_membership_epoch(epoch);
  return s.stub->Watch(ctx, req);
}

TEST_CASE("job service: a Watch without the job's secret is refused", "[job_service][elastic]") {
  const std::string secret(64, 'w');
  Server s(secret);
  s.service.BreakGeneration(1, "lost the agent on host h2");  // what a caller must not learn
  for (const char* wrong : {static_cast<const char*>(nullptr), "not-the-secret"}) {
    grpc::ClientContext ctx;
    auto reader = OpenWatch(s, wrong, 0, 1, 0, &ctx);
    v1::MembershipNotice n;
    CHECK_FALSE(reader->Read(&n));
    CHECK(reader->Finish().error_code() == grpc::StatusCode::UNAUTHENTICATED);
  }
  CHECK(s.service.open_watches() == 0);
  // A request that names no generation is refused too.
  grpc::ClientContext ctx;
  auto reader = OpenWatch(s, secret.c_str(), 0, 0, 0, &ctx);
  v1::MembershipNotice n;
  CHECK_FALSE(reader->Read(&n));
  CHECK(reader->Finish().error_code() == grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_CASE("job service: Watches get the epoch and the broken generations, late ones at once",
          "[job_service][elastic]") {
  const std::string secret(64, 'v');
  Server s(secret);
  grpc::ClientContext c1, c2;
  auto w1 = OpenWatch(s, secret.c_str(), 0, 1, 0, &c1);  // worker 0, generation 1
  auto w2 = OpenWatch(s, secret.c_str(), 1, 2, 0, &c2);  // worker 1, generation 2
  // The first notice also proves that each Watch is open.
  s.service.RaiseMembershipEpoch(3);
  v1::MembershipNotice n;
  for (auto* w : {w1.get(), w2.get()}) {
    REQUIRE(w->Read(&n));
    CHECK(n.membership_epoch() == 3);
    CHECK(n.broken_generation() == 0);
  }
  CHECK(s.service.open_watches() == 2);
  s.service.RaiseMembershipEpoch(2);  // lower: nothing
  s.service.BreakGeneration(1, "lost the agent on host h2: no heartbeat from the agent for 10 s");
  s.service.BreakGeneration(1, "again");  // the same generation: nothing
  s.service.RaiseMembershipEpoch(4);
  REQUIRE(w1->Read(&n));
  CHECK(n.broken_generation() == 1);
  CHECK(n.reason() == "lost the agent on host h2: no heartbeat from the agent for 10 s");
  REQUIRE(w1->Read(&n));
  CHECK(n.membership_epoch() == 4);
  // Generation 2 is not broken: its Watch got only the epoch.
  REQUIRE(w2->Read(&n));
  CHECK(n.broken_generation() == 0);
  CHECK(n.membership_epoch() == 4);

  // A Watch opened after the fact hears at once what it missed.
  grpc::ClientContext c3;
  auto w3 = OpenWatch(s, secret.c_str(), 2, 1, 1, &c3);
  REQUIRE(w3->Read(&n));
  CHECK(n.membership_epoch() == 4);
  CHECK(n.broken_generation() == 1);
  CHECK(n.reason() == "lost the agent on host h2: no heartbeat from the agent for 10 s");

  // A rank that cancels its Watch (ringrun_shutdown) is forgotten.
  c3.TryCancel();
  while (w3->Read(&n)) {
  }
  CHECK(w3->Finish().error_code() == grpc::StatusCode::CANCELLED);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (s.service.open_watches() != 2 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHECK(s.service.open_watches() == 2);

  // The job is over: the Watches end cleanly, and a new one is refused.
  s.service.Close();
  for (auto* w : {w1.get(), w2.get()}) {
    CHECK_FALSE(w->Read(&n));
    CHECK(w->Finish().ok());
  }
  grpc::ClientContext c4;
  auto w4 = OpenWatch(s, secret.c_str(), 3, 1, 0, &c4);
  CHECK_FALSE(w4->Read(&n));
  CHECK(w4->Finish().error_code() == grpc::StatusCode::ABORTED);
}

TEST_CASE("PeerAddress strips the transport and port", "[job_service]") {
  CHECK(PeerAddress("ipv4:198.18.0.2:41000") == "198.18.0.2");
  CHECK(PeerAddress("ipv6:[::1]:41000") == "::1");
  CHECK(PeerAddress("ipv6:[fe80::1%eth0]:5") == "fe80::1%eth0");
}

TEST_CASE("output routing tags whole lines and keeps the stderr tail", "[output]") {
  char* buf = nullptr;
  size_t len = 0;
  FILE* out = open_memstream(&buf, &len);
  job::OutputRouter::Config c;
  c.out = out;
  c.err = out;
  c.tail_lines = 2;
  std::vector<std::string> seen;
  c.on_line = [&](int, bool, std::string_view l) { seen.emplace_back(l); };
  job::OutputRouter router(c);
  router.Write(3, false, "a\n\nb\n");
  router.Write(3, true, "e1\ne2\ne3\n");
  router.Write(3, true, "partial");
  router.Flush();
  std::fclose(out);
  std::string text(buf, len);
  free(buf);
  CHECK(text ==
        "[3]<stdout>:a\n[3]<stdout>:\n[3]<stdout>:b\n[3]<stderr>:e1\n[3]<stderr>:e2\n"
        "[3]<stderr>:e3\n[3]<stderr>:partial\n");
  CHECK(router.StderrTail(3) == "e3\npartial");
  CHECK(seen.size() == 7);
}

}  // namespace
}  // namespace ringrun::launcher::service

namespace ringrun {
namespace {

TEST_CASE("the packed peer table round-trips and refuses damage", "[peer_table]") {
  v1::JoinReply reply;
  reply.set_size(7);
  for (const char* a : {"198.18.0.2", "198.18.0.3", "::1"}) reply.add_addresses(a);
  const uint32_t hosts[] = {0, 0, 1, 1, 1, 2, 0};  // runs, and a host that comes back
  const uint32_t ports[] = {1, 65535, 40000, 256, 255, 2, 3};
  for (int r = 0; r < 7; ++r) {
    reply.add_address_of_rank(hosts[r]);
    reply.add_port_of_rank(ports[r]);
  }
  reply.set_job_id("j");
  const v1::JoinReply original = reply;
  REQUIRE(PackPeerColumns(&reply).ok());
  CHECK(reply.port_of_rank_size() == 0);
  CHECK(reply.packed_size() == 7);
  v1::JoinReply damaged = reply;
  REQUIRE(UnpackPeerColumns(&reply).ok());
  CHECK(reply.SerializeAsString() == original.SerializeAsString());

  damaged.mutable_packed_peers()->pop_back();
  CHECK_FALSE(UnpackPeerColumns(&damaged).ok());
  v1::JoinReply big;
  big.add_addresses("a");
  big.add_address_of_rank(0);
  big.add_port_of_rank(70000);
  CHECK_FALSE(PackPeerColumns(&big).ok());
}

}  // namespace
}  // namespace ringrun

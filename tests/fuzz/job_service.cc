// Fuzz target: the job service's request handling (launcher/service/job_service.*, rendezvous.*).
// The real JobService, built as launcher/job/job.cc builds it, serves on loopback; each input is
// one call whose body is raw fuzz bytes, so the bytes go through gRPC's framing, Protobuf's parser
// and the handlers exactly as a client's would.
//
// Input: byte 0 picks the call (bits 0-1: Register, Join, Session, Register) and its credential
// (bit 2: no secret, bit 3: a wrong one). The rest is the request body; for Session it is a
// series of messages, each a length byte and that many bytes, the remainder being the last.
//
// Properties: a call without the right secret is answered UNAUTHENTICATED, whatever its body
// (the service checks the secret before it parses anything), and never reaches the job (the
// events seen do not change); an authenticated Register succeeds if its body parses and is
// INVALID_ARGUMENT otherwise; every call ends well before its deadline (nothing is held: the
// rendezvous has one rank, so a valid Join completes at once); and nothing crashes or trips a
// sanitizer. The server is configured as the launcher's (ConfigureJobServer: the 2 MiB request
// cap, keepalive), so a larger body is RESOURCE_EXHAUSTED before any handler runs.
#include "launcher/service/job_service.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "launcher/service/rendezvous.h"
#include "ringrun/common/auth.h"
#include "ringrun/common/defaults.h"
#include "ringrun/job.pb.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using ringrun::launcher::service::JobService;
using ringrun::launcher::service::Rendezvous;
namespace v1 = ringrun::v1;

constexpr int kDeadlineMs = 5000;
constexpr size_t kCap = ringrun::kMaxJobServiceRequestBytes;  // ConfigureJobServer's request cap
const std::string kSecret(64, 's');

class CountingEvents final : public ringrun::launcher::service::JobEvents {
 public:
  grpc::Status OnRegister(const v1::RegisterRequest& req, const std::string& peer,
                          v1::RegisterReply* reply) override {
    seen++;
    reply->set_job_id("fuzz");
    reply->add_ranks()->set_rank(req.host_index());
    return grpc::Status::OK;
  }
  void OnAgentEvent(int, const v1::AgentEvent&) override { seen++; }
  void OnSessionEnded(int, bool, const std::string&) override { seen++; }
  std::atomic<long> seen{0};
};

struct Harness {
  Harness() : rendezvous(1, "fuzz"), service(kSecret, &events, &rendezvous, 100, 1000) {
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(&service);
    ringrun::launcher::service::ConfigureJobServer(&b);  // as launcher/service/job_server.cc
    server = b.BuildAndStart();
    FUZZ_CHECK(server && port > 0);
    stub = std::make_unique<grpc::GenericStub>(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  }
  CountingEvents events;
  ringrun::launcher::service::Rendezvous rendezvous;
  JobService service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<grpc::GenericStub> stub;
};

Harness& TheHarness() {
  static Harness* h = new Harness();  // lives for the whole run, like a job's service
  return *h;
}

// A call's final status, handed from a gRPC thread. Set notifies under the lock, so once Get
// returns the setter no longer touches this object and it may be destroyed.
class Done {
 public:
  void Set(const grpc::Status& s) {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = s;
    done_ = true;
    cv_.notify_all();
  }
  grpc::Status Get() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return done_; });
    return status_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;    // guarded by mu_
  grpc::Status status_;  // guarded by mu_
};

grpc::ByteBuffer Bytes(const std::string& s) {
  grpc::Slice slice(s);
  return grpc::ByteBuffer(&slice, 1);
}

grpc::Status Unary(Harness& h, grpc::ClientContext* ctx, const std::string& method,
                   const std::string& body) {
  grpc::ByteBuffer req = Bytes(body), reply;
  Done done;
  h.stub->UnaryCall(ctx, method, grpc::StubOptions(), &req, &reply,
                    [&done](grpc::Status s) { done.Set(s); });
  return done.Get();
}

// Writes each message, half-closes, reads until the service ends the stream.
class SessionCall final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  SessionCall(Harness& h, grpc::ClientContext* ctx, std::vector<std::string> messages) {
    for (auto& m : messages) out_.push_back(Bytes(m));
    h.stub->PrepareBidiStreamingCall(ctx, "/ringrun.v1.JobService/Session", grpc::StubOptions(),
                                     this);
    StartRead(&in_);
    WriteNext();
    StartCall();
  }
  grpc::Status Wait() { return done_.Get(); }
  void OnWriteDone(bool ok) override {
    if (ok) WriteNext();
  }
  void OnReadDone(bool ok) override {
    if (ok) StartRead(&in_);
  }
  void OnDone(const grpc::Status& s) override { done_.Set(s); }

 private:
  void WriteNext() {
    if (next_ < out_.size()) {
      StartWrite(&out_[next_++]);
    } else if (next_++ == out_.size()) {
      StartWritesDone();
    }
  }
  std::vector<grpc::ByteBuffer> out_;
  size_t next_ = 0;
  grpc::ByteBuffer in_;
  Done done_;
};

std::vector<std::string> SplitMessages(const std::string& body) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < body.size()) {
    size_t len = static_cast<uint8_t>(body[i++]);
    out.push_back(body.substr(i, len));
    i += len;
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Harness& h = TheHarness();
  const int method = data[0] & 3;
  const bool no_secret = data[0] & 4;
  const bool wrong_secret = data[0] & 8;
  const bool authenticated = !no_secret && !wrong_secret;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);

  grpc::ClientContext ctx;
  ctx.set_deadline(ringrun::DeadlineAfterMs(kDeadlineMs));
  if (!no_secret) ringrun::AttachSecret(&ctx, wrong_secret ? std::string(64, 'w') : kSecret);
  const long seen_before = h.events.seen;

  grpc::Status status;
  if (method == 2) {
    SessionCall call(h, &ctx, SplitMessages(body));
    status = call.Wait();
  } else {
    const bool join = method == 1;
    status = Unary(h, &ctx,
                   join ? "/ringrun.v1.JobService/Join" : "/ringrun.v1.JobService/Register", body);
    v1::RegisterRequest parsed;
    if (!join && authenticated && body.size() <= kCap) {
      FUZZ_CHECK(parsed.ParseFromString(body)
                     ? status.ok()
                     : status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    }
  }

  if (std::getenv("RINGRUN_FUZZ_VERBOSE") != nullptr) {
    std::fprintf(stderr, "call %d auth=%d body=%zu bytes: status %d %s\n", method, authenticated,
                 body.size(), static_cast<int>(status.error_code()),
                 status.error_message().c_str());
  }
  FUZZ_CHECK(status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED);
  if (!authenticated) {
    bool too_big = false;  // the cap applies per message (Session: each one)
    if (method == 2) {
      for (const std::string& m : SplitMessages(body)) too_big |= m.size() > kCap;
    } else {
      too_big = body.size() > kCap;
    }
    FUZZ_CHECK(status.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
               (too_big && status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED));
    FUZZ_CHECK(h.events.seen == seen_before);
  }
  return 0;
}

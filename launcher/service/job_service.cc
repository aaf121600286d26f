#include "launcher/service/job_service.h"

#include <atomic>
#include <chrono>
#include <thread>

#include "ringrun/common/auth.h"
#include "ringrun/common/defaults.h"

namespace ringrun::launcher::service {

using Clock = std::chrono::steady_clock;

std::string PeerAddress(const std::string& peer) {
  std::string s = peer;
  auto colon = s.find(':');
  if (colon != std::string::npos && (s.rfind("ipv4", 0) == 0 || s.rfind("ipv6", 0) == 0)) {
    s = s.substr(colon + 1);
  }
  if (!s.empty() && s[0] == '[') {
    auto end = s.find(']');
    return end == std::string::npos ? s : s.substr(1, end - 1);
  }
  auto last = s.rfind(':');
  return last == std::string::npos ? s : s.substr(0, last);
}

JobService::JobService(std::string secret, JobEvents* events, Rendezvous* rendezvous,
                       int heartbeat_interval_ms, int heartbeat_timeout_ms)
    : secret_(std::move(secret)),
      events_(events),
      rendezvous_(rendezvous),
      heartbeat_interval_ms_(heartbeat_interval_ms),
      heartbeat_timeout_ms_(heartbeat_timeout_ms) {}

JobService::~JobService() {
  Close();
  std::vector<std::thread> threads;
  {
    MutexLock lock(&mu_);
    threads.swap(registers_);
  }
  for (std::thread& t : threads) t.join();
}

void ConfigureJobServer(grpc::ServerBuilder* builder) {
  builder->SetMaxReceiveMessageSize(kMaxJobServiceRequestBytes);
  builder->SetMaxSendMessageSize(-1);  // Join replies carry the whole peer table
  builder->AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, kJobServiceHandshakeTimeoutMs);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveMs);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
}

grpc::ServerUnaryReactor* JobService::Register(grpc::CallbackServerContext* ctx,
                                               const grpc::ByteBuffer* req,
                                               grpc::ByteBuffer* reply) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  grpc::Status auth = CheckSecret(*ctx, secret_);
  if (!auth.ok()) {
    reactor->Finish(auth);
    return reactor;
  }
  if (events_ == nullptr) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "no agents here"));
    return reactor;
  }
  v1::RegisterRequest request;
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (req->Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices)
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  if (!request.ParseFromString(bytes)) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "not a RegisterRequest"));
    return reactor;
  }
  // OnRegister may wait for other agents (until the start deadline): not on a gRPC thread.
  MutexLock lock(&mu_);
  registers_.emplace_back(
      [this, reactor, reply, request = std::move(request), peer = PeerAddress(ctx->peer())] {
        v1::RegisterReply out;
        grpc::Status st = events_->OnRegister(request, peer, &out);
        if (st.ok()) {
          std::string serialized = out.SerializeAsString();
          grpc::Slice slice(serialized);
          *reply = grpc::ByteBuffer(&slice, 1);
        }
        reactor->Finish(st);
      });
  return reactor;
}

grpc::Status JobService::Session(
    grpc::ServerContext* ctx, grpc::ServerReaderWriter<v1::AgentCommand, v1::AgentEvent>* stream) {
  grpc::Status auth = CheckSecret(*ctx, secret_);
  if (!auth.ok()) return auth;
  if (events_ == nullptr) return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "no agents here");
  v1::AgentEvent first;
  if (!stream->Read(&first) || !first.has_hello()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a Session starts with Hello");
  }
  const int host = first.hello().host_index();
  {
    MutexLock lock(&mu_);
    if (closed_) return grpc::Status(grpc::StatusCode::ABORTED, "the job is over");
    Outbox& box = outboxes_[host];
    if (box.open) {
      return grpc::Status(grpc::StatusCode::ALREADY_EXISTS, "host already has a Session");
    }
    box.open = true;
  }

  // The reader runs beside this handler, which writes commands and pings and watches the
  // agent's heartbeat.
  std::atomic<int64_t> last_heard_ms{0};
  std::atomic<bool> reader_done{false};
  auto now_ms = [] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch())
        .count();
  };
  last_heard_ms = now_ms();
  std::thread reader([&] {
    v1::AgentEvent ev;
    while (stream->Read(&ev)) {
      last_heard_ms = now_ms();
      if (!ev.has_heartbeat()) events_->OnAgentEvent(host, ev);
    }
    reader_done = true;
    MutexLock lock(&mu_);
    cv_.SignalAll();
  });

  bool clean = false;
  std::string why;
  auto next_ping = Clock::now();
  {
    MutexLock lock(&mu_);
    while (true) {
      auto& box = outboxes_[host];
      while (!box.queue.empty()) {
        v1::AgentCommand cmd = std::move(box.queue.front());
        box.queue.pop_front();
        mu_.Unlock();
        bool ok = stream->Write(cmd);
        mu_.Lock();
        if (!ok) break;
      }
      if (reader_done) {
        // The agent half-closed after its last event: a clean end (the job decides whether its
        // ranks were all reported). A broken stream shows up as a cancelled context.
        clean = !ctx->IsCancelled();
        why = clean ? "" : "the connection to the agent broke";
        break;
      }
      if (closed_) {
        clean = true;
        break;
      }
      if (now_ms() - last_heard_ms > heartbeat_timeout_ms_) {
        why = "no heartbeat from the agent for " + std::to_string(heartbeat_timeout_ms_ / 1000) +
              " s";
        break;
      }
      if (Clock::now() >= next_ping) {
        mu_.Unlock();
        v1::AgentCommand ping;
        ping.mutable_ping();
        bool ok = stream->Write(ping);
        mu_.Lock();
        next_ping = Clock::now() + std::chrono::milliseconds(heartbeat_interval_ms_);
        if (!ok) {
          why = "the connection to the agent broke";
          break;
        }
        continue;
      }
      cv_.WaitUntil(&mu_, std::min(next_ping, Clock::now() + std::chrono::milliseconds(200)));
    }
    outboxes_.erase(host);
  }
  if (!reader_done) ctx->TryCancel();
  reader.join();
  events_->OnSessionEnded(host, clean, why);
  return grpc::Status::OK;
}

grpc::ServerUnaryReactor* JobService::Join(grpc::CallbackServerContext* ctx,
                                           const grpc::ByteBuffer* req, grpc::ByteBuffer* reply) {
  grpc::Status auth = CheckSecret(*ctx, secret_);
  if (!auth.ok() || rendezvous_ == nullptr) {
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(auth.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "no rendezvous")
                              : auth);
    return reactor;
  }
  return rendezvous_->Join(ctx, req, reply);
}

void JobService::Send(int host_index, const v1::AgentCommand& command) {
  MutexLock lock(&mu_);
  if (closed_) return;
  outboxes_[host_index].queue.push_back(command);
  cv_.SignalAll();
}

void JobService::Close() {
  MutexLock lock(&mu_);
  closed_ = true;
  cv_.SignalAll();
}

}  // namespace ringrun::launcher::service

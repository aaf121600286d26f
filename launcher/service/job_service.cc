#include "launcher/service/job_service.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <utility>

#include "ringrun/common/auth.h"
#include "ringrun/common/defaults.h"
#include "ringrun/common/tsan.h"

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

// One agent's Session. Reads are serialized by gRPC; everything the service's other threads
// touch is guarded by the service's mu_. It ends in two steps: End (under mu_: the service
// forgets it and cancels the call if the agent has not half-closed), then, once its last read
// and write are done, Conclude (the job hears of the end, then Finish). So every event reaches
// the job before the end does, and every pointer the service holds is to a live reactor (it
// is deleted in OnDone, which follows Finish).
class JobService::SessionReactor final
    : public grpc::ServerBidiReactor<v1::AgentEvent, v1::AgentCommand> {
 public:
  SessionReactor(JobService* service, grpc::CallbackServerContext* ctx)
      : service_(*service), ctx_(ctx) {
    RINGRUN_HAPPENS_BEFORE(this);
    StartRead(&event_);
  }

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone() override;

  // Stops the Session: nothing more is written and the service forgets it. Cancels the call
  // when the agent has not half-closed, so that the outstanding read ends. Returns Ready().
  bool End(bool clean, std::string why) REQUIRES(service_.mu_);
  // Whether the caller must now Conclude(): the Session is ending, its last read and write are
  // done, and no one has concluded it yet. True once.
  bool Ready() REQUIRES(service_.mu_);
  // Reports the end to the job, then finishes the call (outside mu_). The job hears of the end
  // before the agent does, so an agent's exit never overtakes its Session's end.
  void Conclude();

  // The agent's host index, set from its Hello before any other thread can reach this
  // Session; constant after that, so it is read without mu_.
  int host = -1;
  std::atomic<int64_t> last_heard_ms{0};
  Clock::time_point next_ping GUARDED_BY(service_.mu_);
  bool ping_due GUARDED_BY(service_.mu_) = false;
  bool writing GUARDED_BY(service_.mu_) = false;  // `out` is being written
  v1::AgentCommand out GUARDED_BY(service_.mu_);

 private:
  JobService& service_;
  grpc::CallbackServerContext* const ctx_;
  v1::AgentEvent event_;     // the read in flight; read callbacks only
  bool registered_ = false;  // the Hello was accepted; read callbacks only
  bool reads_done_ GUARDED_BY(service_.mu_) = false;
  bool ending_ GUARDED_BY(service_.mu_) = false;
  bool concluded_ GUARDED_BY(service_.mu_) = false;
  bool clean_ GUARDED_BY(service_.mu_) = false;
  std::string why_ GUARDED_BY(service_.mu_);
};

// One rank's Watch. Its notices wait in `queue` and are written one at a time. Everything the
// service's other threads touch is guarded by the service's mu_. It is finished exactly once
// (TakeFinish), by whoever stops it while no write is in flight or by the write that completes
// last, and deleted in OnDone, which first takes it out of the service's list: so every pointer
// the service holds under mu_ is to a live reactor, and a write that Post started (writing set
// under mu_) is never overtaken by Finish.
class JobService::WatchReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  WatchReactor(JobService* service, uint32_t gen) : generation(gen), service_(*service) {
    RINGRUN_HAPPENS_BEFORE(this);
  }

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

  // Starts the write that Post prepared (outside mu_).
  void Write() {
    RINGRUN_HAPPENS_BEFORE(this);
    StartWrite(&out);
  }
  // Stops the Watch with `status`: nothing more is written. Returns whether the caller must now
  // call Finish(finish_status) outside mu_.
  bool Stop(grpc::Status status) REQUIRES(service_.mu_) {
    if (!finishing) finishing = true, finish_status = std::move(status);
    return TakeFinish();
  }
  bool TakeFinish() REQUIRES(service_.mu_) {
    if (!finishing || writing || finished) return false;
    finished = true;
    return true;
  }
  void Conclude() {
    grpc::Status st;
    {
      MutexLock lock(&service_.mu_);
      st = finish_status;
    }
    RINGRUN_HAPPENS_BEFORE(this);
    Finish(st);
  }

  const uint32_t generation;  // the generation the rank joined
  std::deque<grpc::ByteBuffer> queue GUARDED_BY(service_.mu_);
  grpc::ByteBuffer out GUARDED_BY(service_.mu_);  // the write in flight
  bool writing GUARDED_BY(service_.mu_) = false;
  bool finishing GUARDED_BY(service_.mu_) = false;
  bool finished GUARDED_BY(service_.mu_) = false;
  grpc::Status finish_status GUARDED_BY(service_.mu_);

 private:
  JobService& service_;
};

void JobService::WatchReactor::OnWriteDone(bool ok) {
  RINGRUN_HAPPENS_AFTER(this);
  bool next = false, finish = false;
  {
    MutexLock lock(&service_.mu_);
    writing = false;
    if (!ok && !finishing) {
      finishing = true, finish_status = grpc::Status(grpc::StatusCode::CANCELLED, "write failed");
    }
    if (!finishing && !queue.empty()) {
      out = std::move(queue.front());
      queue.pop_front();
      writing = next = true;
    }
    finish = TakeFinish();
  }
  if (next) Write();
  if (finish) Conclude();
}

void JobService::WatchReactor::OnCancel() {
  RINGRUN_HAPPENS_AFTER(this);
  bool finish;
  {
    MutexLock lock(&service_.mu_);
    finish = Stop(grpc::Status::CANCELLED);
  }
  if (finish) Conclude();
}

void JobService::WatchReactor::OnDone() {
  RINGRUN_HAPPENS_AFTER(this);
  {
    MutexLock lock(&service_.mu_);
    auto& w = service_.watches_;
    w.erase(std::remove(w.begin(), w.end(), this), w.end());
  }
  delete this;
}

namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch())
      .count();
}

// A Session refused before it began (no secret, no Hello): finished at once.
class RefusedSession final : public grpc::ServerBidiReactor<v1::AgentEvent, v1::AgentCommand> {
 public:
  explicit RefusedSession(grpc::Status status) {
    RINGRUN_HAPPENS_BEFORE(this);  // gRPC calls OnDone on another thread
    Finish(std::move(status));
  }
  void OnDone() override {
    RINGRUN_HAPPENS_AFTER(this);
    delete this;
  }
};

// A Watch refused before it began (no secret, a bad request, the job over): finished at once.
class RefusedWatch final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit RefusedWatch(grpc::Status status) {
    RINGRUN_HAPPENS_BEFORE(this);
    Finish(std::move(status));
  }
  void OnDone() override {
    RINGRUN_HAPPENS_AFTER(this);
    delete this;
  }
};

// The bytes of a raw request (empty when they cannot be read: then no request parses).
std::string Bytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (buffer.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices)
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return bytes;
}

grpc::ByteBuffer Serialize(const google::protobuf::Message& m) {
  std::string bytes = m.SerializeAsString();
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace

bool JobService::SessionReactor::End(bool clean, std::string why) {
  if (ending_) return false;
  ending_ = true;
  clean_ = clean;
  why_ = std::move(why);
  auto it = service_.outboxes_.find(host);
  if (it != service_.outboxes_.end() && it->second.session == this) service_.outboxes_.erase(it);
  // Cancelling makes an outstanding read or write complete at once; its completion runs on a
  // gRPC thread, never inline here.
  if (!reads_done_) ctx_->TryCancel();
  return Ready();
}

bool JobService::SessionReactor::Ready() {
  if (!ending_ || !reads_done_ || writing || concluded_) return false;
  concluded_ = true;
  return true;
}

void JobService::SessionReactor::Conclude() {
  bool clean;
  std::string why;
  {
    MutexLock lock(&service_.mu_);
    clean = clean_;
    why = why_;
  }
  service_.events_->OnSessionEnded(host, clean, why);
  RINGRUN_HAPPENS_BEFORE(this);
  Finish(grpc::Status::OK);
}

void JobService::SessionReactor::OnReadDone(bool ok) {
  RINGRUN_HAPPENS_AFTER(this);  // gRPC calls back on its threads (see the class comment)
  if (!registered_) {
    if (!ok || !event_.has_hello()) {
      RINGRUN_HAPPENS_BEFORE(this);
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a Session starts with Hello"));
      return;
    }
    const int h = event_.hello().host_index();
    const v1::AgentCommand* first = nullptr;
    grpc::Status refused;
    {
      MutexLock lock(&service_.mu_);
      Outbox& box = service_.outboxes_[h];
      if (service_.closed_) {
        refused = grpc::Status(grpc::StatusCode::ABORTED, "the job is over");
      } else if (box.session != nullptr) {
        refused = grpc::Status(grpc::StatusCode::ALREADY_EXISTS, "host already has a Session");
      } else {
        box.session = this;
        host = h;
        registered_ = true;
        last_heard_ms = NowMs();
        ping_due = true;  // the first ping goes at once
        next_ping = Clock::now() + std::chrono::milliseconds(service_.heartbeat_interval_ms_);
        first = service_.NextWrite(this);
      }
    }
    if (!refused.ok()) {
      RINGRUN_HAPPENS_BEFORE(this);
      Finish(refused);
      return;
    }
    RINGRUN_HAPPENS_BEFORE(this);
    if (first != nullptr) StartWrite(first);
    RINGRUN_HAPPENS_BEFORE(this);
    StartRead(&event_);
    return;
  }
  if (ok) {
    last_heard_ms = NowMs();
    if (!event_.has_heartbeat()) service_.events_->OnAgentEvent(host, event_);
    RINGRUN_HAPPENS_BEFORE(this);
    StartRead(&event_);
    return;
  }
  // The agent half-closed after its last event: a clean end (the job decides whether its ranks
  // were all reported). A broken stream shows up as a cancelled context.
  // (After End, the read ends because End cancelled the call.)
  const bool clean = !ctx_->IsCancelled();
  bool conclude;
  {
    MutexLock lock(&service_.mu_);
    reads_done_ = true;
    conclude = ending_ ? Ready() : End(clean, clean ? "" : "the connection to the agent broke");
  }
  if (conclude) Conclude();
}

void JobService::SessionReactor::OnWriteDone(bool ok) {
  RINGRUN_HAPPENS_AFTER(this);
  const v1::AgentCommand* next = nullptr;
  bool conclude = false;
  {
    MutexLock lock(&service_.mu_);
    writing = false;
    if (ending_) {
      conclude = Ready();
    } else if (!ok) {
      conclude = End(false, "the connection to the agent broke");
    } else {
      next = service_.NextWrite(this);
    }
  }
  RINGRUN_HAPPENS_BEFORE(this);
  if (next != nullptr) StartWrite(next);
  if (conclude) Conclude();
}

void JobService::SessionReactor::OnDone() {
  RINGRUN_HAPPENS_AFTER(this);
  delete this;
}

JobService::JobService(std::string secret, JobEvents* events, Rendezvous* rendezvous,
                       int heartbeat_interval_ms, int heartbeat_timeout_ms)
    : secret_(std::move(secret)),
      events_(events),
      rendezvous_(rendezvous),
      heartbeat_interval_ms_(heartbeat_interval_ms),
      heartbeat_timeout_ms_(heartbeat_timeout_ms) {
  if (events_ == nullptr) return;
  // The ticker takes no signals, whichever thread builds the service and whenever: a job's
  // signals go to its SignalForwarder's thread, which may start after this one.
  sigset_t all, caller;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &caller);
  ticker_ = std::thread([this] { Tick(); });
  pthread_sigmask(SIG_SETMASK, &caller, nullptr);
}

JobService::~JobService() {
  Close();
  if (ticker_.joinable()) ticker_.join();
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
  if (!request.ParseFromString(Bytes(*req))) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "not a RegisterRequest"));
    return reactor;
  }
  JobEvents::RegisterDone done = [reactor, reply](grpc::Status st, v1::RegisterReply out) {
    if (st.ok()) {
      std::string serialized = out.SerializeAsString();
      grpc::Slice slice(serialized);
      *reply = grpc::ByteBuffer(&slice, 1);
    }
    reactor->Finish(st);
  };
  const std::string peer = PeerAddress(ctx->peer());
  if (events_->OnRegisterAsync(request, peer, done)) return reactor;
  // The blocking form may wait for other agents (until the start deadline): not on a gRPC thread.
  MutexLock lock(&mu_);
  registers_.emplace_back([this, done, request = std::move(request), peer] {
    v1::RegisterReply out;
    grpc::Status st = events_->OnRegister(request, peer, &out);
    done(st, std::move(out));
  });
  return reactor;
}

grpc::ServerBidiReactor<v1::AgentEvent, v1::AgentCommand>* JobService::Session(
    grpc::CallbackServerContext* ctx) {
  grpc::Status auth = CheckSecret(*ctx, secret_);
  if (!auth.ok()) return new RefusedSession(auth);
  if (events_ == nullptr) {
    return new RefusedSession(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "no agents here"));
  }
  return new SessionReactor(this, ctx);
}

const v1::AgentCommand* JobService::NextWrite(SessionReactor* session) {
  if (session->writing) return nullptr;
  auto it = outboxes_.find(session->host);
  if (it == outboxes_.end() || it->second.session != session) return nullptr;  // ending
  std::deque<v1::AgentCommand>& queue = it->second.queue;
  if (!queue.empty()) {
    session->out = std::move(queue.front());
    queue.pop_front();
  } else if (session->ping_due) {
    session->ping_due = false;
    session->out.Clear();
    session->out.mutable_ping();
  } else {
    return nullptr;
  }
  session->writing = true;
  return &session->out;
}

void JobService::Tick() {
  // A quarter of the shorter period, so that a ping is never much late and silence is noticed
  // within a quarter of the timeout.
  const auto period = std::chrono::milliseconds(
      std::clamp(std::min(heartbeat_interval_ms_, heartbeat_timeout_ms_) / 4, 1, 500));
  const std::string silent =
      "no heartbeat from the agent for " + std::to_string(heartbeat_timeout_ms_ / 1000) + " s";
  std::vector<std::pair<SessionReactor*, const v1::AgentCommand*>> writes;
  std::vector<SessionReactor*> finishes;
  MutexLock lock(&mu_);
  while (!closed_) {
    cv_.WaitUntil(&mu_, Clock::now() + period);
    if (closed_) break;
    const auto now = Clock::now();
    const int64_t now_ms = NowMs();
    for (auto it = outboxes_.begin(); it != outboxes_.end();) {
      SessionReactor* session = it->second.session;
      ++it;  // End erases the Session's outbox
      if (session == nullptr) continue;
      if (now_ms - session->last_heard_ms > heartbeat_timeout_ms_) {
        if (session->End(false, silent)) finishes.push_back(session);
      } else if (now >= session->next_ping) {
        session->ping_due = true;
        session->next_ping = now + std::chrono::milliseconds(heartbeat_interval_ms_);
        if (const v1::AgentCommand* m = NextWrite(session)) writes.emplace_back(session, m);
      }
    }
    if (writes.empty() && finishes.empty()) continue;
    mu_.Unlock();
    for (auto& [session, m] : writes) {
      RINGRUN_HAPPENS_BEFORE(session);
      session->StartWrite(m);
    }
    for (SessionReactor* session : finishes) session->Conclude();
    writes.clear();
    finishes.clear();
    mu_.Lock();
  }
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

grpc::ServerWriteReactor<grpc::ByteBuffer>* JobService::Watch(grpc::CallbackServerContext* ctx,
                                                              const grpc::ByteBuffer* req) {
  grpc::Status auth = CheckSecret(*ctx, secret_);
  if (!auth.ok()) return new RefusedWatch(auth);
  v1::WatchRequest request;
  if (!request.ParseFromString(Bytes(*req)) || request.worker_id() < 0 ||
      request.generation() == 0) {
    return new RefusedWatch(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                         "a Watch names a worker and the generation it joined"));
  }
  WatchReactor* watch = nullptr;
  WatchReactor* start = nullptr;
  {
    MutexLock lock(&mu_);
    if (!closed_) {
      watch = new WatchReactor(this, request.generation());
      watches_.push_back(watch);
      // What the rank missed between its Join and this Watch.
      v1::MembershipNotice first;
      if (membership_epoch_ > request.membership_epoch()) {
        first.set_membership_epoch(membership_epoch_);
      }
      if (broken_generation_ >= request.generation()) {
        first.set_broken_generation(broken_generation_);
        first.set_reason(broken_reason_);
      }
      if (first.ByteSizeLong() > 0) start = Post(watch, first);
    }
  }
  if (watch == nullptr) {
    return new RefusedWatch(grpc::Status(grpc::StatusCode::ABORTED, "the job is over"));
  }
  if (start != nullptr) start->Write();
  return watch;
}

JobService::WatchReactor* JobService::Post(WatchReactor* watch,
                                           const v1::MembershipNotice& notice) {
  if (watch->finishing) return nullptr;
  watch->queue.push_back(Serialize(notice));
  if (watch->writing) return nullptr;
  watch->out = std::move(watch->queue.front());
  watch->queue.pop_front();
  watch->writing = true;
  return watch;
}

void JobService::BreakGeneration(uint32_t generation, const std::string& reason) {
  std::vector<WatchReactor*> starts;
  {
    MutexLock lock(&mu_);
    if (closed_ || generation <= broken_generation_) return;
    broken_generation_ = generation;
    broken_reason_ = reason;
    v1::MembershipNotice notice;
    notice.set_broken_generation(generation);
    notice.set_reason(reason);
    for (WatchReactor* w : watches_) {
      if (w->generation > generation) continue;
      if (WatchReactor* s = Post(w, notice)) starts.push_back(s);
    }
  }
  for (WatchReactor* w : starts) w->Write();
}

void JobService::RaiseMembershipEpoch(uint64_t epoch) {
  std::vector<WatchReactor*> starts;
  {
    MutexLock lock(&mu_);
    if (closed_ || epoch <= membership_epoch_) return;
    membership_epoch_ = epoch;
    v1::MembershipNotice notice;
    notice.set_membership_epoch(epoch);
    for (WatchReactor* w : watches_) {
      if (WatchReactor* s = Post(w, notice)) starts.push_back(s);
    }
  }
  for (WatchReactor* w : starts) w->Write();
}

int JobService::open_watches() const {
  MutexLock lock(&mu_);
  return static_cast<int>(watches_.size());
}

void JobService::Send(int host_index, const v1::AgentCommand& command) {
  SessionReactor* session = nullptr;
  const v1::AgentCommand* next = nullptr;
  {
    MutexLock lock(&mu_);
    if (closed_) return;
    Outbox& box = outboxes_[host_index];
    box.queue.push_back(command);
    session = box.session;
    if (session != nullptr) next = NextWrite(session);
  }
  RINGRUN_HAPPENS_BEFORE(session);
  if (next != nullptr) session->StartWrite(next);
}

void JobService::Close() {
  std::vector<SessionReactor*> finishes;
  std::vector<WatchReactor*> watches;
  {
    MutexLock lock(&mu_);
    closed_ = true;
    cv_.SignalAll();
    for (WatchReactor* w : watches_) {
      if (w->Stop(grpc::Status::OK)) watches.push_back(w);
    }
    for (auto it = outboxes_.begin(); it != outboxes_.end();) {
      SessionReactor* session = it->second.session;
      ++it;
      if (session != nullptr && session->End(true, "")) finishes.push_back(session);
    }
  }
  for (SessionReactor* session : finishes) session->Conclude();
  for (WatchReactor* w : watches) w->Conclude();
}

int JobService::open_sessions() const {
  MutexLock lock(&mu_);
  int n = 0;
  for (const auto& [host, box] : outboxes_) n += box.session != nullptr;
  return n;
}

}  // namespace ringrun::launcher::service

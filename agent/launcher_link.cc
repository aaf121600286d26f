#include "agent/launcher_link.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <deque>
#include <thread>

#include "ringrun/common/auth.h"
#include "ringrun/common/defaults.h"
#include "ringrun/common/fd.h"
#include "ringrun/common/log.h"
#include "ringrun/common/thread_annotations.h"
#include "ringrun/job.grpc.pb.h"

namespace ringrun::agent {
namespace {

using std::chrono::milliseconds;
using Stream = grpc::ClientReaderWriter<v1::AgentEvent, v1::AgentCommand>;

// Events to the launcher go through one writer thread, so the agent's loop never blocks on the
// network. Thread-safe.
class Outbox {
 public:
  explicit Outbox(Stream* stream) : stream_(stream), thread_([this] { Loop(); }) {}
  ~Outbox() { Close(); }

  void Push(v1::AgentEvent ev) {
    MutexLock lock(&mu_);
    bytes_ += ev.ByteSizeLong();
    queue_.push_back(std::move(ev));
    cv_.Signal();
  }
  size_t queued_bytes() {
    MutexLock lock(&mu_);
    return bytes_;
  }
  // Waits (until `deadline`) for the queue to drain, then half-closes the stream.
  bool Drain(Deadline deadline) {
    MutexLock lock(&mu_);
    done_ = true;
    cv_.Signal();
    while (!finished_ && drained_cv_.WaitUntil(&mu_, deadline)) {
    }
    return finished_;
  }
  void Close() {
    {
      MutexLock lock(&mu_);
      done_ = true;
      abandon_ = true;
      cv_.Signal();
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  // The writer thread. The stream is written without the lock, so that Push never waits on
  // the network; only this thread writes it.
  void Loop() {
    MutexLock lock(&mu_);
    while (true) {
      while (queue_.empty() && !done_) cv_.Wait(&mu_);
      if (abandon_ && !finished_) break;
      if (queue_.empty() && done_) {
        const bool broken = broken_;
        mu_.Unlock();
        if (!broken) stream_->WritesDone();
        mu_.Lock();
        finished_ = true;
        drained_cv_.SignalAll();
        break;
      }
      v1::AgentEvent ev = std::move(queue_.front());
      queue_.pop_front();
      bytes_ -= ev.ByteSizeLong();
      if (broken_) continue;
      mu_.Unlock();
      bool ok = stream_->Write(ev);
      mu_.Lock();
      if (!ok) broken_ = true;
    }
    finished_ = true;
    drained_cv_.SignalAll();
  }

  // Constant after construction.
  Stream* const stream_;

  Mutex mu_;
  CondVar cv_;          // queue_ or done_ changed
  CondVar drained_cv_;  // finished_ set
  // Guarded by mu_.
  std::deque<v1::AgentEvent> queue_ GUARDED_BY(mu_);
  size_t bytes_ GUARDED_BY(mu_) = 0;       // the serialized size of queue_
  bool done_ GUARDED_BY(mu_) = false;      // Drain or Close: write what is queued, then end
  bool abandon_ GUARDED_BY(mu_) = false;   // Close: end without writing the rest
  bool finished_ GUARDED_BY(mu_) = false;  // the writer thread is done
  bool broken_ GUARDED_BY(mu_) = false;    // a write failed: the rest is dropped

  std::thread thread_;  // last: started once every field above exists
};

Status FromGrpc(const grpc::Status& st) {
  switch (st.error_code()) {
    case grpc::StatusCode::ABORTED:
      return Aborted(st.error_message());
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return Timeout(st.error_message());
    case grpc::StatusCode::UNAVAILABLE:
      return Unavailable(st.error_message());
    case grpc::StatusCode::UNAUTHENTICATED:
      return PermissionDenied(st.error_message());
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::ALREADY_EXISTS:
      return InvalidArgument(st.error_message());
    default:
      return Internal(st.error_message());
  }
}

class GrpcLauncherLink final : public LauncherLink {
 public:
  GrpcLauncherLink(const std::string& target, const std::string& secret, const Clock& clock)
      : secret_(secret),
        clock_(clock),
        stub_(v1::JobService::NewStub(MakeChannel(target, kKeepaliveMs, kKeepaliveTimeoutMs))),
        wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
        last_heard_(clock.Now().time_since_epoch().count()) {}

  ~GrpcLauncherLink() override {
    if (stream_ && reader_.joinable()) Close(/*lost=*/true, 0);
  }

  Result<v1::RegisterReply> Register(const v1::RegisterRequest& request, int timeout_ms) override {
    grpc::ClientContext ctx;
    AttachSecret(&ctx, secret_);
    ctx.set_deadline(DeadlineAfterMs(timeout_ms));
    ctx.set_wait_for_ready(true);
    v1::RegisterReply reply;
    grpc::Status st = stub_->Register(&ctx, request, &reply);
    if (!st.ok()) return FromGrpc(st);
    return reply;
  }

  Status OpenSession(int host_index) override {
    if (!wake_.valid()) return ErrnoStatus("eventfd", errno);
    AttachSecret(&session_ctx_, secret_);
    stream_ = stub_->Session(&session_ctx_);
    outbox_ = std::make_unique<Outbox>(stream_.get());
    v1::AgentEvent hello;
    hello.mutable_hello()->set_host_index(host_index);
    outbox_->Push(std::move(hello));
    last_heard_ = clock_.Now().time_since_epoch().count();
    reader_ = std::thread([this] { ReadCommands(); });
    return Status::Ok();
  }

  void Send(v1::AgentEvent event) override { outbox_->Push(std::move(event)); }
  size_t queued_bytes() override { return outbox_->queued_bytes(); }
  std::vector<v1::AgentCommand> TakeCommands() override {
    MutexLock lock(&mu_);
    std::vector<v1::AgentCommand> out(std::make_move_iterator(commands_.begin()),
                                      std::make_move_iterator(commands_.end()));
    commands_.clear();
    return out;
  }
  Clock::TimePoint last_heard() override {
    return Clock::TimePoint(Clock::TimePoint::duration(last_heard_.load()));
  }
  bool session_over() override { return session_over_; }
  int wake_fd() override { return wake_.get(); }

  void Close(bool lost, int timeout_ms) override {
    if (!lost) {
      auto deadline = std::chrono::steady_clock::now() + milliseconds(timeout_ms);
      outbox_->Drain(deadline);
      deadline = std::chrono::steady_clock::now() + milliseconds(timeout_ms);
      while (!session_over_ && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(milliseconds(5));
      }
    }
    if (!session_over_) session_ctx_.TryCancel();
    reader_.join();
    outbox_->Close();
    grpc::Status st = stream_->Finish();
    spdlog::debug("session finished");
    if (!st.ok() && !lost) spdlog::debug("session ended: {}", st.error_message());
  }

 private:
  // The reader thread: commands from the launcher, until the stream ends.
  void ReadCommands() {
    v1::AgentCommand cmd;
    while (stream_->Read(&cmd)) {
      last_heard_ = clock_.Now().time_since_epoch().count();
      if (cmd.has_ping()) continue;
      {
        MutexLock lock(&mu_);
        commands_.push_back(cmd);
      }
      Wake();
    }
    session_over_ = true;
    Wake();
  }
  void Wake() {
    uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof(one));
  }

  // Constant after construction.
  const std::string secret_;
  const Clock& clock_;
  const std::unique_ptr<v1::JobService::Stub> stub_;
  const UniqueFd wake_;

  // Set by OpenSession, then constant until Close.
  grpc::ClientContext session_ctx_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<Outbox> outbox_;
  std::thread reader_;

  // Written by the reader thread.
  std::atomic<Clock::TimePoint::rep> last_heard_;
  std::atomic<bool> session_over_{false};

  Mutex mu_;
  std::deque<v1::AgentCommand> commands_ GUARDED_BY(mu_);  // read, not yet taken
};

}  // namespace

std::unique_ptr<LauncherLink> MakeGrpcLauncherLink(const std::string& target,
                                                   const std::string& secret, const Clock& clock) {
  return std::make_unique<GrpcLauncherLink>(target, secret, clock);
}

}  // namespace ringrun::agent

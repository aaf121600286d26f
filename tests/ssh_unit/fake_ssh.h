// A scripted SshConnector for unit tests: per host, a queue of connect outcomes, a local address,
// and a shared FakeRemote through which a test sees what the starter sent (command, stdin) and
// plays the remote side (output, exit status, connection loss).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "launcher/starters/ssh_session.h"

namespace ringrun::launcher::starters::testing {

// The remote end of one fake session. All members guarded by mu but `notify`, a pipe that
// becomes readable when the remote has something for Pump (as a session's socket does).
struct FakeRemote {
  FakeRemote() {
    if (::pipe2(notify, O_NONBLOCK | O_CLOEXEC) != 0) notify[0] = notify[1] = -1;
  }
  ~FakeRemote() {
    for (int fd : notify) {
      if (fd >= 0) ::close(fd);
    }
  }
  int notify[2];
  void Notify() { (void)!::write(notify[1], "n", 1); }

  std::mutex mu;
  std::string command;
  std::string stdin_data;
  std::string pending_out, pending_err;
  std::optional<int> pending_exit;
  bool close = false;       // the remote closes the channel
  bool lose = false;        // the connection fails
  bool terminated = false;  // Terminate() was called
  bool exec_fails = false;

  void Emit(const std::string& out, const std::string& err) {
    {
      std::lock_guard<std::mutex> l(mu);
      pending_out += out;
      pending_err += err;
    }
    Notify();
  }
  void Exit(int status) {
    {
      std::lock_guard<std::mutex> l(mu);
      pending_exit = status;
      close = true;
    }
    Notify();
  }
  void LoseConnection() {
    {
      std::lock_guard<std::mutex> l(mu);
      lose = true;
    }
    Notify();
  }
  template <typename T>
  T Get(T FakeRemote::*field) {
    std::lock_guard<std::mutex> l(mu);
    return this->*field;
  }
};

class FakeSession final : public SshSession {
 public:
  FakeSession(std::shared_ptr<FakeRemote> remote, std::string local)
      : remote_(std::move(remote)), local_(std::move(local)) {}
  std::string LocalAddress() const override { return local_; }
  Status Exec(const std::string& command) override {
    std::lock_guard<std::mutex> l(remote_->mu);
    remote_->command = command;
    if (remote_->exec_fails) return Unavailable("fake: exec refused");
    return Status::Ok();
  }
  Status WriteStdin(std::string_view data) override {
    std::lock_guard<std::mutex> l(remote_->mu);
    remote_->stdin_data.append(data);
    return Status::Ok();
  }
  int PollFd() const override { return remote_->notify[0]; }
  void Pump(int timeout_ms, int wake_fd, ExecEvents* ev) override {
    char drain[64];
    while (::read(remote_->notify[0], drain, sizeof(drain)) > 0) {
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      {
        std::lock_guard<std::mutex> l(remote_->mu);
        bool any = !remote_->pending_out.empty() || !remote_->pending_err.empty() ||
                   remote_->pending_exit || remote_->close || remote_->lose;
        if (any) {
          ev->stdout_data = std::exchange(remote_->pending_out, {});
          ev->stderr_data = std::exchange(remote_->pending_err, {});
          ev->exit_status = std::exchange(remote_->pending_exit, std::nullopt);
          if (remote_->lose) {
            ev->closed = true;
            ev->error = Unavailable("fake: SSH connection lost: Socket error: disconnected");
          } else if (remote_->close) {
            ev->closed = true;
          }
          return;
        }
      }
      if (std::chrono::steady_clock::now() >= deadline) return;
      pollfd p{wake_fd, POLLIN, 0};
      if (wake_fd >= 0 && ::poll(&p, 1, 2) > 0) return;
      if (wake_fd < 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  void Terminate() override {
    std::lock_guard<std::mutex> l(remote_->mu);
    remote_->terminated = true;
  }

 private:
  std::shared_ptr<FakeRemote> remote_;
  std::string local_;
};

class FakeConnector final : public SshConnector {
 public:
  struct Script {
    std::deque<std::pair<SshFailure, std::string>> failures;  // consumed first, one per attempt
    std::string local_address = "198.18.0.1";
    std::shared_ptr<FakeRemote> remote = std::make_shared<FakeRemote>();
  };

  // Returns the script for `host` (created on first use). Call before Start().
  Script& For(const std::string& host) {
    std::lock_guard<std::mutex> l(mu_);
    return scripts_[host];
  }
  int connects(const std::string& host) {
    std::lock_guard<std::mutex> l(mu_);
    return connects_[host];
  }
  int max_in_flight() {
    std::lock_guard<std::mutex> l(mu_);
    return max_in_flight_;
  }
  void set_connect_delay(std::chrono::milliseconds d) {
    std::lock_guard<std::mutex> l(mu_);
    delay_ = d;
  }

  SshConnectOutcome Connect(const hosts::HostSpec& host, const SshConfig&) override {
    std::chrono::milliseconds delay;
    {
      std::lock_guard<std::mutex> l(mu_);
      ++connects_[host.name];
      ++in_flight_;
      max_in_flight_ = std::max(max_in_flight_, in_flight_);
      delay = delay_;
    }
    std::this_thread::sleep_for(delay);
    std::lock_guard<std::mutex> l(mu_);
    --in_flight_;
    Script& s = scripts_[host.name];
    SshConnectOutcome out;
    if (!s.failures.empty()) {
      auto [kind, text] = s.failures.front();
      s.failures.pop_front();
      out.failure = kind;
      out.status = Status(SshFailureCode(kind), host.Display() + ": " + text);
      return out;
    }
    out.session = std::make_unique<FakeSession>(s.remote, s.local_address);
    return out;
  }

 private:
  std::mutex mu_;
  std::map<std::string, Script> scripts_;  // guarded by mu_
  std::map<std::string, int> connects_;    // guarded by mu_
  int in_flight_ = 0;                      // guarded by mu_
  int max_in_flight_ = 0;                  // guarded by mu_
  std::chrono::milliseconds delay_{0};     // guarded by mu_
};

}  // namespace ringrun::launcher::starters::testing

// Turns asynchronous signals into calls on one thread of its own, so that the rest of the
// launcher handles them as ordinary events.
#pragma once

#include <signal.h>

#include <atomic>
#include <functional>
#include <thread>
#include <vector>

namespace ringrun::launcher::job {

class SignalForwarder {
 public:
  // Blocks `signals` in the calling thread, and so in every thread it starts afterwards, ignores
  // SIGPIPE, and calls `on_signal(signo)` from its own thread for each of `signals` that
  // arrives. Construct it on the main thread before any other thread starts. `signals` must
  // not be empty.
  SignalForwarder(std::vector<int> signals, std::function<void(int)> on_signal);
  // Stops the thread, then restores the signal mask and SIGPIPE's disposition.
  ~SignalForwarder();
  SignalForwarder(const SignalForwarder&) = delete;
  SignalForwarder& operator=(const SignalForwarder&) = delete;

 private:
  const std::vector<int> signals_;
  const std::function<void(int)> on_signal_;
  sigset_t set_, old_mask_;
  struct sigaction old_pipe_ {};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace ringrun::launcher::job

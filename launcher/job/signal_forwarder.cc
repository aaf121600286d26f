#include "launcher/job/signal_forwarder.h"

#include <pthread.h>

#include <ctime>

namespace ringrun::launcher::job {

SignalForwarder::SignalForwarder(std::vector<int> signals, std::function<void(int)> on_signal)
    : signals_(std::move(signals)), on_signal_(std::move(on_signal)) {
  sigemptyset(&set_);
  for (int s : signals_) sigaddset(&set_, s);
  pthread_sigmask(SIG_BLOCK, &set_, &old_mask_);
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ign, &old_pipe_);
  thread_ = std::thread([this] {
    timespec wait{0, 100 * 1000 * 1000};  // bounds how long stop_ goes unseen
    while (!stop_) {
      int s = sigtimedwait(&set_, nullptr, &wait);
      if (s > 0 && !stop_) on_signal_(s);
    }
  });
}

SignalForwarder::~SignalForwarder() {
  stop_ = true;
  pthread_kill(thread_.native_handle(), signals_.back());  // wakes sigtimedwait at once
  thread_.join();
  sigaction(SIGPIPE, &old_pipe_, nullptr);
  pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
}

}  // namespace ringrun::launcher::job

// A TCP pair: one connected, non-blocking socket per peer, both directions on it.
#pragma once

#include <vector>

#include "runtime/src/transport/pair.h"

namespace ringrun::runtime::transport {

class TcpPair final : public Pair {
 public:
  using Pair::Pair;
  bool is_shm() const override { return false; }
  Result<bool> Progress(OpState& st) override;

 private:
  std::vector<char> staging_;  // a RecvReduce's received bytes not yet reduced
  size_t staged_ = 0;
};

}  // namespace ringrun::runtime::transport

// The rendezvous seam for ranks that another launcher started: a key-value store that every
// rank of the job reaches (torchrun's TCPStore, handed in through ringrun_init_with_store), on
// which they find each other. Modelled on Gloo's rendezvous::Store: set, get, wait and add on
// keys. store_job_client.h joins a job through one; the ringrun job service (job_client.h) is
// the other way to join.
//
// Values are bytes. A key is set by one rank and read by others; a Get or Wait waits for a key
// that is not set yet, up to its timeout. Failure: kTimeout when a wait ran out (naming the
// key), another code for a store that cannot be reached (its message says why).
// Thread-safety: the runtime calls a store from one thread at a time; MemoryStore is
// thread-safe (it stands for the shared server when ranks are threads).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ringrun/common/status.h"
#include "ringrun/common/thread_annotations.h"

namespace ringrun::runtime::rendezvous {

class Store {
 public:
  virtual ~Store() = default;
  // Sets `key` to `value`, replacing any value it had.
  virtual Status Set(const std::string& key, const std::string& value) = 0;
  // The value of `key`, waiting up to timeout_ms for some rank to set it.
  virtual Result<std::string> Get(const std::string& key, int timeout_ms) = 0;
  // Waits up to timeout_ms until every one of `keys` is set.
  virtual Status Wait(const std::vector<std::string>& keys, int timeout_ms) = 0;
  // Adds `delta` to the integer under `key` (0 when unset), atomically for all ranks, and
  // returns the sum.
  virtual Result<int64_t> Add(const std::string& key, int64_t delta) = 0;
};

// A store in this process's memory: ranks as threads share one (tests).
class MemoryStore final : public Store {
 public:
  Status Set(const std::string& key, const std::string& value) override;
  Result<std::string> Get(const std::string& key, int timeout_ms) override;
  Status Wait(const std::vector<std::string>& keys, int timeout_ms) override;
  Result<int64_t> Add(const std::string& key, int64_t delta) override;

 private:
  Mutex mu_;
  CondVar changed_;
  std::map<std::string, std::string> values_ GUARDED_BY(mu_);
};

}  // namespace ringrun::runtime::rendezvous

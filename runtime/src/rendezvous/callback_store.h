// A Store over a caller's ringrun_store callbacks (ringrun.h): how the C API hands a store
// implemented elsewhere (torch's TCPStore, from Python) to the runtime.
#pragma once

#include "ringrun/ringrun.h"
#include "runtime/src/rendezvous/store.h"

namespace ringrun::runtime::rendezvous {

class CallbackStore final : public Store {
 public:
  // `callbacks` must outlive the store; Valid() says whether every required callback is set.
  explicit CallbackStore(const ringrun_store& callbacks) : c_(callbacks) {}
  static bool Valid(const ringrun_store& callbacks);

  Status Set(const std::string& key, const std::string& value) override;
  Result<std::string> Get(const std::string& key, int timeout_ms) override;
  Status Wait(const std::vector<std::string>& keys, int timeout_ms) override;
  Result<int64_t> Add(const std::string& key, int64_t delta) override;

 private:
  // The Status of a callback's result: its code, "store <what> '<key>'" and last_error's word.
  Status Check(ringrun_status st, const std::string& what) const;

  const ringrun_store& c_;
};

}  // namespace ringrun::runtime::rendezvous

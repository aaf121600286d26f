// Helpers the engine tests share (host and device): submit one entry, wait for a handle.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/src/engine/engine.h"
#include "runtime/src/runtime.h"

namespace ringrun::runtime::testing {

// Submits one entry; nullptr (and *err set) when the submission is refused.
inline std::shared_ptr<engine::HandleState> Submit(Runtime& rt, engine::Entry e,
                                                   std::string* err = nullptr) {
  std::vector<engine::Entry> v;
  v.push_back(std::move(e));
  engine::SubmitResult r = rt.Submit(std::move(v));
  if (err) *err = r.message;
  return r.handle;
}

// Waits (20 s at most) and returns "" or the handle's failure. The message is written before
// the handle is done, and read only then.
inline std::string WaitOk(engine::HandleState& h) {
  ringrun_status st = engine::WaitHandle(h, 20000);
  if (st == RINGRUN_OK) return "";
  return h.name() + ": status " + std::to_string(st) + ": " + (h.done() ? h.message : "");
}

// Waits (20 s at most) and returns the status and the handle's message.
inline std::pair<ringrun_status, std::string> WaitStatus(engine::HandleState& h) {
  ringrun_status st = engine::WaitHandle(h, 20000);
  return {st, h.done() ? h.message : std::string()};
}

}  // namespace ringrun::runtime::testing

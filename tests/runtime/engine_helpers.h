// Helpers the engine tests share (host and device): submit one entry, wait for a handle.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/src/engine/engine.h"
#include "runtime/src/runtime.h"

namespace ringrun::runtime::testing {

// The tests describe a submission as an Entry (its req.name the name to submit under); this
// is what the engine is given of it. The view reads e's send_rows and shape: e must outlive
// its use.
inline engine::TensorArgs ArgsOf(const engine::Entry& e) {
  const engine::Request& r = e.req;
  engine::TensorArgs t;
  t.kind = r.kind, t.dtype = r.dtype, t.op = r.op, t.root = r.root, t.count = r.count;
  t.row_elems = r.row_elems, t.prescale = r.prescale, t.postscale = r.postscale;
  t.flags = r.flags, t.fixed = r.fixed;
  t.send_rows = r.send_rows.empty() ? nullptr : r.send_rows.data();
  if (r.shaped) t.shape = r.shape.data(), t.ndims = static_cast<uint32_t>(r.shape.size());
  t.send = e.send, t.recv = e.recv, t.stream = e.stream;
  return t;
}

// Submits one entry under its req.name; nullptr (and *err set) when the submission is refused.
inline std::shared_ptr<engine::HandleState> Submit(Runtime& rt, const engine::Entry& e,
                                                   std::string* err = nullptr) {
  engine::HandleState* h = nullptr;
  const engine::TensorArgs t = ArgsOf(e);
  Status st = rt.engine().Submit(e.req.name, &t, 1, /*group=*/false, &h);
  if (err) *err = st.message();
  return h ? engine::ShareHandle(h) : nullptr;
}

// Submits a grouped allreduce named after entries[0]'s req.name.
struct Submitted {
  Status status;
  std::shared_ptr<engine::HandleState> handle;
};
inline Submitted SubmitGroup(Runtime& rt, std::vector<engine::Entry> entries) {
  engine::HandleState* h = nullptr;
  const std::string name = entries.empty() ? std::string() : entries[0].req.name;
  std::vector<engine::TensorArgs> ts;
  for (const engine::Entry& e : entries) ts.push_back(ArgsOf(e));
  Submitted out;
  out.status = rt.engine().Submit(name, ts.data(), ts.size(), /*group=*/true, &h);
  if (h) out.handle = engine::ShareHandle(h);
  return out;
}

// What the engines log (the stall inspector's warnings), from any rank's thread.
class Logs {
 public:
  std::function<void(const std::string&)> Sink() {
    return [this](const std::string& m) {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.push_back(m);
    };
  }
  std::vector<std::string> Lines() {
    std::lock_guard<std::mutex> lock(mu_);
    return lines_;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> lines_;
};

// Waits (20 s at most) and returns "" or the handle's failure. The message is written before
// the handle is done, and read only then.
inline std::string WaitOk(engine::HandleState& h) {
  Code code = engine::WaitHandle(h, 20000);
  if (code == Code::kOk) return "";
  return h.name() + ": " + CodeName(code) + ": " + (h.done() ? h.message : "");
}

// Waits (20 s at most) and returns the code and the handle's message.
inline std::pair<Code, std::string> WaitStatus(engine::HandleState& h) {
  Code code = engine::WaitHandle(h, 20000);
  return {code, h.done() ? h.message : std::string()};
}

}  // namespace ringrun::runtime::testing

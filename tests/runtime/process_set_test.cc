// Process sets (runtime.h): subsets of a thread job's ranks with engines of their own.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "tests/runtime/engine_helpers.h"
#include "tests/runtime/thread_job.h"

namespace ringrun::runtime {
namespace {

using testing::Failures;
using testing::RunThreadJob;
using testing::ThreadJobOptions;

// Submits an allreduce of one double named `name` on `engine` and waits: its result, or the
// failure in *err.
double AllreduceOn(engine::Engine& engine, const std::string& name, double v, ringrun_op op,
                   std::string* err) {
  engine::TensorArgs t;
  t.kind = engine::Kind::kAllreduce, t.dtype = RINGRUN_FLOAT64, t.op = op, t.count = 1;
  t.send = &v, t.recv = &v;
  engine::HandleState* h = nullptr;
  Status st = engine.Submit(name, &t, 1, /*group=*/false, &h);
  if (!st.ok()) {
    *err = st.ToString();
    return 0;
  }
  std::shared_ptr<engine::HandleState> handle = engine::ShareHandle(h);
  *err = testing::WaitOk(*handle);
  return v;
}

TEST_CASE("process sets negotiate among their members only", "[runtime][process_set]") {
  ThreadJobOptions o;
  o.np = 4;
  std::string failures = RunThreadJob(o, [](int r, Runtime& rt, Failures& f) {
    Result<int> a = rt.AddProcessSet({2, 0, 1});
    Result<int> b = rt.AddProcessSet({1, 3});
    if (!a.ok() || !b.ok() || *a != 1 || *b != 2) {
      return f.Add(r, "add: " + a.status().ToString() + " " + b.status().ToString());
    }
    const int rank_in_b = r == 1 ? 0 : r == 3 ? 1 : -1;
    if (rt.SetSize(*a) != 3 || rt.SetRank(*a) != (r < 3 ? r : -1) || rt.SetRank(*b) != rank_in_b) {
      f.Add(r, "set rank or size");
    }
    std::string err;
    for (int step = 0; step < 3; ++step) {
      // The same name in both sets, between the job's own collectives.
      if (r < 3) {
        double v = AllreduceOn(**rt.SetEngine(*a, "Allreduce"), "x", r + 1, RINGRUN_SUM, &err);
        if (!err.empty() || v != 6) f.Add(r, "set a: " + err + " " + std::to_string(v));
      }
      if (r == 1 || r == 3) {
        int64_t v =
            AllreduceOn(**rt.SetEngine(*b, "Allreduce"), "x", 10 * r, RINGRUN_AVERAGE, &err);
        if (!err.empty() || v != 20) f.Add(r, "set b: " + err + " " + std::to_string(v));
      }
      int64_t g = r;
      Status st = rt.Allreduce(&g, &g, 1, RINGRUN_INT64, RINGRUN_SUM);
      if (!st.ok() || g != 6) f.Add(r, "global: " + st.ToString());
    }
    // Set ranks: broadcast from the set's rank 1 (job rank 1 in a), allgather in set order.
    if (r < 3) {
      engine::Engine& e = **rt.SetEngine(*a, "Broadcast");
      int64_t v = 100 + r;
      engine::TensorArgs t;
      t.kind = engine::Kind::kBroadcast, t.dtype = RINGRUN_INT64, t.count = 1, t.root = 1;
      t.send = &v, t.recv = &v;
      engine::HandleState* h = nullptr;
      if (Status st = e.Submit("bc", &t, 1, false, &h); !st.ok()) return f.Add(r, st.ToString());
      std::shared_ptr<engine::HandleState> handle = engine::ShareHandle(h);
      err = testing::WaitOk(*handle);
      if (!err.empty() || v != 101) f.Add(r, "broadcast: " + err);
    }
    // A non-member is told so, in Horovod's words; an unknown id too.
    Result<engine::Engine*> none = rt.SetEngine(*a, "Allreduce");
    if (r == 3 && (none.ok() || none.status().message() !=
                                    "Allreduce: Rank 3 is not a member of the provided process "
                                    "set.")) {
      f.Add(r, "non-member: " + none.status().ToString());
    }
    if (rt.SetEngine(7, "Allgather").status().code() != Code::kInvalidArgument) {
      f.Add(r, "unknown id accepted");
    }
    // Remove, then the id is given again; a removed set's engine refuses.
    if (Status st = rt.RemoveProcessSet(*a); !st.ok()) return f.Add(r, st.ToString());
    if (rt.SetSize(*a) != -1) f.Add(r, "removed set still there");
    Result<int> c = rt.AddProcessSet({0, 3});
    if (!c.ok() || *c != 1) return f.Add(r, "re-add: " + c.status().ToString());
    if (r == 0 || r == 3) {
      double v = AllreduceOn(**rt.SetEngine(*c, "Allreduce"), "x", r, RINGRUN_SUM, &err);
      if (!err.empty() || v != 3) f.Add(r, "set c: " + err);
    }
    // A duplicate of a registered set, and ranks that disagree, fail on every rank.
    if (rt.AddProcessSet({3, 1}).status().code() != Code::kInvalidArgument) f.Add(r, "duplicate");
    Result<int> odd = rt.AddProcessSet(r == 2 ? std::vector<int>{0, 2} : std::vector<int>{0, 1});
    if (odd.ok() ||
        odd.status().message().find("rank 2 passed other arguments") == std::string::npos) {
      f.Add(r, "disagreement: " + odd.status().ToString());
    }
    Result<int> next = rt.AddProcessSet({2});  // the same id everywhere after that failure
    if (!next.ok() || *next != 3) f.Add(r, "after a refusal: " + next.status().ToString());
  });
  INFO(failures);
  CHECK(failures.empty());
}

TEST_CASE("a lost peer fails every set's pending work, naming it", "[runtime][process_set]") {
  ThreadJobOptions o;
  o.np = 3;
  o.timeout_ms = 10000;
  std::string failures = RunThreadJob(o, [](int r, Runtime& rt, Failures& f) {
    Result<int> a = rt.AddProcessSet({0, 1});
    if (!a.ok()) return f.Add(r, a.status().ToString());
    int64_t g = 0;
    if (Status st = rt.Allreduce(&g, &g, 1, RINGRUN_INT64, RINGRUN_SUM); !st.ok()) {
      return f.Add(r, st.ToString());
    }
    if (r == 2) {
      rt.Shutdown();  // its connections close, as a dead process's would
      return;
    }
    if (r == 1) return;  // never submits "late": rank 0's stays pending until the loss
    // Rank 2 is not in the set. The message names it when this rank's job engine sees the loss
    // first; rank 1, when rank 1 saw it first and broke its connections to this rank.
    std::string err;
    AllreduceOn(**rt.SetEngine(*a, "Allreduce"), "late", 1, RINGRUN_SUM, &err);
    if (err.find("rank 2") == std::string::npos && err.find("peer rank 1") == std::string::npos) {
      f.Add(r, "not failed naming a peer: " + err);
    }
  });
  INFO(failures);
  CHECK(failures.empty());
}

}  // namespace
}  // namespace ringrun::runtime

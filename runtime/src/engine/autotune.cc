// Autotune's hook in the engine (engine.h says how the choice travels; tuner.h how it is made).
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "runtime/src/engine/engine.h"
#include "runtime/src/engine/wire.h"

namespace ringrun::runtime::engine {
namespace {

// Rank 0's block: a tag, then the settings when the tag is not kNone.
enum TunedTag : uint8_t { kNone = 0, kTrial = 1, kFinal = 2 };

}  // namespace

void Engine::StartTuner() {
  if (!tuning_ || options_.rank != 0) return;
  // The layout allows a hierarchical allreduce (every host the same number of ranks, several
  // hosts): the algorithm a large allreduce would take says so.
  const bool hierarchical_possible =
      options_.hierarchical && transport_ &&
      std::strcmp(AllreduceAlgorithm(*transport_, world_, size_t{1} << 24, 4, true),
                  "hierarchical") == 0;
  AutotuneOptions o = options_.autotune;
  o.tune_burst = o.tune_burst && !confined_;  // confined to one CPU, the window stays off
  std::function<void(const std::string&)> csv;
  if (!o.log_path.empty()) {
    std::shared_ptr<FILE> file(std::fopen(o.log_path.c_str(), "we"), [](FILE* f) {
      if (f) std::fclose(f);
    });
    if (!file) {
      const std::string why = "rank 0: cannot open the autotune log " + o.log_path + ": " +
                              std::strerror(errno) + " (tuning without it)";
      if (options_.log) {
        options_.log(why);
      } else {
        std::fprintf(stderr, "ringrun: %s\n", why.c_str());
      }
    } else {
      csv = [file](const std::string& line) {
        std::fprintf(file.get(), "%s\n", line.c_str());
        std::fflush(file.get());
      };
    }
  }
  const TunedParams initial{fusion_.threshold(), burst_quiet_ns_, hierarchical_};
  tuner_ = std::make_unique<Tuner>(o, initial, hierarchical_possible, options_.cache_capacity > 0,
                                   std::move(csv));
  if (!tuner_->active()) {
    // Nothing to tune (every knob given): the other ranks learn it in the first round.
    proposal_ = initial, proposal_final_ = true;
    tuner_.reset();
  }
}

void Engine::PutTuned(std::string* frame) {
  if (options_.rank != 0) return;  // only rank 0's frame carries the block
  if (!proposal_) {
    Put<uint8_t>(frame, kNone);
    return;
  }
  Put<uint8_t>(frame, proposal_final_ ? kFinal : kTrial);
  Put<uint64_t>(frame, proposal_->fusion_threshold);
  Put<int64_t>(frame, proposal_->burst_quiet_ns);
  Put<uint8_t>(frame, proposal_->hierarchical ? 1 : 0);
  proposal_.reset();
}

Status Engine::TakeTuned(std::string* rank0_frame) {
  size_t pos = 0;
  uint8_t tag = kNone;
  if (!Get(*rank0_frame, &pos, &tag) || tag > kFinal) {
    return Internal("malformed autotune block in rank 0's negotiation frame");
  }
  if (tag != kNone) {
    TunedParams p;
    uint64_t threshold = 0;
    uint8_t hierarchical = 0;
    if (!Get(*rank0_frame, &pos, &threshold) || !Get(*rank0_frame, &pos, &p.burst_quiet_ns) ||
        !Get(*rank0_frame, &pos, &hierarchical)) {
      return Internal("malformed autotune block in rank 0's negotiation frame");
    }
    p.fusion_threshold = static_cast<size_t>(threshold);
    p.hierarchical = hierarchical != 0;
    ApplyTuned(p);
    if (options_.autotune.applied) options_.autotune.applied(controller_.round(), p);
    if (tag == kFinal) tuning_ = false;  // on every rank, after this round's frames
  }
  rank0_frame->erase(0, pos);
  return Status::Ok();
}

void Engine::ApplyTuned(const TunedParams& p) {
  fusion_.set_threshold(p.fusion_threshold);
  burst_quiet_ns_ = confined_ ? 0 : p.burst_quiet_ns;
  hierarchical_ = p.hierarchical;
  // The plans kept for repeated rounds were made with the old threshold.
  uniform_plan_.of = nullptr;
  general_plan_.of = nullptr;
}

void Engine::ObserveRound(const Response* responses, size_t n, int64_t start_us) {
  for (size_t i = 0; i < n; ++i) {
    const Response& r = responses[i];
    if (r.type != Response::kRun) continue;
    tuner_->Observe(r.req.name, r.req.count * r.req.ElemBytes(), start_us);
  }
  if (!tuner_->EndRound()) return;
  proposal_ = tuner_->current();
  proposal_final_ = !tuner_->active();
  if (proposal_final_) tuner_.reset();  // closes the log
}

}  // namespace ringrun::runtime::engine

// The runtime's tuning knobs from the environment: ringrun's variables (ringrun.h lists them)
// and Horovod's (horovod/common/common.h, with Horovod's meaning and units). Where both name
// the same knob, ringrun's wins. A Horovod variable that means nothing here is not ignored in
// silence: it becomes a note, which rank 0 logs once at init (KnobNotes).
//
// Called by ReadJobEnv (runtime.h) only; `getenv` is injectable for tests.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ringrun/common/status.h"

namespace ringrun::runtime {

struct JobEnv;

using Getenv = std::function<const char*(const char*)>;

// Fills e's knobs from the environment. A malformed value is kInvalidArgument naming the
// variable; e->knob_notes receives one line per Horovod variable that is set and means
// something else here, or nothing.
Status ReadKnobs(const Getenv& getenv, JobEnv* e);

// The Horovod variables that ringrun reads, and those it knows and does not use, each with
// what ringrun does instead: ReadKnobs reports the unused ones from here, and the README's
// table "Horovod's variables" mirrors it.
struct HorovodVariable {
  const char* name;
  const char* here;  // what ringrun does with it
  bool honoured;
};
const std::vector<HorovodVariable>& HorovodVariables();

}  // namespace ringrun::runtime

// The compressed form of JoinReply's peer columns (see proto/ringrun/job.proto).
#pragma once

#include "ringrun/common/status.h"
#include "ringrun/job.pb.h"

namespace ringrun {

// Moves reply's addresses/address_of_rank/port_of_rank into packed_peers and packed_size.
// Other fields are untouched. Ports must fit 16 bits.
Status PackPeerColumns(v1::JoinReply* reply);
// The inverse: when packed_peers is set, restores the three columns and clears it.
// A reply without packed_peers is left as it is.
Status UnpackPeerColumns(v1::JoinReply* reply);

}  // namespace ringrun

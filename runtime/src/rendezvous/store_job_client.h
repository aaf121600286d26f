// Joining a job through a Store (store.h), where another launcher started the ranks: the same
// JobClient seam as the ringrun job service, and the same peer table out of it.
//
// A round of the rendezvous (JoinInfo.generation: ringrun_init after ringrun_shutdown joins
// the next) lives under "ringrun/<generation>/". Rank 0 makes the round's data-plane secret and
// sets it under ".../secret" (ShareSecret). Each rank sets its JoinRequest under
// ".../join/<rank>". Rank 0 reads them in rank order, builds the JoinReply the job service
// would send (addresses numbered in order of first use, so that ranks that gave one address
// are one host, as shared memory and local_rank count them) and sets it under ".../peers";
// the others read it there. A rank 0 that fails sets its failure there instead, so that the
// others fail with its message at once. Rank 0 makes O(size) store calls, the others O(1).
#pragma once

#include <memory>
#include <string>

#include "runtime/src/job_client.h"
#include "runtime/src/rendezvous/store.h"

namespace ringrun::runtime::rendezvous {

// The prefix of every key ringrun sets in a store that the job's other users share.
inline constexpr char kStorePrefix[] = "ringrun/";

// The data-plane secret of round `generation`: rank 0 makes one (GenerateSecret) and sets it;
// the other ranks wait up to timeout_ms for it. Whoever can read the store can read it
// (docs/security.md).
Result<std::string> ShareSecret(Store& store, int rank, uint32_t generation, int timeout_ms);

// The rank that sets `key` in this rendezvous: r for ".../join/<r>", rank 0 for every other key
// (the secret, the peer table). Stores that keep each value under the process that set it
// (PMIx: pmix_store.h) read a key there.
int SetterOf(const std::string& key);

// A JobClient that joins through `store`, which must outlive it. Join fails with kTimeout when
// ranks did not come within the timeout (rank 0 names them), kInvalidArgument when ranks
// disagree on the size or two processes claim one rank, and with the store's own error when
// it cannot be reached.
std::unique_ptr<JobClient> MakeStoreJobClient(Store& store);

}  // namespace ringrun::runtime::rendezvous

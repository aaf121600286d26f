#include "runtime/src/rendezvous/store_job_client.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <unordered_map>
#include <vector>

#include "ringrun/common/defaults.h"
#include "ringrun/common/peer_table.h"
#include "ringrun/common/secret.h"

namespace ringrun::runtime::rendezvous {
namespace {

using Clock = std::chrono::steady_clock;

std::string RoundPrefix(uint32_t generation) {
  return kStorePrefix + std::to_string(generation) + "/";
}

int MsLeft(Clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::max<int64_t>(left, 1));
}

// The ".../peers" value: 'T' and a serialized JoinReply, or 'E', a code, ':' and rank 0's
// failure.
constexpr char kTable = 'T', kFailure = 'E';

class StoreJobClient final : public JobClient {
 public:
  explicit StoreJobClient(Store& store) : store_(store) {}

  Result<transport::PeerTable> Join(const JoinInfo& info, int timeout_ms) override {
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    const std::string round = RoundPrefix(info.generation);
    const std::string req = MakeJoinRequest(info).SerializeAsString();
    if (Status st = store_.Set(round + "join/" + std::to_string(info.rank), req); !st.ok()) {
      return st.Annotate("store");
    }
    std::string published;
    if (info.rank == 0) {
      Result<v1::JoinReply> built = Gather(round, info, deadline);
      published = built.ok() ? kTable + built->SerializeAsString()
                             : kFailure + std::to_string(static_cast<int>(built.status().code())) +
                                   ":rank 0: " + built.status().message();
      // Even a failed publication is worth trying: the others would otherwise wait it out.
      Status set = store_.Set(round + "peers", published);
      if (!built.ok()) return built.status();
      if (!set.ok()) return set.Annotate("store");
    } else {
      // Rank 0 gives up at the same deadline and then publishes why: wait a little longer, so
      // that its reason arrives rather than a bare timeout here.
      Result<std::string> got =
          store_.Get(round + "peers", MsLeft(deadline) + kStorePeerTableGraceMs);
      if (!got.ok()) {
        if (got.status().code() != Code::kTimeout) return got.status().Annotate("store");
        return Timeout("rank 0 did not publish the peer table within " +
                       std::to_string(timeout_ms + kStorePeerTableGraceMs) +
                       " ms (is rank 0 running, in this job?): " + got.status().message());
      }
      published = std::move(got.value());
    }
    if (!published.empty() && published[0] == kFailure) {
      const size_t colon = published.find(':');
      const int code = std::atoi(published.substr(1, colon - 1).c_str());
      const bool known = code > 0 && code <= static_cast<int>(Code::kInternal);
      return Status(known ? static_cast<Code>(code) : Code::kInternal,
                    colon == std::string::npos ? published : published.substr(colon + 1));
    }
    v1::JoinReply reply;
    if (published.empty() || published[0] != kTable ||
        !reply.ParseFromArray(published.data() + 1, static_cast<int>(published.size() - 1))) {
      return Internal("store: '" + round + "peers' does not hold a peer table");
    }
    Result<transport::PeerTable> table = PeerTableFromReply(&reply, info.size, "store");
    if (!table.ok()) return table.status();
    if (table->address(info.rank) != info.address || table->port_of_rank[info.rank] != info.port) {
      return InvalidArgument("the peer table has " + table->Describe(info.rank) + ", not this " +
                             "process (" + info.address + ":" + std::to_string(info.port) +
                             "): another process joined as rank " + std::to_string(info.rank) +
                             " (were two processes given that rank?)");
    }
    return table;
  }

 private:
  // Rank 0: every rank's JoinRequest, in rank order, as the reply the job service would send.
  Result<v1::JoinReply> Gather(const std::string& round, const JoinInfo& info,
                               Clock::time_point deadline) {
    v1::JoinReply reply;
    std::unordered_map<std::string, uint32_t> address_index;
    for (int r = 0; r < info.size; ++r) {
      Result<std::string> got = store_.Get(round + "join/" + std::to_string(r), MsLeft(deadline));
      if (!got.ok()) {
        if (got.status().code() != Code::kTimeout) return got.status().Annotate("store");
        return Timeout(Missing(round, r, info.size) + " did not join within the join timeout (" +
                       got.status().message() + ")");
      }
      v1::JoinRequest req;
      if (!req.ParseFromString(*got) || req.rank() != r) {
        return Internal("store: '" + round + "join/" + std::to_string(r) + "' does not hold rank " +
                        std::to_string(r) + "'s JoinRequest");
      }
      if (req.size() != info.size) {
        return InvalidArgument("rank " + std::to_string(r) + " believes the job has " +
                               std::to_string(req.size()) + " ranks; rank 0 believes " +
                               std::to_string(info.size));
      }
      if (req.address().empty() || req.port() == 0 || req.port() > 65535) {
        return InvalidArgument("rank " + std::to_string(r) + " sent no usable data-plane endpoint");
      }
      auto [it, inserted] =
          address_index.emplace(req.address(), static_cast<uint32_t>(reply.addresses_size()));
      if (inserted) reply.add_addresses(req.address());
      reply.add_address_of_rank(it->second);
      reply.add_port_of_rank(req.port());
      if (r == 0) reply.set_nccl_id(req.nccl_id());
    }
    reply.set_size(info.size);
    RINGRUN_RETURN_IF_ERROR(PackPeerColumns(&reply));
    return reply;
  }

  // "rank 3" or "ranks 3, 5, 6 (of 8)": `first` and the later ranks whose key is not set
  // either, looked at without waiting (at most a few, so that a large missing job costs little).
  std::string Missing(const std::string& round, int first, int size) {
    constexpr int kNamed = 8;
    std::vector<int> missing{first};
    int more = 0;
    for (int r = first + 1; r < size; ++r) {
      if (missing.size() >= kNamed) {
        ++more;
        continue;
      }
      if (!store_.Wait({round + "join/" + std::to_string(r)}, 1).ok()) missing.push_back(r);
    }
    std::string s = missing.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < missing.size(); ++i) {
      s += (i ? ", " : "") + std::to_string(missing[i]);
    }
    if (more > 0) s += " and " + std::to_string(more) + " later ones not looked at";
    return s + " (of " + std::to_string(size) + ")";
  }

  Store& store_;
};

}  // namespace

Result<std::string> ShareSecret(Store& store, int rank, uint32_t generation, int timeout_ms) {
  const std::string key = RoundPrefix(generation) + "secret";
  if (rank == 0) {
    Result<std::string> secret = GenerateSecret();
    if (!secret.ok()) return secret.status();
    if (Status st = store.Set(key, *secret); !st.ok()) return st.Annotate("store");
    return secret;
  }
  Result<std::string> secret = store.Get(key, timeout_ms);
  if (!secret.ok()) {
    if (secret.status().code() != Code::kTimeout) return secret.status().Annotate("store");
    return Timeout("rank 0 did not share the job's secret within " + std::to_string(timeout_ms) +
                   " ms (is rank 0 running, in this job?): " + secret.status().message());
  }
  if (secret->size() != 2 * kSecretBytes) {
    return InvalidArgument("store: '" + key + "' does not hold a secret of " +
                           std::to_string(2 * kSecretBytes) + " characters");
  }
  return secret;
}

int SetterOf(const std::string& key) {
  const std::string join = "/join/";
  const size_t at = key.rfind(join);
  if (key.rfind(kStorePrefix, 0) != 0 || at == std::string::npos) return 0;
  const char* digits = key.c_str() + at + join.size();
  char* end = nullptr;
  const long rank = std::strtol(digits, &end, 10);
  return end != digits && *end == '\0' && rank >= 0 && rank <= (1 << 24) ? static_cast<int>(rank)
                                                                         : 0;
}

std::unique_ptr<JobClient> MakeStoreJobClient(Store& store) {
  return std::make_unique<StoreJobClient>(store);
}

}  // namespace ringrun::runtime::rendezvous

#include "launcher/hosts/placement.h"

#include <algorithm>
#include <climits>
#include <string>

namespace ringrun::launcher::hosts {
namespace {

// How many hosts the "too many ranks" message lists before summarising the rest.
constexpr size_t kHostsNamedInError = 16;

}  // namespace

int TotalSlots(const std::vector<HostSpec>& hosts) {
  long long total = 0;
  for (const HostSpec& h : hosts) total += std::max(h.slots, 0);
  return total > INT_MAX ? INT_MAX : static_cast<int>(total);
}

Status CheckNumProc(const std::vector<HostSpec>& hosts, int np, bool oversubscribe) {
  if (np < 1) return InvalidArgument("-np " + std::to_string(np) + ": must be at least 1");
  if (hosts.empty())
    return InvalidArgument("no hosts to place " + std::to_string(np) + " ranks on");
  for (const HostSpec& h : hosts) {
    if (h.slots < 1) {
      return InvalidArgument("host " + h.Display() + " has " + std::to_string(h.slots) +
                             " slots; every host needs at least 1");
    }
  }
  int total = TotalSlots(hosts);
  if (np <= total || oversubscribe) return Status::Ok();
  std::string list;
  for (size_t i = 0; i < hosts.size() && i < kHostsNamedInError; ++i) {
    if (i) list += ", ";
    list += hosts[i].Display() + ":" + std::to_string(hosts[i].slots);
  }
  if (hosts.size() > kHostsNamedInError) {
    list += ", and " + std::to_string(hosts.size() - kHostsNamedInError) + " more hosts";
  }
  return InvalidArgument("-np " + std::to_string(np) + " exceeds the " + std::to_string(total) +
                         (total == 1 ? " slot" : " slots") + " available (" + list +
                         "); --oversubscribe allows more ranks than slots");
}

Result<std::vector<RankPlacement>> PlaceRanks(const std::vector<HostSpec>& hosts, int np,
                                              bool oversubscribe) {
  RINGRUN_RETURN_IF_ERROR(CheckNumProc(hosts, np, oversubscribe));

  // Ranks per host, filling each host before the next.
  std::vector<int> on_host(hosts.size(), 0);
  int left = np;
  int node_count = 0;
  for (size_t h = 0; h < hosts.size() && left > 0; ++h) {
    on_host[h] = std::min(hosts[h].slots, left);
    left -= on_host[h];
    ++node_count;
  }
  for (size_t h = 0; left > 0; h = (h + 1) % hosts.size()) {  // --oversubscribe
    ++on_host[h];
    --left;
  }

  // cross_size[l]: hosts with more than l ranks. Since the hosts that have ranks are a prefix and
  // each has local ranks 0..n-1, a host's cross_rank for local rank l is the number of earlier
  // hosts with more than l ranks.
  int max_local = *std::max_element(on_host.begin(), on_host.end());
  std::vector<int> cross_size(static_cast<size_t>(max_local), 0);
  for (int n : on_host) {
    for (int l = 0; l < n; ++l) ++cross_size[static_cast<size_t>(l)];
  }

  std::vector<RankPlacement> out;
  out.reserve(static_cast<size_t>(np));
  std::vector<int> seen_with_local(static_cast<size_t>(max_local), 0);
  int rank = 0;
  int node_rank = 0;
  for (size_t h = 0; h < hosts.size(); ++h) {
    if (on_host[h] == 0) continue;
    for (int l = 0; l < on_host[h]; ++l) {
      RankPlacement p;
      p.rank = rank++;
      p.host_index = static_cast<int>(h);
      p.local_rank = l;
      p.local_size = on_host[h];
      p.cross_rank = seen_with_local[static_cast<size_t>(l)]++;
      p.cross_size = cross_size[static_cast<size_t>(l)];
      p.node_rank = node_rank;
      p.node_count = node_count;
      out.push_back(p);
    }
    ++node_rank;
  }
  return out;
}

}  // namespace ringrun::launcher::hosts

// This host's network interfaces and their addresses, for --network-interfaces: the launcher
// takes its own address from them, and each agent reports its host's so that the launcher can
// name every rank's data-plane address (RINGRUN_HOST_ADDR).
#pragma once

#include <string>
#include <vector>

#include "ringrun/common/status.h"

namespace ringrun {

struct NetInterface {
  std::string name;     // "eth0"
  std::string address;  // its first IPv4 address, else its first IPv6 one that is not
                        // link-local (that needs a scope to be dialled); empty: none
};

// Every interface, once, in getifaddrs order. Errors name getifaddrs and errno.
Result<std::vector<NetInterface>> ListInterfaces();

// The address of the first of `names` that has one in `interfaces`. NotFound otherwise, naming
// each: "--network-interfaces eth9: no such interface", "... ib0: no usable address".
Result<std::string> FirstInterfaceAddress(const std::vector<NetInterface>& interfaces,
                                          const std::vector<std::string>& names);

// The source address of this host's route to `host` (a name or an address): where `host` can
// reach this host. Found with a UDP connect, which sends nothing. NotFound names `host` and
// says whether its name did not resolve or no route leads there.
Result<std::string> RouteSourceAddress(const std::string& host);

// Whether `addr` names this host only: 127.0.0.0/8, ::1 or "localhost" (no peer can reach it).
inline bool IsLoopback(const std::string& addr) {
  return addr.rfind("127.", 0) == 0 || addr == "::1" || addr == "localhost";
}

}  // namespace ringrun

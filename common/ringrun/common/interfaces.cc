#include "ringrun/common/interfaces.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

#include "ringrun/common/fd.h"

namespace ringrun {

Result<std::vector<NetInterface>> ListInterfaces() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return ErrnoStatus("getifaddrs", errno);
  std::vector<NetInterface> out;
  std::vector<std::string> v6;  // by index in out: a fallback when there is no IPv4 address
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_name == nullptr) continue;
    auto at = std::find_if(out.begin(), out.end(),
                           [&](const NetInterface& i) { return i.name == it->ifa_name; });
    if (at == out.end()) {
      out.push_back({it->ifa_name, ""});
      v6.emplace_back();
      at = out.end() - 1;
    }
    const size_t i = static_cast<size_t>(at - out.begin());
    if (it->ifa_addr == nullptr) continue;
    char buf[INET6_ADDRSTRLEN] = {0};
    if (it->ifa_addr->sa_family == AF_INET && out[i].address.empty()) {
      inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(it->ifa_addr)->sin_addr, buf,
                sizeof buf);
      out[i].address = buf;
    } else if (it->ifa_addr->sa_family == AF_INET6 && v6[i].empty()) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(it->ifa_addr);
      if (IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr)) continue;
      inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof buf);
      v6[i] = buf;
    }
  }
  freeifaddrs(list);
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].address.empty()) out[i].address = v6[i];
  }
  return out;
}

Result<std::string> FirstInterfaceAddress(const std::vector<NetInterface>& interfaces,
                                          const std::vector<std::string>& names) {
  std::string why;
  for (const std::string& name : names) {
    auto it = std::find_if(interfaces.begin(), interfaces.end(),
                           [&](const NetInterface& i) { return i.name == name; });
    if (it != interfaces.end() && !it->address.empty()) return it->address;
    why += (why.empty() ? "" : "; ") + name +
           (it == interfaces.end() ? ": no such interface" : ": no usable address");
  }
  return NotFound("--network-interfaces " + why);
}

Result<std::string> RouteSourceAddress(const std::string& host) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  if (int rc = ::getaddrinfo(host.c_str(), "9", &hints, &res); rc != 0) {
    return NotFound(host + ": cannot resolve the name (" + gai_strerror(rc) + ")");
  }
  std::string found;
  for (addrinfo* ai = res; ai && found.empty(); ai = ai->ai_next) {
    UniqueFd fd(::socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!fd.valid() || ::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len) != 0) continue;
    char buf[INET6_ADDRSTRLEN] = "";
    const void* a =
        local.ss_family == AF_INET
            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
            : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
    if (::inet_ntop(local.ss_family, a, buf, sizeof(buf))) found = buf;
  }
  ::freeaddrinfo(res);
  if (found.empty()) return NotFound(host + ": no route to it");
  return found;
}

}  // namespace ringrun

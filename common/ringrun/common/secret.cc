#include "ringrun/common/secret.h"

#include <errno.h>
#include <sys/random.h>

namespace ringrun {

Result<std::string> GenerateSecret() {
  unsigned char raw[kSecretBytes];
  size_t got = 0;
  while (got < sizeof(raw)) {
    ssize_t n = ::getrandom(raw + got, sizeof(raw) - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("getrandom", errno);
    }
    got += static_cast<size_t>(n);
  }
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * kSecretBytes);
  for (unsigned char c : raw) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace ringrun

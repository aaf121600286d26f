// Little-endian-on-this-host encoding of negotiation frames (all ranks run one build of
// libringrun; the hello round checks the version).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace ringrun::runtime::engine {

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}
inline void PutString(std::string* out, const std::string& s) {
  Put<uint32_t>(out, static_cast<uint32_t>(s.size()));
  out->append(s);
}
template <typename T>
bool Get(const std::string& in, size_t* pos, T* v) {
  if (in.size() - *pos < sizeof(T) || *pos > in.size()) return false;
  std::memcpy(v, in.data() + *pos, sizeof(T));
  *pos += sizeof(T);
  return true;
}
inline bool GetString(const std::string& in, size_t* pos, std::string* s) {
  uint32_t n;
  if (!Get(in, pos, &n) || in.size() - *pos < n) return false;
  s->assign(in.data() + *pos, n);
  *pos += n;
  return true;
}

}  // namespace ringrun::runtime::engine

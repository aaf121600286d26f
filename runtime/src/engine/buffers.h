// What the engine asks of a caller's buffer: whether it is device memory, whether two overlap,
// and a copy tuned for the few-byte tensors of a fused batch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ringrun::runtime::engine {

// Whether p is CUDA device memory (the build's answer: engine options may inject another).
// Memory in the program's heap is host memory without asking the loader whether CUDA is there
// and CUDA what p is, which costs more than the rest of a small submission. Thread-safe.
bool IsDeviceMemory(const void* p);

// Whether [a, a + bytes) and [b, b + bytes) overlap without being the same buffer.
inline bool PartialOverlap(const void* a, const void* b, size_t bytes) {
  const char* x = static_cast<const char*>(a);
  const char* y = static_cast<const char*>(b);
  return x != y && bytes > 0 && x < y + bytes && y < x + bytes;
}

// memcpy for the fusion buffer's tensors, many of which are a few bytes (biases, norms): up to
// 16 bytes in two overlapping loads and stores instead of a call.
inline void CopyBytes(void* dst, const void* src, size_t n) {
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  if (n > 16) {
    std::memcpy(d, s, n);
  } else if (n >= 8) {
    uint64_t a, b;
    std::memcpy(&a, s, 8), std::memcpy(&b, s + n - 8, 8);
    std::memcpy(d, &a, 8), std::memcpy(d + n - 8, &b, 8);
  } else if (n >= 4) {
    uint32_t a, b;
    std::memcpy(&a, s, 4), std::memcpy(&b, s + n - 4, 4);
    std::memcpy(d, &a, 4), std::memcpy(d + n - 4, &b, 4);
  } else {
    for (size_t i = 0; i < n; ++i) d[i] = s[i];
  }
}

}  // namespace ringrun::runtime::engine

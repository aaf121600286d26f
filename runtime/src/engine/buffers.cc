#include "runtime/src/engine/buffers.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "runtime/src/gpu/device_backend.h"  // IsDevicePointer

namespace ringrun::runtime::engine {
namespace {

// The start of the program's heap (the break at exec), from /proc/self/stat; 0 if unknown.
uintptr_t HeapStart() {
  static const uintptr_t start = [] {
    std::FILE* f = std::fopen("/proc/self/stat", "r");
    if (!f) return uintptr_t{0};
    char buf[2048];
    const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
    std::fclose(f);
    buf[n] = '\0';
    // Fields after the command name (which may hold spaces and parentheses): start_brk is
    // field 47 (proc(5)).
    const char* p = std::strrchr(buf, ')');
    if (!p) return uintptr_t{0};
    for (int i = 0; i < 45; ++i) {  // the i-th space after it precedes field i + 3
      p = std::strchr(p + 1, ' ');
      if (!p) return uintptr_t{0};
    }
    return static_cast<uintptr_t>(std::strtoull(p + 1, nullptr, 10));
  }();
  return start;
}

}  // namespace

bool IsDeviceMemory(const void* p) {
  if (p == nullptr) return false;
  // Memory in the program's heap (from its start to the current break) is host memory.
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), start = HeapStart();
  if (start != 0 && a >= start && a < reinterpret_cast<uintptr_t>(::sbrk(0))) return false;
  return gpu::IsDevicePointer(p);
}

}  // namespace ringrun::runtime::engine

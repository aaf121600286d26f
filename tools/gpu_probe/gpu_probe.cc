// ringrun-gpu-probe: prints one JSON line describing this host's CUDA driver, runtime, devices
// and NCCL, then exits 0 when there is at least one device and 1 otherwise.
//
//   {"hostname":"node1","ok":true,"driver_version":"13.0","runtime_version":"13.0",
//    "nccl_version":"2.28.9","error":"","devices":[{"index":0,"name":"NVIDIA H200",
//    "memory_bytes":150...,"compute_capability":"9.0","pci_bus_id":"0000:19:00.0"}]}
//
// Versions are "none" when absent; "error" says why there are no devices ("no CUDA driver:
// <CUDA's text>"). With --report-only the exit code is 0 whenever the report was printed, so
// that a job of probes (one per host) is not cut short by the first host without a GPU.
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstring>
#include <string>

#include "ringrun/common/gpu_info.h"

namespace {

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string Hostname() {
  char buf[HOST_NAME_MAX + 1] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  bool report_only = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--report-only") == 0) {
      report_only = true;
    } else if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::printf(
          "usage: ringrun-gpu-probe [--report-only]\n"
          "Prints one JSON line about this host's GPUs; exits 0 if it has one.\n");
      return 0;
    } else {
      std::fprintf(stderr, "ringrun-gpu-probe: unknown argument '%s'\n", argv[i]);
      return 2;
    }
  }
  const ringrun::GpuHostInfo info = ringrun::ProbeGpus();
  const bool ok = !info.devices.empty();
  std::string line =
      "{\"hostname\":" + JsonString(Hostname()) + ",\"ok\":" + (ok ? "true" : "false") +
      ",\"driver_version\":" + JsonString(ringrun::FormatCudaVersion(info.driver_version)) +
      ",\"runtime_version\":" +
      JsonString(ringrun::FormatCudaVersion(info.build.cuda_runtime_version)) +
      ",\"nccl_version\":" +
      JsonString(ringrun::FormatNcclVersion(info.build.nccl_runtime_version)) +
      ",\"error\":" + JsonString(info.error) + ",\"devices\":[";
  for (size_t i = 0; i < info.devices.size(); ++i) {
    const auto& d = info.devices[i];
    if (i > 0) line += ",";
    line += "{\"index\":" + std::to_string(d.index) + ",\"name\":" + JsonString(d.name) +
            ",\"memory_bytes\":" + std::to_string(d.total_memory_bytes) +
            ",\"compute_capability\":" +
            JsonString(std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor)) +
            ",\"pci_bus_id\":" + JsonString(d.pci_bus_id) + "}";
  }
  line += "]}\n";
  std::fputs(line.c_str(), stdout);
  std::fflush(stdout);
  return ok || report_only ? 0 : 1;
}

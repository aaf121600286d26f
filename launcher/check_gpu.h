// `ringrun --check-gpu [-H ... | --hostfile ...] [--allreduce]`: is every host ready for GPU jobs?
//
// Runs `ringrun-gpu-probe --report-only` as an ordinary ringrun job with one rank per host
// (through the agents, so that the answer is the one a real job would get), and prints a table
// with one row per host: status, CUDA driver and runtime versions, NCCL version, and the devices
// (name, memory, compute capability, PCI bus id), or why a host has none ("no CUDA driver:
// <CUDA's text>"). With --allreduce, when every host passed, a second job with one rank per GPU
// runs `ringrun-bench allreduce --device cuda` on 1 MiB with checking and reports its busbw.
//
// Both helper programs are looked up next to the ringrun-agent the job uses (--agent-path, or
// the directory of this ringrun). The exit code is 0 only when every host passed (and the
// allreduce, when asked for); 1 otherwise. A host without a GPU fails in the time it takes to
// start one job, well under 10 s on reachable hosts.
#pragma once

#include <string>
#include <vector>

#include "launcher/job/job.h"
#include "launcher/options.h"

namespace ringrun::launcher {

// One host's answer, parsed from the probe's JSON line.
struct GpuHostReport {
  std::string host;       // as in the host list
  bool reported = false;  // a probe line arrived
  bool ok = false;        // at least one device
  std::string driver_version, runtime_version, nccl_version;
  std::string error;  // the probe's reason, or why no report arrived
  struct Device {
    std::string name;
    double memory_bytes = 0;
    std::string compute_capability;
    std::string pci_bus_id;
  };
  std::vector<Device> devices;
};

// Parses one line of ringrun-gpu-probe output into `report` (host is left alone). False, with
// report->error set, when the line is not a probe report.
bool ParseGpuProbeLine(const std::string& line, GpuHostReport* report);

// The table. `allreduce` is "" (not run) or the text of the allreduce column for every row.
std::string FormatGpuTable(const std::vector<GpuHostReport>& hosts, const std::string& allreduce);

// The whole command; returns ringrun's exit code.
int RunCheckGpu(const Options& options, const job::Starters& starters);

}  // namespace ringrun::launcher

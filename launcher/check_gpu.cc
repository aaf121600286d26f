#include "launcher/check_gpu.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <map>
#include <string_view>

#include "ringrun/common/thread_annotations.h"

namespace ringrun::launcher {
namespace {

namespace pb = google::protobuf;

// The directory holding ringrun-agent on the hosts: --agent-path's, or this ringrun's.
std::string BinDir(const Options& options) {
  std::string path = options.agent_path;
  if (path.empty()) {
    char buf[PATH_MAX + 1] = {0};
    ssize_t n = ::readlink("/proc/self/exe", buf, PATH_MAX);
    if (n > 0) path.assign(buf, static_cast<size_t>(n));
  }
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string StringField(const pb::Struct& s, const std::string& key) {
  auto it = s.fields().find(key);
  if (it == s.fields().end()) return "";
  if (it->second.kind_case() == pb::Value::kStringValue) return it->second.string_value();
  if (it->second.kind_case() == pb::Value::kNumberValue) {
    return std::to_string(it->second.number_value());
  }
  return "";
}

double NumberField(const pb::Struct& s, const std::string& key, double fallback) {
  auto it = s.fields().find(key);
  if (it == s.fields().end() || it->second.kind_case() != pb::Value::kNumberValue) return fallback;
  return it->second.number_value();
}

bool ParseJsonObject(std::string_view line, pb::Struct* out) {
  if (line.empty() || line.front() != '{') return false;
  return pb::util::JsonStringToMessage(pb::StringPiece(line.data(), line.size()), out).ok();
}

// Lines of every rank, as the job printed them. JobHooks::on_line is called from one thread;
// the mutex makes the hand-over to the caller's thread explicit.
class OutputCapture {
 public:
  job::JobHooks Hooks() {
    job::JobHooks hooks;
    hooks.echo_to_console = false;
    hooks.on_line = [this](int rank, bool is_stderr, std::string_view line) {
      MutexLock lock(&mu_);
      (is_stderr ? stderr_ : stdout_)[rank].emplace_back(line);
    };
    return hooks;
  }
  std::vector<std::string> Stdout(int rank) {
    MutexLock lock(&mu_);
    return stdout_[rank];
  }
  std::string StderrTail(int rank) {
    MutexLock lock(&mu_);
    const auto& lines = stderr_[rank];
    return lines.empty() ? "" : lines.back();
  }

 private:
  Mutex mu_;
  std::map<int, std::vector<std::string>> stdout_ GUARDED_BY(mu_);
  std::map<int, std::vector<std::string>> stderr_ GUARDED_BY(mu_);
};

std::string FormatGiB(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

// "2x NVIDIA H200 (139.8 GiB, cc 9.0) at 0000:19:00.0, 0000:3b:00.0": identical devices grouped.
std::string DescribeDevices(const std::vector<GpuHostReport::Device>& devices) {
  std::string out;
  size_t i = 0;
  while (i < devices.size()) {
    const auto& d = devices[i];
    size_t j = i;
    std::string buses;
    while (j < devices.size() && devices[j].name == d.name &&
           devices[j].memory_bytes == d.memory_bytes &&
           devices[j].compute_capability == d.compute_capability) {
      buses += (j > i ? ", " : "") + devices[j].pci_bus_id;
      ++j;
    }
    if (!out.empty()) out += "; ";
    out += std::to_string(j - i) + "x " + d.name + " (" + FormatGiB(d.memory_bytes) + ", cc " +
           d.compute_capability + ") at " + buses;
    i = j;
  }
  return out;
}

std::string Pad(const std::string& s, size_t width) {
  return s.size() >= width ? s : s + std::string(width - s.size(), ' ');
}

// Places and runs one of the check's jobs; its exit code (2 when its ranks cannot be placed).
int RunPlacedJob(const Options& options, const job::Starters& starters,
                 const job::JobHooks& hooks) {
  Result<std::vector<hosts::RankPlacement>> placed = hosts::PlaceRanks(options.hosts, options.np);
  if (!placed.ok()) {
    std::fprintf(stderr, "ringrun: %s\n", placed.status().message().c_str());
    return 2;
  }
  return job::RunJob(options, std::move(placed.value()), starters, hooks);
}

}  // namespace

bool ParseGpuProbeLine(const std::string& line, GpuHostReport* report) {
  pb::Struct s;
  if (!ParseJsonObject(line, &s) || s.fields().count("devices") == 0) {
    report->error = "not a ringrun-gpu-probe report: " + line.substr(0, 120);
    return false;
  }
  report->reported = true;
  report->driver_version = StringField(s, "driver_version");
  report->runtime_version = StringField(s, "runtime_version");
  report->nccl_version = StringField(s, "nccl_version");
  report->error = StringField(s, "error");
  report->devices.clear();
  const pb::Value& devices = s.fields().at("devices");
  if (devices.kind_case() == pb::Value::kListValue) {
    for (const pb::Value& v : devices.list_value().values()) {
      if (v.kind_case() != pb::Value::kStructValue) continue;
      GpuHostReport::Device d;
      d.name = StringField(v.struct_value(), "name");
      d.memory_bytes = NumberField(v.struct_value(), "memory_bytes", 0);
      d.compute_capability = StringField(v.struct_value(), "compute_capability");
      d.pci_bus_id = StringField(v.struct_value(), "pci_bus_id");
      report->devices.push_back(std::move(d));
    }
  }
  report->ok = !report->devices.empty();
  if (!report->ok && report->error.empty()) report->error = "no CUDA device";
  return true;
}

std::string FormatGpuTable(const std::vector<GpuHostReport>& hosts, const std::string& allreduce) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> header = {"HOST", "STATUS", "DRIVER", "RUNTIME", "NCCL", "GPUS"};
  if (!allreduce.empty()) header.push_back("ALLREDUCE");
  header.push_back("DETAIL");
  rows.push_back(header);
  for (const GpuHostReport& h : hosts) {
    std::vector<std::string> row = {h.host,
                                    h.ok ? "OK" : "FAIL",
                                    h.reported ? h.driver_version : "-",
                                    h.reported ? h.runtime_version : "-",
                                    h.reported ? h.nccl_version : "-",
                                    std::to_string(h.devices.size())};
    if (!allreduce.empty()) row.push_back(allreduce);
    row.push_back(h.ok ? DescribeDevices(h.devices) : h.error);
    rows.push_back(std::move(row));
  }
  std::vector<size_t> width(header.size(), 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      line += c + 1 == row.size() ? row[c] : Pad(row[c], width[c] + 2);
    }
    out += line + "\n";
  }
  return out;
}

int RunCheckGpu(const Options& options, const job::Starters& starters) {
  const std::string bin = BinDir(options);

  // Job 1: one probe per host.
  Options probe = options;
  probe.max_restarts = 0;  // a check reports what it finds, once
  probe.command = {bin + "/ringrun-gpu-probe", "--report-only"};
  for (hosts::HostSpec& h : probe.hosts) h.slots = 1;
  probe.np = static_cast<int>(probe.hosts.size());
  OutputCapture probe_out;
  const int probe_rc = RunPlacedJob(probe, starters, probe_out.Hooks());

  std::vector<GpuHostReport> reports(probe.hosts.size());
  bool all_ok = true;
  for (size_t r = 0; r < reports.size(); ++r) {
    GpuHostReport& rep = reports[r];
    rep.host = options.hosts[r].Display();
    for (const std::string& line : probe_out.Stdout(static_cast<int>(r))) {
      if (!line.empty() && line.front() == '{' && ParseGpuProbeLine(line, &rep)) break;
    }
    if (!rep.reported) {
      std::string tail = probe_out.StderrTail(static_cast<int>(r));
      rep.error = "no report from " + bin + "/ringrun-gpu-probe (job exit code " +
                  std::to_string(probe_rc) + ")" + (tail.empty() ? "" : ": " + tail);
    }
    all_ok = all_ok && rep.ok;
  }

  // Job 2: one rank per GPU, a checked 1 MiB allreduce.
  std::string allreduce;
  bool allreduce_ok = true;
  if (options.check_gpu_allreduce) {
    if (!all_ok) {
      allreduce = "skipped";
      allreduce_ok = false;
    } else {
      Options bench = options;
      bench.max_restarts = 0;
      bench.command = {bin + "/ringrun-bench",
                       "allreduce",
                       "--device",
                       "cuda",
                       "-b",
                       "1M",
                       "-e",
                       "1M",
                       "-n",
                       "5",
                       "-w",
                       "2",
                       "-c",
                       "1",
                       "--json"};
      bench.np = 0;
      for (size_t r = 0; r < reports.size(); ++r) {
        bench.hosts[r].slots = static_cast<int>(reports[r].devices.size());
        bench.np += bench.hosts[r].slots;
      }
      OutputCapture bench_out;
      const int bench_rc = RunPlacedJob(bench, starters, bench_out.Hooks());
      pb::Struct result;
      bool have = false;
      for (const std::string& line : bench_out.Stdout(0)) {
        pb::Struct s;
        if (ParseJsonObject(line, &s) && s.fields().count("busbw_GBps") != 0)
          result = s, have = true;
      }
      const double wrong = have ? NumberField(result, "wrong", -1) : -1;
      allreduce_ok = bench_rc == 0 && have && wrong == 0;
      char buf[160];
      if (have) {
        // One rank moves no data between ranks (busbw 0): its algbw is the device copy's.
        const bool one = bench.np == 1;
        std::snprintf(buf, sizeof(buf), "%s %.2f GB/s %s (np=%d, %d wrong)",
                      allreduce_ok ? "OK" : "FAIL",
                      NumberField(result, one ? "algbw_GBps" : "busbw_GBps", 0),
                      one ? "algbw" : "busbw", bench.np, static_cast<int>(wrong));
      } else {
        std::string tail = bench_out.StderrTail(0);
        std::snprintf(buf, sizeof(buf), "FAIL (exit %d%s%.100s)", bench_rc,
                      tail.empty() ? "" : ": ", tail.c_str());
      }
      allreduce = buf;
    }
  }

  const std::string table = FormatGpuTable(reports, allreduce);
  std::fwrite(table.data(), 1, table.size(), stdout);
  const bool pass = all_ok && allreduce_ok;
  std::printf("%s\n",
              pass ? "check-gpu: every host passed" : "check-gpu: FAILED (see the rows above)");
  std::fflush(stdout);
  return pass ? 0 : 1;
}

}  // namespace ringrun::launcher

#include "launcher/hosts/scheduler_hosts.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "launcher/hosts/slurm.h"

namespace ringrun::launcher::hosts {
namespace {

constexpr long kMaxSlots = 65536;

std::vector<std::string> Words(const std::string& line) {
  std::vector<std::string> out;
  std::istringstream in(line);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// A positive slot count, or -1.
long ParseSlots(const std::string& s) {
  if (s.empty() || s.size() > 6) return -1;
  long v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v >= 1 && v <= kMaxSlots ? v : -1;
}

// Adds slots to `host`, keeping first-appearance order.
class HostTally {
 public:
  Status Add(const std::string& name, long slots, const std::string& where) {
    auto it = index_.find(name);
    if (it == index_.end()) {
      index_[name] = hosts_.size();
      HostSpec h;
      h.name = name;
      h.slots = static_cast<int>(slots);
      hosts_.push_back(std::move(h));
      return Status();
    }
    HostSpec& h = hosts_[it->second];
    if (h.slots + slots > kMaxSlots) return InvalidArgument(where + ": more than 65536 slots");
    h.slots += static_cast<int>(slots);
    return Status();
  }
  Result<std::vector<HostSpec>> Take(const std::string& origin) {
    if (hosts_.empty()) return InvalidArgument(origin + ": no hosts");
    return std::move(hosts_);
  }

 private:
  std::vector<HostSpec> hosts_;
  std::map<std::string, size_t> index_;
};

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) {
    if (!l.empty() && l.back() == '\r') l.pop_back();
    out.push_back(l);
  }
  return out;
}

Result<std::string> ReadFile(const std::string& var, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(var + "=" + path + ": " + std::strerror(errno));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

Result<std::vector<HostSpec>> ParsePbsNodefile(const std::string& text, const std::string& origin) {
  HostTally tally;
  std::vector<std::string> lines = Lines(text);
  for (size_t i = 0; i < lines.size(); ++i) {
    std::vector<std::string> w = Words(lines[i]);
    const std::string where = origin + ":" + std::to_string(i + 1);
    if (w.empty()) continue;
    if (w.size() > 1) {
      return InvalidArgument(where + ": '" + lines[i] + "': expected one host name per line");
    }
    RINGRUN_RETURN_IF_ERROR(tally.Add(w[0], 1, where));
  }
  return tally.Take(origin);
}

Result<std::vector<HostSpec>> ParseLsfMcpuHosts(const std::string& value) {
  const std::string origin = "LSB_MCPU_HOSTS=" + value;
  std::vector<std::string> w = Words(value);
  if (w.size() % 2 != 0) {
    return InvalidArgument(origin + ": '" + w.back() +
                           "' has no count (expected HOST COUNT pairs)");
  }
  HostTally tally;
  for (size_t i = 0; i < w.size(); i += 2) {
    long slots = ParseSlots(w[i + 1]);
    if (slots < 0) {
      return InvalidArgument(origin + ": '" + w[i] + " " + w[i + 1] +
                             "': the count must be an integer in [1, 65536]");
    }
    RINGRUN_RETURN_IF_ERROR(tally.Add(w[i], slots, origin));
  }
  return tally.Take(origin);
}

Result<std::vector<HostSpec>> ParseSgeHostfile(const std::string& text, const std::string& origin) {
  HostTally tally;
  std::vector<std::string> lines = Lines(text);
  for (size_t i = 0; i < lines.size(); ++i) {
    std::vector<std::string> w = Words(lines[i]);
    const std::string where = origin + ":" + std::to_string(i + 1);
    if (w.empty()) continue;
    long slots = w.size() >= 2 ? ParseSlots(w[1]) : -1;
    if (slots < 0) {
      return InvalidArgument(where + ": '" + lines[i] +
                             "': expected 'host slots [queue range]' with slots in [1, 65536]");
    }
    RINGRUN_RETURN_IF_ERROR(tally.Add(w[0], slots, where));
  }
  return tally.Take(origin);
}

Result<std::optional<SchedulerHosts>> HostsFromScheduler(const std::vector<std::string>& env) {
  SchedulerHosts out;
  if (InSlurmJob(env)) {
    Result<SlurmAllocation> a = ReadSlurmAllocation(env);
    if (!a.ok()) return a.status();
    out.kind = SchedulerHosts::kSlurm;
    out.hosts = std::move(a->hosts);
    out.source = std::move(a->source);
    out.inside_step = a->inside_step;
    return std::optional<SchedulerHosts>(std::move(out));
  }
  using FileParser = Result<std::vector<HostSpec>> (*)(const std::string&, const std::string&);
  // A host file named by `var`: read it, parse it, name it in errors.
  auto from_file = [&](const char* var, FileParser parse,
                       SchedulerHosts::Kind kind) -> Result<std::optional<SchedulerHosts>> {
    const std::string path = EnvValue(env, var);
    Result<std::string> text = ReadFile(var, path);
    if (!text.ok()) return text.status();
    out.source = std::string(var) + "=" + path;
    Result<std::vector<HostSpec>> hosts = parse(*text, out.source);
    if (!hosts.ok()) return hosts.status();
    out.kind = kind;
    out.hosts = std::move(hosts.value());
    return std::optional<SchedulerHosts>(std::move(out));
  };
  if (!EnvValue(env, "PBS_NODEFILE").empty()) {
    return from_file("PBS_NODEFILE", ParsePbsNodefile, SchedulerHosts::kPbs);
  }
  if (std::string value = EnvValue(env, "LSB_MCPU_HOSTS"); !value.empty()) {
    Result<std::vector<HostSpec>> hosts = ParseLsfMcpuHosts(value);
    if (!hosts.ok()) return hosts.status();
    out.kind = SchedulerHosts::kLsf;
    out.hosts = std::move(hosts.value());
    out.source = "LSB_MCPU_HOSTS=" + value;
    return std::optional<SchedulerHosts>(std::move(out));
  }
  if (!EnvValue(env, "PE_HOSTFILE").empty()) {
    return from_file("PE_HOSTFILE", ParseSgeHostfile, SchedulerHosts::kSge);
  }
  return std::optional<SchedulerHosts>();
}

}  // namespace ringrun::launcher::hosts

#include "launcher/hosts/slurm.h"

#include <cstdio>
#include <functional>
#include <set>

namespace ringrun::launcher::hosts {
namespace {

constexpr uint64_t kMaxRange = 65536;  // Slurm's MAX_RANGE: names per range
constexpr size_t kMaxNames = 1 << 20;  // all brackets of one expression together
constexpr size_t kMaxDigits = 18;      // fits in uint64_t whatever the digits
constexpr int kMaxCount = 65536;

bool IsDigits(std::string_view s) {
  if (s.empty() || s.size() > kMaxDigits) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

uint64_t ToNumber(std::string_view digits) {
  uint64_t v = 0;
  for (char c : digits) v = v * 10 + static_cast<uint64_t>(c - '0');
  return v;
}

std::string Pad(uint64_t value, size_t width) {
  std::string s = std::to_string(value);
  if (s.size() < width) s.insert(0, width - s.size(), '0');
  return s;
}

// "1-3,07,10-12" (the inside of one bracket) to its names' numeric parts.
Result<std::vector<std::string>> ExpandRanges(std::string_view inside, std::string_view token) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t comma = inside.find(',', start);
    std::string_view range = inside.substr(start, comma - start);
    size_t dash = range.find('-');
    std::string_view lo = range.substr(0, dash);
    std::string_view hi = dash == std::string_view::npos ? lo : range.substr(dash + 1);
    auto bad = [&](const std::string& why) {
      return InvalidArgument("'" + std::string(token) + "': range '" + std::string(range) + "' " +
                             why);
    };
    if (range.empty()) return bad("is empty");
    if (!IsDigits(lo) || !IsDigits(hi)) return bad("is not a number or a lo-hi pair of numbers");
    uint64_t a = ToNumber(lo), b = ToNumber(hi);
    if (a > b) return bad("runs backwards");
    if (b - a + 1 > kMaxRange) return bad("names more than 65536 hosts");
    // One bracket may list many ranges: stop at the expression's cap before expanding them all.
    if (out.size() + (b - a + 1) > kMaxNames) {
      return InvalidArgument("'" + std::string(token) + "' names more than " +
                             std::to_string(kMaxNames) + " hosts");
    }
    for (uint64_t v = a; v <= b; ++v) out.push_back(Pad(v, lo.size()));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

// One token: "a[1-2]b[3-4]" -> a1b3 a1b4 a2b3 a2b4, appended to *out.
Status ExpandToken(std::string_view token, std::vector<std::string>* out) {
  std::vector<std::string> texts;                // k+1 texts around k brackets
  std::vector<std::vector<std::string>> values;  // k value lists
  size_t pos = 0;
  while (true) {
    size_t open = token.find('[', pos);
    size_t close = token.find(']', pos);
    if (open == std::string_view::npos) {
      if (close != std::string_view::npos) {
        return InvalidArgument("'" + std::string(token) + "': ']' without '['");
      }
      texts.emplace_back(token.substr(pos));
      break;
    }
    if (close < open) return InvalidArgument("'" + std::string(token) + "': ']' without '['");
    if (close == std::string_view::npos) {
      return InvalidArgument("'" + std::string(token) + "': '[' without ']'");
    }
    texts.emplace_back(token.substr(pos, open - pos));
    std::string_view inside = token.substr(open + 1, close - open - 1);
    if (inside.find('[') != std::string_view::npos) {
      return InvalidArgument("'" + std::string(token) + "': nested '['");
    }
    Result<std::vector<std::string>> v = ExpandRanges(inside, token);
    if (!v.ok()) return v.status();
    values.push_back(std::move(v.value()));
    pos = close + 1;
  }
  const size_t k = values.size();
  if (k == 0) {
    out->push_back(texts[0]);
    return Status();
  }
  if (!texts.back().empty()) {
    return InvalidArgument("'" + std::string(token) + "': text after the last ']' ('" +
                           texts.back() + "'); Slurm allows none");
  }
  size_t total = 1;
  for (const auto& v : values) {
    total *= v.size();
    if (total > kMaxNames) {
      return InvalidArgument("'" + std::string(token) + "' names more than " +
                             std::to_string(kMaxNames) + " hosts");
    }
  }
  // Slurm expands the last bracket first and then each bracket of the prefix from the right,
  // so the loops nest as: bracket k-1 (outermost), k-2, ..., 1, then k (innermost).
  std::vector<size_t> order;
  for (size_t b = k - 1; b-- > 0;) order.push_back(b);
  order.push_back(k - 1);
  std::vector<size_t> pick(k, 0);
  std::function<void(size_t)> loop = [&](size_t depth) {
    if (depth == order.size()) {
      std::string name;
      for (size_t b = 0; b < k; ++b) name += texts[b] + values[b][pick[b]];
      out->push_back(std::move(name));
      return;
    }
    const size_t b = order[depth];
    for (pick[b] = 0; pick[b] < values[b].size(); ++pick[b]) loop(depth + 1);
  };
  loop(0);
  return Status();
}

std::string Describe(std::string_view var, std::string_view value) {
  return std::string(var) + "=" + std::string(value);
}

}  // namespace

Result<std::vector<std::string>> ExpandHostlist(std::string_view expr) {
  std::vector<std::string> out;
  size_t start = 0;
  int depth = 0;
  for (size_t i = 0; i <= expr.size(); ++i) {
    const char c = i < expr.size() ? expr[i] : ',';
    if (c == '[') {
      ++depth;
    } else if (c == ']') {
      if (depth == 0) {
        return InvalidArgument("'" + std::string(expr.substr(start, i + 1 - start)) +
                               "': ']' without '['");
      }
      --depth;
    } else if ((c == ',' || c == ' ' || c == '\t') && (depth == 0 || i == expr.size())) {
      std::string_view token = expr.substr(start, i - start);
      if (depth != 0) return InvalidArgument("'" + std::string(token) + "': '[' without ']'");
      if (!token.empty()) RINGRUN_RETURN_IF_ERROR(ExpandToken(token, &out));
      if (out.size() > kMaxNames) {
        return InvalidArgument("the list names more than " + std::to_string(kMaxNames) + " hosts");
      }
      start = i + 1;
    }
  }
  return out;
}

Result<std::vector<int>> ExpandCountList(std::string_view list) {
  std::vector<int> out;
  size_t start = 0;
  while (true) {
    size_t comma = list.find(',', start);
    std::string_view el = list.substr(start, comma - start);
    auto bad = [&](const std::string& why) {
      return InvalidArgument("'" + std::string(el) + "' " + why);
    };
    std::string_view count = el, reps = "1";
    size_t paren = el.find('(');
    if (paren != std::string_view::npos) {
      if (el.size() < paren + 4 || el.substr(paren, 2) != "(x" || el.back() != ')') {
        return bad("is not COUNT or COUNT(xREPEATS)");
      }
      count = el.substr(0, paren);
      reps = el.substr(paren + 2, el.size() - paren - 3);
    }
    if (!IsDigits(count) || !IsDigits(reps)) {
      return bad(el.empty() ? "is empty" : "is not COUNT or COUNT(xREPEATS)");
    }
    uint64_t c = ToNumber(count), r = ToNumber(reps);
    if (c > static_cast<uint64_t>(kMaxCount)) return bad("is more than 65536 tasks");
    if (r < 1 || r > static_cast<uint64_t>(kMaxCount)) return bad("repeats 0 or over 65536 times");
    out.insert(out.end(), static_cast<size_t>(r), static_cast<int>(c));
    if (out.size() > kMaxNames) return bad("makes the list too long");
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

std::string EnvValue(const std::vector<std::string>& env, std::string_view name) {
  for (const std::string& e : env) {
    if (e.size() > name.size() && e[name.size()] == '=' && e.compare(0, name.size(), name) == 0) {
      return e.substr(name.size() + 1);
    }
  }
  return "";
}

bool InSlurmJob(const std::vector<std::string>& env) {
  return !EnvValue(env, "SLURM_JOB_ID").empty() || !EnvValue(env, "SLURM_JOBID").empty();
}

Result<SlurmAllocation> ReadSlurmAllocation(const std::vector<std::string>& env) {
  SlurmAllocation a;
  a.job_id = EnvValue(env, "SLURM_JOB_ID");
  if (a.job_id.empty()) a.job_id = EnvValue(env, "SLURM_JOBID");
  a.inside_step = !EnvValue(env, "SLURM_STEP_ID").empty();
  std::string list_var, counts_var;
  if (a.inside_step) {
    list_var = "SLURM_STEP_NODELIST";
    counts_var = "SLURM_STEP_TASKS_PER_NODE";
  } else {
    list_var =
        EnvValue(env, "SLURM_JOB_NODELIST").empty() && !EnvValue(env, "SLURM_NODELIST").empty()
            ? "SLURM_NODELIST"
            : "SLURM_JOB_NODELIST";
    counts_var = "SLURM_TASKS_PER_NODE";
  }
  const std::string list = EnvValue(env, list_var);
  const std::string counts = EnvValue(env, counts_var);
  const std::string where = "Slurm job " + a.job_id + ": ";
  if (list.empty()) return InvalidArgument(where + list_var + " is not set or empty");
  if (counts.empty()) return InvalidArgument(where + counts_var + " is not set or empty");
  Result<std::vector<std::string>> names = ExpandHostlist(list);
  if (!names.ok()) {
    return InvalidArgument(where + Describe(list_var, list) + ": " + names.status().message());
  }
  if (names->empty()) return InvalidArgument(where + Describe(list_var, list) + ": no hosts");
  Result<std::vector<int>> slots = ExpandCountList(counts);
  if (!slots.ok()) {
    return InvalidArgument(where + Describe(counts_var, counts) + ": " + slots.status().message());
  }
  if (slots->size() < names->size()) {
    return InvalidArgument(where + Describe(counts_var, counts) + " gives " +
                           std::to_string(slots->size()) + " counts for the " +
                           std::to_string(names->size()) + " hosts of " + Describe(list_var, list));
  }
  std::set<std::string> seen;
  for (size_t i = 0; i < names->size(); ++i) {
    if (!seen.insert((*names)[i]).second) {
      return InvalidArgument(where + Describe(list_var, list) + ": host '" + (*names)[i] +
                             "' is listed twice");
    }
    if ((*slots)[i] == 0) continue;
    HostSpec h;
    h.name = (*names)[i];
    h.slots = (*slots)[i];
    a.hosts.push_back(std::move(h));
  }
  if (a.hosts.empty()) {
    return InvalidArgument(where + Describe(counts_var, counts) + ": no host has a task");
  }
  a.source = where + Describe(list_var, list) + " " + Describe(counts_var, counts);
  return a;
}

Result<StarterChoice> ChooseStarter(const std::string& flag, const std::vector<std::string>& env,
                                    const std::vector<HostSpec>& hosts) {
  StarterChoice c;
  const bool in_job = InSlurmJob(env);
  c.overlap = in_job && !EnvValue(env, "SLURM_STEP_ID").empty();
  if (flag == "ssh") return c;
  if (flag == "slurm") {
    if (!in_job)
      return InvalidArgument("--starter slurm: not inside a Slurm job (SLURM_JOB_ID unset)");
    c.srun = true;
    return c;
  }
  if (!flag.empty() && flag != "auto") {
    return InvalidArgument("--starter " + flag + ": not one of ssh, slurm, auto");
  }
  if (!in_job || hosts.empty()) return c;
  Result<SlurmAllocation> a = ReadSlurmAllocation(env);
  if (!a.ok()) return c;  // hosts were given and the job is unreadable: SSH, as without Slurm
  std::set<std::string> nodes;
  for (const auto& h : a->hosts) nodes.insert(h.name);
  for (const auto& h : hosts) {
    if (!h.user.empty() || !nodes.count(h.name)) return c;
  }
  c.srun = true;
  return c;
}

bool IsSlurmTaskVariable(std::string_view name) {
  static const std::set<std::string_view> kExact = {
      "SLURM_PROCID",
      "SLURM_LOCALID",
      "SLURM_NODEID",
      "SLURM_NTASKS",
      "SLURM_NPROCS",
      "SLURM_NTASKS_PER_NODE",
      "SLURM_GTIDS",
      "SLURM_TASK_PID",
      "SLURM_STEPID",
      "SLURMD_NODENAME",
      "SLURM_LAUNCH_NODE_IPADDR",
      "SLURM_CPU_BIND",
      "SLURM_DISTRIBUTION",
      "SLURM_TOPOLOGY_ADDR",
      "SLURM_TOPOLOGY_ADDR_PATTERN",
      "SLURM_CPUS_ON_NODE",
  };
  static const std::string_view kPrefixes[] = {"SLURM_STEP_", "SLURM_SRUN_COMM_",
                                               "SLURM_CPU_BIND_"};
  if (kExact.count(name)) return true;
  for (std::string_view p : kPrefixes) {
    if (name.substr(0, p.size()) == p) return true;
  }
  return false;
}

}  // namespace ringrun::launcher::hosts

#include "runtime/src/runtime.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>

#include "ringrun/common/defaults.h"
#include "ringrun/common/env_contract.h"
#include "runtime/src/gpu/device_backend.h"
#include "runtime/src/knobs.h"
#include "runtime/src/reduce.h"

namespace ringrun::runtime {

namespace {

Result<int> ParseInt(const char* name, const char* v, int lo, int hi) {
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || x < lo || x > hi) {
    return InvalidArgument(std::string("environment variable ") + name + "='" + v +
                           "' is not an integer in [" + std::to_string(lo) + ", " +
                           std::to_string(hi) + "]");
  }
  return static_cast<int>(x);
}

}  // namespace

Result<JobEnv> ReadJobEnv(const std::function<const char*(const char*)>& getenv) {
  JobEnv e;
  const char* rank = getenv(env::kRank);
  const char* size = getenv(env::kSize);
  auto get_int = [&](const char* name, int lo, int hi, int* out) -> Status {
    const char* v = getenv(name);
    if (v == nullptr || *v == '\0') return Status::Ok();
    Result<int> r = ParseInt(name, v, lo, hi);
    if (!r.ok()) return r.status();
    *out = *r;
    return Status::Ok();
  };
  RINGRUN_RETURN_IF_ERROR(get_int("RINGRUN_TIMEOUT_MS", 1, 1 << 30, &e.timeout_ms));
  int disable_shm = 0;
  RINGRUN_RETURN_IF_ERROR(get_int("RINGRUN_DISABLE_SHM", 0, 1, &disable_shm));
  e.use_shm = disable_shm == 0;
  int allow_nat = 0;
  RINGRUN_RETURN_IF_ERROR(get_int("RINGRUN_ALLOW_NAT", 0, 1, &allow_nat));
  e.allow_nat = allow_nat == 1;
  RINGRUN_RETURN_IF_ERROR(get_int("RINGRUN_SHM_RING_KIB", 4, 1 << 20, &e.shm_ring_kib));
  if (e.shm_ring_kib & (e.shm_ring_kib - 1)) {
    return InvalidArgument("RINGRUN_SHM_RING_KIB must be a power of two");
  }
  if (const char* spin = getenv("RINGRUN_SPIN")) {
    e.spin = std::string(spin) == "yield" ? JobEnv::kYield : spin[0] != '0' ? 1 : 0;
  }
  RINGRUN_RETURN_IF_ERROR(get_int("RINGRUN_JOIN_TIMEOUT_MS", 1, 1 << 30, &e.join_timeout_ms));
  RINGRUN_RETURN_IF_ERROR(ReadKnobs(getenv, &e));
  if (rank == nullptr && size == nullptr) {  // not under ringrun
    e.foreign = rendezvous::DetectForeignJob(getenv);
    e.pmix_launcher = rendezvous::PmixLauncher(getenv).value_or("");
    return e;
  }
  if (rank == nullptr || size == nullptr) {
    return InvalidArgument(std::string("only one of ") + env::kRank + " and " + env::kSize +
                           " is set");
  }
  e.in_job = true;
  RINGRUN_RETURN_IF_ERROR(get_int(env::kSize, 1, 1 << 24, &e.size));
  RINGRUN_RETURN_IF_ERROR(get_int(env::kRank, 0, e.size - 1, &e.rank));
  RINGRUN_RETURN_IF_ERROR(get_int(env::kLocalRank, 0, e.size - 1, &e.local_rank));
  RINGRUN_RETURN_IF_ERROR(get_int(env::kLocalSize, 1, e.size, &e.local_size));
  RINGRUN_RETURN_IF_ERROR(get_int(env::kCrossRank, 0, e.size - 1, &e.cross_rank));
  RINGRUN_RETURN_IF_ERROR(get_int(env::kCrossSize, 1, e.size, &e.cross_size));
  auto get_str = [&](const char* name, std::string* out) {
    const char* v = getenv(name);
    if (v != nullptr && *v != '\0') *out = v;
  };
  get_str(env::kJobService, &e.job_service);
  get_str(env::kSecret, &e.secret);
  get_str(env::kHostAddr, &e.host_addr);
  get_str(env::kJobId, &e.job_id);
  int elastic = 0;
  RINGRUN_RETURN_IF_ERROR(get_int("RINGRUN_ELASTIC", 0, 1, &elastic));
  e.elastic = elastic == 1;
  if (e.elastic) {
    RINGRUN_RETURN_IF_ERROR(get_int("RINGRUN_WORKER_ID", 0, 1 << 24, &e.worker_id));
    if (e.worker_id < 0) e.worker_id = e.rank;
  }
  if (e.size > 1 && e.job_service.empty()) {
    return InvalidArgument(std::string(env::kJobService) + " is not set (job of size " +
                           std::to_string(e.size) + ")");
  }
  return e;
}

Shape ShapeFromHosts(const std::vector<std::string>& host_of_rank, int rank) {
  Shape s;
  s.rank = rank;
  s.size = static_cast<int>(host_of_rank.size());
  std::vector<std::string> order;  // hosts by their first rank
  std::map<std::string, int> count;
  for (const std::string& h : host_of_rank) {
    if (count[h]++ == 0) order.push_back(h);
  }
  const std::string& mine = host_of_rank.at(static_cast<size_t>(rank));
  s.local_rank = 0;
  for (int r = 0; r < rank; ++r) s.local_rank += host_of_rank[static_cast<size_t>(r)] == mine;
  s.local_size = count[mine];
  s.cross_rank = 0, s.cross_size = 0;
  bool before = true;
  for (const std::string& h : order) {
    if (h == mine) before = false;
    if (count[h] <= s.local_rank) continue;
    ++s.cross_size;
    if (before) ++s.cross_rank;
  }
  return s;
}

Shape DeriveShape(const transport::PeerTable& peers, int rank) {
  Shape s;
  s.rank = rank;
  s.size = peers.size();
  std::vector<int> host_slot(peers.addresses.size(), -1);
  int hosts = 0;
  s.local_rank = 0, s.local_size = 0;
  for (int r = 0; r < peers.size(); ++r) {
    int& slot = host_slot[peers.address_of_rank[r]];
    if (slot < 0) slot = hosts++;
    if (peers.SameHost(r, rank)) {
      if (r < rank) ++s.local_rank;
      ++s.local_size;
    }
  }
  s.cross_rank = host_slot[peers.address_of_rank[rank]];
  s.cross_size = hosts;
  return s;
}

void SameHostWaiting(int spin, int local_size, int cpus, transport::TransportOptions* topts) {
  if (spin < 0) {
    // Unset: busy-wait while this host's ranks have a CPU each; past that, a spinning rank
    // holds the CPU that the rank it waits for needs, so poll and yield instead.
    spin = local_size <= cpus ? 1 : JobEnv::kYield;
  }
  topts->spin = spin == 1;
  topts->yield = spin == JobEnv::kYield;
}

namespace {
EngineSettings Settings(const JobEnv& env) {
  EngineSettings s;
  s.fusion_threshold = env.fusion_threshold;
  s.cache_capacity = env.cache_capacity;
  s.hierarchical = env.hierarchical_allreduce != 0;
  s.burst_quiet_ns = env.burst_quiet_ns;
  s.autotune = env.autotune;
  s.stall = env.stall;
  s.timeline = env.timeline;
  // Only a pipe is the launcher's: a program started by a rank inherits the variable, not the
  // fd (close-on-exec), and then writes files of its own.
  struct stat st;
  if (env.timeline_fd >= 0 && ::fstat(env.timeline_fd, &st) == 0 && S_ISFIFO(st.st_mode)) {
    s.timeline_fd = env.timeline_fd;
  }
  s.timeline_dynamic = env.timeline_dynamic;
  s.timeline_mark_cycles = env.timeline_mark_cycles;
  return s;
}

// Without the launcher's pipe, rank 0 writes the file named, as Horovod's coordinator does;
// rank r > 0 writes "t.<r>.json" beside "t.json" (docs/engine.md, "Timeline").
std::string TimelinePath(const std::string& path, int rank, int size) {
  if (path.empty() || size == 1 || rank == 0) return path;
  const size_t slash = path.rfind('/');
  const size_t dot = path.rfind('.');
  const std::string r = std::to_string(rank);
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) {
    return path + "." + r;
  }
  return path.substr(0, dot) + "." + r + path.substr(dot);
}
}  // namespace

namespace {
// A runtime whose engine could not start (no eventfd) is an error of ringrun_init, not a
// runtime that refuses every call.
Result<std::unique_ptr<Runtime>> Started(std::unique_ptr<Runtime> rt) {
  if (Status st = rt->engine().failure(); !st.ok()) return st;
  return rt;
}
}  // namespace

Result<std::unique_ptr<Runtime>> Runtime::Join(const JobEnv& env, JobClient* client, bool* joined) {
  if (joined) *joined = false;
  // RINGRUN_LOG_LEVEL=debug shows, among others, the data plane's refused connections.
  if (!env.log_level.empty()) spdlog::set_level(spdlog::level::from_str(env.log_level));
  if (env.log_hide_time) spdlog::set_pattern("[%l] %v");
  if (env.rank == 0) {
    for (const std::string& note : env.knob_notes)
      std::fprintf(stderr, "ringrun: %s\n", note.c_str());
  }
  Shape shape;
  if (!env.in_job && env.foreign) return rendezvous::RefuseForeignJob(*env.foreign);
  // A job of one rank needs no peers, unless it is elastic: its rank joins the job service like
  // any other, so that its generation completes and it hears of hosts that come (its Watch).
  if (!env.in_job || (env.size == 1 && !env.elastic)) {
    shape.rank = 0, shape.size = 1;
    return Started(std::make_unique<Runtime>(nullptr, shape, env.timeout_ms, Settings(env)));
  }
  Result<transport::Listener> listener = transport::Listen(env.host_addr);
  if (!listener.ok()) {
    return listener.status().Annotate("rank " + std::to_string(env.rank) + ": data-plane listener");
  }
  JoinInfo info;
  info.rank = env.rank;
  info.size = env.size;
  info.address = env.host_addr;
  info.port = listener->port;
  info.generation = env.generation;
  info.elastic = env.elastic;
  info.worker_id = env.worker_id;
  // No NCCL id here: the engine makes one at the first device collective.
  Result<transport::PeerTable> peers =
      client->Join(info, env.join_timeout_ms > 0 ? env.join_timeout_ms : kJoinTimeoutMs);
  if (!peers.ok()) {
    return peers.status().Annotate(env.elastic ? "worker " + std::to_string(env.worker_id)
                                               : "rank " + std::to_string(env.rank));
  }
  if (joined) *joined = true;
  if (peers->job_id.empty()) peers->job_id = env.job_id;
  int my_rank = env.rank;
  std::string secret = env.secret;
  if (env.elastic) {
    // The generation's numbering and keys: this process's rank is where its worker id is,
    // and the data plane's secret and job tag are the generation's, so that a process of
    // another generation cannot connect.
    auto it = std::find(peers->worker_of_rank.begin(), peers->worker_of_rank.end(), env.worker_id);
    if (it == peers->worker_of_rank.end() ||
        peers->host_of_rank.size() != peers->worker_of_rank.size() ||
        static_cast<int>(peers->worker_of_rank.size()) != peers->size() ||
        peers->data_secret.empty()) {
      return Internal("worker " + std::to_string(env.worker_id) +
                      ": the job service's elastic Join reply does not place this process");
    }
    my_rank = static_cast<int>(it - peers->worker_of_rank.begin());
    secret = peers->data_secret;
    peers->job_id += "/generation/" + std::to_string(peers->generation);
    if (peers->size() == 1) {  // alone in this generation: no data plane
      shape = ShapeFromHosts(peers->host_of_rank, 0);
      auto rt = std::make_unique<Runtime>(nullptr, shape, env.timeout_ms, Settings(env));
      rt->generation_ = peers->generation;
      rt->membership_epoch_ = peers->membership_epoch;
      rt->StartWatch(client, env.worker_id);
      return Started(std::move(rt));
    }
  }
  transport::TransportOptions topts;
  std::shared_ptr<transport::Interrupt> interrupt;
  if (env.elastic) topts.interrupt = interrupt = std::make_shared<transport::Interrupt>();
  topts.use_shm = env.use_shm;
  topts.secret = secret;
  topts.allow_nat = env.allow_nat;
  if (env.shm_ring_kib > 0) topts.shm_ring_bytes = size_t(env.shm_ring_kib) << 10;
  EngineSettings settings = Settings(env);
  Shape derived =
      env.elastic ? ShapeFromHosts(peers->host_of_rank, my_rank) : DeriveShape(*peers, env.rank);
  // env.spin (RINGRUN_SPIN, or ringrun_init_with_spin) overrides: a training rank computes on
  // its own thread while the engine waits, so spinning there takes the core its peer needs
  // (the Python package passes 0).
  SameHostWaiting(env.spin, derived.local_size,
                  static_cast<int>(std::thread::hardware_concurrency()), &topts);
  settings.set_transport = topts;
  shape = derived;
  // The launcher's numbering wins where it gave one (an elastic job's is in the reply).
  if (!env.elastic) {
    if (env.local_rank >= 0) shape.local_rank = env.local_rank;
    if (env.local_size >= 0) shape.local_size = env.local_size;
    if (env.cross_rank >= 0) shape.cross_rank = env.cross_rank;
    if (env.cross_size >= 0) shape.cross_size = env.cross_size;
  }
  const uint32_t generation = peers->generation;
  const uint64_t epoch = peers->membership_epoch;
  spdlog::log(env.source.empty() ? spdlog::level::debug : spdlog::level::info,
              "ringrun: rank {} of {} found its peers through {}: local rank {} of {}, cross rank "
              "{} of {}, data plane at {}:{}",
              my_rank, shape.size,
              env.source.empty() ? "the ringrun job service at " + env.job_service : env.source,
              shape.local_rank, shape.local_size, shape.cross_rank, shape.cross_size, env.host_addr,
              info.port);
  Result<std::unique_ptr<transport::Transport>> t = transport::MakeSocketTransport(
      my_rank, std::move(peers.value()), std::move(listener.value()), topts);
  if (!t.ok()) return t.status();
  auto rt =
      std::make_unique<Runtime>(std::move(t.value()), shape, env.timeout_ms, std::move(settings));
  rt->generation_ = generation;
  rt->membership_epoch_ = epoch;
  if (env.elastic) {
    rt->interrupt_ = std::move(interrupt);
    rt->StartWatch(client, env.worker_id);
  }
  return Started(std::move(rt));
}

void Runtime::StartWatch(JobClient* client, int worker_id) {
  std::unique_ptr<MembershipWatch> watch =
      client->Watch(worker_id, generation_, membership_epoch(),
                    [this](const MembershipNotice& n) { OnNotice(n); });
  MutexLock lock(&watch_mu_);
  watch_ = std::move(watch);
}

void Runtime::OnNotice(const MembershipNotice& notice) {
  uint64_t known = membership_epoch_.load(std::memory_order_relaxed);
  while (notice.membership_epoch > known &&
         !membership_epoch_.compare_exchange_weak(known, notice.membership_epoch)) {
  }
  if (notice.broken_generation == 0 || notice.broken_generation < generation_) return;
  Status why = Unavailable("rank " + std::to_string(shape_.rank) + ": generation " +
                           std::to_string(generation_) + " of the job is broken: " + notice.reason);
  if (interrupt_) interrupt_->Raise(why);
  AbortAll(why);
}

Runtime::Runtime(std::unique_ptr<transport::Transport> transport, Shape shape, int timeout_ms,
                 EngineSettings settings)
    : shape_([&] {
        if (transport && (shape.local_rank < 0 || shape.cross_rank < 0)) {
          return DeriveShape(transport->peers(), transport->rank());
        }
        return shape;
      }()),
      timeout_ms_(timeout_ms),
      set_transport_(std::move(settings.set_transport)) {
  if (transport) peers_ = transport->peers();
  engine::EngineOptions o;
  o.rank = shape_.rank, o.size = shape_.size, o.local_rank = shape_.local_rank;
  o.timeout_ms = timeout_ms;
  o.fusion_threshold = settings.fusion_threshold;
  o.cache_capacity = settings.cache_capacity;
  o.hierarchical = settings.hierarchical;
  o.burst_quiet_ns = settings.burst_quiet_ns;
  o.autotune = settings.autotune;
  o.stall = settings.stall;
  // The launcher's pipe takes every rank's events under the name it writes; without one each
  // rank writes its own file.
  o.timeline_fd = settings.timeline.empty() ? -1 : settings.timeline_fd;
  o.timeline_path = o.timeline_fd >= 0 ? settings.timeline
                                       : TimelinePath(settings.timeline, shape_.rank, shape_.size);
  timeline_ = settings.timeline;
  timeline_fd_ = o.timeline_fd;
  o.timeline_dynamic = settings.timeline_dynamic;
  o.timeline_mark_cycles = settings.timeline_mark_cycles;
  o.log = std::move(settings.log);
  o.clock = settings.clock;
  o.is_device = std::move(settings.is_device);
  o.make_nccl_id = std::move(settings.make_nccl_id);
  o.make_device = std::move(settings.make_device);
  o.record_event = std::move(settings.record_event);
  o.on_failure = [this](const Status& st) { AbortAll(st); };
  set_options_ = o;
  set_options_.timeline_path.clear();
  set_options_.timeline_fd = -1;
  set_options_.timeline_dynamic = false;
  // A process set's engine runs with the settings given, untuned: its rank 0 would otherwise
  // tune it too and write a second log into the same HOROVOD_AUTOTUNE_LOG file.
  set_options_.autotune = engine::AutotuneOptions{};
  // The engine thread may fail (and call AbortAll) before this constructor has stored engine_.
  auto engine = std::make_unique<engine::Engine>(std::move(transport), std::move(o));
  MutexLock lock(&sets_mu_);
  engine_ = std::move(engine);
}

Runtime::~Runtime() { Shutdown(); }

void Runtime::Shutdown() {
  std::unique_ptr<MembershipWatch> watch;
  {
    MutexLock lock(&watch_mu_);
    watch.swap(watch_);
  }
  watch.reset();  // cancels the stream; no notice is handled after this
  std::vector<engine::Engine*> sets;
  {
    MutexLock lock(&sets_mu_);
    shut_down_ = true;
    for (auto& e : set_engines_) sets.push_back(e.get());
  }
  for (engine::Engine* e : sets) e->Shutdown();
  engine_->Shutdown();
}

void Runtime::SetFailed(int id, const Status& st) {
  {
    MutexLock lock(&sets_mu_);
    auto it = sets_.find(id);
    if (it != sets_.end() && it->second.removing) return;
  }
  AbortAll(st);
}

void Runtime::AbortAll(const Status& st) {
  MutexLock lock(&sets_mu_);
  // Null only while the constructor has not stored it: then its own failure is all there is.
  if (engine_) engine_->Abort(st);
  for (auto& e : set_engines_) e->Abort(st);  // never calls back here (see Engine::Abort)
}

// ---- Process sets ----

// What each rank says in a registration (AddProcessSet) or removal (RemoveProcessSet).
struct Runtime::SetRecord {
  uint64_t what = 0;  // a hash of the set's ranks (add), or the id removed
  int32_t id = 0;     // the id this rank gives it
  uint32_t port = 0;  // add: where a member listens for the set's connections
  int32_t ok = 0;     // this rank accepts the call
  int32_t remove = 0;
};

namespace {
uint64_t HashRanks(const std::vector<int>& ranks) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the sorted ranks
  for (int r : ranks) {
    for (int i = 0; i < 4; ++i) {
      h ^= (static_cast<uint32_t>(r) >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return h ^ ranks.size();
}

std::string RankList(const std::vector<int>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s + "]";
}

// Whether every rank accepted and agrees with rank 0; else why not, the same on every rank
// (mine: this rank's own refusal, which it reports in its own words).
template <typename Record>
Status Agree(const std::vector<Record>& all, const Status& mine, const char* what) {
  for (size_t r = 0; r < all.size(); ++r) {
    if (!all[r].ok) {
      if (!mine.ok()) return mine;
      return InvalidArgument(std::string(what) + ": rank " + std::to_string(r) +
                             " refused it (its error says why)");
    }
  }
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r].what != all[0].what || all[r].remove != all[0].remove) {
      return InvalidArgument(std::string(what) + ": rank " + std::to_string(r) +
                             " passed other arguments than rank 0 (every rank calls it, in the "
                             "same order, with the same arguments)");
    }
    if (all[r].id != all[0].id) {
      return InvalidArgument(std::string(what) + ": rank " + std::to_string(r) + " has id " +
                             std::to_string(all[r].id) + " for it where rank 0 has " +
                             std::to_string(all[0].id) +
                             " (the ranks registered and removed different sets before)");
    }
  }
  return Status::Ok();
}
}  // namespace

Status Runtime::GatherRecords(const SetRecord& mine, std::vector<SetRecord>* all) {
  all->assign(shape_.size, SetRecord());
  engine::TensorArgs e;
  e.kind = engine::Kind::kAllgather;
  e.dtype = RINGRUN_UINT8, e.count = sizeof(SetRecord), e.row_elems = 1, e.fixed = true;
  e.send = &mine, e.recv = all->data();
  return SubmitAndWait("ringrun.process_set." + std::to_string(registrations_++), e);
}

Result<int> Runtime::AddProcessSet(std::vector<int> ranks) {
  MutexLock admin(&admin_mu_);
  std::sort(ranks.begin(), ranks.end());
  const char* what = "add_process_set";
  Status local;
  if (ranks.empty()) local = InvalidArgument(std::string(what) + ": a process set of no ranks");
  for (size_t i = 0; i < ranks.size() && local.ok(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= shape_.size || (i > 0 && ranks[i] == ranks[i - 1])) {
      local = InvalidArgument(std::string(what) + ": " + RankList(ranks) +
                              " are not distinct ranks of this job (0.." +
                              std::to_string(shape_.size - 1) + ")");
    }
  }
  SetRecord mine;
  {
    MutexLock lock(&sets_mu_);
    if (shut_down_) return Aborted("ringrun is shutting down");
    for (const auto& [id, set] : sets_) {
      if (local.ok() && set.ranks == ranks) {
        local =
            InvalidArgument(std::string(what) + ": a process set with ranks " + RankList(ranks) +
                            " is registered already (id " + std::to_string(id) + ")");
      }
    }
    mine.id = free_ids_.empty() ? next_id_ : free_ids_.front();
  }
  const auto at = std::lower_bound(ranks.begin(), ranks.end(), shape_.rank);
  const int set_rank =
      local.ok() && at != ranks.end() && *at == shape_.rank ? int(at - ranks.begin()) : -1;
  std::optional<transport::Listener> listener;
  if (set_rank >= 0 && ranks.size() > 1) {
    if (!set_transport_) {
      local = InvalidArgument(std::string(what) + ": this runtime cannot connect a process set");
    } else {
      Result<transport::Listener> l = transport::Listen(peers_.address(shape_.rank));
      if (l.ok()) {
        mine.port = l->port;
        listener = std::move(l.value());
      } else {
        local = l.status().Annotate("rank " + std::to_string(shape_.rank) + ": " + what +
                                    ": the set's listener");
      }
    }
  }
  mine.what = HashRanks(ranks), mine.ok = local.ok();
  std::vector<SetRecord> all;
  RINGRUN_RETURN_IF_ERROR(GatherRecords(mine, &all));
  RINGRUN_RETURN_IF_ERROR(Agree(all, local, what));
  const int id = mine.id;
  ProcessSet set;
  set.ranks = ranks, set.rank = set_rank;
  std::unique_ptr<engine::Engine> engine;
  if (set_rank >= 0) {
    std::unique_ptr<transport::Transport> t;
    engine::EngineOptions o = set_options_;
    o.rank = set_rank, o.size = static_cast<int>(ranks.size());
    o.on_failure = [this, id](const Status& st) { SetFailed(id, st); };
    if (ranks.size() > 1) {
      transport::PeerTable table;
      table.addresses = peers_.addresses;
      table.job_id = peers_.job_id + "/process_set/" + std::to_string(id);
      for (int r : ranks) {
        table.address_of_rank.push_back(peers_.address_of_rank[r]);
        table.port_of_rank.push_back(all[r].port);
        table.job_ranks.push_back(r);
      }
      Result<std::unique_ptr<transport::Transport>> made = transport::MakeSocketTransport(
          set_rank, std::move(table), std::move(*listener), *set_transport_);
      // The other ranks go on: their first collective on the set fails (this rank is not
      // there), and so does this call here, which breaks the runtime as a lost peer would.
      if (!made.ok()) {
        Status why =
            made.status().Annotate(std::string(what) + ": process set " + std::to_string(id));
        AbortAll(why);
        return why;
      }
      t = std::move(made.value());
    }
    // No GPU backend: each set's engine thread would enqueue on its own NCCL communicator, and
    // two communicators on one device whose calls interleave in different orders on different
    // ranks can hang. The C API refuses device memory on a set at submission; should some
    // reach the engine, every member fails its first device collective alike (after the id's
    // broadcast, which carries nothing).
    o.make_nccl_id = [] { return std::string(); };
    o.make_device = [](const std::string&) -> Result<std::unique_ptr<gpu::DeviceBackend>> {
      return InvalidArgument(
          "device memory on a process set other than the global one is not supported (use "
          "host tensors on it, or the global set)");
    };
    engine = std::make_unique<engine::Engine>(std::move(t), std::move(o));
    set.engine = engine.get();
  }
  MutexLock lock(&sets_mu_);
  if (!free_ids_.empty() && free_ids_.front() == id) {
    free_ids_.pop_front();
  } else {
    ++next_id_;
  }
  if (engine) {
    if (shut_down_) engine->Shutdown();
    set_engines_.push_back(std::move(engine));
  }
  sets_.emplace(id, std::move(set));
  return id;
}

Status Runtime::RemoveProcessSet(int id) {
  MutexLock admin(&admin_mu_);
  const char* what = "remove_process_set";
  Status local;
  {
    MutexLock lock(&sets_mu_);
    if (shut_down_) return Aborted("ringrun is shutting down");
    if (id == 0) {
      local = InvalidArgument(std::string(what) + ": the global process set cannot be removed");
    } else if (sets_.count(id) == 0) {
      local = InvalidArgument(std::string(what) + ": process set " + std::to_string(id) +
                              " is not registered");
    } else {
      // Before the allgather: a peer that has passed it may close the set's connections.
      sets_[id].removing = true;
    }
  }
  SetRecord mine;
  mine.what = static_cast<uint64_t>(id), mine.id = id, mine.ok = local.ok(), mine.remove = 1;
  std::vector<SetRecord> all;
  Status agreed = GatherRecords(mine, &all);
  if (agreed.ok()) agreed = Agree(all, local, what);
  if (!agreed.ok()) {
    MutexLock lock(&sets_mu_);
    if (auto it = sets_.find(id); it != sets_.end()) it->second.removing = false;
    return agreed;
  }
  engine::Engine* engine = nullptr;
  {
    MutexLock lock(&sets_mu_);
    auto it = sets_.find(id);
    engine = it->second.engine;
    sets_.erase(it);
    free_ids_.push_back(id);
  }
  if (engine) engine->Shutdown();  // kept in set_engines_: a submission may still hold it
  return Status::Ok();
}

Result<engine::Engine*> Runtime::SetEngine(int id, std::string_view what) {
  if (id == 0) return engine_.get();
  MutexLock lock(&sets_mu_);
  auto it = sets_.find(id);
  if (it == sets_.end()) {
    return InvalidArgument(std::string(what) +
                           ": Process set provided does not exist, or has not been registered.");
  }
  if (!it->second.engine) {
    return InvalidArgument(std::string(what) + ": Rank " + std::to_string(shape_.rank) +
                           " is not a member of the provided process set.");
  }
  return it->second.engine;
}

int Runtime::SetRank(int id) {
  if (id == 0) return shape_.rank;
  MutexLock lock(&sets_mu_);
  auto it = sets_.find(id);
  return it == sets_.end() ? -1 : it->second.rank;
}

int Runtime::SetSize(int id) {
  if (id == 0) return shape_.size;
  MutexLock lock(&sets_mu_);
  auto it = sets_.find(id);
  return it == sets_.end() ? -1 : static_cast<int>(it->second.ranks.size());
}

Status Runtime::StartTimeline(const std::string& path, bool mark_cycles) {
  // The launcher's file is every rank's (the engine goes back to the launcher's pipe).
  const bool launchers = timeline_fd_ >= 0 && path == timeline_;
  return engine_->StartTimeline(launchers ? path : TimelinePath(path, shape_.rank, shape_.size),
                                mark_cycles);
}

Status Runtime::SubmitAndWait(std::string_view name, const engine::TensorArgs& tensor,
                              std::shared_ptr<engine::HandleState>* handle) {
  const bool join = tensor.kind == engine::Kind::kJoin;
  engine::HandleState* raw = nullptr;
  RINGRUN_RETURN_IF_ERROR(
      engine_->Submit(name, &tensor, 1, /*group=*/false, &raw, /*run_here=*/true));
  std::shared_ptr<engine::HandleState> owned;
  if (handle) owned = engine::ShareHandle(raw);  // else released below
  engine::HandleState& h = *raw;
  if (join) {
    while (engine::WaitHandle(h, std::numeric_limits<int>::max()) == Code::kTimeout && !h.done()) {
    }
  } else if (engine::WaitHandle(h, timeout_ms_) == Code::kTimeout && !h.done()) {
    engine_->Abort(Timeout("rank " + std::to_string(shape_.rank) + ": " + h.name() +
                           " did not complete within " + std::to_string(timeout_ms_) +
                           " ms (RINGRUN_TIMEOUT_MS)"));
    // The engine fails it at once unless it is inside a collective, which is bounded by the
    // same timeout.
    while (engine::WaitHandle(h, std::numeric_limits<int>::max()) == Code::kTimeout && !h.done()) {
    }
  }
  Status st = h.code == Code::kOk ? Status::Ok() : Status(h.code, h.message);
  if (handle) {
    *handle = std::move(owned);
  } else {
    engine::ReleaseHandle(raw);
  }
  return st;
}

Status Runtime::Allreduce(const void* send, void* recv, size_t count, ringrun_dtype dtype,
                          ringrun_op op, void* stream) {
  engine::TensorArgs e;
  e.kind = engine::Kind::kAllreduce;
  e.dtype = dtype, e.op = op, e.count = count;
  e.send = send, e.recv = recv, e.stream = stream;
  return SubmitAndWait({}, e);
}

Status Runtime::Broadcast(void* buf, size_t count, ringrun_dtype dtype, int root, void* stream) {
  engine::TensorArgs e;
  e.kind = engine::Kind::kBroadcast;
  e.dtype = dtype, e.count = count, e.root = root;
  e.send = buf, e.recv = buf, e.stream = stream;
  return SubmitAndWait({}, e);
}

Status Runtime::Allgather(const void* send, void* recv, size_t count, ringrun_dtype dtype,
                          void* stream) {
  engine::TensorArgs e;
  e.kind = engine::Kind::kAllgather;
  e.dtype = dtype, e.count = count, e.row_elems = 1, e.fixed = true;
  e.send = send, e.recv = recv, e.stream = stream;
  return SubmitAndWait({}, e);
}

Status Runtime::ReduceScatter(const void* send, void* recv, size_t recvcount, ringrun_dtype dtype,
                              ringrun_op op) {
  engine::TensorArgs e;
  e.kind = engine::Kind::kReduceScatter;
  e.dtype = dtype, e.op = op, e.count = recvcount;
  e.send = send, e.recv = recv;
  return SubmitAndWait({}, e);
}

Status Runtime::Alltoall(const void* send, void* recv, size_t count_per_rank, ringrun_dtype dtype) {
  engine::TensorArgs e;
  e.kind = engine::Kind::kAlltoall;
  e.dtype = dtype, e.count = count_per_rank, e.row_elems = 1, e.fixed = true;
  const std::vector<uint64_t> send_rows(shape_.size, count_per_rank);
  e.send_rows = send_rows.data();
  e.send = send, e.recv = recv;
  return SubmitAndWait({}, e);
}

Status Runtime::Barrier() {
  engine::TensorArgs e;
  e.kind = engine::Kind::kBarrier;
  return SubmitAndWait({}, e);
}

}  // namespace ringrun::runtime

// The rendezvous seam: joining through a store (ranks as threads over one MemoryStore, real
// loopback sockets), the C callbacks' adapter, and the refusal to run another launcher's job
// as size 1.
#include "runtime/src/rendezvous/store.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <map>
#include <thread>

#include "runtime/src/rendezvous/callback_store.h"
#include "runtime/src/rendezvous/foreign_job.h"
#include "runtime/src/rendezvous/pmix_store.h"
#include "runtime/src/rendezvous/store_job_client.h"
#include "runtime/src/runtime.h"

namespace ringrun::runtime::rendezvous {
namespace {

std::function<const char*(const char*)> Env(std::map<std::string, std::string> m) {
  auto shared = std::make_shared<std::map<std::string, std::string>>(std::move(m));
  return [shared](const char* n) -> const char* {
    auto it = shared->find(n);
    return it == shared->end() ? nullptr : it->second.c_str();
  };
}

bool Has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

struct RankResult {
  Status status;
  Shape shape;
  std::string secret;
  int64_t sum = 0;
};

// Joins rank `rank` of `size` through `store` as ringrun_init_with_store does, then allreduces
// rank + 1.
RankResult JoinAndSum(Store& store, int rank, int size, const std::string& address,
                      int join_timeout_ms = 10000) {
  RankResult out;
  JobEnv env;
  env.in_job = true, env.rank = rank, env.size = size, env.host_addr = address;
  env.timeout_ms = 10000, env.join_timeout_ms = join_timeout_ms;
  env.source = "a test's store";
  Result<std::string> secret = ShareSecret(store, rank, env.generation, join_timeout_ms);
  if (!secret.ok()) {
    out.status = secret.status();
    return out;
  }
  env.secret = out.secret = *secret;
  std::unique_ptr<JobClient> client = MakeStoreJobClient(store);
  Result<std::unique_ptr<Runtime>> rt = Runtime::Join(env, client.get());
  if (!rt.ok()) {
    out.status = rt.status();
    return out;
  }
  out.shape = (*rt)->shape();
  out.sum = rank + 1;
  out.status = (*rt)->Allreduce(&out.sum, &out.sum, 1, RINGRUN_INT64, RINGRUN_SUM);
  return out;
}

// Every rank of `addresses` (one per rank; null entries do not come) on its own thread.
std::vector<RankResult> RunRanks(Store& store, const std::vector<const char*>& addresses,
                                 int join_timeout_ms = 10000, std::vector<int> sizes = {}) {
  const int n = static_cast<int>(addresses.size());
  std::vector<RankResult> results(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    if (addresses[r] == nullptr) continue;
    const int size = sizes.empty() ? n : sizes[r];
    threads.emplace_back(
        [&, r, size] { results[r] = JoinAndSum(store, r, size, addresses[r], join_timeout_ms); });
  }
  for (auto& t : threads) t.join();
  return results;
}

// A fake of PMIx's data model (pmix_store.h): one process's view, in which a value lives under
// the rank that set it and a get asks the rank that SetterOf names.
class PerProcessStore final : public Store {
 public:
  PerProcessStore(MemoryStore& shared, int rank) : shared_(shared), rank_(rank) {}
  Status Set(const std::string& key, const std::string& value) override {
    return shared_.Set(std::to_string(rank_) + ":" + key, value);
  }
  Result<std::string> Get(const std::string& key, int timeout_ms) override {
    return shared_.Get(std::to_string(SetterOf(key)) + ":" + key, timeout_ms);
  }
  Status Wait(const std::vector<std::string>& keys, int timeout_ms) override {
    for (const std::string& key : keys) RINGRUN_RETURN_IF_ERROR(Get(key, timeout_ms).status());
    return Status::Ok();
  }
  Result<int64_t> Add(const std::string& key, int64_t) override {
    return InvalidArgument("add to '" + key + "'");
  }

 private:
  MemoryStore& shared_;
  const int rank_;
};

}  // namespace

TEST_CASE("ranks join through a store: one secret, hosts by address, then an allreduce",
          "[store]") {
  MemoryStore store;
  std::vector<RankResult> r =
      RunRanks(store, {"127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.2", "127.0.0.2"});
  const int local_rank[] = {0, 1, 0, 1, 2}, local_size[] = {2, 2, 3, 3, 3};
  for (int i = 0; i < 5; ++i) {
    INFO("rank " << i << ": " << r[i].status.ToString());
    REQUIRE(r[i].status.ok());
    CHECK(r[i].sum == 15);
    CHECK(r[i].secret == r[0].secret);
    CHECK(r[i].shape.rank == i);
    CHECK(r[i].shape.size == 5);
    CHECK(r[i].shape.local_rank == local_rank[i]);
    CHECK(r[i].shape.local_size == local_size[i]);
    CHECK(r[i].shape.cross_rank == (i < 2 ? 0 : 1));
    CHECK(r[i].shape.cross_size == 2);
  }
  CHECK(r[0].secret.size() == 64);
}

TEST_CASE("each store key is read from the rank that sets it (PMIx's model), without add",
          "[store][pmix]") {
  CHECK(SetterOf("ringrun/0/join/3") == 3);
  CHECK(SetterOf("ringrun/7/join/0") == 0);
  CHECK(SetterOf("ringrun/0/secret") == 0);
  CHECK(SetterOf("ringrun/2/peers") == 0);
  CHECK(SetterOf("ringrun/0/join/3x") == 0);
  CHECK(SetterOf("other/0/join/3") == 0);

  MemoryStore shared;
  std::vector<PerProcessStore> views;
  for (int r = 0; r < 4; ++r) views.emplace_back(shared, r);
  std::vector<RankResult> results(4);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back(
        [&, r] { results[r] = JoinAndSum(views[r], r, 4, r < 2 ? "127.0.0.1" : "127.0.0.2"); });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r << ": " << results[r].status.ToString());
    REQUIRE(results[r].status.ok());
    CHECK(results[r].sum == 10);
    CHECK(results[r].secret == results[0].secret);
    CHECK(results[r].shape.local_size == 2);
  }
}

TEST_CASE(
    "a PMIx launcher is recognized, RINGRUN_RANK wins over it, and a PMIx server that "
    "cannot be joined is named in the refusal",
    "[store][pmix]") {
  CHECK_FALSE(PmixLauncher(Env({})));
  CHECK_FALSE(PmixLauncher(Env({{"PMIX_RANK", "1"}})));
  CHECK_FALSE(PmixLauncher(Env({{"PMIX_RANK", "1"}, {"PMIX_NAMESPACE", ""}})));
  CHECK(PmixLauncher(Env({{"PMIX_RANK", "1"}, {"PMIX_NAMESPACE", "ns"}})) == "a PMIx launcher");
  CHECK(PmixLauncher(
            Env({{"PMIX_RANK", "1"}, {"PMIX_NAMESPACE", "ns"}, {"OMPI_COMM_WORLD_SIZE", "4"}})) ==
        "mpirun (Open MPI)");
  CHECK(PmixLauncher(Env({{"PMIX_RANK", "1"},
                          {"PMIX_NAMESPACE", "slurm.pmix.7.0"},
                          {"SLURM_PROCID", "1"},
                          {"SLURM_STEP_ID", "0"}})) == "srun (Slurm)");

  const std::map<std::string, std::string> mpirun = {{"OMPI_COMM_WORLD_SIZE", "4"},
                                                     {"OMPI_COMM_WORLD_RANK", "1"},
                                                     {"PMIX_RANK", "1"},
                                                     {"PMIX_NAMESPACE", "1234"}};
  Result<JobEnv> under_mpirun = ReadJobEnv(Env(mpirun));
  REQUIRE(under_mpirun.ok());
  CHECK_FALSE(under_mpirun->in_job);
  CHECK(under_mpirun->pmix_launcher == "mpirun (Open MPI)");
  // What is refused when PMIx cannot be joined (ringrun_init's JoinPmix).
  REQUIRE(under_mpirun->foreign);
  const std::string m =
      RefuseForeignJob(*under_mpirun->foreign, "PMIx_Init: UNREACHABLE").message();
  INFO(m);
  CHECK(Has(m, "one of 4 processes started by mpirun (Open MPI)"));
  CHECK(Has(m, "(its PMIx server could not be joined: PMIx_Init: UNREACHABLE)"));
  CHECK(Has(m, "ringrun -np 4"));

  std::map<std::string, std::string> under_ringrun = mpirun;
  under_ringrun["RINGRUN_RANK"] = "0";
  under_ringrun["RINGRUN_SIZE"] = "1";
  Result<JobEnv> ringrun = ReadJobEnv(Env(under_ringrun));
  REQUIRE(ringrun.ok());
  CHECK(ringrun->in_job);
  CHECK(ringrun->pmix_launcher.empty());
  CHECK_FALSE(ringrun->foreign);

  // srun without --mpi=pmix: no PMIx to join, refused with the way to start it.
  Result<JobEnv> srun = ReadJobEnv(
      Env({{"SLURM_PROCID", "1"}, {"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "2"}}));
  REQUIRE(srun.ok());
  CHECK(srun->pmix_launcher.empty());
  REQUIRE(srun->foreign);
  CHECK(Has(RefuseForeignJob(*srun->foreign).message(), "srun --mpi=pmix -n 2"));
}

TEST_CASE("a PMIx rank's data-plane address: loopback on one node, else a routable one",
          "[store][pmix]") {
  PmixJob one_node;
  one_node.size = 4, one_node.local_size = 4;
  CHECK(PmixHostAddress(one_node).value() == "127.0.0.1");
  PmixJob nodes;
  nodes.size = 4, nodes.local_size = 2, nodes.rank0_host = "localhost";
  Result<std::string> addr = PmixHostAddress(nodes);
  INFO(addr.status().ToString());
  if (addr.ok()) {
    CHECK(addr->rfind("127.", 0) != 0);  // rank 0's loopback name is no address for the others
  } else {
    CHECK(Has(addr.status().message(), "RINGRUN_HOST_ADDR"));  // a host with loopback only
  }
}

TEST_CASE("a rank that never joins a store is named by rank 0, and the others fail with that",
          "[store]") {
  MemoryStore store;
  std::vector<RankResult> r =
      RunRanks(store, {"127.0.0.1", "127.0.0.1", nullptr, nullptr}, /*join_timeout_ms=*/300);
  INFO(r[0].status.ToString() << "\n" << r[1].status.ToString());
  CHECK(r[0].status.code() == Code::kTimeout);
  CHECK(Has(r[0].status.message(), "ranks 2, 3 (of 4) did not join"));
  CHECK(r[1].status.code() == Code::kTimeout);
  CHECK(Has(r[1].status.message(), "rank 0: ranks 2, 3 (of 4) did not join"));
}

TEST_CASE("without rank 0 the others fail at the join timeout naming rank 0", "[store]") {
  MemoryStore store;
  const auto start = std::chrono::steady_clock::now();
  std::vector<RankResult> r = RunRanks(store, {nullptr, "127.0.0.1"}, 200);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  INFO(r[1].status.ToString());
  CHECK(r[1].status.code() == Code::kTimeout);
  CHECK(Has(r[1].status.message(), "rank 0 did not share the job's secret"));
}

TEST_CASE("ranks of a store join that disagree on the size fail", "[store]") {
  MemoryStore store;
  std::vector<RankResult> r = RunRanks(store, {"127.0.0.1", "127.0.0.1"}, 2000, {2, 3});
  INFO(r[0].status.ToString() << "\n" << r[1].status.ToString());
  CHECK(r[0].status.code() == Code::kInvalidArgument);
  CHECK(Has(r[0].status.message(), "rank 1 believes the job has 3 ranks"));
  CHECK_FALSE(r[1].status.ok());
}

TEST_CASE("two processes with one rank: the one not in the peer table fails", "[store]") {
  MemoryStore store;
  RankResult results[3];
  std::thread t0([&] { results[0] = JoinAndSum(store, 0, 2, "127.0.0.1"); });
  std::thread t1([&] { results[1] = JoinAndSum(store, 1, 2, "127.0.0.1"); });
  std::thread t2([&] { results[2] = JoinAndSum(store, 1, 2, "127.0.0.1"); });
  t0.join(), t1.join(), t2.join();
  INFO(results[1].status.ToString() << "\n" << results[2].status.ToString());
  CHECK(results[0].status.ok());
  CHECK(results[1].status.ok() != results[2].status.ok());
  const Status& failed = results[1].status.ok() ? results[2].status : results[1].status;
  CHECK(failed.code() == Code::kInvalidArgument);
  CHECK(Has(failed.message(), "another process joined as rank 1"));
}

TEST_CASE("each round of a store's rendezvous has its own secret and keys", "[store]") {
  MemoryStore store;
  Result<std::string> first = ShareSecret(store, 0, 0, 100);
  Result<std::string> second = ShareSecret(store, 0, 1, 100);
  REQUIRE(first.ok());
  REQUIRE(second.ok());
  CHECK(*first != *second);
  CHECK(*ShareSecret(store, 1, 0, 100) == *first);
  CHECK(*ShareSecret(store, 1, 1, 100) == *second);
  CHECK(ShareSecret(store, 1, 2, 50).status().code() == Code::kTimeout);
}

namespace {
// C callbacks over a MemoryStore, as a caller of ringrun_init_with_store writes them.
struct CStore {
  MemoryStore store;
  std::string error;
  int gets = 0;
};
ringrun_status FromStatus(CStore* c, const Status& st) {
  c->error = st.message();
  return static_cast<ringrun_status>(st.code());
}
ringrun_store Callbacks(CStore* c) {
  ringrun_store s{};
  s.context = c;
  s.set = [](void* ctx, const char* key, const void* value, size_t size) {
    auto* c = static_cast<CStore*>(ctx);
    return FromStatus(c, c->store.Set(key, std::string(static_cast<const char*>(value), size)));
  };
  s.get = [](void* ctx, const char* key, int timeout_ms, void* buffer, size_t capacity,
             size_t* size) {
    auto* c = static_cast<CStore*>(ctx);
    ++c->gets;
    Result<std::string> v = c->store.Get(key, timeout_ms);
    if (!v.ok()) return FromStatus(c, v.status());
    *size = v->size();
    std::memcpy(buffer, v->data(), std::min(capacity, v->size()));
    return RINGRUN_OK;
  };
  s.wait = [](void* ctx, const char* const* keys, size_t count, int timeout_ms) {
    auto* c = static_cast<CStore*>(ctx);
    return FromStatus(c, c->store.Wait(std::vector<std::string>(keys, keys + count), timeout_ms));
  };
  s.add = [](void* ctx, const char* key, int64_t delta, int64_t* result) {
    auto* c = static_cast<CStore*>(ctx);
    Result<int64_t> v = c->store.Add(key, delta);
    if (v.ok()) *result = *v;
    return FromStatus(c, v.status());
  };
  s.last_error = [](void* ctx) { return static_cast<CStore*>(ctx)->error.c_str(); };
  return s;
}
}  // namespace

TEST_CASE("a store over C callbacks: values of any size, codes and the caller's reason",
          "[store]") {
  CStore c;
  ringrun_store callbacks = Callbacks(&c);
  REQUIRE(CallbackStore::Valid(callbacks));
  CallbackStore store(callbacks);
  const std::string big(1000, 'x');
  REQUIRE(store.Set("k", big).ok());
  Result<std::string> got = store.Get("k", 100);
  REQUIRE(got.ok());
  CHECK(*got == big);
  CHECK(c.gets == 2);  // the second with a buffer of the value's size
  REQUIRE(store.Set("empty", "").ok());
  CHECK(store.Get("empty", 100).value().empty());
  CHECK(*store.Add("n", 2) == 2);
  CHECK(*store.Add("n", 3) == 5);
  CHECK(store.Wait({"k", "n"}, 100).ok());
  Status missing = store.Get("nothing", 20).status();
  CHECK(missing.code() == Code::kTimeout);
  CHECK(Has(missing.message(), "store get 'nothing' failed: memory store: key 'nothing'"));
  callbacks.add = nullptr;
  CHECK_FALSE(CallbackStore::Valid(callbacks));
}

TEST_CASE("another launcher's job of several processes is detected", "[store]") {
  CHECK_FALSE(DetectForeignJob(Env({})));
  CHECK_FALSE(DetectForeignJob(Env({{"WORLD_SIZE", "1"}, {"RANK", "0"}})));
  CHECK_FALSE(DetectForeignJob(Env({{"OMPI_COMM_WORLD_SIZE", "1"}, {"PMIX_RANK", "0"}})));
  CHECK_FALSE(DetectForeignJob(Env({{"PMIX_RANK", "0"}})));
  // A batch script of an allocation of 4 tasks is not a step.
  CHECK_FALSE(DetectForeignJob(Env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}})));
  CHECK_FALSE(DetectForeignJob(Env({{"WORLD_SIZE", "two"}})));

  auto torch = DetectForeignJob(Env({{"WORLD_SIZE", "2"}, {"RANK", "1"}, {"LOCAL_RANK", "1"}}));
  REQUIRE(torch);
  CHECK(Has(torch->launcher, "torchrun"));
  CHECK(torch->size == 2);
  CHECK(torch->seen == std::vector<std::string>{"WORLD_SIZE=2", "RANK=1", "LOCAL_RANK=1"});
  CHECK(Has(torch->advice, "(MASTER_ADDR, MASTER_PORT not set here)"));

  auto hvd = DetectForeignJob(Env({{"HOROVOD_SIZE", "4"}, {"HOROVOD_RANK", "3"}}));
  REQUIRE(hvd);
  CHECK(hvd->launcher == "horovodrun");
  CHECK(hvd->seen == std::vector<std::string>{"HOROVOD_SIZE=4", "HOROVOD_RANK=3"});

  auto ompi = DetectForeignJob(
      Env({{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_RANK", "0"}, {"PMIX_RANK", "0"}}));
  REQUIRE(ompi);
  CHECK(ompi->launcher == "mpirun (Open MPI)");
  CHECK(ompi->size == 4);

  auto srun = DetectForeignJob(Env({{"SLURM_PROCID", "2"},
                                    {"SLURM_STEP_ID", "0"},
                                    {"SLURM_NTASKS", "8"},
                                    {"SLURM_STEP_NUM_TASKS", "4"}}));
  REQUIRE(srun);
  CHECK(srun->launcher == "srun (Slurm)");
  CHECK(srun->size == 4);
  CHECK(Has(srun->advice, "srun --mpi=pmix -n 4"));

  auto pmix = DetectForeignJob(Env({{"PMIX_RANK", "3"}}));
  REQUIRE(pmix);
  CHECK(pmix->size == -1);
  CHECK(Has(RefuseForeignJob(*pmix).message(), "one of several processes started by a PMIx"));

  // torchrun inside an srun step is torchrun's job.
  auto nested = DetectForeignJob(Env({{"WORLD_SIZE", "8"},
                                      {"RANK", "5"},
                                      {"MASTER_ADDR", "n1"},
                                      {"MASTER_PORT", "29500"},
                                      {"SLURM_PROCID", "1"},
                                      {"SLURM_STEP_ID", "0"},
                                      {"SLURM_NTASKS", "2"}}));
  REQUIRE(nested);
  CHECK(Has(nested->launcher, "torchrun"));
  CHECK_FALSE(Has(nested->advice, "not set here"));
}

TEST_CASE("ringrun_init's join refuses another launcher's job and runs a single process",
          "[store]") {
  Result<JobEnv> torch = ReadJobEnv(Env({{"WORLD_SIZE", "2"}, {"RANK", "0"}}));
  REQUIRE(torch.ok());
  Result<std::unique_ptr<Runtime>> refused = Runtime::Join(*torch, nullptr);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == Code::kInvalidArgument);
  const std::string& m = refused.status().message();
  INFO(m);
  CHECK(Has(m, "one of 2 processes started by torchrun"));
  CHECK(Has(m, "(WORLD_SIZE=2 RANK=0)"));
  CHECK(Has(m, "will not run as a job of size 1"));
  CHECK(Has(m, "ringrun_init_with_store"));
  CHECK(Has(m, "ringrun -np 2"));

  for (const auto& single : {std::map<std::string, std::string>{},
                             std::map<std::string, std::string>{{"WORLD_SIZE", "1"}}}) {
    Result<JobEnv> env = ReadJobEnv(Env(single));
    REQUIRE(env.ok());
    Result<std::unique_ptr<Runtime>> rt = Runtime::Join(*env, nullptr);
    REQUIRE(rt.ok());
    CHECK((*rt)->shape().size == 1);
  }
  // Under ringrun, the torchrun-style variables it sets are its own.
  Result<JobEnv> ours = ReadJobEnv(Env(
      {{"RINGRUN_RANK", "0"}, {"RINGRUN_SIZE", "1"}, {"WORLD_SIZE", "1"}, {"HOROVOD_SIZE", "1"}}));
  REQUIRE(ours.ok());
  CHECK_FALSE(ours->foreign);
  CHECK(ReadJobEnv(Env({{"RINGRUN_JOIN_TIMEOUT_MS", "1500"}}))->join_timeout_ms == 1500);
  CHECK(ReadJobEnv(Env({{"RINGRUN_JOIN_TIMEOUT_MS", "0"}})).status().code() ==
        Code::kInvalidArgument);
}

}  // namespace ringrun::runtime::rendezvous

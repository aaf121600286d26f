// --check-build's text and --check-gpu's parsing and table, in both build configurations.
#include "launcher/check_gpu.h"

#include <catch2/catch.hpp>
#include <chrono>

#include "launcher/check_build.h"
#include "ringrun/common/gpu_info.h"
#include "ringrun/gpu/config.h"

using namespace ringrun::launcher;

TEST_CASE("check-build lists the version, backends and libraries", "[check_build]") {
  const std::string text = CheckBuildText();
  CHECK_THAT(text, Catch::StartsWith("ringrun v"));
  CHECK_THAT(text, Catch::Contains("[X] CPU TCP") && Catch::Contains("[X] CPU shared memory"));
  CHECK_THAT(text, Catch::Contains("libssh") && Catch::Contains("gRPC") &&
                       Catch::Contains("Protobuf") && Catch::Contains("CUDA runtime"));
#if RINGRUN_HAVE_NCCL
  CHECK_THAT(text, Catch::Contains("[X] NCCL 2."));
  CHECK_THAT(text, !Catch::Contains("CUDA runtime    none"));
#else
  CHECK_THAT(text, Catch::Contains("[ ] NCCL"));
  CHECK_THAT(text, Catch::Contains("none (built without CUDA)"));
#endif
}

TEST_CASE("a probe line without devices is a failing row that says why", "[check_gpu]") {
  GpuHostReport rep;
  rep.host = "node1";
  REQUIRE(ParseGpuProbeLine(
      R"J({"hostname":"vm","ok":false,"driver_version":"none","runtime_version":"13.0",)J"
      R"J("nccl_version":"2.28.9","error":"no CUDA driver: CUDA driver version is insufficient for CUDA runtime version (cudaError 35)","devices":[]})J",
      &rep));
  CHECK(rep.reported);
  CHECK_FALSE(rep.ok);
  CHECK(rep.runtime_version == "13.0");
  CHECK_THAT(rep.error, Catch::StartsWith("no CUDA driver: CUDA driver version is insufficient"));
  const std::string table = FormatGpuTable({rep}, "");
  CHECK_THAT(table, Catch::StartsWith("HOST"));
  CHECK_THAT(table, Catch::Contains("node1") && Catch::Contains("FAIL") &&
                        Catch::Contains("no CUDA driver: "));
}

TEST_CASE("a probe line with devices is a passing row listing them", "[check_gpu]") {
  GpuHostReport rep;
  rep.host = "gpu7";
  REQUIRE(ParseGpuProbeLine(
      R"J({"hostname":"gpu7","ok":true,"driver_version":"13.0","runtime_version":"13.0",)J"
      R"J("nccl_version":"2.28.9","error":"","devices":[)J"
      R"J({"index":0,"name":"NVIDIA H200","memory_bytes":150754820096,"compute_capability":"9.0","pci_bus_id":"0000:19:00.0"},)J"
      R"J({"index":1,"name":"NVIDIA H200","memory_bytes":150754820096,"compute_capability":"9.0","pci_bus_id":"0000:3B:00.0"}]})J",
      &rep));
  CHECK(rep.ok);
  REQUIRE(rep.devices.size() == 2);
  CHECK(rep.devices[1].pci_bus_id == "0000:3B:00.0");
  const std::string table = FormatGpuTable({rep}, "OK 12.34 GB/s (np=2, 0 wrong)");
  CHECK_THAT(table, Catch::Contains("ALLREDUCE") && Catch::Contains("12.34 GB/s"));
  CHECK_THAT(table,
             Catch::Contains("2x NVIDIA H200 (140.4 GiB, cc 9.0) at 0000:19:00.0, 0000:3B:00.0"));
}

TEST_CASE("anything else is not a probe report", "[check_gpu]") {
  GpuHostReport rep;
  CHECK_FALSE(ParseGpuProbeLine("Segmentation fault", &rep));
  CHECK_FALSE(ParseGpuProbeLine(R"J({"op":"allreduce"})J", &rep));
  CHECK_FALSE(rep.reported);
  CHECK_THAT(rep.error, Catch::Contains("not a ringrun-gpu-probe report"));
}

TEST_CASE("the probe library describes every GPU, or names why there is none", "[check_gpu]") {
  ringrun::GpuHostInfo info = ringrun::ProbeGpus();
#if RINGRUN_HAVE_NCCL
  CHECK(info.build.cuda_runtime_version > 0);
  CHECK(info.build.nccl_runtime_version > 0);
#endif
  if (info.devices.empty()) {
    CHECK_FALSE(info.error.empty());
    return;
  }
  // A machine with a GPU: a driver, no error, and each device named and sized.
  CHECK(info.error.empty());
  CHECK(info.driver_version > 0);
  for (size_t i = 0; i < info.devices.size(); ++i) {
    const ringrun::GpuDeviceInfo& d = info.devices[i];
    INFO("device " << i << ": " << d.name << " at " << d.pci_bus_id);
    CHECK(d.index == static_cast<int>(i));
    CHECK_FALSE(d.name.empty());
    CHECK(d.total_memory_bytes > 0);
    CHECK(d.cc_major >= 3);
    CHECK(d.pci_bus_id.size() >= 12);  // "0000:19:00.0"
  }
}

// A real --check-gpu job on this machine (local agent, real probe). Hidden from the unit run;
// CTest runs it as gpu_check_gpu_local (label integration).
TEST_CASE("check-gpu on this host: 0 with a GPU, 1 within 10 s without", "[.][check_gpu_job]") {
  const bool has_gpu = !ringrun::ProbeGpus().devices.empty();
  Options options;
  hosts::HostSpec local;
  local.name = "localhost";
  options.hosts = {local};
  options.np = 1;
  options.check_gpu = true;
  auto starter = starters::MakeLocalAgentStarter();
  job::Starters starters;
  starters.local = starter.get();
  const auto start = std::chrono::steady_clock::now();
  const int rc = RunCheckGpu(options, starters);
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(rc == (has_gpu ? 0 : 1));
  if (!has_gpu) CHECK(took < std::chrono::seconds(10));
}

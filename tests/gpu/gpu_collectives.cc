// Allreduce (every op), broadcast and allgather on CUDA device memory, for every dtype, in place
// and out of place, through the public C API; then the engine's device path: named device
// allreduces submitted in a different order on every rank, fused named allreduces with scale
// factors, reducescatter, alltoall with splits, ragged allgather (results in device memory
// owned by the handle) and the stream-ordered calls on a program's own stream. Run it under
// ringrun (scripts/gpu-check.sh runs it at np=2 on one GPU with a distinct NCCL_HOSTID per
// rank), or alone as a job of size 1. `gpu_collectives engine` runs only the engine's checks.
// Exits 0 when every check passed, 1 on a wrong result or a failed call, 77 without a device.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ringrun/names.h"
#include "ringrun/ringrun.h"

namespace {

const ringrun_dtype kDtypes[] = {RINGRUN_INT8,     RINGRUN_UINT8,   RINGRUN_INT16,
                                 RINGRUN_INT32,    RINGRUN_INT64,   RINGRUN_FLOAT16,
                                 RINGRUN_BFLOAT16, RINGRUN_FLOAT32, RINGRUN_FLOAT64};
const ringrun_op kOps[] = {RINGRUN_SUM, RINGRUN_AVERAGE, RINGRUN_MIN, RINGRUN_MAX, RINGRUN_PRODUCT};
const size_t kCounts[] = {1, 1027, (size_t{1} << 20) + 3};

bool IsFloat(ringrun_dtype t) {
  return t == RINGRUN_FLOAT16 || t == RINGRUN_BFLOAT16 || t == RINGRUN_FLOAT32 ||
         t == RINGRUN_FLOAT64;
}

// IEEE half from a float that is exactly representable (small integers and halves here).
uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  const int exp = static_cast<int>((x >> 23) & 0xff) - 127 + 15;
  const uint32_t mant = x & 0x7fffff;
  if ((x & 0x7fffffff) == 0) return static_cast<uint16_t>(sign);
  if (exp <= 0 || exp >= 31) return static_cast<uint16_t>(sign | 0x7c00);  // not used here
  return static_cast<uint16_t>(sign | (exp << 10) | (mant >> 13));
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const int exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  uint32_t x;
  if (exp == 0 && mant == 0) {
    x = sign;
  } else if (exp == 0) {  // subnormal
    float f = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -f : f;
  } else if (exp == 31) {
    x = sign | 0x7f800000 | (mant << 13);
  } else {
    x = sign | (static_cast<uint32_t>(exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

void Encode(ringrun_dtype t, double v, void* dst) {
  switch (t) {
    case RINGRUN_INT8:
      *static_cast<int8_t*>(dst) = static_cast<int8_t>(v);
      break;
    case RINGRUN_UINT8:
      *static_cast<uint8_t*>(dst) = static_cast<uint8_t>(v);
      break;
    case RINGRUN_INT16:
      *static_cast<int16_t*>(dst) = static_cast<int16_t>(v);
      break;
    case RINGRUN_INT32:
      *static_cast<int32_t*>(dst) = static_cast<int32_t>(v);
      break;
    case RINGRUN_INT64:
      *static_cast<int64_t*>(dst) = static_cast<int64_t>(v);
      break;
    case RINGRUN_FLOAT16:
      *static_cast<uint16_t*>(dst) = FloatToHalf(static_cast<float>(v));
      break;
    case RINGRUN_BFLOAT16: {
      float f = static_cast<float>(v);
      uint32_t x;
      std::memcpy(&x, &f, 4);
      *static_cast<uint16_t*>(dst) = static_cast<uint16_t>(x >> 16);
      break;
    }
    case RINGRUN_FLOAT32:
      *static_cast<float*>(dst) = static_cast<float>(v);
      break;
    case RINGRUN_FLOAT64:
      *static_cast<double*>(dst) = v;
      break;
    case RINGRUN_DTYPE_MIN_ENUM_:
    case RINGRUN_DTYPE_MAX_ENUM_:
      break;
  }
}

double Decode(ringrun_dtype t, const void* src) {
  switch (t) {
    case RINGRUN_INT8:
      return *static_cast<const int8_t*>(src);
    case RINGRUN_UINT8:
      return *static_cast<const uint8_t*>(src);
    case RINGRUN_INT16:
      return *static_cast<const int16_t*>(src);
    case RINGRUN_INT32:
      return *static_cast<const int32_t*>(src);
    case RINGRUN_INT64:
      return static_cast<double>(*static_cast<const int64_t*>(src));
    case RINGRUN_FLOAT16:
      return HalfToFloat(*static_cast<const uint16_t*>(src));
    case RINGRUN_BFLOAT16: {
      uint32_t x = static_cast<uint32_t>(*static_cast<const uint16_t*>(src)) << 16;
      float f;
      std::memcpy(&f, &x, 4);
      return f;
    }
    case RINGRUN_FLOAT32:
      return *static_cast<const float*>(src);
    case RINGRUN_FLOAT64:
      return *static_cast<const double*>(src);
    case RINGRUN_DTYPE_MIN_ENUM_:
    case RINGRUN_DTYPE_MAX_ENUM_:
      break;
  }
  return NAN;
}

// Rank r's element i: small integers, so that every result is exact in every dtype at np <= 2
// (int8 products stay below 127, half and bfloat16 averages are multiples of 1/2).
double Value(int rank, size_t i) { return static_cast<double>(i % 5) + rank + 1; }

double Expected(ringrun_op op, int size, size_t i) {
  double acc = Value(0, i);
  for (int r = 1; r < size; ++r) {
    const double v = Value(r, i);
    switch (op) {
      case RINGRUN_SUM:
      case RINGRUN_AVERAGE:
        acc += v;
        break;
      case RINGRUN_MIN:
        acc = std::min(acc, v);
        break;
      case RINGRUN_MAX:
        acc = std::max(acc, v);
        break;
      case RINGRUN_PRODUCT:
        acc *= v;
        break;
      case RINGRUN_OP_MIN_ENUM_:
      case RINGRUN_OP_MAX_ENUM_:
        break;
    }
  }
  return op == RINGRUN_AVERAGE ? acc / size : acc;
}

struct Checker {
  int rank = 0;
  int checks = 0;
  int failures = 0;

  void Fail(const std::string& what) {
    ++failures;
    if (failures <= 20) std::fprintf(stderr, "rank %d: FAIL %s\n", rank, what.c_str());
  }
  bool Cuda(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return true;
    Fail(std::string(what) + ": " + cudaGetErrorString(e));
    return false;
  }
  bool Call(int rc, const std::string& what) {
    ++checks;
    if (rc == 0) return true;
    Fail(what + ": " + ringrun_error_message());
    return false;
  }
  // Compares n device elements with want(i); reports the first mismatch.
  template <typename Want>
  void Compare(const std::string& what, ringrun_dtype t, const void* dev, size_t n, Want want) {
    const size_t es = ringrun_dtype_size(t);
    std::vector<unsigned char> host(n * es);
    if (!Cuda(cudaMemcpy(host.data(), dev, host.size(), cudaMemcpyDeviceToHost), "cudaMemcpy D2H"))
      return;
    for (size_t i = 0; i < n; ++i) {
      const double got = Decode(t, host.data() + i * es);
      const double w = want(i);
      if (got != w) {
        char buf[160];
        std::snprintf(buf, sizeof(buf), "%s: element %zu is %g, expected %g", what.c_str(), i, got,
                      w);
        Fail(buf);
        return;
      }
    }
  }
};

void* DeviceFill(Checker& c, ringrun_dtype t, size_t n, double (*value)(int, size_t), int rank,
                 size_t alloc_n) {
  const size_t es = ringrun_dtype_size(t);
  std::vector<unsigned char> host(alloc_n * es, 0);
  for (size_t i = 0; i < n; ++i) Encode(t, value(rank, i), host.data() + i * es);
  void* dev = nullptr;
  if (!c.Cuda(cudaMalloc(&dev, host.size()), "cudaMalloc")) return nullptr;
  c.Cuda(cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  return dev;
}

}  // namespace

// The engine's device checks beyond plain named allreduces.
void EngineDeviceChecks(Checker& c, int size) {
  const int me = c.rank;
  // Fused named allreduces with scale factors: a grouped AVERAGE with prescale 2 and postscale
  // 0.5 (the average itself), and SUM with prescale 0.5 in float16 and float32, as handles.
  {
    constexpr int kGroup = 8;
    constexpr size_t kLen = 1000;
    std::vector<void*> bufs(kGroup);
    std::vector<size_t> counts(kGroup);
    for (int k = 0; k < kGroup; ++k) {
      counts[k] = kLen + k;
      bufs[k] = DeviceFill(c, RINGRUN_FLOAT32, counts[k], Value, me, counts[k]);
    }
    ringrun_handle g = nullptr;
    if (c.Call(ringrun_grouped_allreduce_submit("engine.fused", kGroup, bufs.data(), bufs.data(),
                                                counts.data(), RINGRUN_FLOAT32, RINGRUN_AVERAGE,
                                                2.0, 0.5, 0, &g),
               "grouped allreduce submit") &&
        c.Call(ringrun_wait(g), std::string("engine.fused: ") + ringrun_handle_message(g))) {
      for (int k = 0; k < kGroup; ++k) {
        c.Compare("engine.fused." + std::to_string(k), RINGRUN_FLOAT32, bufs[k], counts[k],
                  [&](size_t i) { return Expected(RINGRUN_AVERAGE, size, i); });
      }
    }
    ringrun_release(g);
    for (void* b : bufs) cudaFree(b);
    // 2^20 + 3 elements too: with one rank, NCCL's own PreMulSum kernel leaves the last 3
    // unwritten unless the backend cuts the call (NcclOneRankPreMulSumSpan).
    for (size_t len : {kLen, (size_t{1} << 20) + 3}) {
      for (ringrun_dtype t : {RINGRUN_FLOAT16, RINGRUN_FLOAT32}) {
        const std::string name =
            std::string("engine.scaled.") + ringrun_dtype_name(t) + "." + std::to_string(len);
        void* b = DeviceFill(c, t, len, Value, me, len);
        ringrun_handle h = nullptr;
        if (c.Call(
                ringrun_allreduce_submit(name.c_str(), b, b, len, t, RINGRUN_SUM, 0.5, 1.0, 0, &h),
                name + " submit") &&
            c.Call(ringrun_wait(h), name + ": " + ringrun_handle_message(h))) {
          c.Compare(name, t, b, len,
                    [&](size_t i) { return 0.5 * Expected(RINGRUN_SUM, size, i); });
        }
        ringrun_release(h);
        cudaFree(b);
      }
    }
    // Scale factors with MAX on device memory: refused at submission, naming the op.
    void* b = DeviceFill(c, RINGRUN_FLOAT32, 4, Value, me, 4);
    ringrun_handle h = nullptr;
    ++c.checks;
    if (ringrun_allreduce_submit("engine.bad", b, b, 4, RINGRUN_FLOAT32, RINGRUN_MAX, 2.0, 1.0, 0,
                                 &h) == RINGRUN_OK ||
        std::strstr(ringrun_error_message(), "max") == nullptr) {
      c.Fail(std::string("scale factors with MAX were not refused: ") + ringrun_error_message());
      ringrun_release(h);
    }
    cudaFree(b);
  }
  // Reducescatter: named SUM and AVERAGE, and the blocking call in NCCL's in-place form.
  for (ringrun_op op : {RINGRUN_SUM, RINGRUN_AVERAGE}) {
    constexpr size_t kBlock = 513;
    const std::string name = std::string("engine.rs.") + ringrun_op_name(op);
    void* send = DeviceFill(c, RINGRUN_FLOAT32, kBlock * size, Value, me, kBlock * size);
    void* recv = DeviceFill(c, RINGRUN_FLOAT32, 0, Value, me, kBlock);
    ringrun_handle h = nullptr;
    if (c.Call(
            ringrun_reducescatter_submit(name.c_str(), send, recv, kBlock, RINGRUN_FLOAT32, op, &h),
            name + " submit") &&
        c.Call(ringrun_wait(h), name + ": " + ringrun_handle_message(h))) {
      c.Compare(name, RINGRUN_FLOAT32, recv, kBlock,
                [&](size_t i) { return Expected(op, size, me * kBlock + i); });
    }
    ringrun_release(h);
    cudaFree(send);
    cudaFree(recv);
  }
  {
    constexpr size_t kBlock = 100;
    float* buf = static_cast<float*>(
        DeviceFill(c, RINGRUN_FLOAT32, kBlock * size, Value, me, kBlock * size));
    if (buf != nullptr &&
        c.Call(ringrun_reducescatter(buf, buf + me * kBlock, kBlock, RINGRUN_FLOAT32, RINGRUN_SUM),
               "blocking reducescatter in place")) {
      c.Compare("reducescatter in place", RINGRUN_FLOAT32, buf + me * kBlock, kBlock,
                [&](size_t i) { return Expected(RINGRUN_SUM, size, me * kBlock + i); });
    }
    cudaFree(buf);
  }
  // Alltoall with splits: rank r sends j + 1 + r rows of 3 to rank j, values 100 r + j. The
  // result is device memory owned by the handle.
  {
    constexpr size_t kRow = 3;
    std::vector<size_t> splits(size);
    std::vector<float> host;
    for (int j = 0; j < size; ++j) {
      splits[j] = j + 1 + me;
      host.insert(host.end(), splits[j] * kRow, static_cast<float>(100 * me + j));
    }
    void* send = nullptr;
    ringrun_handle h = nullptr;
    if (c.Cuda(cudaMalloc(&send, host.size() * 4), "cudaMalloc") &&
        c.Cuda(cudaMemcpy(send, host.data(), host.size() * 4, cudaMemcpyHostToDevice), "H2D") &&
        c.Call(
            ringrun_alltoall_submit("engine.a2a", send, splits.data(), kRow, RINGRUN_FLOAT32, &h),
            "alltoall submit") &&
        c.Call(ringrun_wait(h), std::string("engine.a2a: ") + ringrun_handle_message(h))) {
      const void* out = nullptr;
      size_t n = 0;
      std::vector<size_t> rows(size);
      std::vector<double> want;
      for (int q = 0; q < size; ++q) {
        want.insert(want.end(), (me + 1 + q) * kRow, 100.0 * q + me);
      }
      if (c.Call(ringrun_handle_output(h, &out, &n), "alltoall output") &&
          c.Call(ringrun_handle_rows(h, rows.data(), rows.size()), "alltoall rows")) {
        ++c.checks;
        if (n != want.size()) c.Fail("alltoall: " + std::to_string(n) + " elements");
        for (int q = 0; q < size; ++q) {
          if (rows[q] != static_cast<size_t>(me + 1 + q)) c.Fail("alltoall rows");
        }
        if (n == want.size()) {
          c.Compare("engine.a2a", RINGRUN_FLOAT32, out, n, [&](size_t i) { return want[i]; });
        }
      }
    }
    ringrun_release(h);
    cudaFree(send);
  }
  // Ragged allgather: rank r sends r + 1 rows of 2.
  {
    void* send = DeviceFill(c, RINGRUN_FLOAT32, 2 * (me + 1), Value, me, 2 * (me + 1));
    ringrun_handle h = nullptr;
    if (send != nullptr &&
        c.Call(ringrun_allgather_submit("engine.ragged", send, me + 1, 2, RINGRUN_FLOAT32, &h),
               "ragged allgather submit") &&
        c.Call(ringrun_wait(h), std::string("engine.ragged: ") + ringrun_handle_message(h))) {
      const void* out = nullptr;
      size_t n = 0;
      std::vector<double> want;
      for (int q = 0; q < size; ++q) {
        for (size_t i = 0; i < 2 * static_cast<size_t>(q + 1); ++i) want.push_back(Value(q, i));
      }
      if (c.Call(ringrun_handle_output(h, &out, &n), "ragged allgather output")) {
        ++c.checks;
        if (n != want.size()) {
          c.Fail("ragged allgather: " + std::to_string(n) + " elements");
        } else {
          c.Compare("engine.ragged", RINGRUN_FLOAT32, out, n, [&](size_t i) { return want[i]; });
        }
      }
    }
    ringrun_release(h);
    cudaFree(send);
  }
  // The stream-ordered call on the program's own stream: the input is written on that stream
  // right before the call and read back on it right after, with no synchronization between.
  {
    constexpr size_t kLen = 1 << 16;
    cudaStream_t s = nullptr;
    void* buf = nullptr;
    std::vector<float> in(kLen), out(kLen, -1.0f);
    for (size_t i = 0; i < kLen; ++i) in[i] = static_cast<float>(Value(me, i));
    if (c.Cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate") &&
        c.Cuda(cudaMalloc(&buf, kLen * 4), "cudaMalloc") &&
        c.Cuda(cudaMemsetAsync(buf, 0, kLen * 4, s), "cudaMemsetAsync") &&
        c.Cuda(cudaMemcpyAsync(buf, in.data(), kLen * 4, cudaMemcpyHostToDevice, s), "H2D async") &&
        c.Call(ringrun_allreduce_on_stream(buf, buf, kLen, RINGRUN_FLOAT32, RINGRUN_SUM, s),
               "allreduce on stream") &&
        c.Cuda(cudaMemcpyAsync(out.data(), buf, kLen * 4, cudaMemcpyDeviceToHost, s),
               "D2H async") &&
        c.Cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize")) {
      ++c.checks;
      for (size_t i = 0; i < kLen; ++i) {
        if (out[i] != static_cast<float>(Expected(RINGRUN_SUM, size, i))) {
          c.Fail("allreduce on stream: element " + std::to_string(i) + " is " +
                 std::to_string(out[i]));
          break;
        }
      }
    }
    cudaFree(buf);
    if (s != nullptr) cudaStreamDestroy(s);
  }
}

int main(int argc, char** argv) {
  const bool engine_only = argc > 1 && std::strcmp(argv[1], "engine") == 0;
  int ndev = 0;
  cudaError_t e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev == 0) {
    std::printf("SKIP: no CUDA device (%s)\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  // The program chooses its device, as a training program would; the backend must keep it.
  const char* lr = std::getenv("RINGRUN_LOCAL_RANK");
  const int local_rank = lr != nullptr ? std::atoi(lr) : 0;
  cudaSetDevice(local_rank % ndev);
  if (ringrun_init() != 0) {
    std::fprintf(stderr, "ringrun_init: %s\n", ringrun_error_message());
    return 1;
  }
  Checker c;
  c.rank = ringrun_rank();
  const int size = ringrun_size();

  for (size_t ti = 0; !engine_only && ti < sizeof(kDtypes) / sizeof(kDtypes[0]); ++ti) {
    const ringrun_dtype t = kDtypes[ti];
    const size_t es = ringrun_dtype_size(t);
    for (size_t count : kCounts) {
      const std::string where =
          std::string(ringrun_dtype_name(kDtypes[ti])) + " count=" + std::to_string(count);
      // Allreduce, every op valid for the type; out of place, then in place.
      for (size_t oi = 0; oi < sizeof(kOps) / sizeof(kOps[0]); ++oi) {
        const ringrun_op op = kOps[oi];
        if (op == RINGRUN_AVERAGE && !IsFloat(t)) continue;
        for (bool in_place : {false, true}) {
          const std::string what = "allreduce " + std::string(ringrun_op_name(kOps[oi])) + " " +
                                   where + (in_place ? " in place" : "");
          if (t == RINGRUN_INT16) {  // NCCL has no 16-bit integer type: refused, by name
            void* buf = DeviceFill(c, t, count, Value, c.rank, count);
            ++c.checks;
            if (buf != nullptr &&
                (ringrun_allreduce(buf, buf, count, t, op) != RINGRUN_ERR_INVALID_ARGUMENT ||
                 std::strstr(ringrun_error_message(), "int16") == nullptr)) {
              c.Fail(what + ": not refused as int16 on NCCL");
            }
            cudaFree(buf);
            continue;
          }
          void* send = DeviceFill(c, t, count, Value, c.rank, count);
          void* recv = in_place ? send : DeviceFill(c, t, 0, Value, c.rank, count);
          if (send != nullptr && recv != nullptr &&
              c.Call(ringrun_allreduce(send, recv, count, t, op), what)) {
            c.Compare(what, t, recv, count, [&](size_t i) { return Expected(op, size, i); });
          }
          cudaFree(send);
          if (!in_place) cudaFree(recv);
        }
      }
      // Broadcast from the last rank (non-zero when size > 1).
      {
        const int root = size - 1;
        const std::string what = "broadcast root=" + std::to_string(root) + " " + where;
        void* buf = DeviceFill(c, t, count, Value, c.rank, count);
        if (buf != nullptr && c.Call(ringrun_broadcast(buf, count, t, root), what)) {
          c.Compare(what, t, buf, count, [&](size_t i) { return Value(root, i); });
        }
        cudaFree(buf);
      }
      // Allgather, out of place and in NCCL's in-place form (send = recv + rank * count).
      for (bool in_place : {false, true}) {
        const std::string what = "allgather " + where + (in_place ? " in place" : "");
        void* recv = DeviceFill(c, t, 0, Value, c.rank, count * size);
        void* send = nullptr;
        if (in_place && recv != nullptr) {
          send = static_cast<unsigned char*>(recv) + c.rank * count * es;
          std::vector<unsigned char> mine(count * es);
          for (size_t i = 0; i < count; ++i) Encode(t, Value(c.rank, i), mine.data() + i * es);
          c.Cuda(cudaMemcpy(send, mine.data(), mine.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
        } else {
          send = DeviceFill(c, t, count, Value, c.rank, count);
        }
        if (send != nullptr && recv != nullptr &&
            c.Call(ringrun_allgather(send, recv, count, t), what)) {
          c.Compare(what, t, recv, count * size,
                    [&](size_t i) { return Value(static_cast<int>(i / count), i % count); });
        }
        if (!in_place) cudaFree(send);
        cudaFree(recv);
      }
    }
  }
  // A host buffer and a device buffer in one call is an argument error, not a crash.
  {
    float host = 1;
    void* dev = nullptr;
    if (c.Cuda(cudaMalloc(&dev, sizeof(float)), "cudaMalloc")) {
      ++c.checks;
      if (ringrun_allreduce(&host, dev, 1, RINGRUN_FLOAT32, RINGRUN_SUM) == 0) {
        c.Fail("mixed host/device allreduce was accepted");
      }
      cudaFree(dev);
    }
  }

  // The engine: named device allreduces submitted in a different order on every rank, from
  // the handles' API (negotiated like host tensors, run on the backend's stream).
  {
    constexpr int kNamed = 16;
    constexpr size_t kLen = 4099;
    std::vector<void*> bufs(kNamed);
    std::vector<ringrun_handle> hs(kNamed, nullptr);
    for (int k = 0; k < kNamed; ++k) {
      const int t = (k * 7 + c.rank * 3) % kNamed;  // a per-rank permutation
      bufs[t] = DeviceFill(c, RINGRUN_FLOAT32, kLen, Value, c.rank, kLen);
      const std::string name = "engine.dev." + std::to_string(t);
      if (bufs[t] != nullptr) {
        c.Call(ringrun_allreduce_submit(name.c_str(), bufs[t], bufs[t], kLen, RINGRUN_FLOAT32,
                                        RINGRUN_SUM, 1.0, 1.0, 0, &hs[t]),
               name + " submit");
      }
    }
    for (int t = 0; t < kNamed; ++t) {
      const std::string what = "engine.dev." + std::to_string(t);
      if (hs[t] == nullptr) continue;
      ++c.checks;
      if (ringrun_wait(hs[t]) != RINGRUN_OK) {
        c.Fail(what + ": " + ringrun_handle_message(hs[t]));
      } else {
        c.Compare(what, RINGRUN_FLOAT32, bufs[t], kLen,
                  [&](size_t i) { return Expected(RINGRUN_SUM, size, i); });
      }
      ringrun_release(hs[t]);
      cudaFree(bufs[t]);
    }
  }

  EngineDeviceChecks(c, size);

  std::printf("gpu_collectives: rank %d/%d checks=%d failures=%d\n", c.rank, size, c.checks,
              c.failures);
  std::fflush(stdout);
  ringrun_shutdown();
  return c.failures == 0 ? 0 : 1;
}

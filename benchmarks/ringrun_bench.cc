// ringrun-bench: collective bandwidth and latency in the manner of nccl-tests.
//
//   ringrun -np 2 build/bin/ringrun-bench allreduce -b 4K -e 64M -f 4 -n 20 -w 5 -c 1
//           -d float -o sum [--device cpu|cuda] [--json]
//
// Rank 0 prints one row per size: size (bytes), count (elements), type, redop, time (us, the
// slowest rank's mean over -n iterations after -w warm-up ones), algbw = size / time and busbw =
// algbw * factor (GB/s), with nccl-tests' factors: allreduce 2(n-1)/n, reducescatter and
// allgather (n-1)/n, broadcast 1; and #wrong, the elements that differ from the expected
// result when -c 1. For allgather and reducescatter, size is the larger (whole) buffer.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ringrun/names.h"
#include "ringrun/ringrun.h"

#if RINGRUN_BENCH_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

struct Options {
  std::string op;
  size_t min_bytes = 8, max_bytes = 64 << 20;
  double factor = 2;
  int iters = 20, warmup = 5;
  bool check = true;
  ringrun_dtype dtype = RINGRUN_FLOAT32;
  ringrun_op redop = RINGRUN_SUM;
  bool cuda = false;
  bool json = false;
};

bool ParseSize(const char* s, size_t* out) {
  char* end;
  double v = std::strtod(s, &end);
  if (end == s || v < 0) return false;
  switch (*end) {
    case 'K':
    case 'k':
      v *= 1024;
      ++end;
      break;
    case 'M':
    case 'm':
      v *= 1024 * 1024;
      ++end;
      break;
    case 'G':
    case 'g':
      v *= 1024.0 * 1024 * 1024;
      ++end;
      break;
    default:
      break;
  }
  if (*end == 'B' || *end == 'b') ++end;
  if (*end != '\0') return false;
  *out = static_cast<size_t>(v);
  return true;
}

// The names of ringrun/names.h, any case, and nccl-tests' short spellings.
const char* Canonical(const std::string& s) {
  static const struct {
    const char* alias;
    const char* name;
  } kAliases[] = {{"int", "int32"},     {"half", "float16"},   {"bf16", "bfloat16"},
                  {"float", "float32"}, {"double", "float64"}, {"avg", "average"},
                  {"prod", "product"}};
  for (const auto& a : kAliases) {
    if (s == a.alias) return a.name;
  }
  return s.c_str();
}
bool ParseDtype(const std::string& s, ringrun_dtype* d) {
  return ringrun_dtype_from_name(Canonical(s), d) == 0;
}
bool ParseOp(const std::string& s, ringrun_op* o) {
  return ringrun_op_from_name(Canonical(s), o) == 0;
}
const char* DtypeName(ringrun_dtype d) { return ringrun_dtype_name(d); }
const char* OpName(ringrun_op o) { return ringrun_op_name(o); }

int Usage() {
  std::fprintf(stderr,
               "usage: ringrun-bench allreduce|broadcast|allgather|reducescatter -b MIN -e MAX "
               "-f FACTOR -n ITERS -w WARMUP -c 0|1 -d DTYPE -o OP [--device cpu|cuda] "
               "[--json]\n  sizes take K/M/G suffixes; DTYPE int8|uint8|int16|int32|int64|"
               "float16|bfloat16|float32|float64 (or half|bf16|float|double); OP sum|"
               "product|min|max|average (or prod|avg)\n");
  return 2;
}

bool Parse(int argc, char** argv, Options* o) {
  if (argc < 2) return false;
  o->op = argv[1];
  if (o->op != "allreduce" && o->op != "broadcast" && o->op != "allgather" &&
      o->op != "reducescatter") {
    return false;
  }
  for (int i = 2; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "--json") {
      o->json = true;
      continue;
    }
    if (i + 1 >= argc) return false;
    const char* v = argv[++i];
    bool ok = true;
    if (k == "-b")
      ok = ParseSize(v, &o->min_bytes);
    else if (k == "-e")
      ok = ParseSize(v, &o->max_bytes);
    else if (k == "-f")
      o->factor = std::atof(v), ok = o->factor > 1;
    else if (k == "-n")
      o->iters = std::atoi(v), ok = o->iters > 0;
    else if (k == "-w")
      o->warmup = std::atoi(v), ok = o->warmup >= 0;
    else if (k == "-c")
      o->check = std::atoi(v) != 0;
    else if (k == "-d")
      ok = ParseDtype(v, &o->dtype);
    else if (k == "-o")
      ok = ParseOp(v, &o->redop);
    else if (k == "--device") {
      ok = std::strcmp(v, "cpu") == 0 || std::strcmp(v, "cuda") == 0;
      o->cuda = std::strcmp(v, "cuda") == 0;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "ringrun-bench: bad value for %s: %s\n", k.c_str(), v);
      return false;
    }
  }
  return o->min_bytes <= o->max_bytes;
}

// Small exact values: element i of rank r.
double Value(int r, size_t i, ringrun_op op) {
  if (op == RINGRUN_PRODUCT) return (i + r) % 3 == 0 ? 2 : 1;
  return static_cast<double>((i * 7 + r * 3) % 17);
}

void Store(ringrun_dtype d, double v, void* p, size_t i) {
  switch (d) {
    case RINGRUN_INT8:
      static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v);
      break;
    case RINGRUN_UINT8:
      static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v);
      break;
    case RINGRUN_INT16:
      static_cast<int16_t*>(p)[i] = static_cast<int16_t>(v);
      break;
    case RINGRUN_INT32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      break;
    case RINGRUN_INT64:
      static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
      break;
    case RINGRUN_FLOAT16: {
      // Small integers: exact. Build the half from the float's fields.
      float f = static_cast<float>(v);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      uint16_t h = 0;
      if (f != 0) {
        h = static_cast<uint16_t>(((u >> 16) & 0x8000) | ((((u >> 23) & 0xff) - 112) << 10) |
                                  ((u >> 13) & 0x3ff));
      }
      static_cast<uint16_t*>(p)[i] = h;
      break;
    }
    case RINGRUN_BFLOAT16: {
      float f = static_cast<float>(v);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      static_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(u >> 16);
      break;
    }
    case RINGRUN_FLOAT32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case RINGRUN_FLOAT64:
      static_cast<double*>(p)[i] = v;
      break;
    case RINGRUN_DTYPE_MIN_ENUM_:
    case RINGRUN_DTYPE_MAX_ENUM_:
      break;
  }
}

double Load(ringrun_dtype d, const void* p, size_t i) {
  switch (d) {
    case RINGRUN_INT8:
      return static_cast<const int8_t*>(p)[i];
    case RINGRUN_UINT8:
      return static_cast<const uint8_t*>(p)[i];
    case RINGRUN_INT16:
      return static_cast<const int16_t*>(p)[i];
    case RINGRUN_INT32:
      return static_cast<const int32_t*>(p)[i];
    case RINGRUN_INT64:
      return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case RINGRUN_FLOAT16: {
      uint16_t h = static_cast<const uint16_t*>(p)[i];
      if ((h & 0x7fff) == 0) return 0;
      uint32_t u = (uint32_t(h & 0x8000) << 16) | ((((h >> 10) & 0x1f) + 112) << 23) |
                   (uint32_t(h & 0x3ff) << 13);
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    }
    case RINGRUN_BFLOAT16: {
      uint32_t u = uint32_t(static_cast<const uint16_t*>(p)[i]) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    }
    case RINGRUN_FLOAT32:
      return static_cast<const float*>(p)[i];
    case RINGRUN_FLOAT64:
      return static_cast<const double*>(p)[i];
    case RINGRUN_DTYPE_MIN_ENUM_:
    case RINGRUN_DTYPE_MAX_ENUM_:
      break;
  }
  return 0;
}

double Reduce(ringrun_op op, int n, size_t i) {
  double acc = Value(0, i, op);
  for (int r = 1; r < n; ++r) {
    const double v = Value(r, i, op);
    if (op == RINGRUN_SUM || op == RINGRUN_AVERAGE) acc += v;
    if (op == RINGRUN_PRODUCT) acc *= v;
    if (op == RINGRUN_MIN) acc = std::min(acc, v);
    if (op == RINGRUN_MAX) acc = std::max(acc, v);
  }
  return op == RINGRUN_AVERAGE ? acc / n : acc;
}

// Host or device buffers of one size.
class Buffers {
 public:
  Buffers(bool cuda, size_t send, size_t recv)
      : cuda_(cuda), send_bytes_(send), recv_bytes_(recv) {}
  ~Buffers() {
#if RINGRUN_BENCH_HAVE_CUDA
    if (cuda_) {
      if (send_) cudaFree(send_);
      if (recv_) cudaFree(recv_);
      return;
    }
#endif
    std::free(send_), std::free(recv_);
  }
  // "" on success, else why not.
  std::string Allocate() {
    if (cuda_) {
#if RINGRUN_BENCH_HAVE_CUDA
      cudaError_t e = cudaMalloc(&send_, std::max<size_t>(send_bytes_, 1));
      if (e == cudaSuccess) e = cudaMalloc(&recv_, std::max<size_t>(recv_bytes_, 1));
      if (e != cudaSuccess) return std::string("cudaMalloc: ") + cudaGetErrorString(e);
      return "";
#else
      return "this build of ringrun-bench has no CUDA runtime";
#endif
    }
    send_ = std::aligned_alloc(4096, Round(send_bytes_));
    recv_ = std::aligned_alloc(4096, Round(recv_bytes_));
    if (!send_ || !recv_) return "out of memory";
    std::memset(send_, 0, Round(send_bytes_));
    std::memset(recv_, 0, Round(recv_bytes_));
    return "";
  }
  void* send() { return send_; }
  void* recv() { return recv_; }
  // Copies between the host and this buffer (a plain memcpy for host buffers).
  void Upload(void* dst, const std::vector<char>& src) {
#if RINGRUN_BENCH_HAVE_CUDA
    if (cuda_) {
      cudaMemcpy(dst, src.data(), src.size(), cudaMemcpyHostToDevice);
      return;
    }
#endif
    std::memcpy(dst, src.data(), src.size());
  }
  std::vector<char> Download(const void* src, size_t n) {
    std::vector<char> out(n);
#if RINGRUN_BENCH_HAVE_CUDA
    if (cuda_) {
      cudaMemcpy(out.data(), src, n, cudaMemcpyDeviceToHost);
      return out;
    }
#endif
    std::memcpy(out.data(), src, n);
    return out;
  }

 private:
  static size_t Round(size_t n) { return std::max<size_t>(4096, (n + 4095) / 4096 * 4096); }
  const bool cuda_;
  const size_t send_bytes_, recv_bytes_;
  void* send_ = nullptr;
  void* recv_ = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!Parse(argc, argv, &o)) return Usage();
  if (ringrun_init() != 0) {
    std::fprintf(stderr, "ringrun-bench: ringrun_init: %s\n", ringrun_error_message());
    return 1;
  }
  const int rank = ringrun_rank(), n = ringrun_size();
  const size_t elem = ringrun_dtype_size(o.dtype);
  const bool reduces = o.op == "allreduce" || o.op == "reducescatter";
  if (!reduces) o.redop = RINGRUN_SUM;
  if (rank == 0 && !o.json) {
    std::printf("# ringrun-bench %s np=%d device=%s dtype=%s iters=%d warmup=%d\n", o.op.c_str(), n,
                o.cuda ? "cuda" : "cpu", DtypeName(o.dtype), o.iters, o.warmup);
    std::printf("#%12s %12s %8s %7s %10s %8s %8s %7s\n", "size", "count", "type", "redop", "time",
                "algbw", "busbw", "#wrong");
    std::printf("#%12s %12s %8s %7s %10s %8s %8s %7s\n", "(B)", "(elements)", "", "", "(us)",
                "(GB/s)", "(GB/s)", "");
  }
  int status = 0;
  for (double b = static_cast<double>(o.min_bytes); b <= static_cast<double>(o.max_bytes) + 0.5;
       b *= o.factor) {
    // Whole-buffer elements, rounded to a multiple of np (per-rank blocks for the gathers).
    size_t count = static_cast<size_t>(b) / elem;
    if (o.op == "allgather" || o.op == "reducescatter") count = count / n * n;
    const size_t bytes = count * elem;
    const size_t block = count / n;  // per-rank elements of allgather/reducescatter
    size_t send_bytes = bytes, recv_bytes = bytes;
    if (o.op == "allgather") send_bytes = block * elem;
    if (o.op == "reducescatter") recv_bytes = block * elem;
    Buffers buf(o.cuda, send_bytes, recv_bytes);
    std::string err = buf.Allocate();
    if (!err.empty()) {
      std::fprintf(stderr, "ringrun-bench: rank %d: --device %s: %s\n", rank,
                   o.cuda ? "cuda" : "cpu", err.c_str());
      status = 1;
      break;
    }
    // Inputs: send holds rank r's values (for allgather: its block; broadcast: root 0's).
    std::vector<char> host(send_bytes);
    const size_t send_count = send_bytes / std::max<size_t>(elem, 1);
    const size_t first = o.op == "allgather" ? rank * block : 0;
    const int owner = o.op == "broadcast" ? 0 : rank;
    for (size_t i = 0; i < send_count; ++i) {
      Store(o.dtype, Value(owner, first + i, o.redop), host.data(), i);
    }
    buf.Upload(buf.send(), host);
    auto run = [&]() -> int {
      if (o.op == "allreduce")
        return ringrun_allreduce(buf.send(), buf.recv(), count, o.dtype, o.redop);
      if (o.op == "broadcast") return ringrun_broadcast(buf.send(), count, o.dtype, 0);
      if (o.op == "allgather") return ringrun_allgather(buf.send(), buf.recv(), block, o.dtype);
      return ringrun_reducescatter(buf.send(), buf.recv(), block, o.dtype, o.redop);
    };
    bool failed = false;
    for (int i = 0; i < o.warmup && !failed; ++i) failed = run() != 0;
    failed = failed || ringrun_barrier() != 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o.iters && !failed; ++i) failed = run() != 0;
    double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
        o.iters;
    if (failed || ringrun_allreduce(&us, &us, 1, RINGRUN_FLOAT64, RINGRUN_MAX) != 0) {
      std::fprintf(stderr, "ringrun-bench: rank %d: %s %zu bytes: %s\n", rank, o.op.c_str(), bytes,
                   ringrun_error_message());
      status = 1;
      break;
    }
    // Check: one more run on fresh inputs, against the exact expected values.
    double wrong = 0;
    if (o.check) {
      if (o.op == "broadcast") {
        std::vector<char> junk(send_bytes, rank == 0 ? 0 : 0x7f);
        if (rank != 0) buf.Upload(buf.send(), junk);
      }
      if (run() != 0) {
        std::fprintf(stderr, "ringrun-bench: rank %d: check run: %s\n", rank,
                     ringrun_error_message());
        status = 1;
        break;
      }
      const void* out_dev = o.op == "broadcast" ? buf.send() : buf.recv();
      const size_t out_bytes = o.op == "broadcast" ? send_bytes : recv_bytes;
      std::vector<char> out = buf.Download(out_dev, out_bytes);
      const size_t out_count = out_bytes / elem;
      const bool is_allreduce = o.op == "allreduce", is_reducescatter = o.op == "reducescatter";
      const bool is_broadcast = o.op == "broadcast";
      for (size_t i = 0; i < out_count; ++i) {
        double want;
        if (is_allreduce)
          want = Reduce(o.redop, n, i);
        else if (is_reducescatter)
          want = Reduce(o.redop, n, rank * block + i);
        else if (is_broadcast)
          want = Value(0, i, o.redop);
        else
          want = Value(static_cast<int>(i / std::max<size_t>(block, 1)), i, o.redop);
        char w[8];
        Store(o.dtype, want, w, 0);
        if (std::memcmp(w, out.data() + i * elem, elem) != 0) {
          // AVERAGE of integers is rejected; for floats compare with a tolerance of one ulp-ish.
          const double got = Load(o.dtype, out.data(), i);
          if (std::fabs(got - want) > 1e-2 * std::max(1.0, std::fabs(want))) wrong += 1;
        }
      }
      ringrun_allreduce(&wrong, &wrong, 1, RINGRUN_FLOAT64, RINGRUN_SUM);
    }
    const double algbw = bytes / us / 1e3;  // bytes/us = MB/s; /1e3 -> GB/s
    double factor = 1;
    if (o.op == "allreduce") factor = 2.0 * (n - 1) / n;
    if (o.op == "allgather" || o.op == "reducescatter") factor = double(n - 1) / n;
    const double busbw = algbw * factor;
    if (rank == 0) {
      if (o.json) {
        std::printf(
            "{\"op\":\"%s\",\"np\":%d,\"bytes\":%zu,\"dtype\":\"%s\",\"redop\":\"%s\","
            "\"time_us\":%.2f,\"algbw_GBps\":%.4f,\"busbw_GBps\":%.4f,\"wrong\":%.0f}\n",
            o.op.c_str(), n, bytes, DtypeName(o.dtype), reduces ? OpName(o.redop) : "none", us,
            algbw, busbw, o.check ? wrong : -1.0);
      } else {
        std::printf(" %12zu %12zu %8s %7s %10.2f %8.3f %8.3f %7s\n", bytes, count,
                    DtypeName(o.dtype), reduces ? OpName(o.redop) : "none", us, algbw, busbw,
                    o.check ? std::to_string(static_cast<long long>(wrong)).c_str() : "N/A");
      }
      std::fflush(stdout);
    }
    if (wrong > 0) status = 1;
    if (b == 0) break;
  }
  ringrun_shutdown();
  return status;
}

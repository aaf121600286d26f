// C++ wrapper of ringrun.h: a scoped job membership and typed collectives that report failure
// as ringrun::Error (an exception, because this header is the user's module boundary, not
// ours; the library itself never throws across its C API).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "ringrun/ringrun.h"

namespace ringrun {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
inline void Check(int rc, const char* what) {
  if (rc != 0) throw Error(std::string(what) + ": " + ringrun_error_message());
}
template <typename T>
struct DtypeOf;
template <>
struct DtypeOf<int8_t> {
  static constexpr ringrun_dtype kValue = RINGRUN_INT8;
};
template <>
struct DtypeOf<uint8_t> {
  static constexpr ringrun_dtype kValue = RINGRUN_UINT8;
};
template <>
struct DtypeOf<int32_t> {
  static constexpr ringrun_dtype kValue = RINGRUN_INT32;
};
template <>
struct DtypeOf<int64_t> {
  static constexpr ringrun_dtype kValue = RINGRUN_INT64;
};
template <>
struct DtypeOf<float> {
  static constexpr ringrun_dtype kValue = RINGRUN_FLOAT32;
};
template <>
struct DtypeOf<double> {
  static constexpr ringrun_dtype kValue = RINGRUN_FLOAT64;
};
}  // namespace detail

// Joins the job on construction and leaves it on destruction. One per process.
class Session {
 public:
  Session() { detail::Check(ringrun_init(), "ringrun_init"); }
  ~Session() { ringrun_shutdown(); }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  int rank() const { return ringrun_rank(); }
  int size() const { return ringrun_size(); }
  int local_rank() const { return ringrun_local_rank(); }
  int local_size() const { return ringrun_local_size(); }
  int cross_rank() const { return ringrun_cross_rank(); }
  int cross_size() const { return ringrun_cross_size(); }

  template <typename T>
  void Allreduce(const T* send, T* recv, size_t count, ringrun_op op = RINGRUN_SUM) {
    detail::Check(ringrun_allreduce(send, recv, count, detail::DtypeOf<T>::kValue, op),
                  "ringrun_allreduce");
  }
  template <typename T>
  void Allreduce(std::vector<T>& inout, ringrun_op op = RINGRUN_SUM) {
    Allreduce(inout.data(), inout.data(), inout.size(), op);
  }
  template <typename T>
  void Broadcast(T* buf, size_t count, int root) {
    detail::Check(ringrun_broadcast(buf, count, detail::DtypeOf<T>::kValue, root),
                  "ringrun_broadcast");
  }
  template <typename T>
  void Broadcast(std::vector<T>& buf, int root) {
    Broadcast(buf.data(), buf.size(), root);
  }
  template <typename T>
  void Allgather(const T* send, T* recv, size_t count) {
    detail::Check(ringrun_allgather(send, recv, count, detail::DtypeOf<T>::kValue),
                  "ringrun_allgather");
  }
  template <typename T>
  void ReduceScatter(const T* send, T* recv, size_t recvcount, ringrun_op op = RINGRUN_SUM) {
    detail::Check(ringrun_reducescatter(send, recv, recvcount, detail::DtypeOf<T>::kValue, op),
                  "ringrun_reducescatter");
  }
  template <typename T>
  void Alltoall(const T* send, T* recv, size_t count_per_rank) {
    detail::Check(ringrun_alltoall(send, recv, count_per_rank, detail::DtypeOf<T>::kValue),
                  "ringrun_alltoall");
  }
  void Barrier() { detail::Check(ringrun_barrier(), "ringrun_barrier"); }
};

}  // namespace ringrun

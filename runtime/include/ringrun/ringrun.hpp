// C++ wrapper of ringrun.h: a scoped job membership and typed collectives that report failure
// as ringrun::Error (an exception, because this header is the user's module boundary, not
// ours; the library itself never throws across its C API).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ringrun/ringrun.h"

namespace ringrun {

class Error : public std::runtime_error {
 public:
  Error(ringrun_status status, const std::string& what)
      : std::runtime_error(what), status_(status) {}
  ringrun_status status() const { return status_; }

 private:
  ringrun_status status_;
};

namespace detail {
inline void Check(ringrun_status rc, const char* what) {
  if (rc != RINGRUN_OK) throw Error(rc, std::string(what) + ": " + ringrun_error_message());
}
template <typename T>
struct DtypeOf;
template <>
struct DtypeOf<uint16_t> {  // raw fp16 bits; use the C API for bfloat16
  static constexpr ringrun_dtype kValue = RINGRUN_FLOAT16;
};
template <>
struct DtypeOf<int8_t> {
  static constexpr ringrun_dtype kValue = RINGRUN_INT8;
};
template <>
struct DtypeOf<uint8_t> {
  static constexpr ringrun_dtype kValue = RINGRUN_UINT8;
};
template <>
struct DtypeOf<int16_t> {
  static constexpr ringrun_dtype kValue = RINGRUN_INT16;
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

// One submitted collective (see ringrun.h). Move-only; releases the handle on destruction
// (a pending one is detached: its buffers stay the library's until it completes).
class Handle {
 public:
  Handle() = default;
  explicit Handle(ringrun_handle h) : h_(h) {}
  Handle(Handle&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      ringrun_release(h_);
      h_ = std::exchange(o.h_, nullptr);
    }
    return *this;
  }
  ~Handle() { ringrun_release(h_); }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  ringrun_handle get() const { return h_; }
  const char* name() const { return ringrun_handle_name(h_); }
  // True once complete (successfully or not).
  bool Test() const { return ringrun_test(h_) != RINGRUN_IN_PROGRESS; }
  // Waits; throws Error with the handle's message on failure.
  void Wait() const {
    ringrun_status st = ringrun_wait(h_);
    if (st != RINGRUN_OK) {
      throw Error(st, std::string(ringrun_handle_name(h_)) + ": " + ringrun_handle_message(h_));
    }
  }
  // Allgather/alltoall after Wait(): the result and the rows that came from each rank.
  template <typename T>
  std::vector<T> Output() const {
    const void* data = nullptr;
    size_t count = 0;
    Check(ringrun_handle_output(h_, &data, &count), "ringrun_handle_output");
    const T* p = static_cast<const T*>(data);
    return std::vector<T>(p, p + count);
  }
  std::vector<size_t> Rows() const {
    std::vector<size_t> rows(static_cast<size_t>(ringrun_size()));
    Check(ringrun_handle_rows(h_, rows.data(), rows.size()), "ringrun_handle_rows");
    return rows;
  }

 private:
  static void Check(ringrun_status rc, const char* what) { detail::Check(rc, what); }
  ringrun_handle h_ = nullptr;
};

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
  // The membership epoch of an elastic job (ringrun_membership_epoch).
  uint64_t membership_epoch() const {
    uint64_t epoch = 0;
    detail::Check(ringrun_membership_epoch(&epoch), "ringrun_membership_epoch");
    return epoch;
  }

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
  // Returns the last rank that joined.
  int Join() {
    int last = -1;
    detail::Check(ringrun_join(&last), "ringrun_join");
    return last;
  }

  // Named submissions (name may be empty: a default name). Buffers belong to the library until
  // the handle completes.
  template <typename T>
  Handle AllreduceAsync(const std::string& name, const T* send, T* recv, size_t count,
                        ringrun_op op = RINGRUN_SUM, double prescale = 1.0, double postscale = 1.0,
                        unsigned flags = 0) {
    ringrun_handle h = nullptr;
    detail::Check(
        ringrun_allreduce_submit(Name(name), send, recv, count, detail::DtypeOf<T>::kValue, op,
                                 prescale, postscale, flags, &h),
        "ringrun_allreduce_submit");
    return Handle(h);
  }
  template <typename T>
  Handle BroadcastAsync(const std::string& name, T* buf, size_t count, int root) {
    ringrun_handle h = nullptr;
    detail::Check(
        ringrun_broadcast_submit(Name(name), buf, count, detail::DtypeOf<T>::kValue, root, &h),
        "ringrun_broadcast_submit");
    return Handle(h);
  }
  template <typename T>
  Handle AllgatherAsync(const std::string& name, const T* send, size_t rows, size_t row_elems = 1) {
    ringrun_handle h = nullptr;
    detail::Check(
        ringrun_allgather_submit(Name(name), send, rows, row_elems, detail::DtypeOf<T>::kValue, &h),
        "ringrun_allgather_submit");
    return Handle(h);
  }
  template <typename T>
  Handle AlltoallAsync(const std::string& name, const T* send, const std::vector<size_t>& rows,
                       size_t row_elems = 1) {
    if (rows.size() != static_cast<size_t>(ringrun_size())) {
      throw Error(RINGRUN_ERR_INVALID_ARGUMENT,
                  "AlltoallAsync: rows has " + std::to_string(rows.size()) +
                      " entries, one per rank is " + std::to_string(ringrun_size()));
    }
    ringrun_handle h = nullptr;
    detail::Check(ringrun_alltoall_submit(Name(name), send, rows.data(), row_elems,
                                          detail::DtypeOf<T>::kValue, &h),
                  "ringrun_alltoall_submit");
    return Handle(h);
  }
  template <typename T>
  Handle ReduceScatterAsync(const std::string& name, const T* send, T* recv, size_t recvcount,
                            ringrun_op op = RINGRUN_SUM) {
    ringrun_handle h = nullptr;
    detail::Check(ringrun_reducescatter_submit(Name(name), send, recv, recvcount,
                                               detail::DtypeOf<T>::kValue, op, &h),
                  "ringrun_reducescatter_submit");
    return Handle(h);
  }
  Handle BarrierAsync() {
    ringrun_handle h = nullptr;
    detail::Check(ringrun_barrier_submit(&h), "ringrun_barrier_submit");
    return Handle(h);
  }

 private:
  static const char* Name(const std::string& name) { return name.empty() ? nullptr : name.c_str(); }
};

}  // namespace ringrun

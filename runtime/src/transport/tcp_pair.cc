#include "runtime/src/transport/tcp_pair.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ringrun::runtime::transport {

namespace {

// A Progress step moves at most kTcpChunk bytes of one op, so that a Run alternates between its
// sends and receives instead of filling one socket direction while the other idles (measured:
// benchmarks/README.md, "Data-plane constants"). A RecvReduce stages at most kStagingBytes
// before reducing them: small enough to stay in L2.
constexpr size_t kTcpChunk = 128 << 10;
constexpr size_t kStagingBytes = 64 << 10;

}  // namespace

Result<bool> TcpPair::Progress(OpState& st) {
  Op& op = *st.op;
  bool moved = false;
  const size_t limit = std::min(op.bytes, st.done + kTcpChunk);
  while (st.done < limit) {
    if (op.kind == Op::kSend) {
      ssize_t n = ::send(fd(), static_cast<char*>(op.buf) + st.done, limit - st.done,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        return ErrnoStatus("send", errno);
      }
      st.done += static_cast<size_t>(n), moved = true;
    } else if (op.kind == Op::kRecv) {
      ssize_t n = ::recv(fd(), static_cast<char*>(op.buf) + st.done, limit - st.done, MSG_DONTWAIT);
      if (n == 0) return Unavailable("connection closed by peer");
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        return ErrnoStatus("recv", errno);
      }
      st.done += static_cast<size_t>(n), moved = true;
    } else {
      if (staging_.empty()) staging_.resize(kStagingBytes);
      // staged_ bytes of the op past st.done sit at the start of staging_.
      const size_t want = std::min(op.bytes - st.done, kStagingBytes) - staged_;
      ssize_t n = ::recv(fd(), staging_.data() + staged_, want, MSG_DONTWAIT);
      if (n == 0) return Unavailable("connection closed by peer");
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        return ErrnoStatus("recv", errno);
      }
      staged_ += static_cast<size_t>(n), moved = true;
      const size_t whole = staged_ - staged_ % op.elem_size;
      if (whole > 0) {
        const char* mine = static_cast<const char*>(op.src) + st.done;
        const char* in = staging_.data();
        op.reduce(static_cast<char*>(op.buf) + st.done, op.incoming_first ? in : mine,
                  op.incoming_first ? mine : in, whole / op.elem_size);
        if (op.finish) op.finish->Apply(static_cast<char*>(op.buf) + st.done, whole / op.elem_size);
        std::memmove(staging_.data(), staging_.data() + whole, staged_ - whole);
        staged_ -= whole;
        st.done += whole;
      }
    }
  }
  st.complete = st.done == op.bytes;
  return moved;
}

}  // namespace ringrun::runtime::transport

// Every default wait and interval, in one place.
#pragma once

namespace ringrun {

inline constexpr int kDefaultStartTimeoutS = 30;   // --start-timeout
inline constexpr int kDefaultGraceMs = 5000;       // SIGTERM -> SIGKILL
inline constexpr int kHeartbeatIntervalMs = 2000;  // Session pings, each way
inline constexpr int kHeartbeatTimeoutMs = 10000;  // silence that means "lost" (< 15 s bound)
inline constexpr int kKeepaliveMs = 3000;          // gRPC transport keepalive
inline constexpr int kKeepaliveTimeoutMs = 5000;
inline constexpr int kRpcDeadlineMs = 10000;    // unary calls other than Join
inline constexpr int kJoinTimeoutMs = 120000;   // ringrun_init waiting for every rank
inline constexpr int kSshConnectTimeoutS = 10;  // --ssh-connect-timeout
inline constexpr int kSshFanout = 32;           // --ssh-fanout
inline constexpr int kStderrTailLines = 10;     // lines shown with a failing rank
// The largest request the job service accepts. Requests are small but for an agent's Output
// event, which carries at most 1 MiB + 64 KiB of a rank's output (agent.cc: kMaxLine and
// kReadChunk); anything larger is refused (RESOURCE_EXHAUSTED) before it is read whole.
inline constexpr int kMaxJobServiceRequestBytes = 2 << 20;
// A connection to the job service that has not finished its HTTP/2 handshake by then is closed.
inline constexpr int kJobServiceHandshakeTimeoutMs = 5000;

}  // namespace ringrun

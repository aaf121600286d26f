// Every default wait, interval, spin time and retry count of ringrun, in one place. Flags and
// environment variables override some of them (named beside each); `ringrun --help` prints
// those from these constants.
#pragma once

namespace ringrun {

// The launcher and its agents.
inline constexpr int kDefaultStartTimeoutS = 30;   // --start-timeout: agents and ranks up
inline constexpr int kDefaultGraceMs = 5000;       // --grace-period: SIGTERM -> SIGKILL
inline constexpr int kHeartbeatIntervalMs = 2000;  // Session pings, each way
inline constexpr int kHeartbeatTimeoutMs = 10000;  // silence that means "lost" (< 15 s bound)
inline constexpr int kKeepaliveMs = 3000;          // gRPC transport keepalive
inline constexpr int kKeepaliveTimeoutMs = 5000;
inline constexpr int kRpcDeadlineMs = 10000;        // unary calls other than Join
inline constexpr int kSecretReadTimeoutMs = 30000;  // an agent reading the secret on its stdin
inline constexpr int kStderrTailLines = 10;         // lines shown with a failing rank

// SSH.
inline constexpr int kSshConnectTimeoutS = 10;  // --ssh-connect-timeout: each blocking step
inline constexpr int kSshFanout = 32;           // --ssh-fanout: connections in progress at once
inline constexpr int kSshConnectAttempts = 3;   // tries in all, for transient failures only
inline constexpr int kSshRetryBackoffMs = 200;  // before the second try, doubled after each
// After an agent's exit status, output still in flight may follow before its channel closes.
inline constexpr int kSshCloseAfterExitMs = 2000;

// libringrun.
inline constexpr int kJoinTimeoutMs = 120000;              // ringrun_init waiting for every rank
inline constexpr int kDefaultCollectiveTimeoutMs = 60000;  // RINGRUN_TIMEOUT_MS: every wait
inline constexpr int kPairHelloTimeoutMs = 10000;          // a data-plane connection's greeting
inline constexpr int kNcclFinalizeTimeoutMs = 5000;        // ncclCommFinalize at shutdown
inline constexpr int kNcclAbortTimeoutMs = 10000;          // ncclCommAbort, which can hang too
// Joining through a store (runtime/src/rendezvous): ranks other than 0 wait this much longer
// than the join timeout for the peer table, so that rank 0's reason for giving up reaches them.
inline constexpr int kStorePeerTableGraceMs = 2000;
// Busy-wait this long on a shared-memory pair before sleeping on its futex (only when a host's
// ranks do not outnumber its CPUs): waking a sleeping rank costs tens of microseconds under a
// hypervisor, paid once per collective phase when ranks arrive a little apart.
inline constexpr int kShmSpinUs = 1000;
// Where a host's ranks outnumber its CPUs, an engine thread about to sleep that finds a peer's
// frame already there yields this long, the round left to its program's next blocking call
// (runtime/src/transport/socket_transport.cc, WaitForInput), before it runs the round itself.
inline constexpr int kIdleYieldUs = 200;
// The engine's negotiation busy-waits for a peer's frame only this long before sleeping: that
// frame comes when the peer's engine gets to it, which can take long while the peer's
// application submits, and a spinning engine takes the core that application needs (measured:
// benchmarks/README.md, "Engine choices").
inline constexpr int kNegotiationSpinUs = 20;
// How long a Run waits on a same-host peer whose engine sleeps with its wake-ups quiet (a
// blocking call ran the last round in its stead, Transport::LeaveIdleWakeQuiet) before waking
// it. Longer than the data plane's spin, so that the peer of a loop of blocking calls that is
// descheduled for a moment is not woken (its program calls again and runs the round); short
// against any timeout.
inline constexpr int kQuietKickUs = 2000;

// Elastic jobs (launcher/elastic/).
inline constexpr int kDiscoveryTimeoutMs = 10000;  // a host discovery script's run, then SIGKILL
inline constexpr int kElasticTimeoutS = 600;       // --elastic-timeout: too few slots, then end
inline constexpr int kDiscoveryOutputBytes = 1 << 20;  // a script's stdout beyond this: an error

// The job service.
// The largest request the job service accepts. Requests are small but for an agent's Output
// event, which carries at most 1 MiB + 64 KiB of a rank's output (agent_loop.h: kMaxLineBytes,
// and one read); anything larger is refused (RESOURCE_EXHAUSTED) before it is read whole.
inline constexpr int kMaxJobServiceRequestBytes = 2 << 20;
// A connection to the job service that has not finished its HTTP/2 handshake by then is closed.
inline constexpr int kJobServiceHandshakeTimeoutMs = 5000;

}  // namespace ringrun

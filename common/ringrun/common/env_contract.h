// The launcher-to-rank environment contract: names set by the launcher, read by libringrun.
#pragma once

namespace ringrun::env {

inline constexpr char kRank[] = "RINGRUN_RANK";
inline constexpr char kSize[] = "RINGRUN_SIZE";
inline constexpr char kLocalRank[] = "RINGRUN_LOCAL_RANK";
inline constexpr char kLocalSize[] = "RINGRUN_LOCAL_SIZE";
inline constexpr char kCrossRank[] = "RINGRUN_CROSS_RANK";
inline constexpr char kCrossSize[] = "RINGRUN_CROSS_SIZE";
inline constexpr char kHostname[] = "RINGRUN_HOSTNAME";
inline constexpr char kJobId[] = "RINGRUN_JOB_ID";
// host:port of the job service, as reachable from the rank's host.
inline constexpr char kJobService[] = "RINGRUN_JOB_SERVICE";
// The job secret (64 hex characters). Ranks must not put it on a command line.
inline constexpr char kSecret[] = "RINGRUN_SECRET";
// The address of this rank's host as the launcher sees it: a good data-plane address.
inline constexpr char kHostAddr[] = "RINGRUN_HOST_ADDR";
// The index of this rank's host in the host list.
inline constexpr char kHostIndex[] = "RINGRUN_HOST_INDEX";
// How many times the job was restarted before this attempt (--max-restarts): 0, 1, ...
inline constexpr char kRestartCount[] = "RINGRUN_RESTART_COUNT";

// Launcher to agent, not to ranks: the job secret in the environment of an agent started by
// srun (a step's command line is public). The agent unsets it before anything else.
inline constexpr char kAgentSecret[] = "RINGRUN_AGENT_SECRET";

}  // namespace ringrun::env

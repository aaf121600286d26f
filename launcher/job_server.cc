#include "launcher/job_server.h"

#include "ringrun/common/defaults.h"

namespace ringrun::launcher {

// A client pings at most every kKeepaliveMs; the server accepts pings without calls in flight
// and never counts them as abuse, so that a quiet agent keeps its channel.
constexpr int kMinPingIntervalMs = 1000;

Result<JobServer> StartJobServer(const std::string& address, JobService& service) {
  JobServer out;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &out.port);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             kMinPingIntervalMs);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  out.server = builder.BuildAndStart();
  if (!out.server || out.port == 0) {
    return Unavailable("could not listen on " + address + " for the job service");
  }
  return out;
}

}  // namespace ringrun::launcher

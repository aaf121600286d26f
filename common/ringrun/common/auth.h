// The job secret on the wire: clients attach it, the service checks it on every call.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>

namespace ringrun {

inline constexpr char kSecretMetadataKey[] = "x-ringrun-secret";

// Adds the secret to a call's metadata.
void AttachSecret(grpc::ClientContext* ctx, const std::string& secret);
// OK when the call carries exactly `secret`; UNAUTHENTICATED otherwise. Constant time.
grpc::Status CheckSecret(const grpc::ServerContextBase& ctx, const std::string& secret);
// A deadline `ms` milliseconds from now.
std::chrono::system_clock::time_point DeadlineAfterMs(int64_t ms);
// An insecure channel with keepalive pings, so a silent peer is noticed within
// keepalive_ms + timeout_ms even when no call is in flight.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, int keepalive_ms,
                                           int keepalive_timeout_ms);

}  // namespace ringrun

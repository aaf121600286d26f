#include "ringrun/common/auth.h"

#include "ringrun/common/secret.h"

namespace ringrun {

void AttachSecret(grpc::ClientContext* ctx, const std::string& secret) {
  ctx->AddMetadata(kSecretMetadataKey, secret);
}

grpc::Status CheckSecret(const grpc::ServerContextBase& ctx, const std::string& secret) {
  const auto& md = ctx.client_metadata();
  auto it = md.find(kSecretMetadataKey);
  if (it == md.end() ||
      !ConstantTimeEquals(std::string_view(it->second.data(), it->second.size()), secret)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or wrong job secret");
  }
  return grpc::Status::OK;
}

std::chrono::system_clock::time_point DeadlineAfterMs(int64_t ms) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(ms);
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, int keepalive_ms,
                                           int keepalive_timeout_ms) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, keepalive_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, keepalive_timeout_ms);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, -1);
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

}  // namespace ringrun

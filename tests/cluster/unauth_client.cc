// unauth_client: run as a rank, calls the job service at $RINGRUN_JOB_SERVICE without the secret
// and then with a wrong one, and prints each call's gRPC status code ("UNAUTHENTICATED" twice
// is what a correct service answers). Exits 0 when both calls were refused as unauthenticated.
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "ringrun/common/auth.h"
#include "ringrun/job.grpc.pb.h"

namespace {

const char* CodeText(grpc::StatusCode c) {
  switch (c) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    default:
      return "OTHER";
  }
}

grpc::StatusCode Call(ringrun::v1::JobService::Stub& stub, const char* secret) {
  grpc::ClientContext ctx;
  ctx.set_deadline(ringrun::DeadlineAfterMs(5000));
  if (secret != nullptr) ringrun::AttachSecret(&ctx, secret);
  ringrun::v1::RegisterRequest req;
  req.set_host_index(0);
  ringrun::v1::RegisterReply reply;
  return stub.Register(&ctx, req, &reply).error_code();
}

}  // namespace

int main() {
  const char* target = std::getenv("RINGRUN_JOB_SERVICE");
  if (target == nullptr) {
    std::fprintf(stderr, "RINGRUN_JOB_SERVICE is not set\n");
    return 2;
  }
  auto stub = ringrun::v1::JobService::NewStub(
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::StatusCode none = Call(*stub, nullptr);
  grpc::StatusCode wrong = Call(*stub, std::string(64, '0').c_str());
  std::printf("no_secret=%s wrong_secret=%s\n", CodeText(none), CodeText(wrong));
  return none == grpc::StatusCode::UNAUTHENTICATED && wrong == grpc::StatusCode::UNAUTHENTICATED
             ? 0
             : 1;
}

#include "common/rpc/grpc_lifetime.h"

#include <grpc/grpc.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "catch2/catch.hpp"

namespace pstrain {
namespace {

// A server on a free loopback port and a channel to it, both gone at the
// end of the call.
void ServerAndChannel() {
  grpc::CallbackGenericService service;  // answers UNIMPLEMENTED
  grpc::ServerBuilder builder;
  builder.RegisterCallbackGenericService(&service);
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  REQUIRE(server != nullptr);
  REQUIRE(port > 0);
  std::shared_ptr<grpc::Channel> channel = grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  channel->GetState(/*try_to_connect=*/true);
  server->Shutdown();
}

TEST_CASE("KeepGrpcUntilExit holds gRPC's library for the rest of the process: servers and "
          "channels going away do not shut it down") {
  // Nothing in this process has used gRPC yet (this binary's only case).
  REQUIRE(grpc_is_initialized() == 0);
  KeepGrpcUntilExit();
  CHECK(grpc_is_initialized() == 1);
  KeepGrpcUntilExit();  // one reference in all
  ServerAndChannel();
  CHECK(grpc_is_initialized() == 1);
  // A pair as each gRPC object takes and gives back: the last one out would
  // run the global shutdown, were the reference not held.
  grpc_init();
  grpc_shutdown();
  CHECK(grpc_is_initialized() == 1);
}

}  // namespace
}  // namespace pstrain

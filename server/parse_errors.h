// A server interceptor that turns a request gRPC could not parse into
// INVALID_ARGUMENT. gRPC's generated sync handlers answer bytes that are not
// a valid message of the method's request type with INTERNAL and an empty
// message (proto_utils.h: GenericDeserialize), which blames the server for a
// client's bytes; the callback handlers (Submit, FetchState) with
// UNIMPLEMENTED and no text (server_callback_handlers.h: the reactor is never
// made). With this interceptor the status is INVALID_ARGUMENT
// "the request to /fxdp.v1.JobService/GetJob (N bytes) is not a valid
// fxdp.v1 protobuf message of its type". Every method of every service gets
// it (the raw CompileService methods parse their bytes themselves and say the
// same). Register with ServerBuilder::experimental().SetInterceptorCreators.
#ifndef FXDP_SERVER_PARSE_ERRORS_H_
#define FXDP_SERVER_PARSE_ERRORS_H_

#include <memory>

#include "grpcpp/support/server_interceptor.h"

namespace fxdp::server {

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeParseErrorInterceptorFactory();

}  // namespace fxdp::server

#endif  // FXDP_SERVER_PARSE_ERRORS_H_

#include "server/parse_errors.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"

namespace fxdp::server {
namespace {

using grpc::experimental::InterceptionHookPoints;

class ParseErrorInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit ParseErrorInterceptor(grpc::experimental::ServerRpcInfo* info)
      : info_(info),
        single_request_(info->type() == grpc::experimental::ServerRpcInfo::Type::UNARY ||
                        info->type() == grpc::experimental::ServerRpcInfo::Type::SERVER_STREAMING) {
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    // A unary or server-streaming call has exactly one request message; a
    // null one after receiving is a request that did not parse.
    if (single_request_ &&
        methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr) {
      unparsable_ = true;
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS) &&
        unparsable_) {
      // The sync API answers such a request INTERNAL; the callback API
      // (Submit, FetchState) UNIMPLEMENTED with no text, before any handler
      // runs: both are this interceptor's to rewrite.
      const grpc::StatusCode code = methods->GetSendStatus().error_code();
      if (code == grpc::StatusCode::INTERNAL || code == grpc::StatusCode::UNIMPLEMENTED) {
        methods->ModifySendStatus(
            grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                         absl::StrCat("the request to ", info_->method(),
                                      " is not a valid protobuf message of its type")));
      }
    }
    methods->Proceed();
  }

 private:
  grpc::experimental::ServerRpcInfo* const info_;
  const bool single_request_;
  bool unparsable_ = false;
};

class Factory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new ParseErrorInterceptor(info);
  }
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MakeParseErrorInterceptorFactory() {
  return std::make_unique<Factory>();
}

}  // namespace fxdp::server

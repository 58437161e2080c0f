// Issue 25: the identity of a call belongs to that call. An in-process
// fxdp-server (tests/server/test_server.h) with TLS, client tokens and a
// worker join token from scripts/dev_ca.sh; every client call goes over ONE
// channel (one TLS connection) with its own per-call token:
//   - 8 threads calling as alice and bob at once: no abort, every answer for
//     its own caller (before: security_context.cc:197 aborted the server
//     within seconds, and bob got alice's jobs);
//   - another identity's job is NOT_FOUND with the text of an unknown one;
//     ListWorkers shows a job id to its owner and admins only;
//   - wrong tokens: counted against their connection (blocked after
//     --max-auth-failures, a right token included) and reported to the audit
//     log once per host per window.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "security/server_auth.h"
#include "tests/server/mlp_job.h"
#include "tests/server/test_server.h"
#include "tests/test_util.h"

namespace fxdp::testing {
namespace {

using ::testing::HasSubstr;

// Certificates and tokens of scripts/dev_ca.sh, made once, removed at exit.
std::string Pki() {
  struct Dir {
    std::string path;
    ~Dir() { std::filesystem::remove_all(path); }
  };
  static const Dir dir{[] {
    char tmpl[] = "/tmp/fxdp_call_auth_XXXXXX";
    std::string d = mkdtemp(tmpl);
    const std::string cmd =
        absl::StrCat("sh ", FXDP_SOURCE_DIR, "/scripts/dev_ca.sh ", d, " >/dev/null 2>&1");
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return d;
  }()};
  return dir.path;
}

std::string Token(const std::string& who) {
  return ValueOrDie(security::ReadTokenFile(absl::StrCat(Pki(), "/", who, ".token")));
}

struct Reports {
  std::mutex mu;
  std::vector<std::pair<std::string, int64_t>> failures;  // host, count
  std::vector<std::string> blocks;                        // peer
};

class SecureServer {
 public:
  explicit SecureServer(Reports* reports = nullptr) {
    security::ServerSecurityOptions o;
    const std::string p = Pki();
    o.tls_cert = p + "/server.pem";
    o.tls_key = p + "/server.key";
    o.tls_ca = p + "/ca.pem";
    o.client_tokens = p + "/client-tokens";
    o.worker_token_file = p + "/worker.token";
    if (reports != nullptr) {
      o.auth_limits.on_failures = [reports](const std::string& host, int64_t n) {
        std::lock_guard<std::mutex> l(reports->mu);
        reports->failures.emplace_back(host, n);
      };
      o.auth_limits.on_block = [reports](const std::string& peer, int) {
        std::lock_guard<std::mutex> l(reports->mu);
        reports->blocks.push_back(peer);
      };
    }
    security_ = ValueOrDie(security::MakeServerSecurity(o));
    server::JobServiceOptions jobs;
    jobs.queue_grace_s = 300;  // jobs stay queued without workers
    server_ = std::make_unique<TestServer>(jobs, server::WorkerRegistryOptions{}, &security_);
  }

  // A new channel (its own TLS connection: a local subchannel pool).
  std::shared_ptr<grpc::Channel> Channel() const {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ValueOrDie(security::ReadSmallFile(Pki() + "/ca.pem", "ca"));
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return grpc::CreateCustomChannel(server_->address(), grpc::SslCredentials(ssl), args);
  }

 private:
  security::ServerSecurity security_;
  std::unique_ptr<TestServer> server_;
};

void As(grpc::ClientContext* ctx, const std::string& token) {
  ctx->AddMetadata("authorization", "Bearer " + token);
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
}

// A queued job of the caller (its Submit stream stays open until destroyed).
class QueuedJob {
 public:
  QueuedJob(const std::shared_ptr<grpc::Channel>& ch, const std::string& token, int world = 1)
      : stub_(v1::JobService::NewStub(ch)) {
    As(&ctx_, token);
    stream_ = stub_->Submit(&ctx_);
    v1::SubmitJobRequest r;
    *r.mutable_spec() = MlpSpec(world, 1);
    EXPECT_TRUE(stream_->Write(r));
    for (const v1::TensorChunk& c : {F32("fc.weight", {3, 4}, 0), F32("fc.bias", {3}, 100)}) {
      *r.mutable_state() = c;
      stream_->Write(r);
    }
    for (const v1::TensorChunk& c : MlpBatch(1)) {
      v1::StepBatch* b = r.mutable_batch();
      b->Clear();
      b->set_step(1);
      *b->add_tensors() = c;
      b->set_more(c.name() == "input.0");
      stream_->Write(r);
    }
    v1::JobEvent e;
    EXPECT_TRUE(stream_->Read(&e)) << stream_->Finish().error_message();
    id_ = e.job_id();
  }
  ~QueuedJob() { ctx_.TryCancel(); }
  const std::string& id() const { return id_; }

 private:
  std::unique_ptr<v1::JobService::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SubmitJobRequest, v1::JobEvent>> stream_;
  std::string id_;
};

grpc::Status GetJob(v1::JobService::Stub* stub, const std::string& token, const std::string& id,
                    v1::JobInfo* info) {
  grpc::ClientContext ctx;
  As(&ctx, token);
  v1::GetJobRequest req;
  req.set_job_id(id);
  return stub->GetJob(&ctx, req, info);
}

// What one call as `who` got wrong ("" when all was right): its ListJobs is
// exactly its own job, GetJob of it says it is the owner, the other's job
// is NOT_FOUND.
std::string OneRound(v1::JobService::Stub* stub, const std::string& who, const std::string& token,
                     const std::string& mine, const std::string& theirs) {
  grpc::ClientContext ctx;
  As(&ctx, token);
  v1::ListJobsResponse list;
  if (grpc::Status s = stub->ListJobs(&ctx, {}, &list); !s.ok())
    return "ListJobs: " + s.error_message();
  if (list.jobs_size() != 1 || list.jobs(0).job_id() != mine || list.jobs(0).owner() != who) {
    return absl::StrCat(who, "'s ListJobs: ", list.ShortDebugString());
  }
  v1::JobInfo info;
  if (grpc::Status s = GetJob(stub, token, mine, &info); !s.ok() || info.owner() != who) {
    return absl::StrCat(who, "'s GetJob of its job: ", s.error_message(), " owner '", info.owner(),
                        "'");
  }
  if (grpc::Status s = GetJob(stub, token, theirs, &info);
      s.error_code() != grpc::StatusCode::NOT_FOUND) {
    return absl::StrCat(who, "'s GetJob of another's job: ", s.error_code(), " ", info.owner());
  }
  return "";
}

TEST(CallAuth, EightThreadsOnOneConnectionEachGetTheirOwnAnswers) {
  SecureServer server;
  const std::shared_ptr<grpc::Channel> ch = server.Channel();  // the one connection
  const std::string tokens[2] = {Token("alice"), Token("bob")};
  const std::string names[2] = {"alice", "bob"};
  QueuedJob alice(ch, tokens[0]), bob(ch, tokens[1]);
  const std::string ids[2] = {alice.id(), bob.id()};
  ASSERT_FALSE(ids[0].empty());
  ASSERT_FALSE(ids[1].empty());
  std::atomic<int64_t> rounds{0}, wrong{0};
  std::mutex mu;
  std::string first_wrong;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      auto stub = v1::JobService::NewStub(ch);
      for (int i = 0; std::chrono::steady_clock::now() < until; ++i) {
        const int w = (t + i) % 2;
        const std::string bad = OneRound(stub.get(), names[w], tokens[w], ids[w], ids[1 - w]);
        ++rounds;
        if (bad.empty()) continue;
        ++wrong;
        std::lock_guard<std::mutex> l(mu);
        if (first_wrong.empty()) first_wrong = bad;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0) << "of " << rounds.load() << " rounds; first: " << first_wrong;
  EXPECT_GT(rounds.load(), 8);
}

TEST(CallAuth, AnotherIdentitysJobIsNotFoundLikeAMissingOneAndHiddenInListWorkers) {
  SecureServer server;
  const std::shared_ptr<grpc::Channel> ch = server.Channel();
  FakeWorker worker(server.Channel(), Token("worker"), "w0");
  ASSERT_TRUE(worker.WaitRegistered());
  worker.Hold();  // alice's job stays RUNNING on it
  QueuedJob alice(ch, Token("alice"));
  auto stub = v1::JobService::NewStub(ch);
  v1::JobInfo info;
  const grpc::Status theirs = GetJob(stub.get(), Token("bob"), alice.id(), &info);
  const grpc::Status missing = GetJob(stub.get(), Token("bob"), "job-999-abcdef", &info);
  EXPECT_EQ(theirs.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(absl::StrReplaceAll(theirs.error_message(), {{alice.id(), "ID"}}),
            absl::StrReplaceAll(missing.error_message(), {{"job-999-abcdef", "ID"}}));
  EXPECT_TRUE(GetJob(stub.get(), Token("admin"), alice.id(), &info).ok());

  auto workers = v1::WorkerService::NewStub(ch);
  auto job_seen_by = [&](const std::string& who) {
    grpc::ClientContext ctx;
    As(&ctx, Token(who));
    v1::ListWorkersResponse r;
    EXPECT_TRUE(workers->ListWorkers(&ctx, {}, &r).ok());
    return r.workers_size() == 1 ? r.workers(0).job_id() : "?";
  };
  ASSERT_TRUE(WaitUntil([&] { return job_seen_by("alice") == alice.id(); }, 30))
      << job_seen_by("alice");
  EXPECT_EQ(job_seen_by("admin"), alice.id());
  EXPECT_EQ(job_seen_by("bob"), "");
  worker.Release();
}

TEST(CallAuth, WrongTokensBlockTheirConnectionAndAreReportedOncePerHostAndWindow) {
  Reports reports;
  SecureServer server(&reports);
  const std::shared_ptr<grpc::Channel> guesser = server.Channel(), other = server.Channel();
  auto list = [](const std::shared_ptr<grpc::Channel>& ch, const std::string& token) {
    grpc::ClientContext ctx;
    As(&ctx, token);
    v1::ListJobsResponse r;
    return v1::JobService::NewStub(ch)->ListJobs(&ctx, {}, &r);
  };
  for (int i = 0; i < 20; ++i) {
    const grpc::Status s = list(guesser, absl::StrCat("guess-guess-guess-", i));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_THAT(s.error_message(), HasSubstr("invalid token"));
  }
  // Blocked now (--max-auth-failures 20), a right token too; another connection is not.
  const grpc::Status blocked = list(guesser, Token("alice"));
  EXPECT_EQ(blocked.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << blocked.error_message();
  EXPECT_TRUE(list(other, Token("alice")).ok());
  EXPECT_EQ(list(other, "guess-guess-guess-x").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  std::lock_guard<std::mutex> l(reports.mu);
  // 21 wrong tokens from 127.0.0.1 on two connections: one line (the first),
  // the other 20 held for the next line after the window.
  ASSERT_EQ(reports.failures.size(), 1u);
  EXPECT_EQ(reports.failures[0].first, "ipv4:127.0.0.1");
  EXPECT_EQ(reports.failures[0].second, 1);
  ASSERT_EQ(reports.blocks.size(), 1u);
  EXPECT_THAT(reports.blocks[0], HasSubstr("ipv4:127.0.0.1:"));
}

}  // namespace
}  // namespace fxdp::testing

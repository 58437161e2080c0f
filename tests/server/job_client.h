// What the job service tests share: the MLP job's requests (spec, state,
// batches) as a client streams them, one Submit call (Submission), GetJob,
// CancelJob and FetchState calls, attached fake workers, fast options.
#ifndef FXDP_TESTS_SERVER_JOB_CLIENT_H_
#define FXDP_TESTS_SERVER_JOB_CLIENT_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "server/jobs/job_options.h"
#include "tests/server/mlp_job.h"
#include "tests/server/test_server.h"

namespace fxdp::testing {

// `c` split in two chunks at byte `at`.
inline std::vector<v1::TensorChunk> Split(const v1::TensorChunk& c, size_t at) {
  v1::TensorChunk a = c, b = c;
  a.set_data(c.data().substr(0, at));
  b.set_data(c.data().substr(at));
  b.set_offset(at);
  return {a, b};
}

inline std::vector<v1::TensorChunk> State() {
  std::vector<v1::TensorChunk> out = Split(F32("fc.weight", {3, 4}, 0), 20);
  out.push_back(F32("fc.bias", {3}, 100));
  return out;
}

struct JobArgs {
  int world = 1;
  int64_t steps = 1;
  int64_t batches = -1;  // -1: steps
  std::vector<std::string> data_paths;
  std::function<void(v1::JobSpec&)> edit_spec;
};

inline JobArgs Args(int world, int64_t steps, int64_t batches = -1,
                    std::vector<std::string> data_paths = {}) {
  JobArgs a;
  a.world = world;
  a.steps = steps;
  a.batches = batches;
  a.data_paths = std::move(data_paths);
  return a;
}

inline std::vector<v1::SubmitJobRequest> Requests(const JobArgs& a) {
  std::vector<v1::SubmitJobRequest> out(1);
  v1::JobSpec* spec = out[0].mutable_spec();
  *spec = MlpSpec(a.world, a.steps);
  for (const auto& p : a.data_paths) spec->add_data_paths(p);
  if (a.edit_spec) a.edit_spec(*spec);
  std::vector<v1::TensorChunk> state = State();
  for (const v1::Node& n :
       spec->graph().nodes()) {  // a graph with hyper-parameters: their values too
    if (n.kind() == v1::PLACEHOLDER && n.placeholder().role() == v1::HYPERPARAMETER) {
      state.push_back(F32(n.placeholder().state_name(), {}, 0.5f));
    }
  }
  spec->set_num_state_tensors(spec->num_state_tensors() +
                              static_cast<uint32_t>(state.size() - State().size()));
  for (const auto& c : state) *out.emplace_back().mutable_state() = c;
  const int64_t batches = a.data_paths.empty() ? (a.batches < 0 ? a.steps : a.batches) : 0;
  for (int64_t s = 1; s <= batches; ++s) {
    for (const auto& c : MlpBatch(s)) {
      v1::StepBatch* b = out.emplace_back().mutable_batch();
      b->set_step(s);
      *b->add_tensors() = c;
      b->set_more(c.name() == "input.0");
    }
  }
  return out;
}

// One Submit call: writes its requests (then WritesDone), reads its events.
class Submission {
 public:
  // `close`: half-close after the requests (else the client keeps the stream open).
  Submission(const TestServer& server, const std::vector<v1::SubmitJobRequest>& requests,
             bool close = true)
      : stub_(server.jobs()) {
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    stream_ = stub_->Submit(&ctx_);
    for (const auto& r : requests) {
      if (!stream_->Write(r)) break;
    }
    if (close) stream_->WritesDone();
  }
  explicit Submission(const TestServer& server, const JobArgs& args = JobArgs())
      : Submission(server, Requests(args)) {}

  bool Write(const v1::SubmitJobRequest& r) { return stream_->Write(r); }
  void Close() { stream_->WritesDone(); }
  // Events until one reports `step` (or the job ends); that one.
  v1::JobEvent UntilStep(int64_t step) {
    v1::JobEvent e;
    while (stream_->Read(&e) && e.step() < step && e.state() <= v1::JOB_STATE_RUNNING) {
    }
    return e;
  }
  v1::JobEvent Next() {
    v1::JobEvent e;
    EXPECT_TRUE(stream_->Read(&e)) << "the stream ended";
    return e;
  }
  // The remaining events, then the call's status.
  grpc::Status Finish(std::vector<v1::JobEvent>* rest = nullptr) {
    v1::JobEvent e;
    while (stream_->Read(&e)) {
      if (rest != nullptr) rest->push_back(e);
    }
    return stream_->Finish();
  }
  void Cancel() { ctx_.TryCancel(); }

 private:
  std::unique_ptr<v1::JobService::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SubmitJobRequest, v1::JobEvent>> stream_;
};

inline v1::JobInfo GetJob(const TestServer& s, const std::string& id,
                          grpc::Status* status = nullptr) {
  grpc::ClientContext ctx;
  v1::GetJobRequest req;
  req.set_job_id(id);
  v1::JobInfo info;
  grpc::Status st = s.jobs()->GetJob(&ctx, req, &info);
  if (status != nullptr) *status = st;
  return info;
}

inline v1::JobInfo CancelJob(const TestServer& s, const std::string& id) {
  grpc::ClientContext ctx;
  v1::CancelJobRequest req;
  req.set_job_id(id);
  req.set_reason("test");
  v1::JobInfo info;
  EXPECT_TRUE(s.jobs()->CancelJob(&ctx, req, &info).ok());
  return info;
}

// The final state's tensors by name (chunks of at most `chunk_bytes`).
inline grpc::Status FetchState(const TestServer& s, const std::string& id,
                               std::map<std::string, std::string>* out, uint32_t chunk_bytes = 0) {
  grpc::ClientContext ctx;
  v1::FetchJobStateRequest req;
  req.set_job_id(id);
  req.set_chunk_bytes(chunk_bytes);
  auto reader = s.jobs()->FetchState(&ctx, req);
  v1::StateChunk c;
  while (reader->Read(&c)) {
    if (c.has_tensor()) {
      if (chunk_bytes > 0) {  // the server clamps what it is asked for
        EXPECT_LE(c.tensor().data().size(),
                  std::clamp<size_t>(chunk_bytes, server::kMinFetchChunkBytes,
                                     server::kMaxFetchChunkBytes));
      }
      (*out)[c.tensor().name()] += c.tensor().data();
    }
  }
  return reader->Finish();
}

// Attached and registered fake workers w0, w1, ...
inline std::vector<std::unique_ptr<FakeWorker>> Workers(const TestServer& s, int n,
                                                        const std::string& prefix = "w") {
  std::vector<std::unique_ptr<FakeWorker>> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(std::make_unique<FakeWorker>(s.address(), prefix + std::to_string(i)));
    EXPECT_TRUE(out.back()->WaitRegistered());
  }
  return out;
}

inline server::JobServiceOptions FastOptions() {
  server::JobServiceOptions o;
  o.dispatch_interval_s = 0.01;
  o.release_grace_s = 1;
  o.keep_state_s = 1;  // a held step (FakeWorker::Hold) is given up on soon
  return o;
}

}  // namespace fxdp::testing

#endif  // FXDP_TESTS_SERVER_JOB_CLIENT_H_

#include "tests/server/test_server.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/parse_errors.h"

namespace fxdp::testing {

TestServer::TestServer(server::JobServiceOptions jobs, server::WorkerRegistryOptions workers,
                       const security::ServerSecurity* security, server::CompileLimits limits)
    : compile_({}, limits, security != nullptr ? security->auth : nullptr),
      registry_(workers, security != nullptr ? security->auth : nullptr),
      job_service_(&compile_, &registry_, jobs, nullptr,
                   security != nullptr ? security->auth : nullptr) {
  registry_.SetJobOwners([this](const std::string& id) { return job_service_.OwnerOf(id); });
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(
      "127.0.0.1:0",
      security != nullptr ? security->credentials : grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&compile_);
  builder.RegisterService(&registry_);
  builder.RegisterService(&job_service_);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(server::MakeParseErrorInterceptorFactory());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  server_ = builder.BuildAndStart();
  address_ = "127.0.0.1:" + std::to_string(port);
  if (security == nullptr || !security->tls)
    channel_ = grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
}

TestServer::~TestServer() {
  job_service_.CancelAll("the test server stops");
  registry_.Shutdown();
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server_->Wait();
}

bool WaitUntil(const std::function<bool()>& pred, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

FakeWorker::FakeWorker(const std::string& address, std::string id, int heartbeat_ms)
    : id_(std::move(id)), heartbeat_ms_(heartbeat_ms) {
  channel_ = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  Start();
}

FakeWorker::FakeWorker(std::shared_ptr<grpc::Channel> channel, const std::string& token,
                       std::string id, int heartbeat_ms)
    : id_(std::move(id)), heartbeat_ms_(heartbeat_ms), channel_(std::move(channel)) {
  ctx_.AddMetadata("authorization", "Bearer " + token);
  Start();
}

void FakeWorker::Start() {
  stub_ = v1::WorkerService::NewStub(channel_);
  stream_ = stub_->Attach(&ctx_);
  v1::WorkerMessage reg;
  v1::Register* r = reg.mutable_register_worker();
  r->set_protocol_version(v1::WORKER_PROTOCOL_VERSION_2);
  r->set_worker_id(id_);
  r->set_hostname("fake");
  r->set_pid(1);
  r->set_device("cpu");
  r->set_capacity(1);
  Write(reg);
  heartbeat_ = std::thread(&FakeWorker::HeartbeatLoop, this);  // first: the reader joins it
  reader_ = std::thread(&FakeWorker::ReadLoop, this);
}

FakeWorker::~FakeWorker() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  ctx_.TryCancel();
  reader_.join();
}

void FakeWorker::Write(const v1::WorkerMessage& m) {
  std::lock_guard<std::mutex> l(write_mu_);
  if (stream_ != nullptr) stream_->Write(m);
}

bool FakeWorker::WaitRegistered(double timeout_s) {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait_for(l, std::chrono::duration<double>(timeout_s), [&] { return registered_ || ended_; });
  return registered_ && !ended_;
}

bool FakeWorker::ended() const {
  std::lock_guard<std::mutex> l(mu_);
  return ended_;
}

grpc::Status FakeWorker::status() const {
  std::lock_guard<std::mutex> l(mu_);
  return status_;
}

void FakeWorker::StopHeartbeats() {
  std::lock_guard<std::mutex> l(mu_);
  heartbeats_ = false;
}

void FakeWorker::Kill() { ctx_.TryCancel(); }

void FakeWorker::Hold() {
  std::lock_guard<std::mutex> l(mu_);
  hold_ = true;
}

size_t FakeWorker::held() const {
  std::lock_guard<std::mutex> l(mu_);
  return held_.size();
}

void FakeWorker::Release() {
  std::vector<int64_t> steps;
  v1::AssignJob a;
  {
    std::lock_guard<std::mutex> l(mu_);
    hold_ = false;
    steps.swap(held_);
    if (job_id_.empty()) return;
    a = jobs_.back().assign;
  }
  for (int64_t s : steps) AnswerStep(a, s);
}

void FakeWorker::HoldCheckpoints() {
  std::lock_guard<std::mutex> l(mu_);
  hold_checkpoints_ = true;
}

void FakeWorker::ReleaseCheckpoints() {
  std::vector<v1::WorkerMessage> held;
  {
    std::lock_guard<std::mutex> l(mu_);
    hold_checkpoints_ = false;
    held.swap(held_checkpoints_);
  }
  for (const v1::WorkerMessage& m : held) Write(m);
}

void FakeWorker::FailAt(int64_t step, grpc::StatusCode code, std::string error) {
  std::lock_guard<std::mutex> l(mu_);
  fail_step_ = step;
  fail_code_ = code;
  fail_error_ = std::move(error);
}

std::vector<FakeWorker::JobRecord> FakeWorker::jobs() const {
  std::lock_guard<std::mutex> l(mu_);
  return jobs_;
}

void FakeWorker::HeartbeatLoop() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_ && !ended_) {
    if (registered_ && heartbeats_) {
      v1::WorkerMessage m;
      v1::Heartbeat* h = m.mutable_heartbeat();
      h->set_state(job_id_.empty() ? v1::WORKER_STATE_IDLE : v1::WORKER_STATE_BUSY);
      h->set_job_id(job_id_);
      l.unlock();
      Write(m);
      l.lock();
    }
    cv_.wait_for(l, std::chrono::milliseconds(heartbeat_ms_), [&] { return stop_ || ended_; });
  }
}

void FakeWorker::ReadLoop() {
  v1::ServerMessage m;
  while (stream_->Read(&m)) Handle(m);
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  heartbeat_.join();
  grpc::Status s;
  {
    std::lock_guard<std::mutex> l(write_mu_);
    s = stream_->Finish();
    stream_.reset();
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    status_ = s;
    ended_ = true;
  }
  cv_.notify_all();
}

FakeWorker::JobRecord* FakeWorker::Current(const std::string& job_id) {
  return !jobs_.empty() && job_id_ == job_id ? &jobs_.back() : nullptr;
}

void FakeWorker::AnswerStep(const v1::AssignJob& a, int64_t step) {
  v1::WorkerMessage m, checkpoint;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (job_id_ != a.job_id()) return;
    if (step == fail_step_) {
      v1::JobFailed* f = m.mutable_job_failed();
      f->set_job_id(a.job_id());
      f->set_rank(a.rank());
      f->set_step(step);
      f->set_code(static_cast<int>(fail_code_));
      f->set_error(fail_error_);
      fail_step_ = 0;
      job_id_.clear();
    } else {
      v1::StepResult* r = m.mutable_step_result();
      r->set_job_id(a.job_id());
      r->set_rank(a.rank());
      r->set_step(step);
      r->set_loss(static_cast<double>(step));
      r->set_local_loss(static_cast<double>(a.rank()));
      r->set_step_ms(1);
      const v1::CheckpointPolicy& c = a.checkpoints();
      if (a.has_checkpoints() && ((c.every() > 0 && step % c.every() == 0) || step == a.steps())) {
        v1::WorkerMessage w;
        v1::CheckpointWritten* cw = w.mutable_checkpoint_written();
        cw->set_job_id(a.job_id());
        cw->set_rank(a.rank());
        cw->set_step(step);
        cw->set_path(absl::StrCat(c.dir(), "/step-", step));
        if (hold_checkpoints_) {
          held_checkpoints_.push_back(std::move(w));
        } else {
          checkpoint = std::move(w);
        }
      }
    }
  }
  if (checkpoint.has_checkpoint_written()) Write(checkpoint);
  Write(m);
}

namespace {

// A LoadGraph: the program held (its eviction first), checked against max_graphs.
void RecordLoadGraph(const v1::LoadGraph& g, FakeWorker::JobRecord* rec) {
  std::vector<uint32_t>& held = rec->held_graphs;
  if (g.evict_graph_id() != 0) {
    auto it = std::find(held.begin(), held.end(), g.evict_graph_id());
    if (it == held.end()) rec->errors.push_back(absl::StrCat("evicts ", g.evict_graph_id()));
    if (it != held.end()) held.erase(it);
  }
  held.push_back(g.graph_id());
  if (held.size() > rec->assign.max_graphs())
    rec->errors.push_back(absl::StrCat("holds ", held.size(), " programs"));
  rec->loads.push_back(g);
}

// A Batch's graph_id: recorded, and it must name a program held (0: AssignJob's).
void RecordGraphId(int64_t step, uint32_t id, FakeWorker::JobRecord* rec) {
  const std::vector<uint32_t>& held = rec->held_graphs;
  if (id != 0 && std::find(held.begin(), held.end(), id) == held.end())
    rec->errors.push_back(absl::StrCat("step ", step, " runs graph ", id, ", not held"));
  rec->graph_ids[step] = id;
}

// A chunk appended to its tensor in `into` (a new tensor at offset 0).
void AddChunk(FakeWorker::Tensors& into, const v1::TensorChunk& c, FakeWorker::JobRecord* rec) {
  FakeWorker::Tensor& t = into[c.name()];
  if (c.offset() == 0) t = FakeWorker::Tensor{c.dtype(), {c.shape().begin(), c.shape().end()}, ""};
  t.data += c.data();
  rec->max_chunk_bytes = std::max(rec->max_chunk_bytes, c.data().size());
}

v1::WorkerMessage JobStarted(const v1::AssignJob& a) {
  v1::WorkerMessage s;
  s.mutable_job_started()->set_job_id(a.job_id());
  s.mutable_job_started()->set_rank(a.rank());
  s.mutable_job_started()->set_world_size(a.world_size());
  return s;
}

v1::WorkerMessage JobEnded(const v1::AssignJob& a, bool cancelled) {
  v1::WorkerMessage e;
  e.mutable_job_ended()->set_job_id(a.job_id());
  e.mutable_job_ended()->set_rank(a.rank());
  if (cancelled) e.mutable_job_ended()->set_cancelled(true);
  return e;
}

// FetchState's answer: a chunk per state tensor, the last one marked (one
// empty chunk for no state).
std::vector<v1::WorkerMessage> StateChunks(const FakeWorker::JobRecord& rec) {
  std::vector<v1::WorkerMessage> out;
  for (const auto& [name, t] : rec.state) {
    v1::WorkerMessage c;
    v1::TensorChunk* tc = c.mutable_state_chunk()->mutable_tensor();
    c.mutable_state_chunk()->set_job_id(rec.assign.job_id());
    tc->set_name(name);
    tc->set_dtype(t.dtype);
    for (int64_t d : t.shape) tc->add_shape(d);
    tc->set_data(t.data);
    out.push_back(std::move(c));
  }
  if (out.empty()) out.emplace_back().mutable_state_chunk()->set_job_id(rec.assign.job_id());
  out.back().mutable_state_chunk()->set_last(true);
  return out;
}

}  // namespace

void FakeWorker::Handle(v1::ServerMessage& m) {
  std::unique_lock<std::mutex> l(mu_);
  switch (m.msg_case()) {
    case v1::ServerMessage::kRegistered:
      registered_ = true;
      cv_.notify_all();
      return;
    case v1::ServerMessage::kAssignJob: {
      JobRecord rec;
      rec.assign = m.assign_job();
      rec.assign.clear_graph();
      jobs_.push_back(std::move(rec));
      job_id_ = m.assign_job().job_id();
      return;
    }
    case v1::ServerMessage::kStateChunk: {
      JobRecord* rec = Current(m.state_chunk().job_id());
      if (rec == nullptr) return;
      if (m.state_chunk().has_tensor()) AddChunk(rec->state, m.state_chunk().tensor(), rec);
      if (!m.state_chunk().last()) return;
      v1::WorkerMessage s = JobStarted(rec->assign);
      if (rec->assign.report_dataset_shapes())
        *s.mutable_job_started()->mutable_dataset_shapes() = dataset_shapes_;
      l.unlock();
      Write(s);
      return;
    }
    case v1::ServerMessage::kLoadGraph: {
      JobRecord* rec = Current(m.load_graph().job_id());
      if (rec != nullptr) RecordLoadGraph(m.load_graph(), rec);
      return;
    }
    case v1::ServerMessage::kBatch: {
      JobRecord* rec = Current(m.batch().job_id());
      if (rec == nullptr) return;
      const int64_t step = m.batch().step();
      RecordGraphId(step, m.batch().graph_id(), rec);
      ++rec->batch_messages[step];
      Tensors& into = rec->batches[step];
      for (const v1::HyperparameterValue& h : m.batch().hyperparameters())
        rec->hyperparameters[step][h.name()] = h.value();
      for (const v1::TensorChunk& c : m.batch().tensors()) AddChunk(into, c, rec);
      if (m.batch().more()) return;
      if (hold_) {
        held_.push_back(step);
        return;
      }
      const v1::AssignJob a = rec->assign;
      l.unlock();
      AnswerStep(a, step);
      return;
    }
    case v1::ServerMessage::kFetchState: {
      JobRecord* rec = Current(m.fetch_state().job_id());
      if (rec == nullptr) return;
      ++rec->fetches;
      std::vector<v1::WorkerMessage> out = StateChunks(*rec);
      if (m.fetch_state().end_job()) {
        out.push_back(JobEnded(rec->assign, false));
        job_id_.clear();
      }
      l.unlock();
      for (const auto& x : out) Write(x);
      return;
    }
    case v1::ServerMessage::kCancelJob: {
      JobRecord* rec = Current(m.cancel_job().job_id());
      if (rec == nullptr) return;
      rec->cancelled = true;
      held_.clear();
      const v1::WorkerMessage e = JobEnded(rec->assign, true);
      job_id_.clear();
      l.unlock();
      Write(e);
      return;
    }
    default: return;
  }
}

}  // namespace fxdp::testing

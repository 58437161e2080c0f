#include "server/jobs/dispatcher.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "analysis/ir/random_ops.h"

namespace fxdp::server {
namespace {

// The job a worker message is about (null for heartbeats and registration).
const std::string* JobIdOf(const v1::WorkerMessage& m) {
  switch (m.msg_case()) {
    case v1::WorkerMessage::kJobStarted: return &m.job_started().job_id();
    case v1::WorkerMessage::kJobFailed: return &m.job_failed().job_id();
    case v1::WorkerMessage::kStepResult: return &m.step_result().job_id();
    case v1::WorkerMessage::kStateChunk: return &m.state_chunk().job_id();
    case v1::WorkerMessage::kJobEnded: return &m.job_ended().job_id();
    case v1::WorkerMessage::kEvalResult: return &m.eval_result().job_id();
    case v1::WorkerMessage::kCheckpointWritten: return &m.checkpoint_written().job_id();
    default: return nullptr;
  }
}

}  // namespace

int FreeLocalPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  int port = 0;
  socklen_t len = sizeof(a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

int Dispatcher::Subscribe(std::vector<int64_t>* handles) {
  for (int r = 0; r < world(); ++r) {
    std::weak_ptr<Job> weak = job_;
    const std::string job_id = id_;
    // Runs on the worker's reader thread, maybe after the job ended.
    const int64_t h = pool_->Subscribe(
        workers_[r], [weak, r, job_id](const std::string&, const v1::WorkerMessage* m) {
          std::shared_ptr<Job> job = weak.lock();
          if (!job) return;
          Job::Msg msg;
          msg.rank = r;
          if (m == nullptr) {
            msg.lost = true;
          } else {
            const std::string* id = JobIdOf(*m);
            if (id == nullptr || *id != job_id) return;
            msg.m = *m;
          }
          job->FromRank(std::move(msg));
        });
    if (h == 0) return r;
    handles->push_back(h);
  }
  return -1;
}

std::string Dispatcher::RendezvousHost() const {
  // Rank 0's address as the server sees its connection (WorkerInfo.address;
  // loopback when it runs here), never the hostname it declared
  // (docs/robustness.md).
  std::string host = "127.0.0.1";
  for (const auto& w : pool_->List()) {
    if (w.worker_id() == workers_[0] && !w.address().empty()) host = w.address();
  }
  return host;
}

v1::GraphDef Dispatcher::RankGraph(const v1::ExpandResponse& expanded, int rank) const {
  v1::GraphDef g = expanded.graphs(rank % expanded.graphs_size());
  if (const int64_t done = job_->plan().first_step; done > 0) {
    // A resumed job's workers count its steps from 1: its random ops go on from `done`.
    v1::StringPair* kv = g.add_metadata();
    kv->set_key(std::string(ir::kStepOffsetKey));
    kv->set_value(absl::StrCat(done));
  }
  return g;
}

bool Dispatcher::LoadGraph(int rank, uint32_t graph_id, const v1::ExpandResponse& expanded,
                           uint32_t evict) {
  v1::ServerMessage m;
  v1::LoadGraph* l = m.mutable_load_graph();
  l->set_job_id(id_);
  l->set_graph_id(graph_id);
  *l->mutable_graph() = RankGraph(expanded, rank);
  l->set_evict_graph_id(evict);
  return Send(rank, m);
}

int Dispatcher::Assign(const std::string& host, int port, int64_t steps, uint32_t max_graphs) {
  const v1::JobSpec& spec = job_->plan().spec;
  for (int r = 0; r < world(); ++r) {
    v1::ServerMessage m;
    v1::AssignJob* a = m.mutable_assign_job();
    a->set_job_id(id_);
    a->set_rank(r);
    a->set_world_size(world());
    a->set_rendezvous_host(host);
    a->set_rendezvous_port(port);
    a->set_collective_timeout_s(spec.collective_timeout_s());
    a->set_device("cpu");
    a->set_steps(steps);
    *a->mutable_graph() = RankGraph(job_->plan().expanded, r);
    a->set_max_graphs(max_graphs);
    // Rank 0 reports a dataset's step shapes (dataset_shapes.h).
    a->set_report_dataset_shapes(r == 0 && job_->plan().symbolic != nullptr &&
                                 spec.data_paths_size() > 0);
    a->set_num_state_tensors(spec.num_state_tensors());
    a->set_batches_sharded(spec.data_paths_size() == 0);
    const int n = spec.data_paths_size();
    for (int i = 0; i < n; ++i)
      a->add_data_paths(spec.data_paths(static_cast<int>((i + job_->plan().first_step) % n)));
    AddCheckpointFields(a);
    if (spec.has_eval()) {
      *a->mutable_eval() = spec.eval();  // its graph: this rank's expanded one
      *a->mutable_eval()->mutable_graph() =
          job_->plan().eval.graphs(r % job_->plan().eval.graphs_size());
    }
    job_->MarkAssigned(r);
    if (!Send(r, m)) return r;
  }
  return -1;
}

void Dispatcher::AddCheckpointFields(v1::AssignJob* a) const {
  const JobPlan& plan = job_->plan();
  if (!plan.spec.has_initial_checkpoint() && !plan.spec.has_checkpoints()) return;
  *a->mutable_sharded_state() = plan.expanded.sharded_state();
  if (plan.spec.has_checkpoints()) *a->mutable_checkpoints() = plan.spec.checkpoints();
  if (!plan.spec.has_initial_checkpoint()) return;
  v1::CheckpointSource* c = a->mutable_initial_checkpoint();
  *c = plan.spec.initial_checkpoint();
  for (v1::StateFill& f : *c->mutable_fills()) {
    // The whole shape, which a FULLY_SHARD rank needs to leave its padding zero.
    if (const ir::DeclaredTensors::Tensor* t = plan.declared_state.Find(f.state_name()))
      f.mutable_shape()->Assign(t->shape.begin(), t->shape.end());
  }
}

bool Dispatcher::Send(int rank, const v1::ServerMessage& m) {
  return pool_->Send(workers_[rank], m);
}

int Dispatcher::SendAll(const v1::ServerMessage& m) {
  for (int r = 0; r < world(); ++r) {
    if (!Send(r, m)) return r;
  }
  return -1;
}

void Dispatcher::CancelAssigned(const std::string& reason, int except) {
  v1::ServerMessage m;
  m.mutable_cancel_job()->set_job_id(id_);
  m.mutable_cancel_job()->set_reason(reason);
  for (int r = 0; r < world(); ++r) {
    if (r != except && job_->assigned(r)) Send(r, m);
  }
}

void Dispatcher::CancelOthers(const std::string& reason) {
  v1::ServerMessage m;
  m.mutable_cancel_job()->set_job_id(id_);
  m.mutable_cancel_job()->set_reason(reason);
  for (int r = 1; r < world(); ++r) Send(r, m);
}

}  // namespace fxdp::server

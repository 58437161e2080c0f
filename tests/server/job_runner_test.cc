// The job runner without gRPC (server/jobs/job_runner.h), with the spec checks,
// the job table and the scheduler as the server wires them. The workers are an
// in-process WorkerPool whose workers answer like `fxdp-worker attach`
// (JobStarted once the state is complete, a StepResult per step with loss =
// step and local_loss = rank, the state back on FetchState, JobEnded on end_job
// and CancelJob); the client is a JobClient whose messages are queued on the
// job before it runs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "analysis/ir/batch_split.h"
#include "server/compile/compile_service.h"
#include "server/jobs/job.h"
#include "server/jobs/job_runner.h"
#include "server/jobs/job_scheduler.h"
#include "server/jobs/job_spec.h"
#include "server/jobs/job_store.h"
#include "server/jobs/job_table.h"
#include "server/workers/worker_pool.h"
#include "tests/server/mlp_job.h"
#include "tests/test_util.h"
#include "util/status_macros.h"

namespace fxdp::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A whole submission: spec, state, `steps` batches (each in two messages).
std::vector<v1::SubmitJobRequest> Requests(int world, int64_t steps) {
  std::vector<v1::SubmitJobRequest> out(1);
  *out[0].mutable_spec() = MlpSpec(world, steps);
  *out.emplace_back().mutable_state() = F32("fc.weight", {3, 4}, 0);
  *out.emplace_back().mutable_state() = F32("fc.bias", {3}, 100);
  for (int64_t s = 1; s <= steps; ++s) {
    const auto b = MlpBatch(s);
    out.push_back(BatchMessage(s, b[0], true));
    out.push_back(BatchMessage(s, b[1], false));
  }
  return out;
}

// In-process workers w0, w1, ... (see the file comment). Replies are
// delivered to the subscribers from inside Send, outside the pool's lock.
class InProcessWorkers : public server::WorkerPool {
 public:
  struct Record {
    v1::AssignJob assign;
    std::map<std::string, v1::TensorChunk> state;                       // whole tensors
    std::map<int64_t, std::map<std::string, v1::TensorChunk>> batches;  // by step
    std::map<int64_t, int> batch_messages;
    bool cancelled = false;
  };

  explicit InProcessWorkers(int n) {
    for (int i = 0; i < n; ++i) workers_["w" + std::to_string(i)];
  }

  std::vector<v1::WorkerInfo> List() const override {
    std::lock_guard<std::mutex> l(mu_);
    std::vector<v1::WorkerInfo> out;
    for (const auto& [id, w] : workers_) {
      v1::WorkerInfo& i = out.emplace_back();
      i.set_worker_id(id);
      i.set_state(w.lost   ? v1::WORKER_STATE_LOST
                  : w.busy ? v1::WORKER_STATE_BUSY
                           : v1::WORKER_STATE_IDLE);
    }
    return out;
  }
  std::vector<std::string> IdleWorkers() const override {
    std::lock_guard<std::mutex> l(mu_);
    std::vector<std::string> out;
    for (const auto& [id, w] : workers_) {
      if (!w.lost && !w.busy) out.push_back(id);
    }
    return out;
  }
  int64_t Subscribe(const std::string& id, Listener listener) override {
    std::lock_guard<std::mutex> l(mu_);
    if (workers_.count(id) == 0 || workers_[id].lost) return 0;
    listeners_[next_] = {id, std::move(listener)};
    return next_++;
  }
  void Unsubscribe(int64_t handle) override {
    std::lock_guard<std::mutex> l(mu_);
    listeners_.erase(handle);
  }
  bool Send(const std::string& id, const v1::ServerMessage& m) override {
    std::vector<v1::WorkerMessage> replies;
    {
      std::lock_guard<std::mutex> l(mu_);
      Worker& w = workers_[id];
      if (w.lost) return false;
      Handle(w, m, &replies);
    }
    for (const auto& r : replies) Deliver(id, &r);
    return true;
  }

  // The worker's stream ends: its subscribers hear of it, it is LOST.
  void Lose(const std::string& id) {
    {
      std::lock_guard<std::mutex> l(mu_);
      workers_[id].lost = true;
    }
    Deliver(id, nullptr);
  }
  std::vector<Record> jobs(const std::string& id) const {
    std::lock_guard<std::mutex> l(mu_);
    return workers_.at(id).jobs;
  }
  // A hostile or broken worker: edits the state it sends on FetchState.
  std::function<void(std::vector<v1::WorkerMessage>*)> edit_fetched;

 private:
  struct Worker {
    bool busy = false, lost = false;
    std::vector<Record> jobs;
  };

  static void Add(std::map<std::string, v1::TensorChunk>& into, const v1::TensorChunk& c) {
    v1::TensorChunk& t = into[c.name()];
    if (c.offset() == 0) {
      t = c;
      t.clear_offset();
    } else {
      t.mutable_data()->append(c.data());
    }
  }

  void Handle(Worker& w, const v1::ServerMessage& m, std::vector<v1::WorkerMessage>* out) {
    Record* rec = w.jobs.empty() ? nullptr : &w.jobs.back();
    switch (m.msg_case()) {
      case v1::ServerMessage::kAssignJob:
        w.busy = true;
        w.jobs.emplace_back().assign = m.assign_job();
        w.jobs.back().assign.clear_graph();
        return;
      case v1::ServerMessage::kStateChunk:
        if (m.state_chunk().has_tensor()) Add(rec->state, m.state_chunk().tensor());
        if (m.state_chunk().last()) {
          out->emplace_back().mutable_job_started()->set_job_id(rec->assign.job_id());
          out->back().mutable_job_started()->set_rank(rec->assign.rank());
        }
        return;
      case v1::ServerMessage::kBatch: {
        const int64_t step = m.batch().step();
        ++rec->batch_messages[step];
        for (const auto& c : m.batch().tensors()) Add(rec->batches[step], c);
        if (m.batch().more()) return;
        v1::StepResult* r = out->emplace_back().mutable_step_result();
        r->set_job_id(rec->assign.job_id());
        r->set_rank(rec->assign.rank());
        r->set_step(step);
        r->set_loss(static_cast<double>(step));
        r->set_local_loss(rec->assign.rank());
        return;
      }
      case v1::ServerMessage::kFetchState:
        for (const auto& [name, t] : rec->state) {
          v1::StateChunk* c = out->emplace_back().mutable_state_chunk();
          c->set_job_id(rec->assign.job_id());
          *c->mutable_tensor() = t;
        }
        out->back().mutable_state_chunk()->set_last(true);
        if (edit_fetched) edit_fetched(out);
        if (m.fetch_state().end_job()) End(w, rec, out);
        return;
      case v1::ServerMessage::kCancelJob:
        rec->cancelled = true;
        End(w, rec, out);
        return;
      default: return;
    }
  }
  static void End(Worker& w, Record* rec, std::vector<v1::WorkerMessage>* out) {
    w.busy = false;
    out->emplace_back().mutable_job_ended()->set_job_id(rec->assign.job_id());
  }
  void Deliver(const std::string& id, const v1::WorkerMessage* m) {
    std::vector<Listener> to;
    {
      std::lock_guard<std::mutex> l(mu_);
      for (const auto& [h, entry] : listeners_) {
        if (entry.first == id) to.push_back(entry.second);
      }
    }
    for (const auto& f : to) f(id, m);
  }

  mutable std::mutex mu_;
  std::map<std::string, Worker> workers_;
  std::map<int64_t, std::pair<std::string, Listener>> listeners_;
  int64_t next_ = 1;
};

// The client: its messages are queued on the job before the run; it records
// the events.
class QueuedClient : public server::JobClient {
 public:
  void Write(v1::JobEvent e) override {
    std::lock_guard<std::mutex> l(mu_);
    events_.push_back(std::move(e));
  }
  void SetReadBudget(size_t) override {}
  void Consumed(size_t) override {}
  std::vector<v1::JobEvent> events() const {
    std::lock_guard<std::mutex> l(mu_);
    return events_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<v1::JobEvent> events_;
};

server::JobServiceOptions FastOptions() {
  server::JobServiceOptions o;
  o.dispatch_interval_s = 0.01;
  o.release_grace_s = 1;
  return o;
}

// The parts as the server wires them, without gRPC.
struct Parts {
  explicit Parts(int workers, server::JobServiceOptions o = FastOptions())
      : options(o), pool(workers), table(o), scheduler(&pool, &table, o) {
    context.options = o;
    context.expand = server::RunExpand;
    context.pool = &pool;
    context.table = &table;
    context.scheduler = &scheduler;
  }
  // Runs a job whose client sent `requests` and half-closed.
  absl::Status Run(const std::vector<v1::SubmitJobRequest>& requests, QueuedClient* client,
                   std::shared_ptr<server::Job>* job_out = nullptr) {
    auto job = std::make_shared<server::Job>();
    for (const auto& r : requests) job->FromClient(r, r.ByteSizeLong());
    job->ClientEnded();
    if (job_out != nullptr) *job_out = job;
    return server::RunJob(context, client, job);
  }

  server::JobServiceOptions options;
  InProcessWorkers pool;
  server::JobTable table;
  server::JobScheduler scheduler;
  server::JobContext context;
};

TEST(JobRunner, RunsAStreamedJobOnTwoRanksWithoutGrpc) {
  Parts parts(2);
  QueuedClient client;
  ASSERT_TRUE(parts.Run(Requests(2, 2), &client).ok());
  const auto ev = client.events();
  ASSERT_EQ(ev.size(), 5u);
  EXPECT_EQ(ev[0].state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(ev[1].state(), v1::JOB_STATE_RUNNING);
  EXPECT_THAT(ev[1].workers(), ElementsAre("w0", "w1"));
  EXPECT_EQ(ev[2].step(), 1);
  EXPECT_THAT(ev[2].local_losses(), ElementsAre(0.0, 1.0));
  EXPECT_EQ(ev[3].step(), 2);
  EXPECT_EQ(ev[3].loss(), 2.0);
  EXPECT_EQ(ev[4].state(), v1::JOB_STATE_SUCCEEDED);

  // Each rank got half of every global batch, rows [4r, 4r + 4).
  for (int r = 0; r < 2; ++r) {
    const auto jobs = parts.pool.jobs("w" + std::to_string(r));
    ASSERT_EQ(jobs.size(), 1u);
    EXPECT_EQ(jobs[0].assign.rank(), r);
    EXPECT_TRUE(jobs[0].assign.batches_sharded());
    for (int64_t step = 1; step <= 2; ++step) {
      for (const auto& global : MlpBatch(step)) {
        const v1::TensorChunk& got = jobs[0].batches.at(step).at(global.name());
        const int64_t cols = global.shape(1);
        EXPECT_THAT(got.shape(), ElementsAre(4, cols));
        EXPECT_EQ(got.data(), global.data().substr(4 * r * cols * 4, 4 * cols * 4))
            << global.name();
      }
    }
  }
  // The table has the job and its final state (rank 0's state).
  const std::vector<std::shared_ptr<server::Job>> all = parts.table.All();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0]->state(), v1::JOB_STATE_SUCCEEDED);
  auto state = parts.table.FinalState(ev[0].job_id());
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ((*state)->size(), 2u);
  EXPECT_EQ((*state)->at(0).name(), "fc.bias");
  EXPECT_EQ((*state)->at(1).data(), F32("fc.weight", {3, 4}, 0).data());
}

TEST(JobRunner, BadInputFailsTheJobInvalidArgumentAndCancelsTheRanks) {
  Parts parts(2);
  std::vector<v1::SubmitJobRequest> req = Requests(2, 1);
  req.back().mutable_batch()->mutable_tensors(0)->set_dtype(v1::FLOAT64);
  QueuedClient client;
  const absl::Status s = parts.Run(req, &client);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      s.message(),
      HasSubstr("step 1's batch: input 'input.1' is f64[8, 3], the graph expects f32[8, 3]"));
  EXPECT_EQ(client.events().back().state(), v1::JOB_STATE_FAILED);
  for (const char* w : {"w0", "w1"}) EXPECT_TRUE(parts.pool.jobs(w).back().cancelled) << w;
}

TEST(JobRunner, ALostRankFailsTheJobUnavailableNamingIt) {
  Parts parts(2);
  // The client never sends step 1's batch: the job waits while w1 is lost.
  std::vector<v1::SubmitJobRequest> req = Requests(2, 1);
  req.resize(3);
  auto job = std::make_shared<server::Job>();
  for (const auto& r : req) job->FromClient(r, r.ByteSizeLong());
  QueuedClient client;
  std::thread lose([&] {
    while (parts.pool.jobs("w1").empty()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    parts.pool.Lose("w1");
  });
  const absl::Status s = server::RunJob(parts.context, &client, job);
  lose.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("rank 1 (worker w1) was lost"));
  EXPECT_EQ(job->state(), v1::JOB_STATE_FAILED);
}

// Ragged inputs (issue 23): the MLP with a flat text i64[17] (no batch dim) and its offsets
// i64[8] (8 bags, batch dim 0), listed as ragged in the rank graphs (fxdp.ragged, written here
// by the expander): each rank gets its bags' tokens and its offsets rebased; a step whose
// offsets decrease fails the job INVALID_ARGUMENT naming the element, no rank getting any of it.
TEST(JobRunner, SendsEachRankItsBagsOfARaggedInput) {
  std::string text = ReadTestData("mlp_sgd.txt");
  const std::string y = "batch_dim=0}\n  %t:";
  text.replace(text.find(y), y.size(),
               "batch_dim=0}\n"
               "  %text: i64[17] = placeholder() {role=INPUT, state=\"text\", batch_dim=-1}\n"
               "  %offsets: i64[8] = placeholder() {role=INPUT, state=\"offsets\", batch_dim=0}\n"
               "  %t:");
  std::vector<v1::SubmitJobRequest> req = Requests(2, 2);
  *req[0].mutable_spec()->mutable_graph() = ir::EncodeGraph(ValueOrDie(ir::ParseGraphText(text)));
  auto ints = [](const char* name, std::vector<int64_t> v) {
    v1::TensorChunk c;
    c.set_name(name);
    c.set_dtype(v1::INT64);
    c.add_shape(static_cast<int64_t>(v.size()));
    c.set_data(std::string(reinterpret_cast<const char*>(v.data()), v.size() * 8));
    return c;
  };
  std::vector<int64_t> tokens(17);
  for (int i = 0; i < 17; ++i) tokens[i] = 100 + i;
  // Step 1's offsets, then step 2's (bag 5 starts before bag 4), before each step's last message.
  const std::vector<int64_t> good = {0, 4, 5, 8, 10, 13, 15, 16}, bad = {0, 4, 5, 8, 10, 9, 15, 16};
  for (int64_t step : {1, 2}) {
    auto at =
        req.insert(req.end() - (step == 1 ? 3 : 1), BatchMessage(step, ints("text", tokens), true));
    req.insert(at + 1, BatchMessage(step, ints("offsets", step == 1 ? good : bad), true));
  }
  Parts parts(2);
  parts.context.expand = [](const v1::ExpandRequest& r) -> absl::StatusOr<v1::ExpandResponse> {
    FXDP_ASSIGN_OR_RETURN(v1::ExpandResponse x, server::RunExpand(r));
    for (v1::GraphDef& g : *x.mutable_graphs()) {
      v1::StringPair* m = g.add_metadata();
      m->set_key(ir::kRaggedKey);
      m->set_value("text offsets\n");
    }
    return x;
  };
  QueuedClient client;
  const absl::Status s = parts.Run(req, &client);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          "step 2's batch: input 'offsets' (the offsets of the bags of input "
                          "'text' i64[17]): offsets[5] is 9, outside [10, 17]"));
  const std::vector<std::vector<int64_t>> spans = {{0, 10}, {10, 17}},
                                          offsets = {{0, 4, 5, 8}, {0, 3, 5, 6}};
  for (int r = 0; r < 2; ++r) {
    const auto jobs = parts.pool.jobs("w" + std::to_string(r));
    ASSERT_EQ(jobs.size(), 1u);
    EXPECT_EQ(jobs[0].batches.count(2), 0u) << "rank " << r << " got some of step 2";
    const auto& got = jobs[0].batches.at(1);
    const int64_t n = spans[r][1] - spans[r][0];
    EXPECT_THAT(got.at("text").shape(), ElementsAre(n));
    EXPECT_EQ(got.at("text").data(), ints("text", tokens).data().substr(spans[r][0] * 8, n * 8));
    EXPECT_EQ(got.at("offsets").data(), ints("offsets", offsets[r]).data()) << "rank " << r;
    EXPECT_THAT(got.at("input.0").shape(), ElementsAre(4, 4));
  }
}

TEST(JobRunner, ABadSpecIsRefusedBeforeItIsQueued) {
  Parts parts(1);
  v1::SubmitJobRequest r;
  *r.mutable_spec() = MlpSpec(0, 1);
  QueuedClient client;
  const absl::Status s = parts.Run({r}, &client);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("JobSpec.world_size must be >= 1, got 0"));
  EXPECT_TRUE(parts.table.All().empty());
  EXPECT_TRUE(client.events().empty());
}

// Issue 17: the client's initial state is checked against the graph's state
// placeholders as it arrives (name, dtype, shape, count), and a state the
// server holds (--state-dir, data_paths) is bounded by what the graph
// declares and by --max-initial-state-mb, reserved before any of it is read.
TEST(JobRunner, InitialStateIsCheckedAgainstTheGraphAndItsHeldBytesAreBounded) {
  std::string dir = ::testing::TempDir() + "fxdp_bound_XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  auto store = ValueOrDie(server::JobStore::Open(dir));
  server::JobServiceOptions o = FastOptions();
  o.max_initial_state_bytes = 100;  // the MLP's state is 60 bytes
  Parts parts(1, o);
  std::atomic<uint64_t> held{0};
  parts.context.store = store.get();
  parts.context.held_state_bytes = &held;
  auto submit = [&](std::function<void(std::vector<v1::SubmitJobRequest>&)> edit) {
    std::vector<v1::SubmitJobRequest> req = Requests(1, 1);
    req.resize(3);  // spec and state: the workers read the batches
    req[0].mutable_spec()->add_data_paths("/data/a.safetensors");
    if (edit) edit(req);
    QueuedClient client;
    return parts.Run(req, &client);
  };
  auto expect = [&](absl::Status s, absl::StatusCode code, const std::string& want) {
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_THAT(s.message(), HasSubstr(want));
    EXPECT_EQ(held.load(), 0u) << want;  // the reservation was given back
  };
  // A tensor declared far larger than the graph's (the never-ending stream).
  expect(submit([](auto& r) {
           r[1].mutable_state()->clear_shape();
           r[1].mutable_state()->add_shape(int64_t{1} << 36);
         }),
         absl::StatusCode::kInvalidArgument,
         "initial state: tensor 'fc.weight' is f32[68719476736], the graph's placeholder 'w' "
         "declares f32[3, 4]");
  expect(submit([](auto& r) { r[2].mutable_state()->set_dtype(v1::FLOAT64); }),
         absl::StatusCode::kInvalidArgument,
         "tensor 'fc.bias' is f64[3], the graph's placeholder 'b' declares f32[3]");
  expect(submit([](auto& r) { r[2].mutable_state()->set_name("fc.extra"); }),
         absl::StatusCode::kInvalidArgument,
         "tensor 'fc.extra' is not a state tensor of the graph (its 2: fc.weight, fc.bias)");
  expect(submit([](auto& r) { r[2] = r[1]; }), absl::StatusCode::kInvalidArgument,
         "tensor 'fc.weight': sent twice");
  expect(submit([](auto& r) { r[0].mutable_spec()->set_num_state_tensors(3); }),
         absl::StatusCode::kInvalidArgument,
         "JobSpec.num_state_tensors is 3, the graph declares 2 state tensors (fc.weight, fc.bias)");
  // Other jobs' held states leave too little: refused before a byte is read.
  held = 50;
  const absl::Status busy = submit(nullptr);
  EXPECT_EQ(busy.code(), absl::StatusCode::kResourceExhausted) << busy;
  EXPECT_THAT(
      busy.message(),
      HasSubstr("the graph declares 2 state tensors of 0.0 MiB (60 bytes) in all; the "
                "initial states of other jobs that have not started yet hold 0.0 MiB (50 bytes)"));
  held = 0;
  parts.options.max_initial_state_bytes = 50;
  parts.context.options.max_initial_state_bytes = 50;
  expect(submit(nullptr), absl::StatusCode::kResourceExhausted,
         "over this server's limit of 0 MiB for the initial states it holds (fxdp-server "
         "--max-initial-state-mb");
  // A resume holds its checkpoint too: refused before the checkpoint is looked up or read.
  expect(submit([](auto& r) {
           r.resize(1);
           r[0].mutable_spec()->set_resume_job("job-7-abc");
           r[0].mutable_spec()->set_num_state_tensors(0);
         }),
         absl::StatusCode::kResourceExhausted, "--max-initial-state-mb");
  parts.context.options.max_initial_state_bytes = 100;
  expect(submit(nullptr), absl::StatusCode::kOk, "");
  std::remove((dir + "/jobs.db").c_str());
}

// What a worker sends back (rank 0's final state, REPLICATE) is checked
// against the graph as it arrives: a worker cannot make the server hold more
// than the graph declares, nor end with part of the state.
TEST(JobRunner, AWorkersStateIsCheckedAgainstTheGraph) {
  Parts parts(1);
  QueuedClient client;
  parts.pool.edit_fetched = [](std::vector<v1::WorkerMessage>* out) {
    for (v1::WorkerMessage& m : *out) {
      v1::TensorChunk* t = m.mutable_state_chunk()->mutable_tensor();
      if (t->name() == "fc.weight") t->set_shape(0, int64_t{1} << 36);
    }
  };
  absl::Status s = parts.Run(Requests(1, 1), &client);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(),
              HasSubstr("the final state of rank 0: tensor 'fc.weight' is f32[68719476736, 4], the "
                        "graph's placeholder 'w' declares f32[3, 4]"));
  parts.pool.edit_fetched = [](std::vector<v1::WorkerMessage>* out) {
    out->erase(out->begin());
  };  // one tensor short
  s = parts.Run(Requests(1, 1), &client);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(
      s.message(),
      HasSubstr(
          "the final state of rank 0 ended after 1 complete tensors of the 2 the graph declares"));
  EXPECT_EQ(client.events().back().state(), v1::JOB_STATE_FAILED);
}

// The same checks on a streamed job's state (forwarded, never held), and a
// graph whose INPUTs declare a larger batch than --max-batch-mb.
TEST(JobRunner, StreamedStateIsCheckedAndDeclaredBatchesAreBounded) {
  Parts parts(1);
  std::vector<v1::SubmitJobRequest> req = Requests(1, 1);
  req[1].mutable_state()->set_shape(1, 5);
  QueuedClient client;
  absl::Status s = parts.Run(req, &client);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(
      s.message(),
      HasSubstr("initial state: tensor 'fc.weight' is f32[3, 5], the graph's placeholder 'w' "
                "declares f32[3, 4]"));
  parts.context.options.max_batch_bytes = 200;  // input.0 + input.1: 224 bytes
  s = parts.Run(Requests(1, 1), &client);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(
      s.message(),
      HasSubstr(
          "the graph's 2 INPUTs declare a global batch of 0.0 MiB (224 bytes) per step "
          "(input.0, input.1), over this server's limit of 0 MiB (fxdp-server --max-batch-mb)"));
}

TEST(JobScheduler, DispatchesInFifoOrderAndCancelsQueuedJobs) {
  Parts parts(2);
  auto queued = [&] {
    auto j = std::make_shared<server::Job>();
    j->SetPlan(GraphlessPlan(2, 1));
    return j;
  };
  auto a = queued(), b = queued();
  ASSERT_TRUE(parts.scheduler.Enqueue(a).ok());
  absl::StatusOr<v1::JobEvent> first = parts.scheduler.Enqueue(b);
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(a->dispatched());
  EXPECT_THAT(a->workers(), ElementsAre("w0", "w1"));
  EXPECT_EQ(first->queue_position(), 1);
  EXPECT_THAT(first->message(), HasSubstr("waiting for 2 idle workers; 2 registered, 0 idle"));
  EXPECT_TRUE(parts.scheduler.CancelQueued(b->id(), "test",
                                           absl::CancelledError("cancelled while queued")));
  EXPECT_EQ(b->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_FALSE(parts.scheduler.CancelQueued(a->id(), "test", absl::CancelledError("no")));
}

}  // namespace
}  // namespace fxdp::testing

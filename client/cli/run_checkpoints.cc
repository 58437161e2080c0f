#include "client/cli/run_checkpoints.h"

#include <chrono>
#include <cstdio>
#include <set>

#include "client/cli/job_format.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"

namespace fxdp::cli {

// --initial-checkpoint (every state tensor the state file does not hold,
// read under its own name) and --checkpoint-dir into `spec`.
void AddCheckpointSpec(const std::string& initial_checkpoint, const std::string& checkpoint_dir,
                       int32_t every, int32_t keep, const std::vector<ir::RawTensor>& state,
                       v1::JobSpec* spec) {
  if (!initial_checkpoint.empty()) {
    // Every state tensor the state file does not hold, read under its own name.
    std::set<std::string> sent;
    for (const ir::RawTensor& t : state) sent.insert(t.name);
    v1::CheckpointSource* c = spec->mutable_initial_checkpoint();
    c->set_path(initial_checkpoint);
    for (const v1::Node& n : spec->graph().nodes()) {
      if (n.kind() != v1::PLACEHOLDER || n.placeholder().role() == v1::INPUT) continue;
      const std::string& sn = n.placeholder().state_name();
      if (sent.count(sn) > 0) continue;
      v1::CheckpointTensor* t = c->add_tensors();
      t->set_state_name(sn);
      t->set_checkpoint_name(sn);
      sent.insert(sn);  // once (a state name several placeholders share)
    }
  }
  if (!checkpoint_dir.empty()) {
    spec->mutable_checkpoints()->set_dir(checkpoint_dir);
    spec->mutable_checkpoints()->set_every(every);
    spec->mutable_checkpoints()->set_keep(keep);
  }
}

// --checkpoint-dir: the newest complete checkpoint the workers wrote (JobInfo).
void PrintWorkerCheckpoint(v1::JobService::Stub* stub, bool json, const std::string& job_id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::GetJobRequest req;
  req.set_job_id(job_id);
  v1::JobInfo info;
  if (!stub->GetJob(&ctx, req, &info).ok() || info.checkpoint_path().empty()) return;
  if (json) {
    nlohmann::ordered_json o;
    o["event"] = "checkpoint";
    o["job_id"] = job_id;
    o["step"] = info.checkpoint_step();
    o["path"] = info.checkpoint_path();
    PrintLine(o);
  } else {
    std::printf("checkpoint of step %lld: %s (on the workers)\n",
                static_cast<long long>(info.checkpoint_step()), info.checkpoint_path().c_str());
  }
}

}  // namespace fxdp::cli

// JobRunner's evaluations (JobSpec.eval, eval_spec.h; docs/evaluation.md):
// after every due step each rank runs the evaluation graph against its
// current state and answers an EvalResult; rank 0's (the metrics are the same
// on every rank) is recorded in JobInfo.evals and sent as a RUNNING event
// carrying `eval`, after the event of the step it evaluated. The steps end
// only once every due evaluation is in.
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/jobs/eval_spec.h"
#include "server/jobs/job_runner.h"

namespace fxdp::server {
namespace {

// What one EvalResult may carry: its names are the graph's (the worker
// bounds them, executor/worker/named_outputs.h); a worker is not trusted
// to.
constexpr int kMaxEvalMetrics = 1024;
constexpr size_t kMaxMetricNameBytes = 256;

}  // namespace

bool JobRunner::EvalDueAfter(int64_t run_step) const {
  const v1::JobSpec& spec = job_->plan().spec;
  return spec.has_eval() && EvalDue(spec.eval(), first_, run_step, steps_);
}

void JobRunner::StepSent() {
  if (EvalDueAfter(sent_)) ++evals_due_;
}

absl::Status JobRunner::OnEvalResult(const Job::Msg& msg) {
  if (msg.rank != 0) return absl::OkStatus();  // the same metrics on every rank
  const v1::EvalResult& r = msg.m.eval_result();
  std::string wrong;
  if (r.step() < 1 || r.step() > sent_ || !EvalDueAfter(r.step()) || evals_got_ >= evals_due_) {
    wrong =
        absl::StrCat("an evaluation after run step ", r.step(), ", which was not due (", evals_got_,
                     " of ", evals_due_, " due evaluations in, ", sent_, " steps sent)");
  } else if (r.metrics_size() > kMaxEvalMetrics) {
    wrong = absl::StrCat(r.metrics_size(), " metrics, more than ", kMaxEvalMetrics);
  }
  for (const v1::NamedValue& v : r.metrics()) {
    if (wrong.empty() && v.name().size() > kMaxMetricNameBytes)
      wrong = absl::StrCat("a metric name of ", v.name().size(), " bytes, more than ",
                           kMaxMetricNameBytes);
  }
  if (!wrong.empty())
    return Finish(JobChange::kFail,
                  absl::InternalError(absl::StrCat("job ", id_, ": rank 0 sent ", wrong)), -1);
  ++evals_got_;
  v1::EvalMetrics m;
  m.set_step(first_ + r.step());
  *m.mutable_metrics() = r.metrics();
  m.set_batches(r.batches());
  m.set_eval_ms(r.eval_ms());
  evals_waiting_.push_back(std::move(m));
  ReportEvals();
  return absl::OkStatus();
}

void JobRunner::ReportEvals() {
  while (!evals_waiting_.empty() && evals_waiting_.front().step() <= job_->steps_done()) {
    const v1::EvalMetrics& m = evals_waiting_.front();
    job_->AddEval(m);
    v1::JobEvent e = job_->Event(v1::JOB_STATE_RUNNING);
    e.set_step(m.step());
    *e.mutable_eval() = m;
    client_->Write(std::move(e));
    ctx_.table->Update(job_);
    evals_waiting_.pop_front();
  }
}

}  // namespace fxdp::server

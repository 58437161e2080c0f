// JobStore: the durable record of `fxdp-server --state-dir DIR`: every job
// the server knows, in SQLite (DIR/jobs.db: the JobInfo, the JobSpec as
// submitted, the file of its final state), and tensors as safetensors files
// under DIR/states/ (a job's final state; a data_paths job's initial state,
// kept until it ended; a job's last checkpoint, kept until it ended, or,
// when it FAILED, with its submitted spec until it leaves the history, so it
// can be resumed: job_resume.h). Writes are synchronous (a record survives a SIGKILL
// once the call returns). Thread-safe. No gRPC here.
#ifndef FXDP_SERVER_JOBS_JOB_STORE_H_
#define FXDP_SERVER_JOBS_JOB_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/fxdp/v1/jobs.pb.h"
#include "proto/fxdp/v1/worker.pb.h"

struct sqlite3;

namespace fxdp::server {

class JobStore {
 public:
  // Tensors as TensorChunks: written ones may be split in chunks (in
  // order), read ones are whole.
  using Tensors = std::vector<v1::TensorChunk>;

  struct Record {
    int64_t seq = 0;  // submission order
    v1::JobInfo info;
    v1::JobSpec spec;  // as submitted (graph, schedule); empty once the job ended
    bool has_final_state = false, has_initial_state = false;
    int64_t checkpoint_step = 0;  // 0: no checkpoint
  };

  // Errors of writes name the file and the system's reason: a full disk is
  // RESOURCE_EXHAUSTED ("DIR/jobs.db: database or disk is full",
  // "DIR/states/J.safetensors: No space left on device (needed N bytes)").
  // Files are written whole and synced (util::WriteFileAtomically).
  // Opens (creating) DIR/jobs.db and DIR/states/; errors name the path.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& dir);
  ~JobStore();

  const std::string& dir() const { return dir_; }
  // Every record, in submission order.
  absl::StatusOr<std::vector<Record>> Load();
  // A new job (its spec as submitted).
  absl::Status Insert(int64_t seq, const v1::JobInfo& info, const v1::JobSpec& spec);
  // The job's info now; `ended` also drops its initial state, and its spec
  // and checkpoint unless it FAILED with a checkpoint (kept to resume it),
  // and is synced to the disk before it returns (PRAGMA synchronous=FULL).
  absl::Status Update(const v1::JobInfo& info, bool ended);
  // Forgets the job: its record and files.
  absl::Status Erase(const std::string& job_id);

  // A job's final state (whole tensors) / initial state, as a safetensors file.
  absl::Status WriteFinalState(const std::string& job_id, const Tensors& state);
  absl::StatusOr<Tensors> ReadFinalState(const std::string& job_id) const;
  absl::Status EraseFinalState(const std::string& job_id);
  // The size of the final state's file (0: none).
  uint64_t FinalStateBytes(const std::string& job_id) const;
  absl::Status WriteInitialState(const std::string& job_id, const Tensors& state);
  absl::StatusOr<Tensors> ReadInitialState(const std::string& job_id) const;

  // A running job's state after step `step` (--checkpoint-every), replacing
  // the previous one. The file records its step too (its __metadata__): a
  // crash after the file and before the database leaves the file's step the
  // true one, which ReadCheckpoint returns.
  absl::Status WriteCheckpoint(const std::string& job_id, int64_t step, const Tensors& state);
  struct Checkpoint {
    Tensors state;
    int64_t step = 0;
  };
  absl::StatusOr<Checkpoint> ReadCheckpoint(const std::string& job_id) const;
  // What a resume of the job needs: its spec as submitted (with the graph)
  // and the step of its checkpoint (0: none). NOT_FOUND for a job without a
  // record.
  struct ResumePoint {
    v1::JobSpec spec;
    int64_t checkpoint_step = 0;
  };
  absl::StatusOr<ResumePoint> ReadResumePoint(const std::string& job_id);
  // `to`'s checkpoint is `from`'s (step `step`): the file hard-linked (or
  // copied), so that a resumed job can be resumed again before its own first
  // checkpoint.
  absl::Status ShareCheckpoint(const std::string& from, const std::string& to, int64_t step);

  std::string FinalStatePath(const std::string& job_id) const;
  std::string CheckpointPath(const std::string& job_id) const;
  std::string InitialStatePath(const std::string& job_id) const;

 private:
  explicit JobStore(std::string dir) : dir_(std::move(dir)) {}
  struct Param {
    std::string value;
    bool blob = false;
  };
  // Runs `sql` with `params` bound in order (mu_ held).
  absl::Status Exec(const std::string& sql, const std::vector<Param>& params);
  absl::Status UpdateLocked(const v1::JobInfo& info, bool ended);
  absl::Status WriteTensors(const std::string& path, const Tensors& tensors,
                            const std::map<std::string, std::string>& metadata = {}) const;
  absl::StatusOr<Tensors> ReadTensors(const std::string& path,
                                      std::map<std::string, std::string>* metadata = nullptr) const;

  const std::string dir_;
  mutable std::mutex mu_;
  sqlite3* db_ = nullptr;
};

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_JOB_STORE_H_

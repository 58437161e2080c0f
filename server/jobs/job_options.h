// JobServiceOptions: the job service's limits and timings (most are
// fxdp-server flags). Shared by the gRPC layer (job_service.h) and the parts
// under it (job_runner.h, job_scheduler.h, job_table.h), which never include gRPC.
#ifndef FXDP_SERVER_JOBS_JOB_OPTIONS_H_
#define FXDP_SERVER_JOBS_JOB_OPTIONS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fxdp::server {

// FetchJobStateRequest.chunk_bytes is clamped to [min, max]: a 1-byte chunk
// costs a message per byte (a 16 MiB state took the server to 3.4 GB).
inline constexpr size_t kMinFetchChunkBytes = size_t{64} << 10;
inline constexpr size_t kMaxFetchChunkBytes = size_t{4} << 20;
// Room in a message for all but a chunk's data (name, shape, a step's
// hyper-parameters): chunks stay that far under --max-message-mb.
inline constexpr size_t kMessageHeadroomBytes = size_t{64} << 10;

struct JobServiceOptions {
  // Chunk size of what the server sends workers (state, batches) and of
  // FetchState (unless the request asks for another).
  size_t chunk_bytes = size_t{1} << 20;
  // The largest chunk a FetchState request may ask for: kMaxFetchChunkBytes,
  // or less under a small --max-message-mb (LimitChunksToMessages).
  size_t max_fetch_chunk_bytes = kMaxFetchChunkBytes;
  // --max-queued-jobs: more queued jobs are RESOURCE_EXHAUSTED.
  size_t max_queued_jobs = 64;
  // --max-queued-jobs-per-identity: queued jobs of one authenticated
  // identity; more are RESOURCE_EXHAUSTED (without authentication there is
  // one tenant: max_queued_jobs alone holds).
  size_t max_queued_jobs_per_identity = 16;
  // --max-state-mb: bytes of final states kept for FetchState.
  uint64_t max_state_bytes = uint64_t{2048} << 20;
  // --max-finished-jobs: finished jobs remembered (older ones are forgotten).
  size_t max_finished_jobs = 1000;
  // Steps whose batches are sent before the earliest unfinished step's
  // results are in (>= 1).
  int steps_ahead = 2;
  // Client messages buffered per running job (the client's writes wait
  // beyond it).
  size_t read_ahead_bytes = size_t{4} << 20;
  // When an unconfirmed rank's worker is freed anyway: the job's collective
  // timeout plus this long after the job ended (job_scheduler.h).
  double release_grace_s = 10;
  // How often the scheduler looks at the workers (it also wakes on job ends
  // and submissions).
  double dispatch_interval_s = 0.05;
  // --queue-grace-s: a queued job needing more workers than are registered
  // (not LOST) fails with FAILED_PRECONDITION once that has lasted this long
  // (the queue behind it moves on); a Submit asking for more than are
  // registered fails at once when the server has been up this long (workers
  // had time to attach).
  double queue_grace_s = 10;
  // --client-idle-s: a running job that waits on its client (for its initial
  // state, or for a batch with no step outstanding) fails after this long
  // without a message from it, freeing its workers.
  double client_idle_s = 60;
  // --keep-state-s: a running job that fails while its ranks are alive, or is
  // cancelled, keeps the state of its last completed step (job_lifecycle.h):
  // its ranks finish the steps sent and give their state within this long,
  // else its last checkpoint is what it keeps.
  double keep_state_s = 60;
  // --max-collective-timeout-s: the most JobSpec.collective_timeout_s may
  // be (it bounds each rendezvous and collective, so how long a hung peer
  // holds a worker); more is INVALID_ARGUMENT at Submit.
  double max_collective_timeout_s = 600;
  // --checkpoint-every K (with --state-dir): a job's state is fetched from
  // rank 0 every K steps into the state dir, so that after a restart a
  // data_paths job resumes from there (job_recovery.h) and a FAILED job can
  // be resumed by its client (job_resume.h). 0: no checkpoints.
  int64_t checkpoint_every = 0;
  // --max-initial-state-mb: initial states the server holds at once (with
  // --state-dir a data_paths job's is taken at Submit and held until the job
  // starts). Each such Submit reserves what its graph declares before
  // reading any of it; more than is free is RESOURCE_EXHAUSTED.
  uint64_t max_initial_state_bytes = uint64_t{4096} << 20;
  // Real paths no JobSpec.data_paths may lead into (CheckDataPathsExcluded):
  // the --state-dir, the key and token files.
  std::vector<std::string> data_excluded;
  // --max-batch-mb: one step's global batch as a streamed job's graph
  // declares it (the server assembles it before slicing it); more is
  // RESOURCE_EXHAUSTED at Submit.
  uint64_t max_batch_bytes = uint64_t{2048} << 20;
  // --max-submit-streams: Submit calls at once (queued, running, or not yet
  // queued); more are RESOURCE_EXHAUSTED before a job thread starts.
  size_t max_submit_streams = 256;
  // --max-submit-streams-per-identity: the same for one authenticated identity.
  size_t max_submit_streams_per_identity = 64;
  // --max-fetch-streams: FetchState calls at once (each holds one chunk of
  // at most kMaxFetchChunkBytes); more are RESOURCE_EXHAUSTED.
  size_t max_fetch_streams = 16;
  // --max-fetch-streams-per-identity: the same for one authenticated identity.
  size_t max_fetch_streams_per_identity = 4;
};

// Chunks and their message headers within a gRPC message limit of
// `max_message_bytes` (fxdp-server --max-message-mb): a 1 MiB chunk in a
// 1 MiB message was RESOURCE_EXHAUSTED ("larger than max").
inline void LimitChunksToMessages(size_t max_message_bytes, JobServiceOptions* o) {
  const size_t most = max_message_bytes - kMessageHeadroomBytes;
  o->chunk_bytes = std::min(o->chunk_bytes, most);
  o->max_fetch_chunk_bytes = std::min(kMaxFetchChunkBytes, most);
}

}  // namespace fxdp::server

#endif  // FXDP_SERVER_JOBS_JOB_OPTIONS_H_

#include "server/jobs/job_store.h"

#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "analysis/ir/safetensors.h"
#include "server/jobs/job_lifecycle.h"
#include "util/files.h"

namespace fxdp::server {
namespace {

// A checkpoint file's __metadata__ entry naming the step it holds the state after.
constexpr char kCheckpointStepKey[] = "fxdp.checkpoint_step";

constexpr char kSchema[] =
    "PRAGMA journal_mode=WAL;"
    "PRAGMA synchronous=NORMAL;"
    "CREATE TABLE IF NOT EXISTS jobs ("
    "  seq INTEGER PRIMARY KEY,"  // submission order (the N of job-N-HEX)
    "  id TEXT UNIQUE NOT NULL,"
    "  info BLOB NOT NULL,"  // fxdp.v1.JobInfo
    "  spec BLOB,"           // fxdp.v1.JobSpec as submitted, until the job ended
    "  final_state INTEGER NOT NULL DEFAULT 0,"        // states/ID.safetensors holds it
    "  initial_state INTEGER NOT NULL DEFAULT 0,"      // states/ID.initial.safetensors holds it
    "  checkpoint_step INTEGER NOT NULL DEFAULT 0);";  // states/ID.checkpoint.safetensors: after
                                                       // that step

absl::Status MakeDir(const std::string& path) {
  if (mkdir(path.c_str(), 0700) == 0 || errno == EEXIST) {
    struct stat st {};
    if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("--state-dir: '", path, "' is not a directory"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("--state-dir: cannot create '", path, "': ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& dir) {
  if (absl::Status s = MakeDir(dir); !s.ok()) return s;
  if (absl::Status s = MakeDir(dir + "/states"); !s.ok()) return s;
  std::unique_ptr<JobStore> store(new JobStore(dir));
  const std::string path = dir + "/jobs.db";
  if (sqlite3_open(path.c_str(), &store->db_) != SQLITE_OK) {
    return absl::FailedPreconditionError(
        absl::StrCat("--state-dir: cannot open '", path, "': ", sqlite3_errmsg(store->db_)));
  }
  sqlite3_busy_timeout(store->db_, 5000);
  char* err = nullptr;
  if (sqlite3_exec(store->db_, kSchema, nullptr, nullptr, &err) != SQLITE_OK) {
    const std::string msg = err != nullptr ? err : "unknown error";
    sqlite3_free(err);
    return absl::FailedPreconditionError(
        absl::StrCat("--state-dir: '", path, "' is not a usable job database: ", msg));
  }
  // A database of the first version lacks the checkpoint column (an error
  // here means it has it).
  sqlite3_exec(store->db_, "ALTER TABLE jobs ADD COLUMN checkpoint_step INTEGER NOT NULL DEFAULT 0",
               nullptr, nullptr, nullptr);
  return store;
}

JobStore::~JobStore() { sqlite3_close(db_); }

absl::Status JobStore::Exec(const std::string& sql, const std::vector<Param>& params) {
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st, nullptr) != SQLITE_OK) {
    return absl::InternalError(
        absl::StrCat("job database: ", sqlite3_errmsg(db_), " in '", sql, "'"));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const Param& p = params[i];
    const int idx = static_cast<int>(i) + 1;
    if (p.blob) {
      sqlite3_bind_blob64(st, idx, p.value.data(), p.value.size(), SQLITE_TRANSIENT);
    } else {
      sqlite3_bind_text64(st, idx, p.value.data(), p.value.size(), SQLITE_TRANSIENT, SQLITE_UTF8);
    }
  }
  const int rc = sqlite3_step(st);
  sqlite3_finalize(st);
  if (rc == SQLITE_DONE) return absl::OkStatus();
  // A full disk (SQLITE_FULL) is the filesystem's state, not a bug.
  const absl::StatusCode code = (sqlite3_extended_errcode(db_) & 0xff) == SQLITE_FULL
                                    ? absl::StatusCode::kResourceExhausted
                                    : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat(dir_, "/jobs.db: ", sqlite3_errmsg(db_)));
}

absl::StatusOr<std::vector<JobStore::Record>> JobStore::Load() {
  std::lock_guard<std::mutex> l(mu_);
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db_,
                         "SELECT seq, info, spec, final_state, initial_state, checkpoint_step FROM "
                         "jobs ORDER BY seq",
                         -1, &st, nullptr) != SQLITE_OK) {
    return absl::InternalError(absl::StrCat("job database: ", sqlite3_errmsg(db_)));
  }
  std::vector<Record> out;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    Record r;
    r.seq = sqlite3_column_int64(st, 0);
    const void* info = sqlite3_column_blob(st, 1);
    const void* spec = sqlite3_column_blob(st, 2);
    if (!r.info.ParseFromArray(info, sqlite3_column_bytes(st, 1)) ||
        (spec != nullptr && !r.spec.ParseFromArray(spec, sqlite3_column_bytes(st, 2)))) {
      sqlite3_finalize(st);
      return absl::DataLossError(absl::StrCat(
          "job database ", dir_, "/jobs.db: the record of job #", r.seq, " does not parse"));
    }
    r.has_final_state = sqlite3_column_int(st, 3) != 0;
    r.has_initial_state = sqlite3_column_int(st, 4) != 0;
    r.checkpoint_step = sqlite3_column_int64(st, 5);
    out.push_back(std::move(r));
  }
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE)
    return absl::InternalError(absl::StrCat("job database: ", sqlite3_errmsg(db_)));
  return out;
}

absl::Status JobStore::Insert(int64_t seq, const v1::JobInfo& info, const v1::JobSpec& spec) {
  std::lock_guard<std::mutex> l(mu_);
  return Exec("INSERT OR REPLACE INTO jobs (seq, id, info, spec) VALUES (?, ?, ?, ?)",
              {{std::to_string(seq)},
               {info.job_id()},
               {info.SerializeAsString(), true},
               {spec.SerializeAsString(), true}});
}

absl::Status JobStore::Update(const v1::JobInfo& info, bool ended) {
  std::lock_guard<std::mutex> l(mu_);
  // A job's end is written through to the disk (the WAL synced at the
  // commit), so that a SUCCEEDED the client was told survives a power loss;
  // other updates are synced at the WAL's checkpoints (synchronous=NORMAL).
  if (ended) {
    if (absl::Status s = Exec("PRAGMA synchronous=FULL", {}); !s.ok()) return s;
  }
  absl::Status s = UpdateLocked(info, ended);
  if (ended) Exec("PRAGMA synchronous=NORMAL", {}).IgnoreError();
  return s;
}

absl::Status JobStore::UpdateLocked(const v1::JobInfo& info, bool ended) {
  const std::string info_bytes = info.SerializeAsString();
  if (!ended)
    return Exec("UPDATE jobs SET info = ? WHERE id = ?", {{info_bytes, true}, {info.job_id()}});
  // Files go once the record no longer names them (a record that cannot be
  // written leaves them as they were).
  if (KeepsCheckpoint(info.state())) {  // FAILED, CANCELLED (job_lifecycle.h)
    // An ended job's checkpoint (and the spec a resume is checked against)
    // stay; without a checkpoint the spec goes. A checkpoint its workers
    // wrote (JobInfo.checkpoint_path) keeps the spec too.
    const bool on_workers = !info.checkpoint_path().empty();
    absl::Status s = Exec(
        on_workers ? "UPDATE jobs SET info = ?, initial_state = 0 WHERE id = ?"
                   : "UPDATE jobs SET info = ?, initial_state = 0, "
                     "spec = CASE WHEN checkpoint_step > 0 THEN spec ELSE NULL END WHERE id = ?",
        {{info_bytes, true}, {info.job_id()}});
    if (s.ok()) std::remove(InitialStatePath(info.job_id()).c_str());
    return s;
  }
  absl::Status s = Exec(
      "UPDATE jobs SET info = ?, spec = NULL, initial_state = 0, checkpoint_step = 0 WHERE id = ?",
      {{info_bytes, true}, {info.job_id()}});
  if (s.ok()) {
    std::remove(InitialStatePath(info.job_id()).c_str());
    std::remove(CheckpointPath(info.job_id()).c_str());
  }
  return s;
}

absl::Status JobStore::Erase(const std::string& job_id) {
  std::lock_guard<std::mutex> l(mu_);
  std::remove(FinalStatePath(job_id).c_str());
  std::remove(InitialStatePath(job_id).c_str());
  std::remove(CheckpointPath(job_id).c_str());
  return Exec("DELETE FROM jobs WHERE id = ?", {{job_id}});
}

std::string JobStore::FinalStatePath(const std::string& job_id) const {
  return absl::StrCat(dir_, "/states/", job_id, ".safetensors");
}

std::string JobStore::CheckpointPath(const std::string& job_id) const {
  return absl::StrCat(dir_, "/states/", job_id, ".checkpoint.safetensors");
}

absl::Status JobStore::WriteCheckpoint(const std::string& job_id, int64_t step,
                                       const Tensors& state) {
  // The file names its step: a SIGKILL between its rename and the database
  // update below leaves a file newer than the recorded step, and the file's
  // step is the one that holds.
  if (absl::Status s =
          WriteTensors(CheckpointPath(job_id), state, {{kCheckpointStepKey, std::to_string(step)}});
      !s.ok()) {
    return s;
  }
  std::lock_guard<std::mutex> l(mu_);
  return Exec("UPDATE jobs SET checkpoint_step = ? WHERE id = ?",
              {{std::to_string(step)}, {job_id}});
}

absl::StatusOr<JobStore::Checkpoint> JobStore::ReadCheckpoint(const std::string& job_id) const {
  const std::string path = CheckpointPath(job_id);
  std::map<std::string, std::string> metadata;
  absl::StatusOr<Tensors> state = ReadTensors(path, &metadata);
  if (!state.ok()) return state.status();
  Checkpoint out;
  out.state = *std::move(state);
  auto it = metadata.find(kCheckpointStepKey);
  if (it == metadata.end() || !absl::SimpleAtoi(it->second, &out.step) || out.step <= 0) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint '", path, "' does not name its step (__metadata__ ", kCheckpointStepKey, ")"));
  }
  return out;
}

absl::StatusOr<JobStore::ResumePoint> JobStore::ReadResumePoint(const std::string& job_id) {
  std::lock_guard<std::mutex> l(mu_);
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db_, "SELECT spec, checkpoint_step FROM jobs WHERE id = ?", -1, &st,
                         nullptr) != SQLITE_OK) {
    return absl::InternalError(absl::StrCat("job database: ", sqlite3_errmsg(db_)));
  }
  sqlite3_bind_text64(st, 1, job_id.data(), job_id.size(), SQLITE_TRANSIENT, SQLITE_UTF8);
  const int rc = sqlite3_step(st);
  if (rc != SQLITE_ROW) {
    sqlite3_finalize(st);
    if (rc == SQLITE_DONE)
      return absl::NotFoundError(absl::StrCat("job '", job_id, "' has no record in ", dir_));
    return absl::InternalError(absl::StrCat("job database: ", sqlite3_errmsg(db_)));
  }
  ResumePoint out;
  const void* spec = sqlite3_column_blob(st, 0);
  const bool parsed = spec == nullptr || out.spec.ParseFromArray(spec, sqlite3_column_bytes(st, 0));
  out.checkpoint_step = sqlite3_column_int64(st, 1);
  sqlite3_finalize(st);
  if (!parsed) {
    return absl::DataLossError(absl::StrCat("job database ", dir_, "/jobs.db: the spec of job '",
                                            job_id, "' does not parse"));
  }
  return out;
}

absl::Status JobStore::ShareCheckpoint(const std::string& from, const std::string& to,
                                       int64_t step) {
  const std::string src = CheckpointPath(from), dst = CheckpointPath(to);
  std::remove(dst.c_str());
  if (link(src.c_str(), dst.c_str()) != 0) {  // another filesystem, or no hard links: a copy
    std::map<std::string, std::string> metadata;
    absl::StatusOr<Tensors> state = ReadTensors(src, &metadata);
    if (!state.ok()) return state.status();
    if (absl::Status s = WriteTensors(dst, *state, metadata); !s.ok()) return s;
  }
  std::lock_guard<std::mutex> l(mu_);
  return Exec("UPDATE jobs SET checkpoint_step = ? WHERE id = ?", {{std::to_string(step)}, {to}});
}

std::string JobStore::InitialStatePath(const std::string& job_id) const {
  return absl::StrCat(dir_, "/states/", job_id, ".initial.safetensors");
}

absl::Status JobStore::WriteTensors(const std::string& path, const Tensors& tensors,
                                    const std::map<std::string, std::string>& metadata) const {
  std::vector<ir::RawTensor> raw;
  raw.reserve(tensors.size());
  for (const v1::TensorChunk& t : tensors) {
    if (t.offset() > 0 && !raw.empty() && raw.back().name == t.name()) {  // a later chunk
      raw.back().data += t.data();
      continue;
    }
    absl::StatusOr<ir::DType> dtype = ir::DTypeFromWire(t.dtype());
    if (!dtype.ok())
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name(), "': ", dtype.status().message()));
    ir::RawTensor& r = raw.emplace_back();
    r.name = t.name();
    r.dtype = *dtype;
    r.shape.assign(t.shape().begin(), t.shape().end());
    r.data = t.data();
  }
  std::vector<ir::TensorBytes> views;
  views.reserve(raw.size());
  for (const ir::RawTensor& r : raw) views.push_back({r.name, r.dtype, r.shape, r.data});
  absl::StatusOr<std::string> bytes = ir::SerializeSafetensors(std::move(views), metadata);
  if (!bytes.ok()) return bytes.status();
  // Written aside, synced, then renamed: a file is whole or absent, and
  // durable once this returns.
  return util::WriteFileAtomically(path, *bytes, /*durable=*/true);
}

absl::StatusOr<JobStore::Tensors> JobStore::ReadTensors(
    const std::string& path, std::map<std::string, std::string>* metadata) const {
  absl::StatusOr<std::string> bytes = ir::ReadSafetensorsBytes(path);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<ir::SafetensorsView> view = ir::ParseSafetensors(*bytes);
  if (!view.ok())
    return absl::Status(view.status().code(),
                        absl::StrCat("'", path, "': ", view.status().message()));
  Tensors out;
  for (const ir::SafetensorsEntry& e : view->tensors) {
    v1::TensorChunk& c = out.emplace_back();
    c.set_name(e.name);
    c.set_dtype(static_cast<v1::DType>(ir::DTypeToWire(e.dtype)));
    for (int64_t d : e.shape) c.add_shape(d);
    c.set_data(std::string(view->data.substr(e.begin, e.end - e.begin)));
  }
  if (metadata != nullptr) *metadata = view->metadata;
  return out;
}

absl::Status JobStore::WriteFinalState(const std::string& job_id, const Tensors& state) {
  if (absl::Status s = WriteTensors(FinalStatePath(job_id), state); !s.ok()) return s;
  std::lock_guard<std::mutex> l(mu_);
  return Exec("UPDATE jobs SET final_state = 1 WHERE id = ?", {{job_id}});
}

absl::StatusOr<JobStore::Tensors> JobStore::ReadFinalState(const std::string& job_id) const {
  return ReadTensors(FinalStatePath(job_id));
}

uint64_t JobStore::FinalStateBytes(const std::string& job_id) const {
  struct stat st {};
  return stat(FinalStatePath(job_id).c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

absl::Status JobStore::EraseFinalState(const std::string& job_id) {
  std::lock_guard<std::mutex> l(mu_);
  std::remove(FinalStatePath(job_id).c_str());
  return Exec("UPDATE jobs SET final_state = 0 WHERE id = ?", {{job_id}});
}

absl::Status JobStore::WriteInitialState(const std::string& job_id, const Tensors& state) {
  if (absl::Status s = WriteTensors(InitialStatePath(job_id), state); !s.ok()) return s;
  std::lock_guard<std::mutex> l(mu_);
  return Exec("UPDATE jobs SET initial_state = 1 WHERE id = ?", {{job_id}});
}

absl::StatusOr<JobStore::Tensors> JobStore::ReadInitialState(const std::string& job_id) const {
  return ReadTensors(InitialStatePath(job_id));
}

}  // namespace fxdp::server

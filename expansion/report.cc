// Printing an ExpansionReport.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "analysis/analysis_table.h"
#include "analysis/ir/type_text.h"
#include "expansion/data_parallel.h"
#include "expansion/state_memory.h"
#include "nlohmann/json.hpp"

namespace fxdp {

std::string ExpansionReport::ToJson() const {
  nlohmann::json j;
  j["world_size"] = world_size;
  j["batch_size"] = batch_size;
  j["style"] = std::string(DataParallelStyleName(style));
  nlohmann::json ss = nlohmann::json::array();
  for (const ShardedState& s : sharded_state) {
    ss.push_back({{"state_name", s.state_name},
                  {"role", std::string(ir::PlaceholderRoleName(s.role))},
                  {"shape", s.shape},
                  {"dtype", std::string(ir::DTypeShortName(s.dtype))},
                  {"shard_numel", s.shard_numel},
                  {"placement", "S(0)"},
                  {"reason", ShardedStateReason(s)}});
  }
  j["sharded_state"] = std::move(ss);
  nlohmann::json sl = nlohmann::json::array();
  for (const RankSlice& s : slices) {
    sl.push_back({{"rank", s.rank}, {"start", s.start}, {"size", s.size}});
  }
  j["slices"] = std::move(sl);
  if (micro_batches > 1) {
    j["micro_batches"] = micro_batches;
    nlohmann::json rr = nlohmann::json::array();
    for (const std::vector<RankSlice>& rows : rank_rows) {
      nlohmann::json one = nlohmann::json::array();
      for (const RankSlice& s : rows) one.push_back({{"start", s.start}, {"size", s.size}});
      rr.push_back(std::move(one));
    }
    j["rank_rows"] = std::move(rr);
  }
  nlohmann::json bs = nlohmann::json::array();
  for (const Bucket& b : buckets) {
    bs.push_back({{"index", b.index},
                  {"gradients", b.gradients},
                  {"bytes", b.bytes},
                  {"op", ReduceOpName(b.op)},
                  {"start_after", b.start_after},
                  {"wait_before", b.wait_before},
                  {"start_position", b.start_position},
                  {"wait_position", b.wait_position}});
  }
  j["buckets"] = std::move(bs);
  nlohmann::json cs = nlohmann::json::array();
  for (const Collective& c : collectives) {
    cs.push_back({{"node", c.node},
                  {"purpose", c.purpose},
                  {"op", c.op},
                  {"bytes", c.bytes},
                  {"position", c.position}});
  }
  j["collectives"] = std::move(cs);
  j["bytes_per_step"] = bytes_per_step;
  j["bytes_gathered_per_step"] = bytes_gathered_per_step;
  j["bytes_reduce_scattered_per_step"] = bytes_reduce_scattered_per_step;
  j["sharded_reads"] = sharded_reads;
  j["batch_norm"] = batch_norm;
  j["notes"] = notes;
  return j.dump(1) + "\n";
}

std::string ExpansionReport::ToTable() const {
  std::string out =
      absl::StrFormat("world size %d, global batch %d\n\nrank slices:\n", world_size, batch_size);
  for (const RankSlice& s : slices) {
    absl::StrAppendFormat(&out, "  rank %d: samples [%d, %d) (%d)\n", s.rank, s.start,
                          s.start + s.size, s.size);
  }
  if (micro_batches > 1) {
    absl::StrAppendFormat(&out,
                          "micro-batches: %d of %d samples (the step's batch is %d); each rank "
                          "holds its slice of each:\n",
                          micro_batches, batch_size, micro_batches * batch_size);
    for (size_t r = 0; r < rank_rows.size(); ++r) {
      std::vector<std::string> rows;
      for (const RankSlice& s : rank_rows[r])
        rows.push_back(absl::StrFormat("[%d, %d)", s.start, s.start + s.size));
      absl::StrAppendFormat(&out, "  rank %d: rows %s\n", r, absl::StrJoin(rows, " "));
    }
  }
  absl::StrAppendFormat(&out, "\nstyle: %s\n", DataParallelStyleName(style));
  if (!sharded_state.empty()) {
    absl::StrAppendFormat(&out,
                          "sharded state (%d tensors, flat shards of s = ceil(numel / %d) "
                          "per rank):\n",
                          sharded_state.size(), world_size);
    for (const ShardedState& s : sharded_state) {
      absl::StrAppendFormat(&out, "  %-40s %-15s %s -> S(0) [%d]\n", s.state_name,
                            ir::PlaceholderRoleName(s.role), ir::TypeText(s.dtype, s.shape),
                            s.shard_numel);
    }
  }
  absl::StrAppendFormat(&out, "\nbuckets (%d):\n", buckets.size());
  for (const Bucket& b : buckets) {
    absl::StrAppendFormat(&out,
                          "  bucket %d: %d gradients, %d bytes, %s; starts after %s (#%d), "
                          "waited before %s (#%d)\n    %s\n",
                          b.index, b.gradients.size(), b.bytes, ReduceOpName(b.op), b.start_after,
                          b.start_position, b.wait_before, b.wait_position,
                          absl::StrJoin(b.gradients, ", "));
  }
  absl::StrAppendFormat(&out, "\ncollectives on rank 0 (%d):\n", collectives.size());
  for (const Collective& c : collectives) {
    absl::StrAppendFormat(&out, "  #%-6d %-28s %-14s %d bytes\n", c.position, c.node, c.purpose,
                          c.bytes);
  }
  absl::StrAppendFormat(&out, "\nbytes all-reduced per rank per step: %d\n", bytes_per_step);
  if (bytes_gathered_per_step > 0) {
    absl::StrAppendFormat(&out, "bytes all-gathered per rank per step: %d\n",
                          bytes_gathered_per_step);
  }
  if (bytes_reduce_scattered_per_step > 0) {
    absl::StrAppendFormat(&out, "bytes reduce-scattered per rank per step: %d\n",
                          bytes_reduce_scattered_per_step);
  }
  if (sharded_reads > 0) {
    absl::StrAppendFormat(&out, "replicated values sliced locally: %d\n", sharded_reads);
  }
  if (batch_norm == "local") {
    absl::StrAppend(&out,
                    "batch norm statistics: local (each rank's batch, as DDP; "
                    "--sync-batchnorm for the global batch's)\n");
  } else if (batch_norm == "global") {
    absl::StrAppend(&out,
                    "batch norm statistics: global (sync_batchnorm: all-reduced in forward "
                    "and backward, as SyncBatchNorm)\n");
  }
  for (const std::string& n : notes) absl::StrAppend(&out, "note: ", n, "\n");
  return out;
}

}  // namespace fxdp

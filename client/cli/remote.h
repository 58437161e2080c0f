// `fxdp analyze|expand --server HOST:PORT`: the same commands through
// fxdp-server's CompileService (proto/fxdp/v1/compile.proto) instead of local
// library calls, printing the same output.
#ifndef FXDP_CLIENT_CLI_REMOTE_H_
#define FXDP_CLIENT_CLI_REMOTE_H_

#include <optional>
#include <string>
#include <vector>

#include "analysis/ir/instantiate.h"
#include "proto/fxdp/v1/compile.pb.h"
#include "security/credentials.h"

namespace fxdp::cli {

struct RemoteAnalyzeArgs {
  std::string server, path;
  security::ChannelSecurity creds;
  int32_t world = 2;
  bool json = false;
  bool sync_batchnorm = false;
  std::optional<v1::DataParallelStyle> style;  // AnalyzeRequest.style
  double bucket_cap_mb = 0;                    // 0: the server's default
  bool with_source = false;                    // the table shows each node's source line
  ir::InputShapes shapes;                      // --shape: the graph is instantiated here, then sent
};
// Exit code of the command (commands.h's kExit*).
int RemoteAnalyze(const RemoteAnalyzeArgs& args);

struct RemoteExpandArgs {
  std::string server, path, out;
  security::ChannelSecurity creds;
  int32_t world = 1;
  double bucket_cap_mb = 0, first_bucket_mb = 0;  // 0: the server's defaults
  std::string group_name;
  double last_bucket_mb = -1;  // < 0: the server's default
  bool no_overlap_schedule = false;
  bool sync_batchnorm = false;
  v1::DataParallelStyle style = v1::DATA_PARALLEL_STYLE_REPLICATE;
  bool json = false;
  ir::InputShapes shapes;  // --shape: the graph is instantiated here, then sent
};
int RemoteExpand(const RemoteExpandArgs& args);

// The analysis table (`fxdp analyze` without --json) rendered from a response:
// AnalysisTableText, then the memory summary when the response has one (the
// same text as AnalysisToTable, StyledAnalysisToTable with a style).
std::string AnalyzeResponseToTable(const v1::AnalyzeResponse& r, bool with_source = false);

// OUT with ".rank<r>" before the extension.
std::string RankPath(const std::string& out, int r);

// The files `fxdp expand` writes for `num_graphs` graphs: OUT when every rank
// runs the same graph (`identical`), else RankPath(OUT, r) for each rank.
std::vector<std::string> ExpandOutputPaths(const std::string& out, bool identical, int num_graphs);
// The expansion report's JSON with "files": [{"path", "ranks"}] added: each
// written file and the ranks that run it.
std::string ReportJsonWithFiles(const std::string& report_json,
                                const std::vector<std::string>& paths, int world_size);

}  // namespace fxdp::cli

#endif  // FXDP_CLIENT_CLI_REMOTE_H_

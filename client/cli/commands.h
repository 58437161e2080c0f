// Subcommands of the `fxdp` CLI. Each takes the arguments after its name and
// returns the process exit code (see kExit* below).
#ifndef FXDP_CLIENT_CLI_COMMANDS_H_
#define FXDP_CLIENT_CLI_COMMANDS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace fxdp::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitInvalidInput = 1;  // the graph or file is bad
inline constexpr int kExitUsage = 2;         // wrong command line
inline constexpr int kExitIo = 3;            // cannot read or write a file

// The server every subcommand talks to without --server: $FXDP_SERVER when set,
// else kDefaultServerAddress (fxdp-server's default --listen). analyze and
// expand run locally unless --server is given.
inline constexpr char kDefaultServerAddress[] = "127.0.0.1:50051";
std::string DefaultServer();

// Prints `status` to stderr as "fxdp <cmd>: <message>" and maps it to an exit code.
int ReportError(const std::string& cmd, const absl::Status& status);

int GraphCommand(const std::vector<std::string>& args);
int AnalyzeCommand(const std::vector<std::string>& args);
int ExpandCommand(const std::vector<std::string>& args);
int WorkersCommand(const std::vector<std::string>& args);
// run_command.cc, jobs_command.cc: JobService (--server HOST:PORT, default DefaultServer()).
int RunCommand(const std::vector<std::string>& args);
int JobsCommand(const std::vector<std::string>& args);
int JobCommand(const std::vector<std::string>& args);
int CancelCommand(const std::vector<std::string>& args);
int FetchCommand(const std::vector<std::string>& args);
// export_command.cc: a checkpoint the workers wrote as a Hugging Face model.safetensors.
int ExportCommand(const std::vector<std::string>& args);

// Rows as left-aligned columns two spaces apart, one line each (the first row
// is the header); the human tables of `fxdp jobs`, `fxdp workers`, ...
std::string FormatTable(const std::vector<std::vector<std::string>>& rows);

}  // namespace fxdp::cli

#endif  // FXDP_CLIENT_CLI_COMMANDS_H_

// A small command-line flag parser shared by the fxdp subcommands:
// `--name value`, `--name=value`, boolean `--name`, aliases (`-o`), `--help`,
// and positional arguments, with usage errors that name the flag.
//
//   Flags f("analyze", kUsage);
//   f.Int("--world-size", &world);
//   f.Bool("--json", &json);
//   std::vector<std::string> pos;
//   if (int rc = f.Parse(args, &pos); rc >= 0) return rc;  // --help or a usage error
#ifndef FXDP_CLIENT_CLI_FLAGS_H_
#define FXDP_CLIENT_CLI_FLAGS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace fxdp::cli {

class Flags {
 public:
  Flags(std::string command, const char* usage) : command_(std::move(command)), usage_(usage) {}

  void String(const std::string& name, std::string* out, const std::string& alias = "");
  void Int(const std::string& name, int32_t* out);
  void Double(const std::string& name, double* out);
  void Bool(const std::string& name, bool* out);

  // Parses `args`, appending positional arguments to `positionals`. Returns
  // -1 when the command should go on; otherwise the exit code (0 after
  // printing --help, kExitUsage after printing a usage error).
  int Parse(const std::vector<std::string>& args, std::vector<std::string>* positionals);
  // Whether the flag was given.
  bool Seen(const std::string& name) const;
  // Prints "fxdp <command>: msg" and the usage to stderr; returns kExitUsage.
  int Usage(const std::string& msg) const;

 private:
  struct Flag {
    std::string name, alias;
    bool takes_value = true;
    std::function<bool(const std::string&)> set;  // false: bad value
    const char* kind = "";
    bool seen = false;
  };
  Flag* Find(const std::string& name);
  std::string command_;
  const char* usage_;
  std::vector<Flag> flags_;
};

}  // namespace fxdp::cli

#endif  // FXDP_CLIENT_CLI_FLAGS_H_

// A small command-line flag parser shared by the `fxdp` CLI and `fxdp-worker`:
// `--name value`, `--name=value`, boolean `--name`, aliases (`-o`, old
// spellings), repeatable flags, validated values, `--help`, `--version`, positional
// arguments, and usage errors that name the flag and the value.
//
//   util::Flags f("fxdp analyze", kUsage);
//   f.Int("--world-size", &world);
//   f.Bool("--json", &json);
//   std::vector<std::string> pos;
//   if (int rc = f.Parse(args, &pos); rc >= 0) return rc;  // --help or a usage error
//
// No dependency beyond Abseil: any layer may use it.
#ifndef FXDP_UTIL_FLAGS_H_
#define FXDP_UTIL_FLAGS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace fxdp::util {

inline constexpr int kFlagsExitOk = 0;
inline constexpr int kFlagsExitUsage = 2;

class Flags {
 public:
  // `program` prefixes messages ("fxdp analyze", "fxdp-worker run").
  Flags(std::string program, const char* usage) : program_(std::move(program)), usage_(usage) {}

  void String(const std::string& name, std::string* out, const std::string& alias = "");
  // Every occurrence appends.
  void Strings(const std::string& name, std::vector<std::string>* out);
  void Int(const std::string& name, int32_t* out);
  void Double(const std::string& name, double* out);
  void Bool(const std::string& name, bool* out);
  // A value `set` accepts (false: a usage error "NAME needs KIND, got 'V'").
  void Custom(const std::string& name, const std::string& kind,
              std::function<bool(const std::string&)> set, const std::string& alias = "");

  // Parses `args`, appending positional arguments to `positionals` (nullptr:
  // positionals are a usage error). Returns -1 when the command should go
  // on; otherwise the exit code (0 after printing --help or --version, 2 after printing a
  // usage error).
  int Parse(const std::vector<std::string>& args, std::vector<std::string>* positionals);
  // Whether the flag (or its alias) was given.
  bool Seen(const std::string& name) const;
  // Prints "<program>: msg" and the usage to stderr; returns 2.
  int Usage(const std::string& msg) const;

 private:
  struct Flag {
    std::string name, alias;
    bool takes_value = true;
    std::function<bool(const std::string&)> set;  // false: bad value
    std::string kind;
    bool seen = false;
  };
  Flag* Find(const std::string& name);
  std::string program_;
  const char* usage_;
  std::vector<Flag> flags_;
};

// Validators for Custom().
bool IsPlainName(const std::string& s);  // non-empty, no spaces or control characters
// A size in bytes: a number (fractions allowed) with an optional binary unit,
// K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB (case-insensitive, all powers of
// 1024, as docker's --memory); > 0 and below 2^62.
bool ParseByteSize(const std::string& s, int64_t* out);

}  // namespace fxdp::util

#endif  // FXDP_UTIL_FLAGS_H_

#include "client/cli/flags.h"

#include <cstdio>

#include "absl/strings/numbers.h"
#include "client/cli/commands.h"

namespace fxdp::cli {

void Flags::String(const std::string& name, std::string* out, const std::string& alias) {
  flags_.push_back({name, alias, true, [out](const std::string& v) { *out = v; return true; },
                    "a value"});
}

void Flags::Int(const std::string& name, int32_t* out) {
  flags_.push_back({name, "", true,
                    [out](const std::string& v) { return absl::SimpleAtoi(v, out); },
                    "an integer"});
}

void Flags::Double(const std::string& name, double* out) {
  flags_.push_back({name, "", true,
                    [out](const std::string& v) { return absl::SimpleAtod(v, out); },
                    "a number"});
}

void Flags::Bool(const std::string& name, bool* out) {
  flags_.push_back({name, "", false, [out](const std::string&) { *out = true; return true; },
                    ""});
}

Flags::Flag* Flags::Find(const std::string& name) {
  for (Flag& f : flags_) {
    if (f.name == name || (!f.alias.empty() && f.alias == name)) return &f;
  }
  return nullptr;
}

bool Flags::Seen(const std::string& name) const {
  for (const Flag& f : flags_) {
    if (f.name == name) return f.seen;
  }
  return false;
}

int Flags::Usage(const std::string& msg) const {
  std::fprintf(stderr, "fxdp %s: %s\n\n%s", command_.c_str(), msg.c_str(), usage_);
  return kExitUsage;
}

int Flags::Parse(const std::vector<std::string>& args, std::vector<std::string>* positionals) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::fputs(usage_, stdout);
      return kExitOk;
    }
    if (a.size() < 2 || a[0] != '-') {
      positionals->push_back(a);
      continue;
    }
    std::string name = a, value;
    bool inline_value = false;
    if (const size_t eq = a.find('='); eq != std::string::npos && a.rfind("--", 0) == 0) {
      name = a.substr(0, eq);
      value = a.substr(eq + 1);
      inline_value = true;
    }
    Flag* f = Find(name);
    if (f == nullptr) return Usage("unknown flag " + name);
    f->seen = true;
    if (!f->takes_value) {
      if (inline_value) return Usage(name + " takes no value");
      f->set("");
      continue;
    }
    if (!inline_value) {
      if (i + 1 == args.size()) return Usage(name + " needs " + f->kind);
      value = args[++i];
    }
    if (!f->set(value)) return Usage(name + " needs " + f->kind + ", got '" + value + "'");
  }
  return -1;
}

}  // namespace fxdp::cli

#include "util/flags.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "util/version.h"

namespace fxdp::util {

void Flags::String(const std::string& name, std::string* out, const std::string& alias) {
  Custom(
      name, "a value",
      [out](const std::string& v) {
        *out = v;
        return true;
      },
      alias);
}

void Flags::Strings(const std::string& name, std::vector<std::string>* out) {
  Custom(name, "a value", [out](const std::string& v) {
    out->push_back(v);
    return true;
  });
}

void Flags::Int(const std::string& name, int32_t* out) {
  Custom(name, "an integer", [out](const std::string& v) { return absl::SimpleAtoi(v, out); });
}

void Flags::Double(const std::string& name, double* out) {
  Custom(name, "a number", [out](const std::string& v) { return absl::SimpleAtod(v, out); });
}

void Flags::Bool(const std::string& name, bool* out) {
  flags_.push_back({name, "", false,
                    [out](const std::string&) {
                      *out = true;
                      return true;
                    },
                    ""});
}

void Flags::Custom(const std::string& name, const std::string& kind,
                   std::function<bool(const std::string&)> set, const std::string& alias) {
  flags_.push_back({name, alias, true, std::move(set), kind});
}

Flags::Flag* Flags::Find(const std::string& name) {
  for (Flag& f : flags_) {
    if (f.name == name || (!f.alias.empty() && f.alias == name)) return &f;
  }
  return nullptr;
}

bool Flags::Seen(const std::string& name) const {
  for (const Flag& f : flags_) {
    if (f.name == name || f.alias == name) return f.seen;
  }
  return false;
}

int Flags::Usage(const std::string& msg) const {
  std::fprintf(stderr, "%s: %s\n\n%s", program_.c_str(), msg.c_str(), usage_);
  return kFlagsExitUsage;
}

int Flags::Parse(const std::vector<std::string>& args, std::vector<std::string>* positionals) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::fputs(usage_, stdout);
      return kFlagsExitOk;
    }
    if (a == "--version") {
      std::printf("%s\n", VersionLine(program_).c_str());
      return kFlagsExitOk;
    }
    if (a.size() < 2 || a[0] != '-') {
      if (positionals == nullptr) return Usage("unknown argument '" + a + "'");
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
    if (f == nullptr) return Usage("unknown argument '" + name + "'");
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

bool IsPlainName(const std::string& s) {
  return !s.empty() &&
         std::none_of(s.begin(), s.end(), [](unsigned char c) { return c <= ' ' || c == 0x7f; });
}

bool ParseByteSize(const std::string& s, int64_t* out) {
  size_t unit = s.size();
  while (unit > 0 && std::isalpha(static_cast<unsigned char>(s[unit - 1]))) --unit;
  double number = 0;
  if (unit == 0 || !absl::SimpleAtod(s.substr(0, unit), &number)) return false;
  std::string u = s.substr(unit);
  std::transform(u.begin(), u.end(), u.begin(), [](unsigned char c) { return std::tolower(c); });
  int shift = 0;
  if (u.empty() || u == "b") {
    shift = 0;
  } else if (u == "k" || u == "kb" || u == "kib") {
    shift = 10;
  } else if (u == "m" || u == "mb" || u == "mib") {
    shift = 20;
  } else if (u == "g" || u == "gb" || u == "gib") {
    shift = 30;
  } else if (u == "t" || u == "tb" || u == "tib") {
    shift = 40;
  } else {
    return false;
  }
  const double bytes = number * static_cast<double>(int64_t{1} << shift);
  if (!(bytes >= 1) || bytes >= static_cast<double>(int64_t{1} << 62)) return false;
  *out = static_cast<int64_t>(bytes);
  return true;
}

}  // namespace fxdp::util

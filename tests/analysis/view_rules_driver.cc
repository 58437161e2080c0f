// Test driver for tests/python/test_view_rules_differential.py (not part of
// the CLI). Reads one JSON case per line from stdin:
//   {"op": "aten::squeeze", "overload": "dims", "shape": [4, 1], "args": [[1]], "kwargs": {}}
// ("args" excludes self) and prints one line per case: "OK <DimMap>" or
// "ERR <message>". `--list-ops` prints the ops that have a view rule.
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "analysis/view_rules.h"

namespace {

fxdp::ir::Argument ToArgument(const nlohmann::json& j) {
  if (j.is_null()) return fxdp::ir::NoneArg{};
  if (j.is_boolean()) return j.get<bool>();
  if (j.is_number_integer()) return j.get<int64_t>();
  if (j.is_array()) {
    fxdp::ir::Argument::List list;
    for (const auto& e : j) list.push_back(ToArgument(e));
    return list;
  }
  return j.dump();  // anything else reaches the rule as a (wrong-typed) string
}

std::string RunCase(const nlohmann::json& c) {
  const fxdp::ir::Target target{c.at("op").get<std::string>(), c.at("overload").get<std::string>()};
  const auto shape = c.at("shape").get<std::vector<int64_t>>();
  std::vector<fxdp::ir::Argument> args = {fxdp::ir::ValueRef{fxdp::ir::NodeId{0}, 0}};
  for (const auto& a : c.at("args")) args.push_back(ToArgument(a));
  std::vector<fxdp::ir::KeywordArgument> kwargs;
  for (const auto& [name, value] : c.at("kwargs").items()) {
    kwargs.push_back({name, ToArgument(value)});
  }
  const auto map = fxdp::ComputeViewDimMap(target, shape, args, kwargs);
  if (!map.ok()) return "ERR " + std::string(map.status().message());
  return "OK " + fxdp::DimMapToString(*map);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--list-ops") {
    for (const std::string& op : fxdp::ViewOpNames()) std::cout << op << "\n";
    return 0;
  }
  std::ios::sync_with_stdio(false);
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    std::cout << RunCase(nlohmann::json::parse(line)) << "\n";
  }
  return 0;
}

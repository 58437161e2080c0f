// The text form's parser (analysis/ir/text.h): a hand-written lexer plus
// recursive descent over the grammar text.h describes; PrintGraph (text.cc)
// writes what it reads.
#include "analysis/ir/text.h"

#include <cctype>
#include <charconv>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/stubs/common.h"
#include "util/status_macros.h"

namespace fxdp::ir {
namespace {

std::string Quote(absl::string_view s) { return absl::StrCat("\"", absl::CEscape(s), "\""); }

enum class Tok { kEnd, kIdent, kNumber, kString, kPercent, kPunct };

struct Token {
  Tok kind = Tok::kEnd;
  std::string text;  // identifier/number text, unescaped string, or the punctuation char
  int line = 1, col = 1;
};

bool IsIdentChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == ':';
}

class Lexer {
 public:
  explicit Lexer(absl::string_view s) : s_(s) {}

  absl::StatusOr<Token> Next() {
    SkipSpace();
    Token t;
    t.line = line_;
    t.col = col_;
    if (pos_ >= s_.size()) return t;
    const char c = s_[pos_];
    if (c == '"') {
      size_t end = pos_ + 1;
      while (end < s_.size() && s_[end] != '"') end += (s_[end] == '\\') ? 2 : 1;
      if (end >= s_.size()) return Error(t, "unterminated string");
      std::string unescaped, err;
      if (!absl::CUnescape(s_.substr(pos_ + 1, end - pos_ - 1), &unescaped, &err))
        return Error(t, absl::StrCat("bad string escape: ", err));
      // Graph strings are proto3 strings: bytes that are not UTF-8 would
      // parse here but encode to a GraphDef no decoder accepts.
      if (!google::protobuf::internal::IsStructurallyValidUTF8(unescaped.data(),
                                                               static_cast<int>(unescaped.size())))
        return Error(t, "string is not valid UTF-8");
      t.kind = Tok::kString;
      t.text = std::move(unescaped);
      Advance(end + 1 - pos_);
      return t;
    }
    const bool neg = c == '-' && pos_ + 1 < s_.size();
    const char d = neg ? s_[pos_ + 1] : c;
    if (std::isdigit(static_cast<unsigned char>(d))) {
      size_t end = pos_ + (neg ? 1 : 0);
      while (end < s_.size()) {
        char e = s_[end];
        if (std::isdigit(static_cast<unsigned char>(e)) || e == '.') {
          ++end;
        } else if ((e == 'e' || e == 'E') && end + 1 < s_.size()) {
          end += (s_[end + 1] == '+' || s_[end + 1] == '-') ? 2 : 1;
        } else {
          break;
        }
      }
      t.kind = Tok::kNumber;
      t.text = std::string(s_.substr(pos_, end - pos_));
      Advance(end - pos_);
      return t;
    }
    if (IsIdentChar(c) || (neg && IsIdentChar(d))) {
      size_t end = pos_ + (neg ? 1 : 0);
      while (end < s_.size() && IsIdentChar(s_[end])) ++end;
      t.kind = Tok::kIdent;
      t.text = std::string(s_.substr(pos_, end - pos_));
      Advance(end - pos_);
      return t;
    }
    if (c == '%') {
      t.kind = Tok::kPercent;
      t.text = "%";
      Advance(1);
      return t;
    }
    if (absl::string_view("()[]{},=#+@").find(c) != absl::string_view::npos) {
      t.kind = Tok::kPunct;
      t.text = std::string(1, c);
      Advance(1);
      return t;
    }
    return Error(t, absl::StrCat("unexpected character '", std::string(1, c), "'"));
  }

  static absl::Status Error(const Token& t, absl::string_view msg) {
    return absl::InvalidArgumentError(absl::StrCat("line ", t.line, ", column ", t.col, ": ", msg));
  }

 private:
  void Advance(size_t n) {
    for (size_t i = 0; i < n && pos_ < s_.size(); ++i, ++pos_) {
      if (s_[pos_] == '\n') {
        ++line_;
        col_ = 1;
      } else {
        ++col_;
      }
    }
  }
  void SkipSpace() {
    while (pos_ < s_.size()) {
      if (std::isspace(static_cast<unsigned char>(s_[pos_]))) {
        Advance(1);
      } else if (s_[pos_] == '/' && pos_ + 1 < s_.size() && s_[pos_ + 1] == '/') {
        while (pos_ < s_.size() && s_[pos_] != '\n') Advance(1);  // comment
      } else {
        break;
      }
    }
  }

  absl::string_view s_;
  size_t pos_ = 0;
  int line_ = 1, col_ = 1;
};

class Parser {
 public:
  explicit Parser(absl::string_view text) : lex_(text) {}

  absl::StatusOr<Graph> Run() {
    FXDP_RETURN_IF_ERROR(Advance());
    GraphHeader h;
    FXDP_RETURN_IF_ERROR(ExpectIdent("graph"));
    while (tok_.kind == Tok::kIdent) {
      const std::string key = tok_.text;
      FXDP_RETURN_IF_ERROR(Advance());
      FXDP_RETURN_IF_ERROR(ExpectPunct("="));
      if (key == "format") {
        FXDP_ASSIGN_OR_RETURN(int64_t v, ParseInt());
        h.format_version = static_cast<int32_t>(v);
      } else if (key == "producer") {
        FXDP_ASSIGN_OR_RETURN(h.producer, ParseString());
      } else if (key == "torch") {
        FXDP_ASSIGN_OR_RETURN(h.torch_version, ParseString());
      } else {
        return Error(absl::StrCat("unknown graph attribute '", key, "'"));
      }
    }
    FXDP_RETURN_IF_ERROR(ExpectPunct("{"));
    while (tok_.kind == Tok::kIdent && tok_.text == "meta") {
      FXDP_RETURN_IF_ERROR(Advance());
      FXDP_ASSIGN_OR_RETURN(std::string k, ParseString());
      FXDP_RETURN_IF_ERROR(ExpectPunct("="));
      FXDP_ASSIGN_OR_RETURN(std::string v, ParseString());
      h.metadata.emplace_back(std::move(k), std::move(v));
    }
    while (tok_.kind == Tok::kPercent) FXDP_RETURN_IF_ERROR(ParseNode());
    FXDP_RETURN_IF_ERROR(ExpectPunct("}"));
    if (tok_.kind != Tok::kEnd) return Error("text after the closing '}'");
    return Graph::Create(std::move(h), std::move(nodes_));
  }

 private:
  absl::Status Advance() {
    FXDP_ASSIGN_OR_RETURN(tok_, lex_.Next());
    return absl::OkStatus();
  }
  absl::Status Error(absl::string_view msg) const { return Lexer::Error(tok_, msg); }
  std::string Describe() const {
    switch (tok_.kind) {
      case Tok::kEnd: return "end of input";
      case Tok::kString: return absl::StrCat("string ", Quote(tok_.text));
      default: return absl::StrCat("'", tok_.text, "'");
    }
  }
  bool IsPunct(absl::string_view p) const { return tok_.kind == Tok::kPunct && tok_.text == p; }
  absl::Status ExpectPunct(absl::string_view p) {
    if (!IsPunct(p)) return Error(absl::StrCat("expected '", p, "', got ", Describe()));
    return Advance();
  }
  absl::Status ExpectIdent(absl::string_view id) {
    if (tok_.kind != Tok::kIdent || tok_.text != id)
      return Error(absl::StrCat("expected '", id, "', got ", Describe()));
    return Advance();
  }
  absl::StatusOr<std::string> ParseIdent() {
    if (tok_.kind != Tok::kIdent) return Error(absl::StrCat("expected a name, got ", Describe()));
    std::string s = tok_.text;
    FXDP_RETURN_IF_ERROR(Advance());
    return s;
  }
  absl::StatusOr<std::string> ParseString() {
    if (tok_.kind != Tok::kString)
      return Error(absl::StrCat("expected a string, got ", Describe()));
    std::string s = tok_.text;
    FXDP_RETURN_IF_ERROR(Advance());
    return s;
  }
  absl::StatusOr<int64_t> ParseInt() {
    int64_t v;
    if (tok_.kind != Tok::kNumber || !absl::SimpleAtoi(tok_.text, &v))
      return Error(absl::StrCat("expected an integer, got ", Describe()));
    FXDP_RETURN_IF_ERROR(Advance());
    return v;
  }
  absl::StatusOr<std::vector<int64_t>> ParseIntList(absl::string_view open,
                                                    absl::string_view close) {
    std::vector<int64_t> out;
    FXDP_RETURN_IF_ERROR(ExpectPunct(open));
    while (!IsPunct(close)) {
      if (!out.empty()) FXDP_RETURN_IF_ERROR(ExpectPunct(","));
      FXDP_ASSIGN_OR_RETURN(int64_t v, ParseInt());
      out.push_back(v);
    }
    FXDP_RETURN_IF_ERROR(Advance());
    return out;
  }
  // A number token or inf/-inf/nan.
  absl::StatusOr<double> ParseFloatToken(const std::string& s) {
    if (s == "inf") return HUGE_VAL;
    if (s == "-inf") return -HUGE_VAL;
    if (s == "nan") return std::nan("");
    double v;
    auto res = std::from_chars(s.data(), s.data() + s.size(), v);
    if (res.ec != std::errc() || res.ptr != s.data() + s.size())
      return Error(absl::StrCat("bad float '", s, "'"));
    return v;
  }
  static bool LooksFloat(const std::string& s) {
    return s.find_first_of(".eE") != std::string::npos || s == "inf" || s == "-inf" || s == "nan";
  }

  absl::StatusOr<ValueType> ParseType() {
    if (tok_.kind != Tok::kIdent) return Error(absl::StrCat("expected a type, got ", Describe()));
    const Token type_tok = tok_;
    const std::string name = tok_.text;
    FXDP_RETURN_IF_ERROR(Advance());
    if (name == "none") return ValueType::Of(ValueKind::kNone);
    if (name == "int") return ValueType::Of(ValueKind::kInt);
    if (name == "float") return ValueType::Of(ValueKind::kFloat);
    if (name == "bool") return ValueType::Of(ValueKind::kBool);
    auto dtype = DTypeFromShortName(name);
    if (!dtype.ok()) return Lexer::Error(type_tok, dtype.status().message());
    TensorType t;
    t.dtype = *dtype;
    FXDP_ASSIGN_OR_RETURN(t.shape, ParseIntList("[", "]"));
    if (IsPunct("{")) {
      FXDP_ASSIGN_OR_RETURN(t.stride, ParseIntList("{", "}"));
    } else {
      absl::StatusOr<std::vector<int64_t>> stride = CheckedContiguousStrides(t.shape);
      if (!stride.ok()) return Lexer::Error(type_tok, stride.status().message());
      t.stride = *std::move(stride);
    }
    if (IsPunct("+")) {
      FXDP_RETURN_IF_ERROR(Advance());
      FXDP_ASSIGN_OR_RETURN(t.storage_offset, ParseInt());
    }
    if (IsPunct("@")) {
      FXDP_RETURN_IF_ERROR(Advance());
      FXDP_ASSIGN_OR_RETURN(std::string dev, ParseIdent());
      auto d = Device::Parse(dev);
      if (!d.ok()) return Error(d.status().message());
      t.device = *d;
    }
    if (tok_.kind == Tok::kIdent && tok_.text == "rg") {
      t.requires_grad = true;
      FXDP_RETURN_IF_ERROR(Advance());
    }
    return ValueType::Tensor(std::move(t));
  }

  absl::StatusOr<Argument> ParseArgument(int depth) {
    if (depth > 16) return Error("lists nested too deeply");
    if (tok_.kind == Tok::kPercent) return ParseValueRef();
    if (IsPunct("[")) return ParseList(depth);
    if (tok_.kind == Tok::kString) {
      FXDP_ASSIGN_OR_RETURN(std::string s, ParseString());
      return Argument(std::move(s));
    }
    const bool special_float = tok_.kind == Tok::kIdent &&
                               (tok_.text == "inf" || tok_.text == "-inf" || tok_.text == "nan");
    if (tok_.kind == Tok::kNumber || special_float) {
      const std::string text = tok_.text;
      if (LooksFloat(text)) {
        FXDP_ASSIGN_OR_RETURN(double v, ParseFloatToken(text));
        FXDP_RETURN_IF_ERROR(Advance());
        return Argument(v);
      }
      FXDP_ASSIGN_OR_RETURN(int64_t v, ParseInt());
      return Argument(v);
    }
    if (tok_.kind != Tok::kIdent)
      return Error(absl::StrCat("expected an argument, got ", Describe()));
    const std::string id = tok_.text;
    FXDP_RETURN_IF_ERROR(Advance());
    if (id == "true") return Argument(true);
    if (id == "false") return Argument(false);
    if (id == "None") return Argument(NoneArg{});
    if (id == "device") {
      FXDP_RETURN_IF_ERROR(ExpectPunct("("));
      FXDP_ASSIGN_OR_RETURN(std::string dev, ParseIdent());
      FXDP_RETURN_IF_ERROR(ExpectPunct(")"));
      auto d = Device::Parse(dev);
      if (!d.ok()) return Error(d.status().message());
      return Argument(*d);
    }
    if (id == "scalar") return ParseScalarCall(depth);
    if (auto d = DTypeFromTorchName(id); d.ok()) return Argument(*d);
    if (auto l = LayoutFromTorchName(id); l.ok()) return Argument(*l);
    if (auto m = MemoryFormatFromTorchName(id); m.ok()) return Argument(*m);
    return Error(absl::StrCat("unknown argument '", id, "'"));
  }

  // %name or %name#k, a value defined above.
  absl::StatusOr<Argument> ParseValueRef() {
    FXDP_RETURN_IF_ERROR(Advance());
    FXDP_ASSIGN_OR_RETURN(std::string name, ParseIdent());
    auto it = index_.find(name);
    if (it == index_.end())
      return Error(absl::StrCat("'%", name, "' is not defined before this use"));
    ValueRef r{NodeId{it->second}, 0};
    if (IsPunct("#")) {
      FXDP_RETURN_IF_ERROR(Advance());
      FXDP_ASSIGN_OR_RETURN(int64_t k, ParseInt());
      r.output = static_cast<int32_t>(k);
    }
    return Argument(r);
  }

  // [a, b, ...]
  absl::StatusOr<Argument> ParseList(int depth) {
    FXDP_RETURN_IF_ERROR(Advance());
    Argument::List items;
    while (!IsPunct("]")) {
      if (!items.empty()) FXDP_RETURN_IF_ERROR(ExpectPunct(","));
      FXDP_ASSIGN_OR_RETURN(Argument a, ParseArgument(depth + 1));
      items.push_back(std::move(a));
    }
    FXDP_RETURN_IF_ERROR(Advance());
    return Argument(std::move(items));
  }

  // scalar(v) or scalar(complex(re, im)), after the word `scalar`.
  absl::StatusOr<Argument> ParseScalarCall(int depth) {
    FXDP_RETURN_IF_ERROR(ExpectPunct("("));
    Scalar s;
    if (tok_.kind == Tok::kIdent && tok_.text == "complex") {
      FXDP_RETURN_IF_ERROR(Advance());
      FXDP_RETURN_IF_ERROR(ExpectPunct("("));
      FXDP_ASSIGN_OR_RETURN(Argument re, ParseArgument(depth + 1));
      FXDP_RETURN_IF_ERROR(ExpectPunct(","));
      FXDP_ASSIGN_OR_RETURN(Argument im, ParseArgument(depth + 1));
      FXDP_RETURN_IF_ERROR(ExpectPunct(")"));
      if (!re.is<double>() || !im.is<double>()) return Error("complex() takes two floats");
      s.value = std::complex<double>(re.as<double>(), im.as<double>());
    } else {
      FXDP_ASSIGN_OR_RETURN(Argument v, ParseArgument(depth + 1));
      if (auto* i = v.get_if<int64_t>())
        s.value = *i;
      else if (auto* f = v.get_if<double>())
        s.value = *f;
      else if (auto* b = v.get_if<bool>())
        s.value = *b;
      else
        return Error("scalar() takes an int, float, bool or complex(re, im)");
    }
    FXDP_RETURN_IF_ERROR(ExpectPunct(")"));
    return Argument(std::move(s));
  }

  absl::Status ParseAttrs(Node& n) {
    FXDP_RETURN_IF_ERROR(ExpectPunct("{"));
    bool first = true;
    while (!IsPunct("}")) {
      if (!first) FXDP_RETURN_IF_ERROR(ExpectPunct(","));
      first = false;
      FXDP_ASSIGN_OR_RETURN(std::string key, ParseIdent());
      FXDP_RETURN_IF_ERROR(ExpectPunct("="));
      if (key == "target") {
        FXDP_ASSIGN_OR_RETURN(n.target.name, ParseString());
      } else if (key == "overload") {
        FXDP_ASSIGN_OR_RETURN(n.target.overload, ParseString());
      } else if (key == "role") {
        FXDP_ASSIGN_OR_RETURN(std::string r, ParseIdent());
        auto role = PlaceholderRoleFromName(r);
        if (!role.ok()) return Error(role.status().message());
        n.placeholder.role = *role;
      } else if (key == "state") {
        FXDP_ASSIGN_OR_RETURN(n.placeholder.state_name, ParseString());
      } else if (key == "batch_dim") {
        FXDP_ASSIGN_OR_RETURN(int64_t b, ParseInt());
        n.placeholder.batch_dim = static_cast<int32_t>(b);
      } else if (key == "grad_of") {
        FXDP_ASSIGN_OR_RETURN(n.grad_of, ParseString());
      } else if (key == "source") {
        FXDP_ASSIGN_OR_RETURN(n.source, ParseString());
      } else if (key == "specs") {
        FXDP_RETURN_IF_ERROR(ExpectPunct("["));
        while (!IsPunct("]")) {
          if (!n.output_specs.empty()) FXDP_RETURN_IF_ERROR(ExpectPunct(","));
          FXDP_ASSIGN_OR_RETURN(std::string r, ParseIdent());
          auto role = OutputRoleFromName(r);
          if (!role.ok()) return Error(role.status().message());
          OutputSpec spec{*role, ""};
          if (tok_.kind == Tok::kString) {
            FXDP_ASSIGN_OR_RETURN(spec.state_name, ParseString());
          }
          n.output_specs.push_back(std::move(spec));
        }
        FXDP_RETURN_IF_ERROR(Advance());
      } else {
        return Error(absl::StrCat("unknown node attribute '", key, "'"));
      }
    }
    return Advance();
  }

  absl::Status ParseNode() {
    FXDP_RETURN_IF_ERROR(Advance());  // '%'
    Node n;
    FXDP_ASSIGN_OR_RETURN(n.name, ParseIdent());
    if (IsPunct(":")) return Error("unexpected ':'");
    // The lexer folds ':' into names, so "%x: f32" lexes "x:" as the name.
    if (!n.name.empty() && n.name.back() == ':') {
      n.name.pop_back();
      if (IsPunct("(")) {
        FXDP_RETURN_IF_ERROR(Advance());
        while (!IsPunct(")")) {
          if (!n.outputs.empty()) FXDP_RETURN_IF_ERROR(ExpectPunct(","));
          FXDP_ASSIGN_OR_RETURN(ValueType v, ParseType());
          n.outputs.push_back(std::move(v));
        }
        FXDP_RETURN_IF_ERROR(Advance());
      } else {
        FXDP_ASSIGN_OR_RETURN(ValueType v, ParseType());
        n.outputs.push_back(std::move(v));
      }
    }
    FXDP_RETURN_IF_ERROR(ExpectPunct("="));
    FXDP_ASSIGN_OR_RETURN(std::string op, ParseIdent());
    if (op == "placeholder" || op == "get_attr" || op == "output") {
      n.kind = op == "placeholder" ? NodeKind::kPlaceholder
               : op == "output"    ? NodeKind::kOutput
                                   : NodeKind::kGetAttr;
      n.target.name = n.kind == NodeKind::kOutput ? "output" : n.name;
    } else {
      n.kind = NodeKind::kCallFunction;
      // "aten::sum.dim_IntList": the overload follows the first '.' after "::".
      const size_t ns = op.find("::");
      const size_t dot = op.find('.', ns == std::string::npos ? 0 : ns + 2);
      if (ns != std::string::npos && dot != std::string::npos) {
        n.target = {op.substr(0, dot), op.substr(dot + 1)};
      } else {
        n.target = {op, ""};
      }
    }
    FXDP_RETURN_IF_ERROR(ExpectPunct("("));
    while (!IsPunct(")")) {
      if (!n.args.empty() || !n.kwargs.empty()) FXDP_RETURN_IF_ERROR(ExpectPunct(","));
      // key=value: an identifier directly followed by '='.
      if (tok_.kind == Tok::kIdent) {
        Token save = tok_;
        Lexer save_lex = lex_;
        FXDP_RETURN_IF_ERROR(Advance());
        if (IsPunct("=")) {
          FXDP_RETURN_IF_ERROR(Advance());
          FXDP_ASSIGN_OR_RETURN(Argument v, ParseArgument(0));
          n.kwargs.push_back({save.text, std::move(v)});
          continue;
        }
        tok_ = save;
        lex_ = save_lex;
      }
      if (!n.kwargs.empty()) return Error("positional argument after a keyword argument");
      FXDP_ASSIGN_OR_RETURN(Argument a, ParseArgument(0));
      n.args.push_back(std::move(a));
    }
    FXDP_RETURN_IF_ERROR(Advance());
    if (IsPunct("{")) FXDP_RETURN_IF_ERROR(ParseAttrs(n));
    if (index_.contains(n.name)) return Error(absl::StrCat("'%", n.name, "' is defined twice"));
    index_.emplace(n.name, static_cast<int32_t>(nodes_.size()));
    nodes_.push_back(std::move(n));
    return absl::OkStatus();
  }

  Lexer lex_;
  Token tok_;
  std::vector<Node> nodes_;
  absl::flat_hash_map<std::string, int32_t> index_;
};

}  // namespace

absl::StatusOr<Graph> ParseGraphText(absl::string_view text) { return Parser(text).Run(); }

}  // namespace fxdp::ir

// Argument and KeywordArgument messages of the direct wire decoder
// (wire_arguments.h).
#include "analysis/ir/wire_arguments.h"

#include <algorithm>
#include <complex>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/casts.h"

namespace fxdp::ir::wire_reader {

bool ParseDevice(Reader r, int level, DeviceFields* d) {
  if (level > kRecursionLimit) return false;
  return ForEachField(
      r,
      [d](uint32_t tag, Reader& in) {
        switch (tag) {
          case Tag(w::device::kType, kVarint): return VarintAs(in, &d->type);
          case Tag(w::device::kIndex, kVarint): return VarintLow32(in, &d->index);
          default: return Field::kUnknown;
        }
      },
      SkipUnknown{&d->unknown, level});
}

bool FinishDevice(const DeviceFields& d, Device* out) {
  if (d.unknown || d.index < -1) return false;
  absl::StatusOr<DeviceType> t = DeviceTypeFromWire(static_cast<int>(d.type));
  if (!t.ok()) return false;
  *out = Device{*t, d.index};
  return true;
}

namespace {

// ---- The Argument tree. A oneof member that is a message can be replaced by
// a later member, taking its content (unknown fields, bad values) with it;
// so inside an Argument "bad" is recorded, not returned, and the bytes are
// still walked to the end: corruption anywhere refuses the input, a bad
// member only if it is still the Argument's value when the Argument ends.

struct ScalarFields {
  uint32_t which = 0;  // the oneof member set (field number), 0: none
  uint64_t bits = 0;   // int, bool, or a double's bits
  uint64_t real = 0, imag = 0;
  bool unknown = false;          // in the Scalar itself
  bool complex_unknown = false;  // in its complex_value

  void Set(uint32_t member) {
    if (which == member) return;
    which = member;
    bits = real = imag = 0;
    complex_unknown = false;
  }
};

bool ParseComplex(Reader r, int level, ScalarFields* s) {
  if (level > kRecursionLimit) return false;
  return ForEachField(
      r,
      [s](uint32_t tag, Reader& in) {
        switch (tag) {
          case Tag(w::complex::kReal, kFixed64): return Fixed64(in, &s->real);
          case Tag(w::complex::kImag, kFixed64): return Fixed64(in, &s->imag);
          default: return Field::kUnknown;
        }
      },
      SkipUnknown{&s->complex_unknown, level});
}

// A oneof member's field (read errors refuse the whole input, so the member
// may be set before its bytes are read).
bool ParseScalar(Reader r, int level, ScalarFields* s) {
  if (level > kRecursionLimit) return false;
  return ForEachField(
      r,
      [s, level](uint32_t tag, Reader& in) {
        switch (tag) {
          case Tag(w::scalar::kIntValue, kVarint):
            s->Set(w::scalar::kIntValue);
            return VarintAs(in, &s->bits);
          case Tag(w::scalar::kFloatValue, kFixed64):
            s->Set(w::scalar::kFloatValue);
            return Fixed64(in, &s->bits);
          case Tag(w::scalar::kBoolValue, kVarint):
            s->Set(w::scalar::kBoolValue);
            return VarintBool(in, &s->bits);
          case Tag(w::scalar::kComplexValue, kLen):
            s->Set(w::scalar::kComplexValue);
            return Message(in, [s, level](Reader sub) { return ParseComplex(sub, level + 1, s); });
          default: return Field::kUnknown;
        }
      },
      SkipUnknown{&s->unknown, level});
}

bool FinishScalar(const ScalarFields& s, Scalar* out) {
  if (s.unknown) return false;
  switch (s.which) {
    case w::scalar::kIntValue: *out = Scalar{static_cast<int64_t>(s.bits)}; return true;
    case w::scalar::kFloatValue: *out = Scalar{absl::bit_cast<double>(s.bits)}; return true;
    case w::scalar::kBoolValue: {
      const bool b = s.bits != 0;
      *out = Scalar{b};
      return true;
    }
    case w::scalar::kComplexValue:
      if (s.complex_unknown) return false;
      *out = Scalar{
          std::complex<double>(absl::bit_cast<double>(s.real), absl::bit_cast<double>(s.imag))};
      return true;
    default: return false;  // no value
  }
}

// One Argument message, possibly given in several pieces (a singular field
// that occurs more than once is merged).
struct ArgumentFields {
  uint32_t which = 0;       // the oneof member set (field number), 0: none
  bool unknown = false;     // unknown field in the Argument itself: kept whatever the member
  bool member_bad = false;  // the member message is unacceptable
  uint64_t bits = 0;        // int/bool/enum value, or a double's bits
  std::string str;
  uint32_t ref_node = 0, ref_output = 0;
  DeviceFields device;
  ScalarFields scalar;
  Argument::List items;

  // Sets the member about to be parsed; another member replaces the old one.
  void Set(uint32_t member) {
    if (which == member) return;
    if (which != 0) {
      member_bad = false;
      bits = 0;
      str.clear();
      ref_node = ref_output = 0;
      device = {};
      scalar = {};
      items.clear();
    }
    which = member;
  }
};

bool ParseArgument(Reader r, int level, int depth, ArgumentFields* a);

bool ParseValueRef(Reader r, int level, ArgumentFields* a) {
  if (level > kRecursionLimit) return false;
  return ForEachField(
      r,
      [a](uint32_t tag, Reader& in) {
        switch (tag) {
          case Tag(w::value_ref::kNode, kVarint): return VarintAs(in, &a->ref_node);
          case Tag(w::value_ref::kOutput, kVarint): return VarintAs(in, &a->ref_output);
          default: return Field::kUnknown;
        }
      },
      SkipUnknown{&a->member_bad, level});
}

// NoneValue has no fields: any field is unknown.
bool ParseNone(Reader r, int level, ArgumentFields* a) {
  if (level > kRecursionLimit) return false;
  return ForEachField(
      r, [](uint32_t, Reader&) { return Field::kUnknown; }, SkipUnknown{&a->member_bad, level});
}

bool FinishArgument(ArgumentFields* a, int depth, Argument* out);

bool ParseList(Reader r, int level, int depth, ArgumentFields* a) {
  if (level > kRecursionLimit) return false;
  if (a->items.empty())
    a->items.reserve(std::min(CountField(r, w::argument_list::kItems), kMaxReserveHint));
  return ForEachField(
      r,
      [a, level, depth](uint32_t tag, Reader& in) {
        if (tag != Tag(w::argument_list::kItems, kLen)) return Field::kUnknown;
        return Message(in, [a, level, depth](Reader sub) {
          bool ok;
          if (DecodeSimpleArgument(sub, level + 1, depth + 1, &a->items.emplace_back(), &ok)) {
            if (!ok) a->member_bad = true;
            return true;
          }
          ArgumentFields item;
          if (!ParseArgument(sub, level + 1, depth + 1, &item)) return false;
          if (!FinishArgument(&item, depth + 1, &a->items.back())) a->member_bad = true;
          return true;
        });
      },
      SkipUnknown{&a->member_bad, level});
}

// Parses (more of) an Argument at `level`, list nesting `depth`. False only on
// corruption; whether the Argument is acceptable is FinishArgument's call.
bool ParseArgument(Reader r, int level, int depth, ArgumentFields* a) {
  if (level > kRecursionLimit) return false;
  return ForEachField(
      r,
      [a, level, depth](uint32_t tag, Reader& in) {
        switch (tag) {
          case Tag(w::argument::kRef, kLen):
            a->Set(w::argument::kRef);
            return Message(in, [a, level](Reader sub) { return ParseValueRef(sub, level + 1, a); });
          case Tag(w::argument::kIntValue, kVarint):
          case Tag(w::argument::kDtype, kVarint):
          case Tag(w::argument::kLayout, kVarint):
          case Tag(w::argument::kMemoryFormat, kVarint):
            a->Set(tag >> 3);
            return VarintAs(in, &a->bits);
          case Tag(w::argument::kBoolValue, kVarint):
            a->Set(w::argument::kBoolValue);
            return VarintBool(in, &a->bits);
          case Tag(w::argument::kFloatValue, kFixed64):
            a->Set(w::argument::kFloatValue);
            return Fixed64(in, &a->bits);
          case Tag(w::argument::kStringValue, kLen):
            a->Set(w::argument::kStringValue);
            return String(in, &a->str);
          case Tag(w::argument::kNone, kLen):
            a->Set(w::argument::kNone);
            return Message(in, [a, level](Reader sub) { return ParseNone(sub, level + 1, a); });
          case Tag(w::argument::kDevice, kLen):
            a->Set(w::argument::kDevice);
            return Message(
                in, [a, level](Reader sub) { return ParseDevice(sub, level + 1, &a->device); });
          case Tag(w::argument::kScalar, kLen):
            a->Set(w::argument::kScalar);
            return Message(
                in, [a, level](Reader sub) { return ParseScalar(sub, level + 1, &a->scalar); });
          case Tag(w::argument::kList, kLen):
            a->Set(w::argument::kList);
            return Message(
                in, [a, level, depth](Reader sub) { return ParseList(sub, level + 1, depth, a); });
          case Tag(w::argument::kSizeExpr, kVarint):
            // Not part of the oneof: a symbolic size leaves the graph to the
            // protobuf path (FinishArgument refuses an Argument with unknowns).
            {
              const Field f = DefaultUint32(in);
              if (f != Field::kUnknown) return f;
              a->unknown = true;
              return Field::kRead;
            }
          default: return Field::kUnknown;
        }
      },
      SkipUnknown{&a->unknown, level});
}

// The checks DecodeGraph makes on an argument; false: not acceptable.
bool FinishArgument(ArgumentFields* a, int depth, Argument* out) {
  if (a->unknown || depth > kMaxListDepth) return false;
  switch (a->which) {
    case w::argument::kRef:
      if (a->member_bad || a->ref_node > static_cast<uint32_t>(kMaxNodes) ||
          a->ref_output > (1u << 30))
        return false;
      *out = Argument(
          ValueRef{NodeId{static_cast<int32_t>(a->ref_node)}, static_cast<int32_t>(a->ref_output)});
      return true;
    case w::argument::kIntValue: *out = Argument(static_cast<int64_t>(a->bits)); return true;
    case w::argument::kFloatValue: *out = Argument(absl::bit_cast<double>(a->bits)); return true;
    case w::argument::kBoolValue: *out = Argument(a->bits != 0); return true;
    case w::argument::kStringValue: *out = Argument(std::move(a->str)); return true;
    case w::argument::kNone:
      if (a->member_bad) return false;
      *out = Argument(NoneArg{});
      return true;
    case w::argument::kDtype: {
      absl::StatusOr<DType> d = DTypeFromWire(Low32(a->bits));
      if (!d.ok()) return false;
      *out = Argument(*d);
      return true;
    }
    case w::argument::kDevice: {
      Device d;
      if (!FinishDevice(a->device, &d)) return false;
      *out = Argument(d);
      return true;
    }
    case w::argument::kLayout: {
      absl::StatusOr<Layout> l = LayoutFromWire(Low32(a->bits));
      if (!l.ok()) return false;
      *out = Argument(*l);
      return true;
    }
    case w::argument::kMemoryFormat: {
      absl::StatusOr<MemoryFormat> m = MemoryFormatFromWire(Low32(a->bits));
      if (!m.ok()) return false;
      *out = Argument(*m);
      return true;
    }
    case w::argument::kScalar: {
      Scalar s;
      if (!FinishScalar(a->scalar, &s)) return false;
      *out = Argument(std::move(s));
      return true;
    }
    case w::argument::kList:
      if (a->member_bad) return false;
      *out = Argument(std::move(a->items));
      return true;
    default: return false;  // no value
  }
}

}  // namespace

bool DecodeGeneralArgument(Reader r, int level, Argument* out) {
  ArgumentFields a;
  return ParseArgument(r, level, 0, &a) && FinishArgument(&a, 0, out);
}

bool DecodeKeywordArgument(Reader r, KeywordArgument* kw) {
  ArgumentFields a;
  bool has_value = false;
  return ForEachField(
             r,
             [kw, &a, &has_value](uint32_t tag, Reader& in) {
               switch (tag) {
                 case Tag(w::keyword_argument::kName, kLen): return String(in, &kw->name);
                 case Tag(w::keyword_argument::kValue, kLen):
                   has_value = true;
                   // KeywordArgument's fields are at level 2, its value's at 3.
                   return Message(in, [&a](Reader sub) { return ParseArgument(sub, 3, 0, &a); });
                 default: return Field::kUnknown;
               }
             },
             RefuseUnknown) &&
         has_value && FinishArgument(&a, 0, &kw->value);
}

}  // namespace fxdp::ir::wire_reader

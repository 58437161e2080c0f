#include "analysis/ir/wire_decoder.h"

#include <algorithm>
#include <climits>
#include <complex>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/casts.h"
#include "google/protobuf/stubs/common.h"
#include "proto/fxdp/v1/graph.pb.h"

namespace fxdp::ir {
namespace {

using wire::kRecursionLimit;
using wire::Tag;
using wire::WireType;
namespace w = ::fxdp::ir::wire;

constexpr WireType kVarint = WireType::kVarint;
constexpr WireType kFixed64 = WireType::kFixed64;
constexpr WireType kLen = WireType::kLengthDelimited;

// Vectors are reserved from a pre-count of their fields (a cheap walk over
// tags and lengths), so the IR holds no spare capacity. Counts the format
// does not bound are capped, so that hostile input (millions of empty
// entries) cannot make one reserve allocate without bound; past the cap
// vectors grow as usual. (Nodes and arguments are bounded by kMaxNodes and
// kMaxArgsPerNode, and reserved exactly, as the protobuf path does.)
constexpr size_t kMaxReserveHint = size_t{1} << 16;

// ---- Reading the wire format. Every reader checks bounds against the end of
// the enclosing message and returns false when the bytes are not what
// protobuf's parser (3.21, parse_context.h) accepts.

struct Reader {
  const uint8_t* p;
  const uint8_t* end;
  bool done() const { return p == end; }
};

// A varint of at most kMaxBytes bytes, the value taken mod 2^(8*sizeof(T)):
// a tag is at most 5 bytes mod 2^32 (protobuf's ReadTag), a varint at most 10
// bytes mod 2^64; 32-bit fields keep the low 32 bits (protobuf's
// ReadVarint32 reads the same bytes).
template <typename T, int kMaxBytes>
bool ReadVarintSlow(Reader& r, T* v) {
  T x = 0;
  for (int i = 0; i < kMaxBytes; ++i) {
    if (i >= r.end - r.p) return false;
    const T b = r.p[i];
    x |= (b & 0x7f) << (7 * i);
    if (b < 0x80) {
      r.p += i + 1;
      *v = x;
      return true;
    }
  }
  return false;
}
template <typename T, int kMaxBytes>
inline bool ReadVarintFast(Reader& r, T* v) {
  if (r.p < r.end && *r.p < 0x80) {
    *v = *r.p++;
    return true;
  }
  return ReadVarintSlow<T, kMaxBytes>(r, v);
}
inline bool ReadTag(Reader& r, uint32_t* tag) { return ReadVarintFast<uint32_t, 5>(r, tag); }
inline bool ReadVarint(Reader& r, uint64_t* v) { return ReadVarintFast<uint64_t, 10>(r, v); }

inline int32_t Low32(uint64_t v) { return static_cast<int32_t>(static_cast<uint32_t>(v)); }

inline bool ReadFixed64(Reader& r, uint64_t* v) {
  if (r.end - r.p < 8) return false;
  uint64_t x = 0;
  for (int i = 7; i >= 0; --i) x = (x << 8) | r.p[i];  // little-endian; compiles to one load
  *v = x;
  r.p += 8;
  return true;
}

// A length prefix: at most 5 bytes, the fifth below 8, the value below
// INT_MAX - 16 (protobuf's ReadSize), and the bytes must be there.
bool ReadLengthSlow(Reader& r, Reader* sub) {
  uint32_t n = 0;
  int i = 0;
  for (;; ++i) {
    if (i >= r.end - r.p) return false;
    const uint32_t b = r.p[i];
    if (i == 4) {
      if (b >= 8) return false;
      n |= b << 28;
      break;
    }
    n |= (b & 0x7f) << (7 * i);
    if (b < 0x80) break;
  }
  r.p += i + 1;
  if (n > static_cast<uint32_t>(INT_MAX - 16)) return false;
  if (n > static_cast<uint64_t>(r.end - r.p)) return false;
  sub->p = r.p;
  sub->end = r.p + n;
  r.p += n;
  return true;
}
inline bool ReadLength(Reader& r, Reader* sub) {
  if (r.p < r.end && *r.p < 0x80) {
    const size_t n = *r.p;
    if (n > static_cast<size_t>(r.end - r.p - 1)) return false;
    sub->p = r.p + 1;
    sub->end = r.p + 1 + n;
    r.p = sub->end;
    return true;
  }
  return ReadLengthSlow(r, sub);
}

// proto3 string fields must hold valid UTF-8: protobuf refuses the whole
// message otherwise. ASCII is checked here, anything else by protobuf's own
// validator so that both agree on every byte sequence.
bool ValidUtf8(const uint8_t* p, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t word;
    std::memcpy(&word, p + i, 8);
    if (word & 0x8080808080808080ull) break;
  }
  for (; i < n; ++i) {
    if (p[i] & 0x80)
      return google::protobuf::internal::IsStructurallyValidUTF8(
          reinterpret_cast<const char*>(p), static_cast<int>(n));
  }
  return true;
}

inline bool ReadString(Reader& r, std::string* out) {
  Reader s;
  if (!ReadLength(r, &s) || !ValidUtf8(s.p, static_cast<size_t>(s.end - s.p))) return false;
  out->assign(reinterpret_cast<const char*>(s.p), static_cast<size_t>(s.end - s.p));
  return true;
}

bool SkipGroup(Reader& r, uint32_t number, int level);

// Skips one field protobuf would keep as an unknown field (number and wire
// type already read in `tag`), in a message whose fields are at `level`.
// False on corruption: field number 0, wire types 4 (outside a group), 6, 7,
// truncation, or a group that is not closed by its own end tag.
bool SkipField(Reader& r, uint32_t tag, int level) {
  if ((tag >> 3) == 0) return false;
  switch (static_cast<WireType>(tag & 7)) {
    case WireType::kVarint: {
      uint64_t v;
      return ReadVarint(r, &v);
    }
    case WireType::kFixed64:
      if (r.end - r.p < 8) return false;
      r.p += 8;
      return true;
    case WireType::kLengthDelimited: {
      Reader s;
      return ReadLength(r, &s);
    }
    case WireType::kStartGroup:
      return SkipGroup(r, tag >> 3, level + 1);
    case WireType::kFixed32:
      if (r.end - r.p < 4) return false;
      r.p += 4;
      return true;
    default:
      return false;
  }
}

// A group's fields, at `level`, up to the end-group tag with its number.
bool SkipGroup(Reader& r, uint32_t number, int level) {
  if (level > kRecursionLimit) return false;
  for (;;) {
    uint32_t tag;
    if (r.done() || !ReadTag(r, &tag) || tag == 0) return false;
    if ((tag & 7) == static_cast<uint32_t>(WireType::kEndGroup)) return (tag >> 3) == number;
    if (!SkipField(r, tag, level)) return false;
  }
}

// Skips one field of any kind; false when the bytes cannot be walked (the
// pre-counts below stop there and leave the error to the decoding pass).
bool SkipAny(Reader& r, uint32_t tag) {
  switch (static_cast<WireType>(tag & 7)) {
    case WireType::kVarint: {
      uint64_t v;
      return ReadVarint(r, &v);
    }
    case WireType::kFixed64:
      if (r.end - r.p < 8) return false;
      r.p += 8;
      return true;
    case WireType::kLengthDelimited: {
      Reader s;
      return ReadLength(r, &s);
    }
    case WireType::kFixed32:
      if (r.end - r.p < 4) return false;
      r.p += 4;
      return true;
    default:
      return false;
  }
}

// ---- One field loop for every message. A message's decoder is a switch from
// tag to field reader, run by ForEachField over the message's fields. A field
// the switch does not know (Field::kUnknown) goes to the message's policy:
// RefuseUnknown, or SkipUnknown, which skips it and records that it was there
// (inside an Argument, where a later oneof member can still replace it).

enum class Field { kRead, kUnknown, kCorrupt };

inline Field Check(bool ok) { return ok ? Field::kRead : Field::kCorrupt; }

template <typename OnField, typename OnUnknown>
inline bool ForEachField(Reader r, OnField on_field, OnUnknown on_unknown) {
  while (!r.done()) {
    uint32_t tag;
    if (!ReadTag(r, &tag)) return false;
    switch (on_field(tag, r)) {
      case Field::kRead:
        break;
      case Field::kCorrupt:
        return false;
      case Field::kUnknown:
        if (!on_unknown(tag, r)) return false;
        break;
    }
  }
  return true;
}

inline bool RefuseUnknown(uint32_t, Reader&) { return false; }

struct SkipUnknown {
  bool* seen;  // set when a field was skipped
  int level;   // the level of the message's fields
  bool operator()(uint32_t tag, Reader& r) const {
    *seen = true;
    return SkipField(r, tag, level);
  }
};

// Field readers: one field's payload into *out, converted as protobuf does.
template <typename T>
inline Field VarintAs(Reader& r, T* out) {  // uint32/int64/uint64 fields: the value mod 2^bits
  uint64_t v;
  if (!ReadVarint(r, &v)) return Field::kCorrupt;
  *out = static_cast<T>(v);
  return Field::kRead;
}
inline Field VarintLow32(Reader& r, int32_t* out) {  // int32 fields
  uint64_t v;
  if (!ReadVarint(r, &v)) return Field::kCorrupt;
  *out = Low32(v);
  return Field::kRead;
}
template <typename T>
inline Field VarintBool(Reader& r, T* out) {  // bool fields: any non-zero varint is true
  uint64_t v;
  if (!ReadVarint(r, &v)) return Field::kCorrupt;
  *out = v != 0;
  return Field::kRead;
}
inline Field Fixed64(Reader& r, uint64_t* out) { return Check(ReadFixed64(r, out)); }
inline Field String(Reader& r, std::string* out) { return Check(ReadString(r, out)); }
// A message field: `decode(Reader)` gets its bytes.
template <typename Decode>
inline Field Message(Reader& r, Decode decode) {
  Reader sub;
  return Check(ReadLength(r, &sub) && decode(sub));
}

// How often the length-delimited field `number` occurs in a message (a reserve
// hint: exact for well-formed input, a lower bound otherwise).
size_t CountField(Reader r, uint32_t number) {
  const uint32_t want = Tag(number, kLen);
  size_t count = 0;
  uint32_t tag;
  while (!r.done() && ReadTag(r, &tag)) {
    count += tag == want;
    if (!SkipAny(r, tag)) break;
  }
  return count;
}

// Varints in a packed field's payload: one per byte without the high bit.
size_t CountVarints(Reader r) {
  size_t n = 0;
  for (const uint8_t* p = r.p; p != r.end; ++p) n += *p < 0x80;
  return n;
}

// ---- The Argument tree. A oneof member that is a message can be replaced by
// a later member, taking its content (unknown fields, bad values) with it;
// so inside an Argument "bad" is recorded, not returned, and the bytes are
// still walked to the end: corruption anywhere refuses the input, a bad
// member only if it is still the Argument's value when the Argument ends.

struct DeviceFields {
  uint32_t type = 0;
  int32_t index = 0;
  bool unknown = false;
};

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
    case w::scalar::kIntValue:
      *out = Scalar{static_cast<int64_t>(s.bits)};
      return true;
    case w::scalar::kFloatValue:
      *out = Scalar{absl::bit_cast<double>(s.bits)};
      return true;
    case w::scalar::kBoolValue: {
      const bool b = s.bits != 0;
      *out = Scalar{b};
      return true;
    }
    case w::scalar::kComplexValue:
      if (s.complex_unknown) return false;
      *out = Scalar{std::complex<double>(absl::bit_cast<double>(s.real),
                                         absl::bit_cast<double>(s.imag))};
      return true;
    default:
      return false;  // no value
  }
}

// One Argument message, possibly given in several pieces (a singular field
// that occurs more than once is merged).
struct ArgumentFields {
  uint32_t which = 0;        // the oneof member set (field number), 0: none
  bool unknown = false;      // unknown field in the Argument itself: kept whatever the member
  bool member_bad = false;   // the member message is unacceptable
  uint64_t bits = 0;         // int/bool/enum value, or a double's bits
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
bool DecodeSimpleArgument(Reader r, int level, int depth, Argument* out, bool* ok);

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
            return Message(in, [a, level](Reader sub) {
              return ParseDevice(sub, level + 1, &a->device);
            });
          case Tag(w::argument::kScalar, kLen):
            a->Set(w::argument::kScalar);
            return Message(in, [a, level](Reader sub) {
              return ParseScalar(sub, level + 1, &a->scalar);
            });
          case Tag(w::argument::kList, kLen):
            a->Set(w::argument::kList);
            return Message(in, [a, level, depth](Reader sub) {
              return ParseList(sub, level + 1, depth, a);
            });
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
      *out = Argument(ValueRef{NodeId{static_cast<int32_t>(a->ref_node)},
                               static_cast<int32_t>(a->ref_output)});
      return true;
    case w::argument::kIntValue:
      *out = Argument(static_cast<int64_t>(a->bits));
      return true;
    case w::argument::kFloatValue:
      *out = Argument(absl::bit_cast<double>(a->bits));
      return true;
    case w::argument::kBoolValue:
      *out = Argument(a->bits != 0);
      return true;
    case w::argument::kStringValue:
      *out = Argument(std::move(a->str));
      return true;
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
    default:
      return false;  // no value
  }
}

// The common arguments, a lone ref or int, without the general machinery.
// Returns false when `r` holds anything else, or anything near the nesting
// limit (nothing is written then: ParseArgument decides); otherwise *ok says
// whether the argument is acceptable.
bool DecodeSimpleArgument(Reader r, int level, int depth, Argument* out, bool* ok) {
  uint32_t tag;
  uint64_t v;
  if (level + 1 > kRecursionLimit || !ReadTag(r, &tag)) return false;
  if (tag == Tag(w::argument::kIntValue, kVarint)) {
    if (!ReadVarint(r, &v) || !r.done()) return false;
    *ok = depth <= kMaxListDepth;
    if (*ok) *out = Argument(static_cast<int64_t>(v));
    return true;
  }
  Reader ref;
  if (tag != Tag(w::argument::kRef, kLen) || !ReadLength(r, &ref) || !r.done()) return false;
  uint32_t node = 0, output = 0;
  while (!ref.done()) {
    if (!ReadTag(ref, &tag) || !ReadVarint(ref, &v)) return false;
    if (tag == Tag(w::value_ref::kNode, kVarint)) node = static_cast<uint32_t>(v);
    else if (tag == Tag(w::value_ref::kOutput, kVarint)) output = static_cast<uint32_t>(v);
    else return false;
  }
  *ok = depth <= kMaxListDepth && node <= static_cast<uint32_t>(kMaxNodes) && output <= (1u << 30);
  if (*ok) *out = Argument(ValueRef{NodeId{static_cast<int32_t>(node)}, static_cast<int32_t>(output)});
  return true;
}

// A top-level argument (node.args[k], or a keyword argument's value).
bool DecodeArgument(Reader r, int level, Argument* out) {
  bool ok;
  if (DecodeSimpleArgument(r, level, 0, out, &ok)) return ok;
  ArgumentFields a;
  return ParseArgument(r, level, 0, &a) && FinishArgument(&a, 0, out);
}

// ---- The rest of the graph. These messages are never inside a oneof, so any
// unknown field or bad value refuses the input at once.

bool DecodeTarget(Reader r, Target* t) {
  return ForEachField(
      r,
      [t](uint32_t tag, Reader& in) {
        switch (tag) {
          case Tag(w::target::kName, kLen): return String(in, &t->name);
          case Tag(w::target::kOverload, kLen): return String(in, &t->overload);
          default: return Field::kUnknown;
        }
      },
      RefuseUnknown);
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

// Appends a packed (length-delimited) or unpacked (one varint) repeated int64,
// refusing more than kMaxRank entries: DecodeGraph refuses such a shape, and
// the verifier such a stride (one entry per dim).
bool ReadRankList(Reader& r, uint32_t tag, std::vector<int64_t>* out) {
  uint64_t v;
  if ((tag & 7) == static_cast<uint32_t>(WireType::kVarint)) {
    if (!ReadVarint(r, &v) || out->size() >= static_cast<size_t>(kMaxRank)) return false;
    out->push_back(static_cast<int64_t>(v));
    return true;
  }
  Reader packed;
  if (!ReadLength(r, &packed)) return false;
  const size_t n = CountVarints(packed);
  if (out->size() + n > static_cast<size_t>(kMaxRank)) return false;
  out->reserve(out->size() + n);
  while (!packed.done()) {
    if (!ReadVarint(packed, &v)) return false;
    out->push_back(static_cast<int64_t>(v));
  }
  return true;
}

struct TensorFields {
  uint32_t dtype = 0;
  DeviceFields device;
  bool has_device = false;
};

bool DecodeTensorMeta(Reader r, TensorType* t, TensorFields* f) {
  return ForEachField(
      r,
      [t, f](uint32_t tag, Reader& in) {
        switch (tag) {
          case Tag(w::tensor_meta::kShape, kLen):
          case Tag(w::tensor_meta::kShape, kVarint):
            return Check(ReadRankList(in, tag, &t->shape));
          case Tag(w::tensor_meta::kStride, kLen):
          case Tag(w::tensor_meta::kStride, kVarint):
            return Check(ReadRankList(in, tag, &t->stride));
          case Tag(w::tensor_meta::kStorageOffset, kVarint):
            return VarintAs(in, &t->storage_offset);
          case Tag(w::tensor_meta::kDtype, kVarint): return VarintAs(in, &f->dtype);
          case Tag(w::tensor_meta::kDevice, kLen):
            f->has_device = true;
            // TensorMeta's fields are at level 3 (node, outputs[k], tensor).
            return Message(in, [f](Reader sub) {
              return ParseDevice(sub, 4, &f->device) && !f->device.unknown;
            });
          case Tag(w::tensor_meta::kRequiresGrad, kVarint):
            return VarintBool(in, &t->requires_grad);
          default: return Field::kUnknown;
        }
      },
      RefuseUnknown);
}

bool DecodeValueMeta(Reader r, ValueType* out) {
  uint32_t kind = 0;
  bool has_tensor = false;
  TensorFields f;
  const bool read = ForEachField(
      r,
      [out, &kind, &has_tensor, &f](uint32_t tag, Reader& in) {
        switch (tag) {
          case Tag(w::value_meta::kKind, kVarint): return VarintAs(in, &kind);
          case Tag(w::value_meta::kTensor, kLen):
            has_tensor = true;
            return Message(in, [out, &f](Reader sub) {
              return DecodeTensorMeta(sub, &out->tensor, &f);
            });
          default: return Field::kUnknown;
        }
      },
      RefuseUnknown);
  if (!read) return false;
  absl::StatusOr<ValueKind> k = ValueKindFromWire(static_cast<int>(kind));
  if (!k.ok() || has_tensor != (*k == ValueKind::kTensor)) return false;
  out->kind = *k;
  if (!has_tensor) return true;
  absl::StatusOr<DType> d = DTypeFromWire(static_cast<int>(f.dtype));
  if (!d.ok() || !f.has_device) return false;
  out->tensor.dtype = *d;
  return FinishDevice(f.device, &out->tensor.device);
}

bool DecodePlaceholder(Reader r, uint32_t* role, PlaceholderSpec* p) {
  return ForEachField(
      r,
      [role, p](uint32_t tag, Reader& in) {
        switch (tag) {
          case Tag(w::placeholder_spec::kRole, kVarint): return VarintAs(in, role);
          case Tag(w::placeholder_spec::kStateName, kLen): return String(in, &p->state_name);
          case Tag(w::placeholder_spec::kBatchDim, kVarint): return VarintLow32(in, &p->batch_dim);
          default: return Field::kUnknown;
        }
      },
      RefuseUnknown);
}

bool DecodeOutputSpec(Reader r, OutputSpec* s) {
  uint32_t role = 0;
  const bool read = ForEachField(
      r,
      [s, &role](uint32_t tag, Reader& in) {
        switch (tag) {
          case Tag(w::output_spec::kRole, kVarint): return VarintAs(in, &role);
          case Tag(w::output_spec::kStateName, kLen): return String(in, &s->state_name);
          default: return Field::kUnknown;
        }
      },
      RefuseUnknown);
  if (!read) return false;
  switch (static_cast<int>(role)) {
    case v1::UPDATED_PARAMETER: s->role = OutputRole::kUpdatedParameter; return true;
    case v1::UPDATED_BUFFER: s->role = OutputRole::kUpdatedBuffer; return true;
    case v1::UPDATED_OPTIMIZER_STATE: s->role = OutputRole::kUpdatedOptimizerState; return true;
    case v1::LOSS: s->role = OutputRole::kLoss; return true;
    case v1::OTHER: s->role = OutputRole::kOther; return true;
    default: return false;
  }
}

struct NodeFieldCounts {
  size_t args = 0, kwargs = 0, outputs = 0, output_specs = 0;
};

NodeFieldCounts CountNodeFields(Reader r) {
  NodeFieldCounts c;
  uint32_t tag;
  while (!r.done() && ReadTag(r, &tag)) {
    switch (tag) {
      case Tag(w::node::kArgs, kLen): ++c.args; break;
      case Tag(w::node::kKwargs, kLen): ++c.kwargs; break;
      case Tag(w::node::kOutputs, kLen): ++c.outputs; break;
      case Tag(w::node::kOutputSpecs, kLen): ++c.output_specs; break;
      default: break;
    }
    if (!SkipAny(r, tag)) break;
  }
  return c;
}

bool DecodeNode(Reader r, Node* n) {
  const NodeFieldCounts c = CountNodeFields(r);
  // The verifier refuses more arguments than this.
  if (c.args + c.kwargs > static_cast<size_t>(kMaxArgsPerNode)) return false;
  n->args.reserve(c.args);
  n->kwargs.reserve(c.kwargs);
  n->outputs.reserve(std::min(c.outputs, kMaxReserveHint));
  n->output_specs.reserve(std::min(c.output_specs, kMaxReserveHint));

  uint32_t kind = 0, role = 0;
  bool has_target = false, has_placeholder = false;
  const bool read = ForEachField(
      r,
      [n, &kind, &role, &has_target, &has_placeholder](uint32_t tag, Reader& in) {
        switch (tag) {
          case Tag(w::node::kName, kLen): return String(in, &n->name);
          case Tag(w::node::kKind, kVarint): return VarintAs(in, &kind);
          case Tag(w::node::kTarget, kLen):
            has_target = true;
            return Message(in, [n](Reader sub) { return DecodeTarget(sub, &n->target); });
          case Tag(w::node::kArgs, kLen):
            // Node fields are at level 1, an argument's at 2.
            return Message(in, [n](Reader sub) {
              return DecodeArgument(sub, 2, &n->args.emplace_back());
            });
          case Tag(w::node::kKwargs, kLen):
            return Message(in, [n](Reader sub) {
              return DecodeKeywordArgument(sub, &n->kwargs.emplace_back());
            });
          case Tag(w::node::kOutputs, kLen):
            return Message(in, [n](Reader sub) {
              return DecodeValueMeta(sub, &n->outputs.emplace_back());
            });
          case Tag(w::node::kPlaceholder, kLen):
            has_placeholder = true;
            return Message(in, [n, &role](Reader sub) {
              return DecodePlaceholder(sub, &role, &n->placeholder);
            });
          case Tag(w::node::kOutputSpecs, kLen):
            return Message(in, [n](Reader sub) {
              return DecodeOutputSpec(sub, &n->output_specs.emplace_back());
            });
          case Tag(w::node::kGradOf, kLen): return String(in, &n->grad_of);
          default:  // unknown field (or a known one with the wrong wire type)
            return Field::kUnknown;
        }
      },
      RefuseUnknown);
  if (!read) return false;
  switch (static_cast<int>(kind)) {
    case v1::PLACEHOLDER: n->kind = NodeKind::kPlaceholder; break;
    case v1::CALL_FUNCTION: n->kind = NodeKind::kCallFunction; break;
    case v1::GET_ATTR: n->kind = NodeKind::kGetAttr; break;
    case v1::OUTPUT: n->kind = NodeKind::kOutput; break;
    default: return false;
  }
  if (!has_target || has_placeholder != (n->kind == NodeKind::kPlaceholder)) return false;
  if (has_placeholder) {
    switch (static_cast<int>(role)) {
      case v1::PARAMETER: n->placeholder.role = PlaceholderRole::kParameter; break;
      case v1::BUFFER: n->placeholder.role = PlaceholderRole::kBuffer; break;
      case v1::OPTIMIZER_STATE: n->placeholder.role = PlaceholderRole::kOptimizerState; break;
      case v1::INPUT: n->placeholder.role = PlaceholderRole::kInput; break;
      case v1::CONSTANT: n->placeholder.role = PlaceholderRole::kConstant; break;
      case v1::HYPERPARAMETER: n->placeholder.role = PlaceholderRole::kHyperparameter; break;
      default: return false;
    }
  }
  return true;
}

bool DecodeStringPair(Reader r, std::pair<std::string, std::string>* kv) {
  return ForEachField(
      r,
      [kv](uint32_t tag, Reader& in) {
        switch (tag) {
          case Tag(w::string_pair::kKey, kLen): return String(in, &kv->first);
          case Tag(w::string_pair::kValue, kLen): return String(in, &kv->second);
          default: return Field::kUnknown;
        }
      },
      RefuseUnknown);
}

}  // namespace

bool DecodeGraphWire(absl::string_view bytes, absl::StatusOr<Graph>* out) {
  const auto* begin = reinterpret_cast<const uint8_t*>(bytes.data());
  Reader r{begin, begin + bytes.size()};
  const size_t node_count = CountField(r, w::graph_def::kNodes);
  if (node_count > static_cast<size_t>(kMaxNodes)) return false;
  std::vector<Node> nodes;
  nodes.reserve(node_count);
  GraphHeader h;
  h.format_version = 0;
  const bool read = ForEachField(
      r,
      [&h, &nodes](uint32_t tag, Reader& in) {
        switch (tag) {
          case Tag(w::graph_def::kFormatVersion, kVarint):
            return VarintLow32(in, &h.format_version);
          case Tag(w::graph_def::kProducer, kLen): return String(in, &h.producer);
          case Tag(w::graph_def::kTorchVersion, kLen): return String(in, &h.torch_version);
          case Tag(w::graph_def::kNodes, kLen):
            return Message(in, [&nodes](Reader sub) {
              return nodes.size() < static_cast<size_t>(kMaxNodes) &&
                     DecodeNode(sub, &nodes.emplace_back());
            });
          case Tag(w::graph_def::kMetadata, kLen):
            return Message(in, [&h](Reader sub) {
              return DecodeStringPair(sub, &h.metadata.emplace_back());
            });
          default: return Field::kUnknown;  // unknown field, wrong wire type, or corrupt
        }
      },
      RefuseUnknown);
  if (!read) return false;
  // A missing version is DecodeGraph's error; any other is the verifier's.
  if (h.format_version == 0) return false;
  *out = Graph::Create(std::move(h), std::move(nodes));
  return true;
}

}  // namespace fxdp::ir

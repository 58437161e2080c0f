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
  while (!r.done()) {
    uint32_t tag;
    uint64_t v;
    if (!ReadTag(r, &tag)) return false;
    switch (tag) {
      case Tag(w::device::kType, kVarint):
        if (!ReadVarint(r, &v)) return false;
        d->type = static_cast<uint32_t>(v);
        break;
      case Tag(w::device::kIndex, kVarint):
        if (!ReadVarint(r, &v)) return false;
        d->index = Low32(v);
        break;
      default:
        d->unknown = true;
        if (!SkipField(r, tag, level)) return false;
    }
  }
  return true;
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
  while (!r.done()) {
    uint32_t tag;
    if (!ReadTag(r, &tag)) return false;
    switch (tag) {
      case Tag(w::complex::kReal, kFixed64):
        if (!ReadFixed64(r, &s->real)) return false;
        break;
      case Tag(w::complex::kImag, kFixed64):
        if (!ReadFixed64(r, &s->imag)) return false;
        break;
      default:
        s->complex_unknown = true;
        if (!SkipField(r, tag, level)) return false;
    }
  }
  return true;
}

bool ParseScalar(Reader r, int level, ScalarFields* s) {
  if (level > kRecursionLimit) return false;
  while (!r.done()) {
    uint32_t tag;
    uint64_t v;
    if (!ReadTag(r, &tag)) return false;
    switch (tag) {
      case Tag(w::scalar::kIntValue, kVarint):
        if (!ReadVarint(r, &v)) return false;
        s->Set(w::scalar::kIntValue);
        s->bits = v;
        break;
      case Tag(w::scalar::kFloatValue, kFixed64):
        if (!ReadFixed64(r, &v)) return false;
        s->Set(w::scalar::kFloatValue);
        s->bits = v;
        break;
      case Tag(w::scalar::kBoolValue, kVarint):
        if (!ReadVarint(r, &v)) return false;
        s->Set(w::scalar::kBoolValue);
        s->bits = v != 0;
        break;
      case Tag(w::scalar::kComplexValue, kLen): {
        Reader sub;
        if (!ReadLength(r, &sub)) return false;
        s->Set(w::scalar::kComplexValue);
        if (!ParseComplex(sub, level + 1, s)) return false;
        break;
      }
      default:
        s->unknown = true;
        if (!SkipField(r, tag, level)) return false;
    }
  }
  return true;
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
  while (!r.done()) {
    uint32_t tag;
    uint64_t v;
    if (!ReadTag(r, &tag)) return false;
    switch (tag) {
      case Tag(w::value_ref::kNode, kVarint):
        if (!ReadVarint(r, &v)) return false;
        a->ref_node = static_cast<uint32_t>(v);
        break;
      case Tag(w::value_ref::kOutput, kVarint):
        if (!ReadVarint(r, &v)) return false;
        a->ref_output = static_cast<uint32_t>(v);
        break;
      default:
        a->member_bad = true;
        if (!SkipField(r, tag, level)) return false;
    }
  }
  return true;
}

// NoneValue has no fields: any field is unknown.
bool ParseNone(Reader r, int level, ArgumentFields* a) {
  if (level > kRecursionLimit) return false;
  while (!r.done()) {
    uint32_t tag;
    if (!ReadTag(r, &tag)) return false;
    a->member_bad = true;
    if (!SkipField(r, tag, level)) return false;
  }
  return true;
}

bool FinishArgument(ArgumentFields* a, int depth, Argument* out);
bool DecodeSimpleArgument(Reader r, int level, int depth, Argument* out, bool* ok);

bool ParseList(Reader r, int level, int depth, ArgumentFields* a) {
  if (level > kRecursionLimit) return false;
  if (a->items.empty())
    a->items.reserve(std::min(CountField(r, w::argument_list::kItems), kMaxReserveHint));
  while (!r.done()) {
    uint32_t tag;
    if (!ReadTag(r, &tag)) return false;
    if (tag == Tag(w::argument_list::kItems, kLen)) {
      Reader sub;
      if (!ReadLength(r, &sub)) return false;
      bool ok;
      if (DecodeSimpleArgument(sub, level + 1, depth + 1, &a->items.emplace_back(), &ok)) {
        if (!ok) a->member_bad = true;
        continue;
      }
      ArgumentFields item;
      if (!ParseArgument(sub, level + 1, depth + 1, &item)) return false;
      if (!FinishArgument(&item, depth + 1, &a->items.back())) a->member_bad = true;
    } else {
      a->member_bad = true;
      if (!SkipField(r, tag, level)) return false;
    }
  }
  return true;
}

// Parses (more of) an Argument at `level`, list nesting `depth`. False only on
// corruption; whether the Argument is acceptable is FinishArgument's call.
bool ParseArgument(Reader r, int level, int depth, ArgumentFields* a) {
  if (level > kRecursionLimit) return false;
  while (!r.done()) {
    uint32_t tag;
    uint64_t v;
    Reader sub;
    if (!ReadTag(r, &tag)) return false;
    switch (tag) {
      case Tag(w::argument::kRef, kLen):
        if (!ReadLength(r, &sub)) return false;
        a->Set(w::argument::kRef);
        if (!ParseValueRef(sub, level + 1, a)) return false;
        break;
      case Tag(w::argument::kIntValue, kVarint):
      case Tag(w::argument::kDtype, kVarint):
      case Tag(w::argument::kLayout, kVarint):
      case Tag(w::argument::kMemoryFormat, kVarint):
        if (!ReadVarint(r, &v)) return false;
        a->Set(tag >> 3);
        a->bits = v;
        break;
      case Tag(w::argument::kBoolValue, kVarint):
        if (!ReadVarint(r, &v)) return false;
        a->Set(w::argument::kBoolValue);
        a->bits = v != 0;
        break;
      case Tag(w::argument::kFloatValue, kFixed64):
        if (!ReadFixed64(r, &v)) return false;
        a->Set(w::argument::kFloatValue);
        a->bits = v;
        break;
      case Tag(w::argument::kStringValue, kLen):
        if (!ReadLength(r, &sub) || !ValidUtf8(sub.p, static_cast<size_t>(sub.end - sub.p)))
          return false;
        a->Set(w::argument::kStringValue);
        a->str.assign(reinterpret_cast<const char*>(sub.p), static_cast<size_t>(sub.end - sub.p));
        break;
      case Tag(w::argument::kNone, kLen):
        if (!ReadLength(r, &sub)) return false;
        a->Set(w::argument::kNone);
        if (!ParseNone(sub, level + 1, a)) return false;
        break;
      case Tag(w::argument::kDevice, kLen):
        if (!ReadLength(r, &sub)) return false;
        a->Set(w::argument::kDevice);
        if (!ParseDevice(sub, level + 1, &a->device)) return false;
        break;
      case Tag(w::argument::kScalar, kLen):
        if (!ReadLength(r, &sub)) return false;
        a->Set(w::argument::kScalar);
        if (!ParseScalar(sub, level + 1, &a->scalar)) return false;
        break;
      case Tag(w::argument::kList, kLen):
        if (!ReadLength(r, &sub)) return false;
        a->Set(w::argument::kList);
        if (!ParseList(sub, level + 1, depth, a)) return false;
        break;
      default:
        a->unknown = true;
        if (!SkipField(r, tag, level)) return false;
    }
  }
  return true;
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
  while (!r.done()) {
    uint32_t tag;
    if (!ReadTag(r, &tag)) return false;
    switch (tag) {
      case Tag(w::target::kName, kLen):
        if (!ReadString(r, &t->name)) return false;
        break;
      case Tag(w::target::kOverload, kLen):
        if (!ReadString(r, &t->overload)) return false;
        break;
      default:
        return false;
    }
  }
  return true;
}

bool DecodeKeywordArgument(Reader r, KeywordArgument* kw) {
  ArgumentFields a;
  bool has_value = false;
  while (!r.done()) {
    uint32_t tag;
    if (!ReadTag(r, &tag)) return false;
    switch (tag) {
      case Tag(w::keyword_argument::kName, kLen):
        if (!ReadString(r, &kw->name)) return false;
        break;
      case Tag(w::keyword_argument::kValue, kLen): {
        Reader sub;
        // KeywordArgument's fields are at level 2, its value's at 3.
        if (!ReadLength(r, &sub) || !ParseArgument(sub, 3, 0, &a)) return false;
        has_value = true;
        break;
      }
      default:
        return false;
    }
  }
  return has_value && FinishArgument(&a, 0, &kw->value);
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
  while (!r.done()) {
    uint32_t tag;
    uint64_t v;
    if (!ReadTag(r, &tag)) return false;
    switch (tag) {
      case Tag(w::tensor_meta::kShape, kLen):
      case Tag(w::tensor_meta::kShape, kVarint):
        if (!ReadRankList(r, tag, &t->shape)) return false;
        break;
      case Tag(w::tensor_meta::kStride, kLen):
      case Tag(w::tensor_meta::kStride, kVarint):
        if (!ReadRankList(r, tag, &t->stride)) return false;
        break;
      case Tag(w::tensor_meta::kStorageOffset, kVarint):
        if (!ReadVarint(r, &v)) return false;
        t->storage_offset = static_cast<int64_t>(v);
        break;
      case Tag(w::tensor_meta::kDtype, kVarint):
        if (!ReadVarint(r, &v)) return false;
        f->dtype = static_cast<uint32_t>(v);
        break;
      case Tag(w::tensor_meta::kDevice, kLen): {
        Reader sub;
        // TensorMeta's fields are at level 3 (node, outputs[k], tensor).
        if (!ReadLength(r, &sub) || !ParseDevice(sub, 4, &f->device) || f->device.unknown)
          return false;
        f->has_device = true;
        break;
      }
      case Tag(w::tensor_meta::kRequiresGrad, kVarint):
        if (!ReadVarint(r, &v)) return false;
        t->requires_grad = v != 0;
        break;
      default:
        return false;
    }
  }
  return true;
}

bool DecodeValueMeta(Reader r, ValueType* out) {
  uint32_t kind = 0;
  bool has_tensor = false;
  TensorFields f;
  while (!r.done()) {
    uint32_t tag;
    uint64_t v;
    if (!ReadTag(r, &tag)) return false;
    switch (tag) {
      case Tag(w::value_meta::kKind, kVarint):
        if (!ReadVarint(r, &v)) return false;
        kind = static_cast<uint32_t>(v);
        break;
      case Tag(w::value_meta::kTensor, kLen): {
        Reader sub;
        if (!ReadLength(r, &sub) || !DecodeTensorMeta(sub, &out->tensor, &f)) return false;
        has_tensor = true;
        break;
      }
      default:
        return false;
    }
  }
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
  while (!r.done()) {
    uint32_t tag;
    uint64_t v;
    if (!ReadTag(r, &tag)) return false;
    switch (tag) {
      case Tag(w::placeholder_spec::kRole, kVarint):
        if (!ReadVarint(r, &v)) return false;
        *role = static_cast<uint32_t>(v);
        break;
      case Tag(w::placeholder_spec::kStateName, kLen):
        if (!ReadString(r, &p->state_name)) return false;
        break;
      case Tag(w::placeholder_spec::kBatchDim, kVarint):
        if (!ReadVarint(r, &v)) return false;
        p->batch_dim = Low32(v);
        break;
      default:
        return false;
    }
  }
  return true;
}

bool DecodeOutputSpec(Reader r, OutputSpec* s) {
  uint32_t role = 0;
  while (!r.done()) {
    uint32_t tag;
    uint64_t v;
    if (!ReadTag(r, &tag)) return false;
    switch (tag) {
      case Tag(w::output_spec::kRole, kVarint):
        if (!ReadVarint(r, &v)) return false;
        role = static_cast<uint32_t>(v);
        break;
      case Tag(w::output_spec::kStateName, kLen):
        if (!ReadString(r, &s->state_name)) return false;
        break;
      default:
        return false;
    }
  }
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
  while (!r.done()) {
    uint32_t tag;
    uint64_t v;
    Reader sub;
    if (!ReadTag(r, &tag)) return false;
    switch (tag) {
      case Tag(w::node::kName, kLen):
        if (!ReadString(r, &n->name)) return false;
        break;
      case Tag(w::node::kKind, kVarint):
        if (!ReadVarint(r, &v)) return false;
        kind = static_cast<uint32_t>(v);
        break;
      case Tag(w::node::kTarget, kLen):
        if (!ReadLength(r, &sub) || !DecodeTarget(sub, &n->target)) return false;
        has_target = true;
        break;
      case Tag(w::node::kArgs, kLen):
        if (!ReadLength(r, &sub)) return false;
        // Node fields are at level 1, an argument's at 2.
        if (!DecodeArgument(sub, 2, &n->args.emplace_back())) return false;
        break;
      case Tag(w::node::kKwargs, kLen):
        if (!ReadLength(r, &sub) || !DecodeKeywordArgument(sub, &n->kwargs.emplace_back()))
          return false;
        break;
      case Tag(w::node::kOutputs, kLen):
        if (!ReadLength(r, &sub) || !DecodeValueMeta(sub, &n->outputs.emplace_back()))
          return false;
        break;
      case Tag(w::node::kPlaceholder, kLen):
        if (!ReadLength(r, &sub) || !DecodePlaceholder(sub, &role, &n->placeholder)) return false;
        has_placeholder = true;
        break;
      case Tag(w::node::kOutputSpecs, kLen):
        if (!ReadLength(r, &sub) || !DecodeOutputSpec(sub, &n->output_specs.emplace_back()))
          return false;
        break;
      case Tag(w::node::kGradOf, kLen):
        if (!ReadString(r, &n->grad_of)) return false;
        break;
      default:
        return false;  // unknown field (or a known one with the wrong wire type)
    }
  }
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
  while (!r.done()) {
    uint32_t tag;
    if (!ReadTag(r, &tag)) return false;
    switch (tag) {
      case Tag(w::string_pair::kKey, kLen):
        if (!ReadString(r, &kv->first)) return false;
        break;
      case Tag(w::string_pair::kValue, kLen):
        if (!ReadString(r, &kv->second)) return false;
        break;
      default:
        return false;
    }
  }
  return true;
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
  while (!r.done()) {
    uint32_t tag;
    uint64_t v;
    Reader sub;
    if (!ReadTag(r, &tag)) return false;
    switch (tag) {
      case Tag(w::graph_def::kFormatVersion, kVarint):
        if (!ReadVarint(r, &v)) return false;
        h.format_version = Low32(v);
        break;
      case Tag(w::graph_def::kProducer, kLen):
        if (!ReadString(r, &h.producer)) return false;
        break;
      case Tag(w::graph_def::kTorchVersion, kLen):
        if (!ReadString(r, &h.torch_version)) return false;
        break;
      case Tag(w::graph_def::kNodes, kLen):
        if (!ReadLength(r, &sub) || nodes.size() >= static_cast<size_t>(kMaxNodes) ||
            !DecodeNode(sub, &nodes.emplace_back()))
          return false;
        break;
      case Tag(w::graph_def::kMetadata, kLen):
        if (!ReadLength(r, &sub) || !DecodeStringPair(sub, &h.metadata.emplace_back()))
          return false;
        break;
      default:
        return false;  // unknown field, wrong wire type, or corrupt
    }
  }
  // A missing version is DecodeGraph's error; any other is the verifier's.
  if (h.format_version == 0) return false;
  *out = Graph::Create(std::move(h), std::move(nodes));
  return true;
}

}  // namespace fxdp::ir

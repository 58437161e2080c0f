// Internal to the direct wire decoder (wire_decoder.h): reading protobuf's
// wire format with its limits, and the one field loop every message's
// decoder runs. Header-only so that the per-field readers inline into the
// decoders of wire_arguments.cc and wire_decoder.cc.
#ifndef FXDP_ANALYSIS_IR_WIRE_READER_H_
#define FXDP_ANALYSIS_IR_WIRE_READER_H_

#include <climits>
#include <cstdint>
#include <cstring>
#include <string>

#include "analysis/ir/wire_decoder.h"
#include "google/protobuf/stubs/common.h"

namespace fxdp::ir::wire_reader {

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
inline bool ReadVarintSlow(Reader& r, T* v) {
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
inline bool ReadLengthSlow(Reader& r, Reader* sub) {
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
inline bool ValidUtf8(const uint8_t* p, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t word;
    std::memcpy(&word, p + i, 8);
    if (word & 0x8080808080808080ull) break;
  }
  for (; i < n; ++i) {
    if (p[i] & 0x80)
      return google::protobuf::internal::IsStructurallyValidUTF8(reinterpret_cast<const char*>(p),
                                                                 static_cast<int>(n));
  }
  return true;
}

inline bool ReadString(Reader& r, std::string* out) {
  Reader s;
  if (!ReadLength(r, &s) || !ValidUtf8(s.p, static_cast<size_t>(s.end - s.p))) return false;
  out->assign(reinterpret_cast<const char*>(s.p), static_cast<size_t>(s.end - s.p));
  return true;
}

inline bool SkipGroup(Reader& r, uint32_t number, int level);

// Skips one field protobuf would keep as an unknown field (number and wire
// type already read in `tag`), in a message whose fields are at `level`.
// False on corruption: field number 0, wire types 4 (outside a group), 6, 7,
// truncation, or a group that is not closed by its own end tag.
inline bool SkipField(Reader& r, uint32_t tag, int level) {
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
    case WireType::kStartGroup: return SkipGroup(r, tag >> 3, level + 1);
    case WireType::kFixed32:
      if (r.end - r.p < 4) return false;
      r.p += 4;
      return true;
    default: return false;
  }
}

// A group's fields, at `level`, up to the end-group tag with its number.
inline bool SkipGroup(Reader& r, uint32_t number, int level) {
  if (level > kRecursionLimit) return false;
  for (;;) {
    uint32_t tag;
    if (r.done() || !ReadTag(r, &tag) || tag == 0) return false;
    if ((tag & 7) == static_cast<uint32_t>(WireType::kEndGroup)) return (tag >> 3) == number;
    if (!SkipField(r, tag, level)) return false;
  }
}

// Skips one field of any kind but a group; false when the bytes cannot be
// walked (the pre-counts below stop there and leave the error to the
// decoding pass).
inline bool SkipAny(Reader& r, uint32_t tag) {
  return static_cast<WireType>(tag & 7) != WireType::kStartGroup && SkipField(r, tag, /*level=*/0);
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
      case Field::kRead: break;
      case Field::kCorrupt: return false;
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
// A symbolic-size field (docs/shapes.md) that a static graph leaves at its
// default: consumed when it holds the default (a uint32 varint of 0, an empty packed
// list), else kUnknown, so the message's policy defers the graph to the
// protobuf path, which refuses a symbolic graph by name.
inline Field DefaultUint32(Reader& r) {
  uint64_t v;
  if (!ReadVarint(r, &v)) return Field::kCorrupt;
  return static_cast<uint32_t>(v) == 0 ? Field::kRead : Field::kUnknown;  // mod 2^32, as protobuf
}
inline Field EmptyPacked(Reader& r) {
  Reader packed;
  if (!ReadLength(r, &packed)) return Field::kCorrupt;
  return packed.done() ? Field::kRead : Field::kUnknown;
}
// A message field: `decode(Reader)` gets its bytes.
template <typename Decode>
inline Field Message(Reader& r, Decode decode) {
  Reader sub;
  return Check(ReadLength(r, &sub) && decode(sub));
}

// How often the length-delimited field `number` occurs in a message (a reserve
// hint: exact for well-formed input, a lower bound otherwise).
inline size_t CountField(Reader r, uint32_t number) {
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
inline size_t CountVarints(Reader r) {
  size_t n = 0;
  for (const uint8_t* p = r.p; p != r.end; ++p) n += *p < 0x80;
  return n;
}

}  // namespace fxdp::ir::wire_reader

#endif  // FXDP_ANALYSIS_IR_WIRE_READER_H_

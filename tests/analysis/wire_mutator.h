// A generic wire tree of an encoded GraphDef, guided by its descriptors, and
// the mutations the wire-decoder tests (ir_wire_decoder_test.cc) apply to it
// field by field before writing it back.
#ifndef FXDP_TESTS_ANALYSIS_WIRE_MUTATOR_H_
#define FXDP_TESTS_ANALYSIS_WIRE_MUTATOR_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/wire_format_lite.h"

namespace fxdp::ir::wire_test {

namespace pb = ::google::protobuf;

// ---- A generic wire tree, guided by the descriptors, to mutate encodings
// field by field and write them back (optionally with non-minimal varints).

struct WMsg;
struct WField {
  uint32_t number = 0;
  int wt = 0;
  uint64_t value = 0;         // varint / fixed64 / fixed32
  std::string bytes;          // length-delimited payload, or a group's body + end tag
  std::shared_ptr<WMsg> msg;  // a parsed sub-message (length-delimited message fields)
};
struct WMsg {
  const pb::Descriptor* desc = nullptr;
  std::vector<WField> fields;
};

inline uint64_t GetVarint(const std::string& b, size_t* i) {
  uint64_t v = 0;
  for (int s = 0;; s += 7) {
    const uint8_t c = static_cast<uint8_t>(b.at((*i)++));
    v |= static_cast<uint64_t>(c & 0x7f) << s;
    if (c < 0x80) return v;
  }
}

// Parses canonical bytes (EncodeGraphBytes output).
inline std::shared_ptr<WMsg> Parse(const std::string& b, const pb::Descriptor* d) {
  auto m = std::make_shared<WMsg>();
  m->desc = d;
  size_t i = 0;
  while (i < b.size()) {
    WField f;
    const uint64_t tag = GetVarint(b, &i);
    f.number = static_cast<uint32_t>(tag >> 3);
    f.wt = static_cast<int>(tag & 7);
    switch (f.wt) {
      case 0: f.value = GetVarint(b, &i); break;
      case 1:
        std::memcpy(&f.value, b.data() + i, 8);
        i += 8;
        break;
      case 5:
        std::memcpy(&f.value, b.data() + i, 4);
        i += 4;
        break;
      case 2: {
        const size_t n = GetVarint(b, &i);
        f.bytes = b.substr(i, n);
        i += n;
        const pb::FieldDescriptor* fd = d->FindFieldByNumber(static_cast<int>(f.number));
        if (fd != nullptr && fd->type() == pb::FieldDescriptor::TYPE_MESSAGE)
          f.msg = Parse(f.bytes, fd->message_type());
        break;
      }
      default: ADD_FAILURE() << "unexpected wire type in canonical bytes"; return m;
    }
    m->fields.push_back(std::move(f));
  }
  return m;
}

inline std::shared_ptr<WMsg> Clone(const WMsg& m) {
  auto c = std::make_shared<WMsg>(m);
  for (WField& f : c->fields)
    if (f.msg) f.msg = Clone(*f.msg);
  return c;
}

struct Writer {
  std::mt19937_64* rng;
  double pad = 0;  // probability of a non-minimal encoding per varint

  // `max`: the longest encoding protobuf accepts (10 for values, 5 for tags
  // and lengths); padding stays within it.
  void Varint(std::string* out, uint64_t v, int max) {
    std::string b;
    do {
      b.push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    } while (v != 0);
    b.back() = static_cast<char>(b.back() & 0x7f);
    if (pad > 0 && std::uniform_real_distribution<double>(0, 1)(*rng) < pad &&
        static_cast<int>(b.size()) < max) {
      const int extra = 1 + static_cast<int>((*rng)() % (max - b.size()));
      for (int k = 0; k < extra; ++k) {
        b.back() = static_cast<char>(b.back() | 0x80);
        b.push_back(0);
      }
    }
    out->append(b);
  }
  void Tag(std::string* out, uint32_t number, int wt) {
    Varint(out, (static_cast<uint64_t>(number) << 3) | static_cast<uint64_t>(wt), 5);
  }
  std::string Write(const WMsg& m) {
    std::string out;
    for (const WField& f : m.fields) {
      Tag(&out, f.number, f.wt);
      switch (f.wt) {
        case 0: Varint(&out, f.value, 10); break;
        case 1: out.append(reinterpret_cast<const char*>(&f.value), 8); break;
        case 5: out.append(reinterpret_cast<const char*>(&f.value), 4); break;
        case 2: {
          const std::string payload = f.msg ? Write(*f.msg) : f.bytes;
          Varint(&out, payload.size(), 5);
          out.append(payload);
          break;
        }
        default: out.append(f.bytes); break;  // a group's body and end tag, or raw bytes
      }
    }
    return out;
  }
};

inline void CollectMessages(WMsg* m, std::vector<WMsg*>* out) {
  out->push_back(m);
  for (WField& f : m->fields)
    if (f.msg) CollectMessages(f.msg.get(), out);
}

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}
  std::mt19937_64& rng() { return rng_; }
  size_t Below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng_() % n); }
  bool OneIn(int n) { return Below(static_cast<size_t>(n)) == 0; }

  uint64_t InterestingVarint() {
    static constexpr uint64_t kValues[] = {0,
                                           1,
                                           2,
                                           3,
                                           4,
                                           5,
                                           6,
                                           7,
                                           9,
                                           12,
                                           17,
                                           31,
                                           77,
                                           100,
                                           127,
                                           128,
                                           16383,
                                           16384,
                                           1u << 24,
                                           (1u << 24) + 1,
                                           1u << 30,
                                           (1u << 30) + 1,
                                           0x7fffffff,
                                           0x80000000,
                                           0xffffffff,
                                           0x100000000,
                                           0x100000001,
                                           0xfffffffffffffffe,
                                           0xffffffffffffffff,
                                           0x8000000000000000};
    if (OneIn(4)) return rng_();
    return kValues[Below(std::size(kValues))];
  }

  std::string RandomString() {
    static const std::string kStrings[] = {"",
                                           "a",
                                           "x",
                                           "aten::add",
                                           "operator.getitem",
                                           "Tensor",
                                           "a_rather_long_node_name_past_sso",
                                           "\xc3\xa9",
                                           "\xe6\x97\xa5\xe6\x9c\xac",
                                           "\xf0\x9f\x98\x80",
                                           "\xff",
                                           "\xc0\x80",
                                           "\xed\xa0\x80",
                                           "\xf4\x90\x80\x80",
                                           "a\xc3",
                                           std::string("nul\0inside", 10)};
    return kStrings[Below(std::size(kStrings))];
  }

  // A plausible value for known field `fd` (or, for messages, a copy of one
  // of the same type found in the tree, or an empty one).
  WField RandomKnownField(const pb::FieldDescriptor* fd, const std::vector<WMsg*>& all) {
    WField f;
    f.number = static_cast<uint32_t>(fd->number());
    switch (fd->type()) {
      case pb::FieldDescriptor::TYPE_STRING:
        f.wt = 2;
        f.bytes = RandomString();
        break;
      case pb::FieldDescriptor::TYPE_DOUBLE:
        f.wt = 1;
        f.value = OneIn(2) ? rng_() : 0x3ff0000000000000;
        break;
      case pb::FieldDescriptor::TYPE_MESSAGE: {
        f.wt = 2;
        std::vector<WMsg*> same;
        for (WMsg* m : all)
          if (m->desc == fd->message_type()) same.push_back(m);
        if (!same.empty() && !OneIn(4)) {
          f.msg = Clone(*same[Below(same.size())]);
        } else {
          f.msg = std::make_shared<WMsg>();
          f.msg->desc = fd->message_type();
        }
        break;
      }
      default:
        if (fd->is_packed() && OneIn(2)) {
          f.wt = 2;
          Writer w{&rng_};
          for (size_t k = Below(4); k > 0; --k) w.Varint(&f.bytes, InterestingVarint(), 10);
        } else {
          f.wt = 0;
          f.value = InterestingVarint();
        }
    }
    return f;
  }

  // A field that protobuf keeps as unknown: a new number, or a known number
  // with the wrong wire type. Rarely something corrupt.
  WField RandomUnknownField(const pb::Descriptor* d, int depth = 0) {
    WField f;
    static constexpr uint32_t kNumbers[] = {13, 15, 16, 42, 99, 1000, 19000, (1u << 29) - 1};
    f.number = kNumbers[Below(std::size(kNumbers))];
    static constexpr int kWireTypes[] = {0, 1, 2, 3, 5};
    f.wt = kWireTypes[Below(std::size(kWireTypes))];
    if (d->field_count() > 0 && OneIn(3)) {
      // A known number with the wrong wire type is an unknown field too.
      const pb::FieldDescriptor* fd = d->field(static_cast<int>(Below(d->field_count())));
      f.number = static_cast<uint32_t>(fd->number());
      const int expected = static_cast<int>(pb::internal::WireFormatLite::WireTypeForFieldType(
          static_cast<pb::internal::WireFormatLite::FieldType>(fd->type())));
      while (f.wt == expected || (fd->is_packed() && f.wt == 2))
        f.wt = kWireTypes[Below(std::size(kWireTypes))];
    }
    switch (f.wt) {
      case 0: f.value = InterestingVarint(); break;
      case 1:
      case 5: f.value = rng_(); break;
      case 2: f.bytes = OneIn(2) ? RandomString() : std::string("\x08\x01", 2); break;
      case 3: {
        // A group: some fields, nested groups, then the end tag.
        Writer w{&rng_};
        std::string body;
        for (size_t k = Below(3); k > 0; --k) {
          WField g = depth < 60 && OneIn(3) ? RandomUnknownField(d, depth + 1)
                                            : WField{1 + static_cast<uint32_t>(Below(20)), 0,
                                                     InterestingVarint(), "", nullptr};
          WMsg tmp;
          tmp.fields.push_back(g);
          body += w.Write(tmp);
        }
        uint32_t end = f.number;
        if (OneIn(15)) end += 1;               // mismatched end tag: corrupt
        if (!OneIn(20)) w.Tag(&body, end, 4);  // or none at all: corrupt
        f.bytes = body;
        break;
      }
    }
    return f;
  }

  // Wraps the fields of Argument `a` in `levels` single-item lists.
  static void Nest(WMsg* a, int levels) {
    for (int k = 0; k < levels; ++k) {
      auto inner = std::make_shared<WMsg>();
      inner->desc = a->desc;
      inner->fields = std::move(a->fields);
      auto list = std::make_shared<WMsg>();
      list->desc = v1::ArgumentList::descriptor();
      list->fields.push_back(WField{1, 2, 0, "", inner});
      a->fields.clear();
      a->fields.push_back(WField{12, 2, 0, "", list});
    }
  }

  // MutateTree's larger mutations of message `m` (`where`: its type's name),
  // each returning its name ("none" where `m` has nothing to mutate).
  // Split a sub-message field into two occurrences (merged on parse).
  std::string Split(WMsg* m, const std::string& where) {
    auto& fs = m->fields;
    std::vector<size_t> subs;
    for (size_t k = 0; k < fs.size(); ++k)
      if (fs[k].msg && fs[k].msg->fields.size() >= 2) subs.push_back(k);
    if (subs.empty()) return "none";
    const size_t k = subs[Below(subs.size())];
    WField second = fs[k];
    second.msg = Clone(*fs[k].msg);
    const size_t cut = 1 + Below(fs[k].msg->fields.size() - 1);
    fs[k].msg->fields.resize(cut);
    second.msg->fields.erase(second.msg->fields.begin(),
                             second.msg->fields.begin() + static_cast<long>(cut));
    fs.insert(fs.begin() + static_cast<long>(k + 1), second);
    return "split in " + where;
  }
  // Packed <-> unpacked repeated int64, or split into several packed runs.
  std::string Unpack(WMsg* m, const std::string& where) {
    auto& fs = m->fields;
    std::vector<size_t> packed;
    for (size_t k = 0; k < fs.size(); ++k)
      if (fs[k].wt == 2 && !fs[k].msg && m->desc->FindFieldByNumber(fs[k].number) &&
          m->desc->FindFieldByNumber(fs[k].number)->is_packed())
        packed.push_back(k);
    if (packed.empty()) return "none";
    const size_t k = packed[Below(packed.size())];
    std::vector<uint64_t> values;
    for (size_t i = 0; i < fs[k].bytes.size();) values.push_back(GetVarint(fs[k].bytes, &i));
    std::vector<WField> repl;
    Writer w{&rng_};
    for (size_t i = 0; i < values.size(); ++i) {
      if (OneIn(2)) {
        repl.push_back(WField{fs[k].number, 0, values[i], "", nullptr});
      } else {
        WField p{fs[k].number, 2, 0, "", nullptr};
        w.Varint(&p.bytes, values[i], 10);
        repl.push_back(p);
      }
    }
    fs.erase(fs.begin() + static_cast<long>(k));
    fs.insert(fs.begin() + static_cast<long>(k), repl.begin(), repl.end());
    return "unpack in " + where;
  }
  // A oneof member first, the existing value after it: the first is
  // replaced (with whatever was wrong inside it) unless both are the
  // same member, in which case they merge.
  std::string OneofFirst(WMsg* m, const std::vector<WMsg*>& all) {
    auto& fs = m->fields;
    if (m->desc != v1::Argument::descriptor() && m->desc != v1::Scalar::descriptor()) return "none";
    const pb::FieldDescriptor* fd = m->desc->field(static_cast<int>(Below(m->desc->field_count())));
    WField f = RandomKnownField(fd, all);
    if (f.msg && OneIn(2)) f.msg->fields.push_back(RandomUnknownField(f.msg->desc));
    if (OneIn(2))
      fs.insert(fs.begin(), f);
    else
      fs.push_back(f);
    return absl::StrCat("oneof ", fd->full_name());
  }
  // An Argument wrapped in lists around the list depth limit (16) and
  // protobuf's recursion limit (48).
  std::string NestArgument(WMsg* m) {
    if (m->desc != v1::Argument::descriptor()) return "none";
    const int levels = static_cast<int>(OneIn(2) ? Below(5) : 14 + Below(12));
    Nest(m, levels);
    if (OneIn(3)) {
      // ...and replaced by an int: only corruption counts then.
      m->fields.push_back(WField{2, 0, 7, "", nullptr});
    }
    return absl::StrCat("nest ", levels);
  }
  // Deeply nested unknown groups.
  std::string DeepGroups(WMsg* m, const std::vector<WMsg*>& all, const std::string& where) {
    auto& fs = m->fields;
    WField g{99, 3, 0, "", nullptr};
    Writer w{&rng_};
    const int levels = 40 + static_cast<int>(Below(12));
    std::string body;
    for (int k = 0; k < levels; ++k) w.Tag(&body, 99, 3);
    for (int k = 0; k <= levels; ++k) w.Tag(&body, 99, 4);
    g.bytes = body;
    if (m->desc != v1::Argument::descriptor() || OneIn(2)) {
      fs.push_back(g);
      return "groups in " + where;
    }
    // Inside a oneof member that gets replaced.
    WField list = RandomKnownField(v1::Argument::descriptor()->FindFieldByNumber(12), all);
    list.msg->fields.push_back(g);
    fs.insert(fs.begin(), list);
    return "groups in replaced list";
  }
  // Raw bytes in place of a message field.
  std::string RawBytes(WMsg* m, const std::string& where) {
    auto& fs = m->fields;
    std::vector<WField*> subs;
    for (WField& f : fs)
      if (f.msg) subs.push_back(&f);
    if (subs.empty()) return "none";
    WField* f = subs[Below(subs.size())];
    Writer w{&rng_};
    f->bytes = w.Write(*f->msg);
    f->msg = nullptr;
    if (!f->bytes.empty()) f->bytes[Below(f->bytes.size())] = static_cast<char>(rng_());
    return "raw bytes in " + where;
  }

  // Applies one structural mutation to the tree; returns its name.
  std::string MutateTree(WMsg* root) {
    std::vector<WMsg*> all;
    CollectMessages(root, &all);
    WMsg* m = all[Below(all.size())];
    // Bias towards arguments and tensor metadata, where the tricky rules live.
    if (OneIn(2)) {
      std::vector<WMsg*> args;
      for (WMsg* x : all)
        if (x->desc == v1::Argument::descriptor() || x->desc == v1::TensorMeta::descriptor() ||
            x->desc == v1::Scalar::descriptor())
          args.push_back(x);
      if (!args.empty()) m = args[Below(args.size())];
    }
    auto& fs = m->fields;
    const std::string where = m->desc->name();
    switch (Below(13)) {
      case 0: std::shuffle(fs.begin(), fs.end(), rng_); return "shuffle " + where;
      case 1:
        if (fs.empty()) return "none";
        {
          WField f = fs[Below(fs.size())];
          if (f.msg) f.msg = Clone(*f.msg);
          fs.insert(fs.begin() + static_cast<long>(Below(fs.size() + 1)), f);
        }
        return "duplicate in " + where;
      case 2: return Split(m, where);
      case 3:
        if (fs.empty()) return "none";
        fs.erase(fs.begin() + static_cast<long>(Below(fs.size())));
        return "delete in " + where;
      case 4:
        fs.insert(fs.begin() + static_cast<long>(Below(fs.size() + 1)),
                  RandomUnknownField(m->desc));
        return "unknown field in " + where;
      case 5: {
        if (m->desc->field_count() == 0) return "none";
        const pb::FieldDescriptor* fd =
            m->desc->field(static_cast<int>(Below(m->desc->field_count())));
        fs.insert(fs.begin() + static_cast<long>(Below(fs.size() + 1)), RandomKnownField(fd, all));
        return absl::StrCat("insert ", fd->full_name());
      }
      case 6: {
        std::vector<WField*> varints;
        for (WField& f : fs)
          if (f.wt == 0) varints.push_back(&f);
        if (varints.empty()) return "none";
        varints[Below(varints.size())]->value = InterestingVarint();
        return "varint in " + where;
      }
      case 7: return Unpack(m, where);
      case 8: return OneofFirst(m, all);
      case 9: {
        std::vector<WField*> strings;
        for (WField& f : fs)
          if (f.wt == 2 && !f.msg && m->desc->FindFieldByNumber(f.number) &&
              m->desc->FindFieldByNumber(f.number)->type() == pb::FieldDescriptor::TYPE_STRING)
            strings.push_back(&f);
        if (strings.empty()) return "none";
        strings[Below(strings.size())]->bytes = RandomString();
        return "string in " + where;
      }
      case 10: return NestArgument(m);
      case 11: return DeepGroups(m, all, where);
      default: return RawBytes(m, where);
    }
  }

  // Byte-level damage to an encoding.
  std::string MutateBytes(std::string* b) {
    if (b->empty()) return "empty";
    switch (Below(6)) {
      case 0:
        for (size_t k = 1 + Below(3); k > 0; --k)
          (*b)[Below(b->size())] ^= static_cast<char>(1 << Below(8));
        return "bit flips";
      case 1: (*b)[Below(b->size())] = static_cast<char>(rng_()); return "byte";
      case 2: b->resize(Below(b->size())); return "truncate";
      case 3: {
        const size_t at = Below(b->size()), len = Below(24);
        b->insert(at, b->substr(at, len));
        return "duplicate span";
      }
      case 4: {
        const size_t at = Below(b->size());
        b->erase(at, Below(8));
        return "delete span";
      }
      default: {
        std::string junk;
        for (size_t k = 1 + Below(4); k > 0; --k) junk.push_back(static_cast<char>(rng_()));
        b->insert(Below(b->size() + 1), junk);
        return "insert bytes";
      }
    }
  }

 private:
  std::mt19937_64 rng_;
};

}  // namespace fxdp::ir::wire_test

#endif  // FXDP_TESTS_ANALYSIS_WIRE_MUTATOR_H_

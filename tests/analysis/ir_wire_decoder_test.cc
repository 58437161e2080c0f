// The direct wire-format decoder (analysis/ir/wire_decoder.h) against the
// protobuf path (parse into a v1::GraphDef, then DecodeGraph) as the oracle:
// on the golden graphs, the synthetic transformer step and thousands of
// mutated encodings (bit flips, truncations, fields reordered, duplicated,
// split, inserted, unknown, packed/unpacked, non-minimal varints, oneof
// members replaced, deep nesting), both must accept with equal graphs, or
// both refuse with the same status. A valid input must never need the
// protobuf path.
#include "analysis/ir/wire_decoder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "analysis/ir/proto_codec.h"
#include "analysis/ir/text.h"
#include "bench/synthetic_graph.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/wire_format_lite.h"
#include "tests/test_util.h"

namespace fxdp::ir {
namespace {

namespace pb = ::google::protobuf;
using ::fxdp::testing::ReadTestData;
using ::fxdp::testing::StatusIs;
using ::fxdp::testing::ValueOrDie;
using wire::WireType;

// The oracle's parser logs every string with invalid UTF-8 it meets, and
// thousands of mutated inputs have some: keep the test log readable.
[[maybe_unused]] const pb::LogHandler* const kPreviousLogHandler = pb::SetLogHandler(nullptr);

// ---- The field table is graph.proto's.

TEST(WireFieldsTest, MatchTheGeneratedDescriptors) {
  const pb::FileDescriptor* file = v1::GraphDef::descriptor()->file();
  int listed = 0;
  for (const wire::FieldSpec& spec : wire::kFields) {
    SCOPED_TRACE(absl::StrCat(spec.message, ".", spec.field));
    const pb::Descriptor* m =
        pb::DescriptorPool::generated_pool()->FindMessageTypeByName(std::string(spec.message));
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(m->file(), file);
    const pb::FieldDescriptor* f = m->FindFieldByName(std::string(spec.field));
    ASSERT_NE(f, nullptr);
    EXPECT_EQ(static_cast<uint32_t>(f->number()), spec.number);
    const auto type = static_cast<pb::internal::WireFormatLite::FieldType>(f->type());
    EXPECT_EQ(static_cast<int>(pb::internal::WireFormatLite::WireTypeForFieldType(type)),
              static_cast<int>(spec.wire_type));
    // The decoder reads strings as UTF-8-checked strings, ints as varints
    // (no zigzag): a change to bytes, sint64 or fixed32 must show here.
    EXPECT_TRUE(f->type() == pb::FieldDescriptor::TYPE_STRING ||
                f->type() == pb::FieldDescriptor::TYPE_MESSAGE ||
                f->type() == pb::FieldDescriptor::TYPE_ENUM ||
                f->type() == pb::FieldDescriptor::TYPE_INT64 ||
                f->type() == pb::FieldDescriptor::TYPE_INT32 ||
                f->type() == pb::FieldDescriptor::TYPE_UINT32 ||
                f->type() == pb::FieldDescriptor::TYPE_BOOL ||
                f->type() == pb::FieldDescriptor::TYPE_DOUBLE)
        << f->type_name();
    if (f->is_repeated() && f->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      EXPECT_TRUE(f->is_packed());  // the decoder takes both forms; writers pack
    }
    ++listed;
  }
  // And every field of every message in graph.proto is listed: a new field
  // must be taught to the direct decoder, which would refuse it as unknown.
  int fields = 0;
  for (int i = 0; i < file->message_type_count(); ++i) {
    const pb::Descriptor* m = file->message_type(i);
    EXPECT_EQ(m->nested_type_count(), 0) << m->full_name();
    for (int k = 0; k < m->field_count(); ++k) {
      ++fields;
      const bool found = std::any_of(
          std::begin(wire::kFields), std::end(wire::kFields), [&](const wire::FieldSpec& s) {
            return s.message == m->full_name() && s.field == m->field(k)->name();
          });
      EXPECT_TRUE(found) << m->field(k)->full_name() << " is missing from wire::kFields";
    }
  }
  EXPECT_EQ(listed, fields);
}

// ---- The comparison.

std::string Hex(const std::string& b, size_t max = 96) {
  std::string out;
  for (size_t i = 0; i < std::min(b.size(), max); ++i)
    absl::StrAppend(&out, absl::Hex(static_cast<uint8_t>(b[i]), absl::kZeroPad2));
  if (b.size() > max) absl::StrAppend(&out, "...");
  return out;
}

struct Tally {
  int cases = 0;
  int accepted = 0;          // both accepted, equal graphs
  int verifier_refused = 0;  // both refused; the direct decoder returned the verifier's status
  int refused = 0;           // both refused; the direct decoder deferred to the protobuf path
  int failures = 0;
};

// Checks that the direct decoder agrees with the protobuf path on `bytes`.
void Compare(const std::string& bytes, const std::string& what, Tally* t) {
  ++t->cases;
  const absl::StatusOr<Graph> want = DecodeGraphBytesViaMessage(bytes);
  absl::StatusOr<Graph> fast;
  const bool decided = DecodeGraphWire(bytes, &fast);
  const absl::StatusOr<Graph> got = DecodeGraphBytes(bytes);
  std::string problem;
  if (want.ok()) {
    if (!decided)
      problem = "valid input refused by the direct decoder";
    else if (!fast.ok())
      problem = absl::StrCat("direct decoder: ", fast.status().ToString());
    else if (!(*fast == *want))
      problem = "direct decoder built a different graph";
    else if (!got.ok() || !(*got == *want))
      problem = "DecodeGraphBytes differs";
    else
      ++t->accepted;
  } else {
    if (decided && fast.status() != want.status())
      problem = absl::StrCat("direct decoder: ",
                             fast.ok() ? std::string("accepted") : fast.status().ToString());
    else if (got.status() != want.status())
      problem = absl::StrCat("DecodeGraphBytes: ",
                             got.ok() ? std::string("accepted") : got.status().ToString());
    else if (decided)
      ++t->verifier_refused;
    else
      ++t->refused;
  }
  if (!problem.empty()) {
    ++t->failures;
    if (t->failures <= 5)
      ADD_FAILURE() << what << ": " << problem << "\n  protobuf path: "
                    << (want.ok() ? std::string("OK") : want.status().ToString()) << "\n  bytes ("
                    << bytes.size() << "): " << Hex(bytes);
  }
}

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

uint64_t GetVarint(const std::string& b, size_t* i) {
  uint64_t v = 0;
  for (int s = 0;; s += 7) {
    const uint8_t c = static_cast<uint8_t>(b.at((*i)++));
    v |= static_cast<uint64_t>(c & 0x7f) << s;
    if (c < 0x80) return v;
  }
}

// Parses canonical bytes (EncodeGraphBytes output).
std::shared_ptr<WMsg> Parse(const std::string& b, const pb::Descriptor* d) {
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

std::shared_ptr<WMsg> Clone(const WMsg& m) {
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

void CollectMessages(WMsg* m, std::vector<WMsg*>* out) {
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
      case 2: {
        // Split a sub-message field into two occurrences (merged on parse).
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
      case 7: {
        // Packed <-> unpacked repeated int64, or split into several packed runs.
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
      case 8: {
        // A oneof member first, the existing value after it: the first is
        // replaced (with whatever was wrong inside it) unless both are the
        // same member, in which case they merge.
        if (m->desc != v1::Argument::descriptor() && m->desc != v1::Scalar::descriptor())
          return "none";
        const pb::FieldDescriptor* fd =
            m->desc->field(static_cast<int>(Below(m->desc->field_count())));
        WField f = RandomKnownField(fd, all);
        if (f.msg && OneIn(2)) f.msg->fields.push_back(RandomUnknownField(f.msg->desc));
        if (OneIn(2))
          fs.insert(fs.begin(), f);
        else
          fs.push_back(f);
        return absl::StrCat("oneof ", fd->full_name());
      }
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
      case 10: {
        if (m->desc != v1::Argument::descriptor()) return "none";
        // Around the list depth limit (16) and protobuf's recursion limit (48).
        const int levels = static_cast<int>(OneIn(2) ? Below(5) : 14 + Below(12));
        Nest(m, levels);
        if (OneIn(3)) {
          // ...and replaced by an int: only corruption counts then.
          m->fields.push_back(WField{2, 0, 7, "", nullptr});
        }
        return absl::StrCat("nest ", levels);
      }
      case 11: {
        // Deeply nested unknown groups.
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
      default: {
        // Raw bytes in place of a message field.
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

std::vector<std::string> GoldenEncodings() {
  std::vector<std::string> out;
  for (const char* name : ::fxdp::testing::kGoldenGraphs)
    out.push_back(EncodeGraphBytes(ValueOrDie(ParseGraphText(ReadTestData(name)))));
  return out;
}

TEST(WireDecoderTest, GoldenAndSyntheticGraphsDecodeIdentically) {
  Tally t;
  for (const std::string& bytes : GoldenEncodings()) Compare(bytes, "golden", &t);
  const std::string synthetic = ValueOrDie(bench::BuildSyntheticGraphBytes(20'000));
  Compare(synthetic, "synthetic 20k", &t);
  EXPECT_EQ(t.accepted, static_cast<int>(std::size(::fxdp::testing::kGoldenGraphs)) + 1);
  EXPECT_EQ(t.failures, 0);
  // And the result re-encodes to the same bytes.
  EXPECT_EQ(EncodeGraphBytes(ValueOrDie(DecodeGraphBytes(synthetic))), synthetic);
}

TEST(WireDecoderTest, NodeSourceSurvivesBothDecoders) {
  const Graph g = ValueOrDie(ParseGraphText(
      "graph format=1 producer=\"test\" torch=\"2.13.0\" {\n"
      "  %x: f32[2] = placeholder() {role=INPUT, state=\"x\", batch_dim=0}\n"
      "  %y: f32[2] = aten::relu(%x) {source=\"train.py:3 in model.act: y = self.act(x)\"}\n"
      "  %output = output([%y]) {specs=[OTHER]}\n"
      "}\n"));
  const std::string bytes = EncodeGraphBytes(g);
  const Graph a = ValueOrDie(DecodeGraphBytes(bytes));
  const Graph b = ValueOrDie(DecodeGraphBytesViaMessage(bytes));
  EXPECT_EQ(a.node(NodeId{1}).source, "train.py:3 in model.act: y = self.act(x)");
  EXPECT_TRUE(a == g);
  EXPECT_TRUE(b == g);
}

TEST(WireDecoderTest, AgreesOnMutatedEncodings) {
  std::vector<std::pair<std::string, std::string>> seeds;  // name, bytes
  for (const char* name : ::fxdp::testing::kGoldenGraphs)
    seeds.emplace_back(name, EncodeGraphBytes(ValueOrDie(ParseGraphText(ReadTestData(name)))));
  bench::TransformerShape zoo = bench::TransformerShape::Zoo();
  seeds.emplace_back("synthetic 1 layer",
                     EncodeGraphBytes(ValueOrDie(bench::BuildTransformerStep(zoo, 1))));
  Mutator mu(20261121);
  Tally tree, bytes;
  constexpr int kTreeCases = 1500, kByteCases = 1000;
  for (const auto& [name, encoded] : seeds) {
    const int scale = name.rfind("synthetic", 0) == 0 ? 6 : 1;  // fewer of the larger graph
    for (int i = 0; i < kTreeCases / scale; ++i) {
      std::shared_ptr<WMsg> root = Parse(encoded, v1::GraphDef::descriptor());
      std::string what = name;
      for (size_t k = 1 + mu.Below(3); k > 0; --k)
        absl::StrAppend(&what, "; ", mu.MutateTree(root.get()));
      Writer w{&mu.rng(), mu.OneIn(4) ? 0.3 : 0.0};
      const std::string b = w.Write(*root);
      Compare(b, what, &tree);
      if (mu.OneIn(4)) {  // and some with byte damage on top
        std::string d = b;
        Compare(d, what + "; " + mu.MutateBytes(&d), &bytes);
      }
    }
    for (int i = 0; i < kByteCases / scale; ++i) {
      std::string b = encoded;
      std::string what = name;
      for (size_t k = 1 + mu.Below(2); k > 0; --k) absl::StrAppend(&what, "; ", mu.MutateBytes(&b));
      Compare(b, what, &bytes);
    }
  }
  std::printf(
      "structural mutations: %d cases, %d accepted, %d refused by the verifier, %d refused\n",
      tree.cases, tree.accepted, tree.verifier_refused, tree.refused);
  std::printf("byte mutations: %d cases, %d accepted, %d refused by the verifier, %d refused\n",
              bytes.cases, bytes.accepted, bytes.verifier_refused, bytes.refused);
  EXPECT_EQ(tree.failures + bytes.failures, 0);
  // The mutations reach all three outcomes.
  EXPECT_GT(tree.accepted, tree.cases / 10);
  EXPECT_GT(tree.verifier_refused, 0);
  EXPECT_GT(tree.refused, tree.cases / 10);
  EXPECT_GT(bytes.refused, 0);
}

// ---- Hand-made encodings at the edges of the wire format.

// Raw encoding helpers.
std::string V(uint64_t v) {
  std::string b;
  do {
    b.push_back(static_cast<char>((v & 0x7f) | (v > 0x7f ? 0x80 : 0)));
    v >>= 7;
  } while (v != 0);
  return b;
}
std::string Field(uint32_t number, const std::string& payload) {
  return V((number << 3) | 2) + V(payload.size()) + payload;
}
std::string VarintField(uint32_t number, uint64_t v) { return V(number << 3) + V(v); }

// mlp_sgd.txt with the payload of node 5 (addmm)'s args[1], or of node 17
// (new_w)'s keyword argument alpha, replaced by `arg`. Node 5's arguments are
// at protobuf nesting level 2, keyword argument values at level 3.
std::string WithArgument(const std::string& arg, bool kwarg = false) {
  v1::GraphDef def = EncodeGraph(ValueOrDie(ParseGraphText(ReadTestData("mlp_sgd.txt"))));
  const std::string marker = "\x01MARK\x01";
  if (kwarg) {
    def.mutable_nodes(17)->mutable_kwargs(0)->mutable_value()->set_string_value(marker);
  } else {
    def.mutable_nodes(5)->mutable_args(1)->set_string_value(marker);
  }
  std::string bytes;
  def.SerializeToString(&bytes);
  std::shared_ptr<WMsg> root = Parse(bytes, v1::GraphDef::descriptor());
  std::vector<WMsg*> all;
  CollectMessages(root.get(), &all);
  std::vector<WField*> found;
  for (WMsg* m : all)
    for (WField& f : m->fields)
      if (f.msg && f.msg->desc == v1::Argument::descriptor() && f.msg->fields.size() == 1 &&
          f.msg->fields[0].bytes == marker)
        found.push_back(&f);
  EXPECT_EQ(found.size(), 1u);
  for (WField* f : found) {
    f->msg = nullptr;
    f->bytes = arg;
  }
  std::mt19937_64 rng(1);
  return Writer{&rng}.Write(*root);
}

TEST(WireDecoderTest, EdgeCasesAgree) {
  const std::string ref = Field(1, VarintField(1, 4));  // %t, output 0
  struct Case {
    std::string name;
    std::string bytes;
    int expect;  // 1: accepted, 0: refused, -1: either
  };
  const std::string bad_list = Field(12, Field(1, ""));  // a list whose item has no value
  const std::string unknown_ref = Field(1, VarintField(1, 4) + VarintField(42, 1));
  std::vector<Case> cases = {
      {"plain ref", WithArgument(ref), 1},
      {"ref merged from two pieces",
       WithArgument(Field(1, VarintField(1, 4)) + Field(1, VarintField(2, 0))), 1},
      {"bad list replaced by a ref", WithArgument(bad_list + ref), 1},
      {"ref replaced by a bad list", WithArgument(ref + bad_list), 0},
      {"ref with unknown field replaced by an int", WithArgument(unknown_ref + VarintField(2, 4)),
       1},
      {"int replaced by ref with unknown field", WithArgument(VarintField(2, 4) + unknown_ref), 0},
      {"unknown field in the argument itself survives replacement",
       WithArgument(VarintField(42, 1) + ref), 0},
      {"unknown field in the argument between two members",
       WithArgument(ref + VarintField(42, 1) + VarintField(2, 4)), 0},
      {"known number with the wrong wire type between two members",
       WithArgument(ref + VarintField(12, 1) + VarintField(2, 4)), 0},
      {"scalar complex with unknown field replaced by int",
       WithArgument(Field(11, Field(4, VarintField(9, 1)) + VarintField(1, 3))), 1},
      {"scalar int replaced by complex with unknown field",
       WithArgument(Field(11, VarintField(1, 3) + Field(4, VarintField(9, 1)))), 0},
      {"list merged from two pieces",
       WithArgument(Field(12, Field(1, ref)) + Field(12, Field(1, ref))), 1},
      {"list nested 16 deep", WithArgument([&] {
         std::string a = ref;
         for (int k = 0; k < 16; ++k) a = Field(12, Field(1, a));
         return a;
       }()),
       1},
      {"list nested 17 deep", WithArgument([&] {
         std::string a = ref;
         for (int k = 0; k < 17; ++k) a = Field(12, Field(1, a));
         return a;
       }()),
       0},
      // The innermost item of 23 nested lists is at protobuf's nesting level
      // 48 (the limit), of 24 at level 50.
      {"list nested 23 deep then replaced", WithArgument([&] {
         std::string a = VarintField(2, 1);
         for (int k = 0; k < 23; ++k) a = Field(12, Field(1, a));
         return a + ref;
       }()),
       1},
      {"list nested 24 deep then replaced (recursion limit)", WithArgument([&] {
         std::string a = VarintField(2, 1);
         for (int k = 0; k < 24; ++k) a = Field(12, Field(1, a));
         return a + ref;
       }()),
       0},
      {"keyword value nested 22 deep then replaced",
       WithArgument(
           [&] {
             std::string a = VarintField(2, 1);
             for (int k = 0; k < 22; ++k) a = Field(12, Field(1, a));
             return a + Field(11, VarintField(1, 3));
           }(),
           true),
       1},
      {"keyword value nested 23 deep then replaced (recursion limit)",
       WithArgument(
           [&] {
             std::string a = VarintField(2, 1);
             for (int k = 0; k < 23; ++k) a = Field(12, Field(1, a));
             return a + Field(11, VarintField(1, 3));
           }(),
           true),
       0},
      {"keyword value merged from two pieces",
       WithArgument(Field(11, VarintField(1, 3)) + Field(11, Field(4, "")), true), 1},
      {"10-byte varint",
       WithArgument(std::string("\x10\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 11) + ref), 1},
      {"11-byte varint",
       WithArgument(std::string("\x10\xff\xff\xff\xff\xff\xff\xff\xff\xff\x81\x01", 12) + ref), 0},
      {"tag in 5 bytes wrapping to field 1",
       WithArgument(std::string("\x8a\x80\x80\x80\x10", 5) + V(ref.size() - 2) + ref.substr(2)), 1},
      {"tag in 6 bytes", WithArgument(std::string("\x8a\x80\x80\x80\x80\x00", 6) + ref.substr(1)),
       0},
      {"length in 5 bytes", WithArgument(std::string("\x0a\x82\x80\x80\x80\x00\x08\x04", 8)), 1},
      {"length in 6 bytes", WithArgument(std::string("\x0a\x82\x80\x80\x80\x80\x00\x08\x04", 9)),
       0},
      {"group in a replaced member", WithArgument(Field(12, "\x1b\x08\x01\x1c") + ref), 1},
      {"unclosed group in a replaced member", WithArgument(Field(12, "\x1b\x08\x01") + ref), 0},
      {"mismatched group end in a replaced member",
       WithArgument(Field(12, "\x1b\x08\x01\x24") + ref), 0},
      {"field number 0 in a replaced member",
       WithArgument(Field(12, std::string("\x00\x01", 2)) + ref), 0},
      {"end-group tag in a replaced member", WithArgument(Field(12, "\x0c") + ref), 0},
      {"wire type 6 in a replaced member", WithArgument(Field(12, "\x0e\x01") + ref), 0},
      {"fixed32 in a replaced member", WithArgument(Field(12, "\x0d\x01\x02\x03\x04") + ref), 1},
      {"invalid UTF-8 in a replaced string", WithArgument(Field(5, "\xff") + ref), 0},
  };
  Tally t;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Compare(c.bytes, c.name, &t);
    const bool ok = DecodeGraphBytesViaMessage(c.bytes).ok();
    if (c.expect >= 0) {
      EXPECT_EQ(ok, c.expect == 1) << c.name;
    }
  }
  // Rank limits: 64 dims are fine, a 65th shape or stride entry is not.
  for (const auto& [shape, stride, expect] :
       {std::tuple{64, 64, true}, std::tuple{65, 65, false}, std::tuple{64, 65, false}}) {
    v1::GraphDef def = EncodeGraph(ValueOrDie(ParseGraphText(ReadTestData("mlp_sgd.txt"))));
    v1::TensorMeta* x = def.mutable_nodes(2)->mutable_outputs(0)->mutable_tensor();
    x->clear_shape();
    x->clear_stride();
    for (int k = 0; k < shape; ++k) x->add_shape(1);
    for (int k = 0; k < stride; ++k) x->add_stride(1);
    std::string b;
    def.SerializeToString(&b);
    Compare(b, absl::StrCat("rank ", shape, "/", stride), &t);
    EXPECT_EQ(DecodeGraphBytesViaMessage(b).ok(), expect) << shape << "/" << stride;
  }
  // Top-level oddities.
  const std::string golden = GoldenEncodings()[0];
  for (const std::string& b :
       {golden + std::string(1, '\0'), golden + "\x0c", golden + "\x07", golden + "\x1b\x1c",
        golden + "\x1b\x24", golden + "\xfa\x01\x00", golden.substr(0, golden.size() - 1),
        std::string("\x08\x01", 2) + golden, golden + "\x08\x81\x80\x80\x80\x10",
        golden + "\x08\x02", std::string(""), std::string("\x08\x01", 2)}) {
    Compare(b, "top level", &t);
  }
  std::printf("edge cases: %d, %d accepted\n", t.cases, t.accepted);
  EXPECT_EQ(t.failures, 0);
}

// ---- The error contract holds through DecodeGraphBytes.

TEST(WireDecoderTest, ErrorsAreTheContractMessages) {
  v1::GraphDef def = EncodeGraph(ValueOrDie(ParseGraphText(ReadTestData("mlp_sgd.txt"))));
  auto decode = [](const v1::GraphDef& d) {
    std::string b;
    d.SerializeToString(&b);
    return DecodeGraphBytes(b).status();
  };
  {
    v1::GraphDef d = def;
    v1::Argument* a = d.mutable_nodes(5)->mutable_args(1);
    a->GetReflection()->MutableUnknownFields(a)->AddLengthDelimited(42, "x");
    EXPECT_THAT(decode(d), StatusIs(absl::StatusCode::kInvalidArgument,
                                    "GraphDef.nodes[5].args[1] (fxdp.v1.Argument) has unknown "
                                    "field number 42"));
  }
  {
    v1::GraphDef d = def;
    d.set_format_version(static_cast<v1::FormatVersion>(2));
    EXPECT_THAT(decode(d), StatusIs(absl::StatusCode::kInvalidArgument,
                                    "unsupported format_version 2 (this build reads 1)"));
  }
  {
    v1::GraphDef d = def;
    d.clear_format_version();
    EXPECT_THAT(decode(d),
                StatusIs(absl::StatusCode::kInvalidArgument, "GraphDef has no format_version"));
  }
  {
    v1::GraphDef d = def;
    d.mutable_nodes(5)->mutable_outputs(0)->mutable_tensor()->set_dtype(static_cast<v1::DType>(77));
    EXPECT_THAT(decode(d), StatusIs(absl::StatusCode::kInvalidArgument,
                                    "node 'addmm' (#5): output 0: unknown dtype enum value 77"));
  }
  {
    v1::GraphDef d = def;
    d.mutable_nodes(6)->mutable_args(0)->mutable_ref()->set_node(9);
    EXPECT_THAT(decode(d), StatusIs(absl::StatusCode::kInvalidArgument,
                                    "node 'sub' (#6): argument 0 references node"));
  }
  std::string b;
  def.SerializeToString(&b);
  EXPECT_THAT(DecodeGraphBytes(b.substr(0, b.size() / 2)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a valid fxdp.v1.GraphDef"));
}

// ---- Nothing crashes: random bytes and random field streams.

TEST(WireDecoderTest, RandomInputsNeverCrash) {
  std::mt19937_64 rng(7);
  Tally t;
  for (int i = 0; i < 1500; ++i) {
    std::string b;
    const size_t n = rng() % 64;
    for (size_t k = 0; k < n; ++k) {
      // Mostly plausible tags (small field numbers, wire types 0-7).
      b.push_back(static_cast<char>(rng() % 3 == 0 ? rng() : (rng() % 13) << 3 | (rng() % 8)));
    }
    if (i % 2) b = std::string("\x08\x01", 2) + b;
    Compare(b, "random", &t);
  }
  std::printf("random inputs: %d, %d accepted\n", t.cases, t.accepted);
  EXPECT_EQ(t.failures, 0);
}

}  // namespace
}  // namespace fxdp::ir

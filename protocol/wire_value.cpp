#include "outrun/protocol/wire_value.h"

namespace outrun::protocol {

WireValueBuilder::Ref WireValueBuilder::nil() {
  return wire::CreateValue(f_);
}

WireValueBuilder::Ref WireValueBuilder::boolean(bool b) {
  wire::ValueBuilder vb(f_);
  vb.add_kind(wire::ValueKind::Boolean);
  vb.add_bool_value(b);
  return vb.Finish();
}

WireValueBuilder::Ref WireValueBuilder::integer(int64_t i) {
  wire::ValueBuilder vb(f_);
  vb.add_kind(wire::ValueKind::Int);
  vb.add_int_value(i);
  return vb.Finish();
}

WireValueBuilder::Ref WireValueBuilder::number(double d) {
  wire::ValueBuilder vb(f_);
  vb.add_kind(wire::ValueKind::Double);
  vb.add_double_value(d);
  return vb.Finish();
}

WireValueBuilder::Ref WireValueBuilder::string(std::string_view s, bool utf8) {
  if (utf8) {
    auto str = f_.CreateString(s.data(), s.size());
    wire::ValueBuilder vb(f_);
    vb.add_kind(wire::ValueKind::String);
    vb.add_string_value(str);
    return vb.Finish();
  }
  auto bytes = f_.CreateVector(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  wire::ValueBuilder vb(f_);
  vb.add_kind(wire::ValueKind::Bytes);
  vb.add_bytes_value(bytes);
  return vb.Finish();
}

WireValueBuilder::Ref WireValueBuilder::array(const std::vector<Ref>& items) {
  auto vec = f_.CreateVector(items);
  wire::ValueBuilder vb(f_);
  vb.add_kind(wire::ValueKind::Array);
  vb.add_items(vec);
  return vb.Finish();
}

WireValueBuilder::Ref WireValueBuilder::map(
    const std::vector<std::pair<std::string_view, Ref>>& entries) {
  std::vector<flatbuffers::Offset<flatbuffers::String>> keys;
  std::vector<Ref> values;
  keys.reserve(entries.size());
  values.reserve(entries.size());
  for (const auto& [k, v] : entries) {
    keys.push_back(f_.CreateString(k.data(), k.size()));
    values.push_back(v);
  }
  auto kv = f_.CreateVector(keys);
  auto iv = f_.CreateVector(values);
  wire::ValueBuilder vb(f_);
  vb.add_kind(wire::ValueKind::Map);
  vb.add_items(iv);
  vb.add_keys(kv);
  return vb.Finish();
}

}  // namespace outrun::protocol

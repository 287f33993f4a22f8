#include "wire_codec.h"

#include <algorithm>
#include <vector>

#include "outrun/protocol/frame.h"
#include "outrun/protocol/input_list.h"
#include "outrun/protocol/script_log.h"
#include "outrun/protocol/wire_value.h"

namespace outrun::detail {

namespace {

struct Budget {
  std::size_t bytes = 0;
  // `depth` counts containers: 32 nested arrays may hold a scalar, as in the worker and InProcess.
  bool ok(const Value& v, int depth) {
    if (auto* s = std::get_if<std::string>(&v.v))
      bytes += s->size();
    else if (auto* b = std::get_if<Bytes>(&v.v))
      bytes += b->data.size();
    else if (auto* a = std::get_if<Array>(&v.v)) {
      if (depth > kMaxValueDepth) return false;
      for (const auto& x : *a)
        if (!ok(x, depth + 1)) return false;
    } else if (auto* m = std::get_if<Map>(&v.v)) {
      if (depth > kMaxValueDepth) return false;
      for (const auto& e : *m) {
        bytes += e.key.size();
        if (!ok(e.value, depth + 1)) return false;
      }
    }
    bytes += 16;
    return bytes <= kMaxInputBytes;
  }
};

// Takes `n` bytes from `budget` (null: no budget); false once it is spent.
bool charge(std::size_t* budget, std::size_t n) {
  if (budget == nullptr) return true;
  if (n > *budget) {
    *budget = 0;  // spent: tells the caller why it failed
    return false;
  }
  *budget -= n;
  return true;
}

// Whether `n` more bytes would fit, without taking them; marks the budget spent when not.
bool fits(std::size_t* budget, std::size_t n) {
  if (budget == nullptr || n <= *budget) return true;
  *budget = 0;
  return false;
}

// Each value costs 16 bytes of `budget` plus its string, bytes or map keys, counted per
// reference (a subtree the frame shares is paid for each time it is used), as Budget does.
bool decode(const wire::Value* in, Value* out, int depth, std::size_t* budget, bool typed = false) {
  if (!charge(budget, 16)) return false;
  if (in == nullptr) {
    out->v = Nil{};
    return true;
  }
  switch (in->kind()) {
    case wire::ValueKind::UInt:
      if (!typed) return false;
      out->v = static_cast<uint64_t>(in->uint_value());
      return true;
    case wire::ValueKind::Float:
      if (!typed) return false;
      out->v = static_cast<float>(in->double_value());
      return true;
    case wire::ValueKind::DateTime:
      if (!typed) return false;
      out->v = DateTime{in->int_value()};
      return true;
    case wire::ValueKind::Nil:
      out->v = Nil{};
      return true;
    case wire::ValueKind::Boolean:
      out->v = in->bool_value();
      return true;
    case wire::ValueKind::Int:
      out->v = static_cast<int64_t>(in->int_value());
      return true;
    case wire::ValueKind::Double:
      out->v = in->double_value();
      return true;
    case wire::ValueKind::String:
      if (!charge(budget, in->string_value() ? in->string_value()->size() : 0)) return false;
      out->v = in->string_value() ? in->string_value()->str() : std::string();
      return true;
    case wire::ValueKind::Bytes: {
      const auto* b = in->bytes_value();
      if (!charge(budget, b ? b->size() : 0)) return false;
      out->v = Bytes{b ? std::string(reinterpret_cast<const char*>(b->data()), b->size())
                       : std::string()};
      return true;
    }
    case wire::ValueKind::Array: {
      if (depth >= kMaxValueDepth) return false;
      Array a;
      if (const auto* items = in->items()) {
        // Refused before the allocation when the items alone would overspend (each is charged
        // as it is decoded).
        if (!fits(budget, std::size_t{16} * items->size())) return false;
        a.resize(items->size());
        for (flatbuffers::uoffset_t i = 0; i < items->size(); ++i)
          if (!decode(items->Get(i), &a[i], depth + 1, budget, typed)) return false;
      }
      out->v = std::move(a);
      return true;
    }
    case wire::ValueKind::Map: {
      if (depth >= kMaxValueDepth) return false;
      const auto* keys = in->keys();
      const auto* items = in->items();
      const flatbuffers::uoffset_t n = keys ? keys->size() : 0;
      if ((items ? items->size() : 0) != n) return false;
      if (!fits(budget, std::size_t{16} * n)) return false;
      Map m(n);
      for (flatbuffers::uoffset_t i = 0; i < n; ++i) {
        if (!charge(budget, keys->Get(i)->size())) return false;
        m[i].key = keys->Get(i)->str();
        if (!decode(items->Get(i), &m[i].value, depth + 1, budget, typed)) return false;
      }
      out->v = std::move(m);
      return true;
    }
  }
  return false;
}

}  // namespace

flatbuffers::Offset<wire::Value> encode_value(flatbuffers::FlatBufferBuilder& f, const Value& v) {
  protocol::WireValueBuilder b(f);
  struct Visitor {
    flatbuffers::FlatBufferBuilder& f;
    protocol::WireValueBuilder& b;
    using Ref = protocol::WireValueBuilder::Ref;
    Ref operator()(const Nil&) { return b.nil(); }
    Ref operator()(bool x) { return b.boolean(x); }
    Ref operator()(int64_t x) { return b.integer(x); }
    Ref operator()(double x) { return b.number(x); }
    Ref operator()(const std::string& s) { return b.string(s, true); }
    Ref operator()(const Bytes& x) { return b.string(x.data, false); }
    // The OPC UA kinds as a script sees them (value.h).
    Ref operator()(uint64_t x) {
      return x <= static_cast<uint64_t>(INT64_MAX) ? b.integer(static_cast<int64_t>(x))
                                                   : b.number(static_cast<double>(x));
    }
    Ref operator()(float x) { return b.number(static_cast<double>(x)); }
    Ref operator()(const DateTime& t) { return b.number(t.unix_seconds()); }
    Ref operator()(const Array& a) {
      std::vector<Ref> items;
      items.reserve(a.size());
      for (const auto& x : a) items.push_back(encode_value(f, x));
      return b.array(items);
    }
    Ref operator()(const Map& m) {
      std::vector<std::pair<std::string_view, Ref>> entries;
      entries.reserve(m.size());
      for (const auto& e : m) entries.emplace_back(e.key, encode_value(f, e.value));
      return b.map(entries);
    }
  };
  return std::visit(Visitor{f, b}, v.v);
}

bool encode_inputs(flatbuffers::FlatBufferBuilder& fbb, const Inputs& inputs, InputsOffset* out,
                   std::string* error) {
  if (inputs.size() > kMaxInputs) {
    *error = "too many inputs (more than " + std::to_string(kMaxInputs) + ")";
    return false;
  }
  Budget budget;
  for (const auto& in : inputs) {
    budget.bytes += in.name.size();
    if (!budget.ok(in.value, 1)) {
      *error = "input '" + in.name + "' is nested deeper than " + std::to_string(kMaxValueDepth) +
               " levels or the inputs are larger than " + std::to_string(kMaxInputBytes) + " bytes";
      return false;
    }
  }
  // Small fixed-size scratch on the stack for the common case of a few inputs.
  constexpr std::size_t kInline = 16;
  flatbuffers::Offset<wire::Input> inline_offsets[kInline];
  std::vector<flatbuffers::Offset<wire::Input>> heap;
  flatbuffers::Offset<wire::Input>* offsets = inline_offsets;
  if (inputs.size() > kInline) {
    heap.resize(inputs.size());
    offsets = heap.data();
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    auto name = fbb.CreateString(inputs[i].name);
    auto value = encode_value(fbb, inputs[i].value);
    offsets[i] = wire::CreateInput(fbb, name, value);
  }
  *out = fbb.CreateVector(offsets, inputs.size());
  return true;
}

static_assert(protocol::kMaxInputCount == kMaxInputs);
static_assert(protocol::kMaxInputDepth == kMaxValueDepth);
static_assert(protocol::kMaxInputListBytes == kMaxInputBytes);

std::string frame_budget_spent_message() {
  return "the inputs of this frame decode to more than " + std::to_string(protocol::kMaxFrameSize) +
         " bytes (a shared subtree counts each time it is used)";
}

bool check_encoded_inputs(std::span<const uint8_t> bytes, std::size_t* frame_budget,
                          std::string* error) {
  // One evaluation's own limit, and no more than what is left of the frame's.
  const bool frame_bound = frame_budget && *frame_budget < kMaxInputBytes;
  const std::size_t start = frame_bound ? *frame_budget : kMaxInputBytes;
  std::size_t left = start;
  protocol::InputListVerdict verdict;
  const bool ok = protocol::check_input_list(bytes.data(), bytes.size(), &left, &verdict);
  // What was walked counts against the frame even when the inputs are refused: a frame of many
  // evaluations that each fail late would otherwise keep the loop walking.
  if (frame_budget) *frame_budget -= start - left;
  if (ok) return true;
  using E = protocol::InputListError;
  const std::string name(verdict.input);
  switch (verdict.error) {
    case E::too_large:
      *error =
          "inputs_buffer is larger than " + std::to_string(protocol::kMaxInputListBytes) + " bytes";
      break;
    case E::misaligned:
      *error = "inputs_buffer is not 8-byte aligned in the frame";
      break;
    case E::too_many:
      *error = "too many inputs (more than " + std::to_string(kMaxInputs) + ")";
      break;
    case E::bad_value:
      *error = "input '" + name + "' is not a valid value";
      break;
    case E::over_budget:
      if (frame_bound)
        *error = frame_budget_spent_message();
      else
        *error = "the inputs are larger than " + std::to_string(kMaxInputBytes) +
                 " bytes (16 per value plus strings, bytes and keys)";
      break;
    case E::none:
    case E::malformed:
      *error = "inputs_buffer is not a valid InputList FlatBuffer";
      break;
  }
  return false;
}

Inputs decode_input_list(const wire::InputList* list) {
  Inputs out;
  std::string unused;
  decode_inputs(list->inputs(), &out, nullptr, &unused);  // checked before
  return out;
}

bool encode_input_list(flatbuffers::FlatBufferBuilder& fbb, const Inputs& inputs,
                       std::span<const uint8_t>* out, std::string* error) {
  fbb.Clear();
  InputsOffset in;
  if (!encode_inputs(fbb, inputs, &in, error)) return false;
  fbb.Finish(wire::CreateInputList(fbb, in));
  *out = {fbb.GetBufferPointer(), fbb.GetSize()};
  return true;
}

bool decode_value(const wire::Value* in, Value* out) {
  return decode(in, out, 0, nullptr);
}

bool decode_tag_value(const wire::Value* in, Value* out, std::size_t* budget) {
  return decode(in, out, 0, budget, true);
}

flatbuffers::Offset<wire::Value> encode_tag_value(flatbuffers::FlatBufferBuilder& f,
                                                  const Value& v) {
  if (auto* u = std::get_if<uint64_t>(&v.v)) {
    wire::ValueBuilder b(f);
    b.add_kind(wire::ValueKind::UInt);
    b.add_uint_value(*u);
    return b.Finish();
  }
  if (auto* x = std::get_if<float>(&v.v)) {
    wire::ValueBuilder b(f);
    b.add_kind(wire::ValueKind::Float);
    b.add_double_value(static_cast<double>(*x));
    return b.Finish();
  }
  if (auto* t = std::get_if<DateTime>(&v.v)) {
    wire::ValueBuilder b(f);
    b.add_kind(wire::ValueKind::DateTime);
    b.add_int_value(t->ticks);
    return b.Finish();
  }
  // Containers through the shared builder, with their elements encoded as tag values.
  protocol::WireValueBuilder wb(f);
  if (auto* a = std::get_if<Array>(&v.v)) {
    std::vector<protocol::WireValueBuilder::Ref> items;
    items.reserve(a->size());
    for (const auto& x : *a) items.push_back(encode_tag_value(f, x));
    return wb.array(items);
  }
  if (auto* m = std::get_if<Map>(&v.v)) {
    std::vector<std::pair<std::string_view, protocol::WireValueBuilder::Ref>> entries;
    entries.reserve(m->size());
    for (const auto& e : *m) entries.emplace_back(e.key, encode_tag_value(f, e.value));
    return wb.map(entries);
  }
  return encode_value(f, v);
}

bool decode_value(const wire::Value* in, Value* out, std::size_t* budget) {
  return decode(in, out, 0, budget);
}

ResultDecode decode_result(bool ok, const wire::Value* in, std::string_view error, Value* value,
                           std::string* message, std::size_t* budget) {
  if (*budget == 0) return ResultDecode::spent;
  if (ok) {
    if (decode(in, value, 0, budget)) return ResultDecode::ok;
    return *budget == 0 ? ResultDecode::spent : ResultDecode::invalid;
  }
  if (!charge(budget, error.size())) return ResultDecode::spent;
  message->assign(error);
  return ResultDecode::ok;
}

void decode_logs(const flatbuffers::Vector<flatbuffers::Offset<wire::LogLine>>* in,
                 std::vector<LogLine>* out, uint32_t* dropped, std::size_t* budget) {
  if (!in || in->size() == 0) return;
  const auto add_dropped = [&](std::size_t n) {
    const uint64_t sum = uint64_t{*dropped} + n;
    *dropped = sum > UINT32_MAX ? UINT32_MAX : static_cast<uint32_t>(sum);
  };
  const std::size_t n = std::min<std::size_t>(in->size(), protocol::kMaxLogLinesPerEvaluation);
  add_dropped(in->size() - n);
  out->reserve(n);
  for (flatbuffers::uoffset_t i = 0; i < n; ++i) {
    const wire::LogLine* line = in->Get(i);
    const std::string_view text = line->text() ? line->text()->string_view() : std::string_view();
    if (!charge(budget, 16 + std::min(text.size(), 4 * protocol::kMaxLogLineBytes))) {
      add_dropped(n - i);
      return;
    }
    LogLine& l = out->emplace_back();
    const auto level = static_cast<uint8_t>(line->level());
    l.level = level <= static_cast<uint8_t>(LogLevel::error) ? static_cast<LogLevel>(level)
                                                             : LogLevel::info;
    if (protocol::log_text_clean(text, protocol::kMaxLogLineBytes))
      l.text.assign(text);
    else
      protocol::append_log_text(&l.text, text, protocol::kMaxLogLineBytes);
  }
}

flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<wire::LogLine>>> encode_logs(
    flatbuffers::FlatBufferBuilder& fbb, const std::vector<LogLine>& logs) {
  if (logs.empty()) return 0;
  flatbuffers::Offset<wire::LogLine> lines[protocol::kMaxLogLinesPerEvaluation];
  const std::size_t n = std::min(logs.size(), protocol::kMaxLogLinesPerEvaluation);
  for (std::size_t i = 0; i < n; ++i)
    lines[i] = wire::CreateLogLine(fbb, static_cast<wire::LogLevel>(logs[i].level),
                                   fbb.CreateString(logs[i].text));
  return fbb.CreateVector(lines, n);
}

bool decode_inputs(const flatbuffers::Vector<flatbuffers::Offset<wire::Input>>* in, Inputs* out,
                   std::size_t* budget, std::string* error) {
  out->clear();
  if (!in) return true;
  if (in->size() > kMaxInputs) {
    *error = "too many inputs (more than " + std::to_string(kMaxInputs) + ")";
    return false;
  }
  out->resize(in->size());
  for (flatbuffers::uoffset_t i = 0; i < in->size(); ++i) {
    const wire::Input* input = in->Get(i);
    // The name is copied too: one Input the frame points at from many places is paid for at
    // each use, its name as its value.
    if (!charge(budget, 16 + input->name()->size())) {
      *error = frame_budget_spent_message();
      return false;
    }
    (*out)[i].name = input->name()->str();
    if (input->value() && !decode(input->value(), &(*out)[i].value, 0, budget)) {
      *error = budget && *budget == 0 ? frame_budget_spent_message()
                                      : "input '" + (*out)[i].name + "' is not a valid value";
      return false;
    }
  }
  return true;
}

}  // namespace outrun::detail

namespace outrun {

Error EncodedInputs::from(std::string_view bytes, EncodedInputs* out) {
  *out = EncodedInputs();
  if (bytes.empty()) return Error::none();
  if (bytes.size() > protocol::kMaxInputListBytes)
    return Error{ErrorCode::invalid_argument, "the encoded inputs are larger than " +
                                                  std::to_string(protocol::kMaxInputListBytes) +
                                                  " bytes"};
  // Checked in the aligned copy it keeps: the caller's bytes may sit anywhere.
  EncodedInputs e = detail::EncodedInputsAccess::make(
      {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
  std::string why;
  if (!detail::check_encoded_inputs({e.data(), e.size_}, nullptr, &why))
    return Error{ErrorCode::invalid_argument, std::move(why)};
  *out = std::move(e);
  return Error::none();
}

}  // namespace outrun

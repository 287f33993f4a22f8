// TagValue / DataValue <-> tags::Change for the tags frames (design/protocol.md "Tags frames"),
// shared by outrund and outrun::Client.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <string>
#include <vector>

#include "outrun/protocol/outrun_generated.h"
#include "outrun/tags.h"
#include "wire_codec.h"

namespace outrun::detail {

// Limits of the tags frames (design/protocol.md).
inline constexpr std::size_t kMaxTagIdsPerFrame = 4096;
inline constexpr std::size_t kMaxUpdatesPerFrame = 65536;
inline constexpr std::size_t kMaxDiagnosticsBytes = 64u << 10;

inline flatbuffers::Offset<wire::TagValue> encode_tag_entry(flatbuffers::FlatBufferBuilder& f,
                                                            const std::string& tag,
                                                            const tags::DataValue& dv) {
  auto t = f.CreateString(tag);
  auto v = encode_tag_value(f, dv.value);
  auto d = dv.diagnostics.empty() ? flatbuffers::Offset<flatbuffers::String>()
                                  : f.CreateString(dv.diagnostics);
  wire::DataValueBuilder b(f);
  b.add_value(v);
  b.add_status(dv.status);
  b.add_source_time(dv.source_time.ticks);
  b.add_server_time(dv.server_time.ticks);
  if (!dv.diagnostics.empty()) b.add_diagnostics(d);
  auto dvo = b.Finish();
  return wire::CreateTagValue(f, t, dvo);
}

// A verified TagValue (untrusted): false for an id of the wrong size or an invalid value
// (`*budget` as decode_tag_value's). An absent DataValue is Nil, Good, no times.
inline bool decode_tag_entry(const wire::TagValue* in, tags::Change* out, std::size_t* budget,
                             std::string* why) {
  const auto* tag = in->tag();
  if (!tag || tag->size() == 0 || tag->size() > tags::kMaxTagIdSize) {
    *why = "a tag id must be 1.." + std::to_string(tags::kMaxTagIdSize) + " bytes";
    return false;
  }
  // The id and diagnostics are copied: paid for at each use, as values are (many entries
  // sharing one 64 KiB diagnostics string would otherwise be copied each time).
  const std::size_t text =
      tag->size() +
      (in->value() && in->value()->diagnostics() ? in->value()->diagnostics()->size() : 0);
  if (text > *budget) {
    *budget = 0;
    *why =
        "the values of this frame decode to too much (a shared subtree counts each time it is "
        "used)";
    return false;
  }
  *budget -= text;
  out->tag = tag->str();
  out->value = tags::DataValue{};
  out->value.status = tags::codes::Good;
  if (const auto* dv = in->value()) {
    out->value.status = dv->status();
    out->value.source_time = DateTime{dv->source_time()};
    out->value.server_time = DateTime{dv->server_time()};
    if (dv->diagnostics()) {
      if (dv->diagnostics()->size() > kMaxDiagnosticsBytes) {
        *why = "diagnostics of '" + out->tag.substr(0, 64) + "' longer than 64 KiB";
        return false;
      }
      out->value.diagnostics = dv->diagnostics()->str();
    }
    if (dv->value() && !decode_tag_value(dv->value(), &out->value.value, budget)) {
      *why = *budget == 0 ? "the values of this frame decode to too much (a shared subtree counts "
                            "each time it is used)"
                          : "the value of '" + out->tag.substr(0, 64) + "' is not a valid value";
      return false;
    }
  }
  return true;
}

// A list of ids from a frame: at most kMaxTagIdsPerFrame, each 1..kMaxTagIdSize bytes.
inline bool decode_tag_ids(const flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>* in,
                           std::vector<std::string>* out, std::string* why) {
  out->clear();
  if (!in) return true;
  if (in->size() > kMaxTagIdsPerFrame) {
    *why = "more than " + std::to_string(kMaxTagIdsPerFrame) + " ids in one frame";
    return false;
  }
  out->reserve(in->size());
  for (const auto* s : *in) {
    if (!s || s->size() == 0 || s->size() > tags::kMaxTagIdSize) {
      *why = "a tag id must be 1.." + std::to_string(tags::kMaxTagIdSize) + " bytes";
      return false;
    }
    out->push_back(s->str());
  }
  return true;
}

}  // namespace outrun::detail

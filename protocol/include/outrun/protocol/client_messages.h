// The frame bodies of a client socket (client <-> outrund): one encoder and one decoder per
// message, with the conventions of messages.h (encoders never clear the builder and return the
// finished frame; decoders take a verified frame and give views into it). Evaluate and Results
// are the worker pipe's: build_evaluation/finish_evaluate and build_result/finish_results.
// The rules: design/protocol.md "Client frames", "Tags frames".
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "outrun/protocol/messages.h"

namespace outrun::protocol {

using TagValueOffsets = std::span<const flatbuffers::Offset<wire::TagValue>>;
using StringVector = flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>;
using TagValueVector = flatbuffers::Vector<flatbuffers::Offset<wire::TagValue>>;

// ---- Statuses a daemon sends

// Daemon -> client: Ok .. InvalidArgument are what a client may receive, and are passed on.
// Any other status (NeedSource, which no daemon sends, or one added after this client was built)
// is not a protocol violation: the answer it came with still ends its evaluation or request, as
// RuntimeError with the message "outrund sent an unknown status N" (in *error, replacing the
// daemon's), and the connection goes on. Client and daemon ship separately and the enum only
// grows, so a newer daemon must not cost an older client its connection.
wire::Status client_status(wire::Status status, std::string* error);

// ---- Client -> daemon

std::span<const uint8_t> encode_client_hello(flatbuffers::FlatBufferBuilder& fbb,
                                             std::string_view client_name,
                                             uint16_t protocol_version = kProtocolVersion);
std::span<const uint8_t> encode_register(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id,
                                         std::string_view key, std::string_view source,
                                         bool check = false);
std::span<const uint8_t> encode_unregister(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id,
                                           std::string_view key);
// `after` is written when not empty.
std::span<const uint8_t> encode_control(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id,
                                        wire::ControlCommand command, int32_t shard,
                                        std::string_view after = {}, uint32_t limit = 0,
                                        std::string_view key = {}, uint64_t since = 0);
std::span<const uint8_t> encode_define_tags(flatbuffers::FlatBufferBuilder& fbb,
                                            uint64_t request_id, std::string_view toml,
                                            bool replace_all);
std::span<const uint8_t> encode_remove_tags(flatbuffers::FlatBufferBuilder& fbb,
                                            uint64_t request_id, std::span<const std::string> ids);
std::span<const uint8_t> encode_list_tags(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id,
                                          std::string_view after = {}, uint32_t limit = 0);
// `updates` built in `fbb` before (the host's encode_tag_entry); `time` in ticks, 0: now.
std::span<const uint8_t> encode_source_updates(flatbuffers::FlatBufferBuilder& fbb,
                                               uint64_t request_id, int64_t time,
                                               TagValueOffsets updates);
std::span<const uint8_t> encode_subscribe(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id,
                                          std::span<const std::string> ids, bool cancel);
std::span<const uint8_t> encode_read_tags(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id,
                                          std::span<const std::string> ids);

struct ClientHelloMsg {
  uint16_t protocol_version = 0;
  std::string_view client_name;
};
struct RegisterMsg {
  uint64_t request_id = 0;
  std::optional<std::string_view> key, source;  // absent: nullopt
  bool check = false;
};
struct UnregisterMsg {
  uint64_t request_id = 0;
  std::optional<std::string_view> key;
};
struct ControlMsg {
  uint64_t request_id = 0;
  wire::ControlCommand command = wire::ControlCommand::Stats;
  int32_t shard = 0;
  std::string_view after;  // absent: empty
  uint32_t limit = 0;
  std::string_view key;  // ScriptLogs, TagLogs; absent: empty
  uint64_t since = 0;
};
struct DefineTagsMsg {
  uint64_t request_id = 0;
  std::optional<std::string_view> toml;
  bool replace_all = false;
};
struct RemoveTagsMsg {
  uint64_t request_id = 0;
  const StringVector* ids = nullptr;  // null: none
};
struct ListTagsMsg {
  uint64_t request_id = 0;
  std::string_view after;  // the cursor ("" the first page)
  uint32_t limit = 0;      // 0: the default
};
struct SourceUpdatesMsg {
  uint64_t request_id = 0;
  int64_t time = 0;
  const TagValueVector* updates = nullptr;  // null: none
};
struct SubscribeMsg {
  uint64_t request_id = 0;
  const StringVector* ids = nullptr;  // null or empty: every tag
  bool cancel = false;
};
struct ReadTagsMsg {
  uint64_t request_id = 0;
  const StringVector* ids = nullptr;
};
using ClientMessage =
    std::variant<ClientHelloMsg, RegisterMsg, EvaluateMsg, UnregisterMsg, ControlMsg, DefineTagsMsg,
                 RemoveTagsMsg, ListTagsMsg, SourceUpdatesMsg, SubscribeMsg, ReadTagsMsg>;
// A frame from a client. false (a protocol violation: the client is disconnected) for a body a
// client does not send. Whether ClientHello comes first and once is the caller's to check.
bool decode_client_frame(const wire::Frame* frame, ClientMessage* out, std::string* why);

// ---- Daemon -> client

// `error` set (not empty): the connection is refused. Fields at 0 are not written.
// `protocol_version`: the one the connection speaks (the client's, when outrund accepts it).
std::span<const uint8_t> encode_server_hello(flatbuffers::FlatBufferBuilder& fbb,
                                             std::string_view server_version, int32_t shards,
                                             uint32_t max_inflight, std::string_view error = {},
                                             uint16_t protocol_version = kProtocolVersion);
// Ok: `handle64`, `handle` (the 32-bit form for protocol 1 and 2 clients; 0: not written),
// `sha256` (32 bytes) and `shard`; otherwise `error` and nothing else.
std::span<const uint8_t> encode_registered(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id,
                                           wire::Status status, std::string_view error,
                                           uint64_t handle64, uint32_t handle,
                                           std::span<const uint8_t> sha256, int32_t shard);
std::span<const uint8_t> encode_unregistered(flatbuffers::FlatBufferBuilder& fbb,
                                             uint64_t request_id, wire::Status status,
                                             std::string_view error);
// `error` and `json` are written when not empty.
std::span<const uint8_t> encode_control_reply(flatbuffers::FlatBufferBuilder& fbb,
                                              uint64_t request_id, wire::Status status,
                                              std::string_view error, std::string_view json);
std::span<const uint8_t> encode_tags_reply(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id,
                                           wire::Status status, std::string_view error,
                                           std::string_view json);
// Ok: `values` (built before); otherwise `error` and no values.
std::span<const uint8_t> encode_tag_values(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id,
                                           wire::Status status, std::string_view error,
                                           TagValueOffsets values);
std::span<const uint8_t> encode_tag_changes(flatbuffers::FlatBufferBuilder& fbb,
                                            TagValueOffsets changes);

struct ServerHelloMsg {
  uint16_t protocol_version = 0;
  int32_t shards = 0;
  std::string_view server_version;
  std::optional<std::string_view> error;  // set: refused (the daemon closes the connection)
  uint32_t max_inflight = 0;              // 0: a daemon from before the field did not say
};
// The answers to requests carry client_status()'s status and message.
struct RegisteredMsg {
  uint64_t request_id = 0;
  wire::Status status = wire::Status::Ok;
  std::string error;
  uint32_t handle = 0;    // protocol 1 and 2
  uint64_t handle64 = 0;  // protocol 3
  int32_t shard = 0;
  std::optional<std::array<uint8_t, 32>> sha256;  // absent, or not 32 bytes: nullopt
};
// Unregistered, ControlReply or TagsReply (`type`); `json` is empty for Unregistered.
struct ReplyMsg {
  wire::Body type = wire::Body::NONE;
  uint64_t request_id = 0;
  wire::Status status = wire::Status::Ok;
  std::string error;
  std::string_view json;
};
struct TagValuesMsg {
  uint64_t request_id = 0;
  wire::Status status = wire::Status::Ok;
  std::string error;
  const TagValueVector* values = nullptr;  // null: none
};
struct TagChangesMsg {
  const TagValueVector* changes = nullptr;  // null: none
};
using DaemonMessage =
    std::variant<ServerHelloMsg, RegisteredMsg, ResultsMsg, ReplyMsg, TagValuesMsg, TagChangesMsg>;
// A frame from the daemon. false for a body a daemon does not send: a client ignores it (a newer
// daemon's frames; design/protocol.md "Writing a client").
bool decode_daemon_frame(const wire::Frame* frame, DaemonMessage* out, std::string* why);

// One Result from the daemon, its status by client_status(): never fails.
struct ClientResult {
  uint64_t id = 0;
  wire::Status status = wire::Status::Ok;
  const wire::Value* value = nullptr;  // Ok: the value (null: Nil)
  std::string error;
};
void decode_daemon_result(const wire::Result* r, ClientResult* out);

}  // namespace outrun::protocol

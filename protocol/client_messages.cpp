#include "outrun/protocol/client_messages.h"

#include <cstring>

namespace outrun::protocol {

namespace {

flatbuffers::Offset<flatbuffers::String> string_or_none(flatbuffers::FlatBufferBuilder& fbb,
                                                        std::string_view s) {
  return s.empty() ? flatbuffers::Offset<flatbuffers::String>()
                   : fbb.CreateString(s.data(), s.size());
}

flatbuffers::Offset<StringVector> make_ids(flatbuffers::FlatBufferBuilder& fbb,
                                           std::span<const std::string> ids) {
  std::vector<flatbuffers::Offset<flatbuffers::String>> v;
  v.reserve(ids.size());
  for (const auto& id : ids) v.push_back(fbb.CreateString(id));
  return fbb.CreateVector(v);
}

std::optional<std::string_view> view(const flatbuffers::String* s) {
  if (!s) return std::nullopt;
  return s->string_view();
}

std::string_view view_or_empty(const flatbuffers::String* s) {
  return s ? s->string_view() : std::string_view();
}

// A reply's status and message, by client_status().
wire::Status reply_status(wire::Status status, const flatbuffers::String* error, std::string* out) {
  if (error)
    out->assign(error->data(), error->size());
  else
    out->clear();
  return client_status(status, out);
}

}  // namespace

wire::Status client_status(wire::Status status, std::string* error) {
  if (status <= wire::Status::InvalidArgument) return status;
  *error = "outrund sent an unknown status " + std::to_string(static_cast<int>(status));
  return wire::Status::RuntimeError;
}

// ---- Client -> daemon

std::span<const uint8_t> encode_client_hello(flatbuffers::FlatBufferBuilder& fbb,
                                             std::string_view client_name,
                                             uint16_t protocol_version) {
  auto name = fbb.CreateString(client_name.data(), client_name.size());
  auto hello = wire::CreateClientHello(fbb, protocol_version, name);
  return finish_frame(fbb, wire::Body::ClientHello, hello.Union());
}

std::span<const uint8_t> encode_register(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id,
                                         std::string_view key, std::string_view source,
                                         bool check) {
  auto k = fbb.CreateString(key.data(), key.size());
  auto s = fbb.CreateString(source.data(), source.size());
  return finish_frame(fbb, wire::Body::Register,
                      wire::CreateRegister(fbb, request_id, k, s, check).Union());
}

std::span<const uint8_t> encode_unregister(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id,
                                           std::string_view key) {
  auto k = fbb.CreateString(key.data(), key.size());
  return finish_frame(fbb, wire::Body::Unregister,
                      wire::CreateUnregister(fbb, request_id, k).Union());
}

std::span<const uint8_t> encode_control(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id,
                                        wire::ControlCommand command, int32_t shard,
                                        std::string_view after, uint32_t limit,
                                        std::string_view key, uint64_t since) {
  auto a = string_or_none(fbb, after);
  auto k = string_or_none(fbb, key);
  auto body = wire::CreateControl(fbb, request_id, command, shard, a, limit, k, since);
  return finish_frame(fbb, wire::Body::Control, body.Union());
}

std::span<const uint8_t> encode_define_tags(flatbuffers::FlatBufferBuilder& fbb,
                                            uint64_t request_id, std::string_view toml,
                                            bool replace_all) {
  auto t = fbb.CreateString(toml.data(), toml.size());
  auto body = wire::CreateDefineTags(fbb, request_id, t, replace_all);
  return finish_frame(fbb, wire::Body::DefineTags, body.Union());
}

std::span<const uint8_t> encode_remove_tags(flatbuffers::FlatBufferBuilder& fbb,
                                            uint64_t request_id, std::span<const std::string> ids) {
  auto v = make_ids(fbb, ids);
  return finish_frame(fbb, wire::Body::RemoveTags,
                      wire::CreateRemoveTags(fbb, request_id, v).Union());
}

std::span<const uint8_t> encode_list_tags(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id,
                                          std::string_view after, uint32_t limit) {
  const auto a = after.empty() ? 0 : fbb.CreateString(after.data(), after.size());
  return finish_frame(fbb, wire::Body::ListTags,
                      wire::CreateListTags(fbb, request_id, a, limit).Union());
}

std::span<const uint8_t> encode_source_updates(flatbuffers::FlatBufferBuilder& fbb,
                                               uint64_t request_id, int64_t time,
                                               TagValueOffsets updates) {
  auto vec = fbb.CreateVector(updates.data(), updates.size());
  auto body = wire::CreateSourceUpdates(fbb, request_id, time, vec);
  return finish_frame(fbb, wire::Body::SourceUpdates, body.Union());
}

std::span<const uint8_t> encode_subscribe(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id,
                                          std::span<const std::string> ids, bool cancel) {
  auto v = make_ids(fbb, ids);
  return finish_frame(fbb, wire::Body::Subscribe,
                      wire::CreateSubscribe(fbb, request_id, v, cancel).Union());
}

std::span<const uint8_t> encode_read_tags(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id,
                                          std::span<const std::string> ids) {
  auto v = make_ids(fbb, ids);
  return finish_frame(fbb, wire::Body::ReadTags, wire::CreateReadTags(fbb, request_id, v).Union());
}

bool decode_client_frame(const wire::Frame* frame, ClientMessage* out, std::string* why) {
  switch (frame->body_type()) {
    case wire::Body::ClientHello: {
      const auto* h = frame->body_as_ClientHello();
      *out = ClientHelloMsg{h->protocol_version(), view_or_empty(h->client_name())};
      return true;
    }
    case wire::Body::Register: {
      const auto* r = frame->body_as_Register();
      *out = RegisterMsg{r->request_id(), view(r->key()), view(r->source()), r->check()};
      return true;
    }
    case wire::Body::Evaluate:
      *out = EvaluateMsg{frame->body_as_Evaluate()->items()};
      return true;
    case wire::Body::Unregister: {
      const auto* u = frame->body_as_Unregister();
      *out = UnregisterMsg{u->request_id(), view(u->key())};
      return true;
    }
    case wire::Body::Control: {
      const auto* c = frame->body_as_Control();
      *out = ControlMsg{
          c->request_id(),         c->command(), c->shard(), view_or_empty(c->after()), c->limit(),
          view_or_empty(c->key()), c->since()};
      return true;
    }
    case wire::Body::DefineTags: {
      const auto* d = frame->body_as_DefineTags();
      *out = DefineTagsMsg{d->request_id(), view(d->toml()), d->replace_all()};
      return true;
    }
    case wire::Body::RemoveTags: {
      const auto* r = frame->body_as_RemoveTags();
      *out = RemoveTagsMsg{r->request_id(), r->ids()};
      return true;
    }
    case wire::Body::ListTags: {
      const auto* l = frame->body_as_ListTags();
      *out = ListTagsMsg{l->request_id(),
                         l->after() ? std::string_view(l->after()->c_str(), l->after()->size())
                                    : std::string_view(),
                         l->limit()};
      return true;
    }
    case wire::Body::SourceUpdates: {
      const auto* u = frame->body_as_SourceUpdates();
      *out = SourceUpdatesMsg{u->request_id(), u->time(), u->updates()};
      return true;
    }
    case wire::Body::Subscribe: {
      const auto* s = frame->body_as_Subscribe();
      *out = SubscribeMsg{s->request_id(), s->ids(), s->cancel()};
      return true;
    }
    case wire::Body::ReadTags: {
      const auto* r = frame->body_as_ReadTags();
      *out = ReadTagsMsg{r->request_id(), r->ids()};
      return true;
    }
    default:
      *why = std::string("a frame a client does not send (") +
             wire::EnumNameBody(frame->body_type()) + ")";
      return false;
  }
}

// ---- Daemon -> client

std::span<const uint8_t> encode_server_hello(flatbuffers::FlatBufferBuilder& fbb,
                                             std::string_view server_version, int32_t shards,
                                             uint32_t max_inflight, std::string_view error,
                                             uint16_t protocol_version) {
  auto e = string_or_none(fbb, error);
  auto v = fbb.CreateString(server_version.data(), server_version.size());
  wire::ServerHelloBuilder b(fbb);
  b.add_protocol_version(protocol_version);
  b.add_shards(shards);
  b.add_server_version(v);
  b.add_error(e);
  b.add_max_inflight(max_inflight);
  return finish_frame(fbb, wire::Body::ServerHello, b.Finish().Union());
}

std::span<const uint8_t> encode_registered(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id,
                                           wire::Status status, std::string_view error,
                                           uint64_t handle64, uint32_t handle,
                                           std::span<const uint8_t> sha256, int32_t shard) {
  const bool ok = status == wire::Status::Ok;
  flatbuffers::Offset<flatbuffers::String> err;
  flatbuffers::Offset<flatbuffers::Vector<uint8_t>> sha;
  if (!ok)
    err = fbb.CreateString(error.data(), error.size());
  else
    sha = fbb.CreateVector(sha256.data(), sha256.size());
  wire::RegisteredBuilder b(fbb);
  b.add_request_id(request_id);
  b.add_status(status);
  if (!ok) {
    b.add_error(err);
  } else {
    b.add_handle(handle);
    b.add_handle64(handle64);
    b.add_sha256(sha);
    b.add_shard(shard);
  }
  return finish_frame(fbb, wire::Body::Registered, b.Finish().Union());
}

std::span<const uint8_t> encode_unregistered(flatbuffers::FlatBufferBuilder& fbb,
                                             uint64_t request_id, wire::Status status,
                                             std::string_view error) {
  auto err = string_or_none(fbb, error);
  wire::UnregisteredBuilder b(fbb);
  b.add_request_id(request_id);
  b.add_status(status);
  b.add_error(err);
  return finish_frame(fbb, wire::Body::Unregistered, b.Finish().Union());
}

std::span<const uint8_t> encode_control_reply(flatbuffers::FlatBufferBuilder& fbb,
                                              uint64_t request_id, wire::Status status,
                                              std::string_view error, std::string_view json) {
  auto err = string_or_none(fbb, error);
  auto js = string_or_none(fbb, json);
  wire::ControlReplyBuilder b(fbb);
  b.add_request_id(request_id);
  b.add_status(status);
  b.add_error(err);
  b.add_json(js);
  return finish_frame(fbb, wire::Body::ControlReply, b.Finish().Union());
}

std::span<const uint8_t> encode_tags_reply(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id,
                                           wire::Status status, std::string_view error,
                                           std::string_view json) {
  auto err = string_or_none(fbb, error);
  auto js = string_or_none(fbb, json);
  wire::TagsReplyBuilder b(fbb);
  b.add_request_id(request_id);
  b.add_status(status);
  b.add_error(err);
  b.add_json(js);
  return finish_frame(fbb, wire::Body::TagsReply, b.Finish().Union());
}

std::span<const uint8_t> encode_tag_values(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id,
                                           wire::Status status, std::string_view error,
                                           TagValueOffsets values) {
  const bool ok = status == wire::Status::Ok;
  flatbuffers::Offset<TagValueVector> vec;
  flatbuffers::Offset<flatbuffers::String> err;
  if (ok)
    vec = fbb.CreateVector(values.data(), values.size());
  else
    err = fbb.CreateString(error.data(), error.size());
  wire::TagValuesBuilder b(fbb);
  b.add_request_id(request_id);
  b.add_status(status);
  if (ok)
    b.add_values(vec);
  else
    b.add_error(err);
  return finish_frame(fbb, wire::Body::TagValues, b.Finish().Union());
}

std::span<const uint8_t> encode_tag_changes(flatbuffers::FlatBufferBuilder& fbb,
                                            TagValueOffsets changes) {
  auto vec = fbb.CreateVector(changes.data(), changes.size());
  return finish_frame(fbb, wire::Body::TagChanges, wire::CreateTagChanges(fbb, vec).Union());
}

bool decode_daemon_frame(const wire::Frame* frame, DaemonMessage* out, std::string* why) {
  switch (frame->body_type()) {
    case wire::Body::ServerHello: {
      const auto* h = frame->body_as_ServerHello();
      *out = ServerHelloMsg{h->protocol_version(), h->shards(), view_or_empty(h->server_version()),
                            view(h->error()), h->max_inflight()};
      return true;
    }
    case wire::Body::Registered: {
      const auto* r = frame->body_as_Registered();
      RegisteredMsg m;
      m.request_id = r->request_id();
      m.status = reply_status(r->status(), r->error(), &m.error);
      m.handle = r->handle();
      m.handle64 = r->handle64();
      m.shard = r->shard();
      if (r->sha256() && r->sha256()->size() == 32) {
        m.sha256.emplace();
        std::memcpy(m.sha256->data(), r->sha256()->data(), 32);
      }
      *out = std::move(m);
      return true;
    }
    case wire::Body::Results:
      *out = ResultsMsg{frame->body_as_Results()->items()};
      return true;
    case wire::Body::Unregistered: {
      const auto* r = frame->body_as_Unregistered();
      ReplyMsg m;
      m.type = wire::Body::Unregistered;
      m.request_id = r->request_id();
      m.status = reply_status(r->status(), r->error(), &m.error);
      *out = std::move(m);
      return true;
    }
    case wire::Body::ControlReply: {
      const auto* r = frame->body_as_ControlReply();
      ReplyMsg m;
      m.type = wire::Body::ControlReply;
      m.request_id = r->request_id();
      m.status = reply_status(r->status(), r->error(), &m.error);
      m.json = view_or_empty(r->json());
      *out = std::move(m);
      return true;
    }
    case wire::Body::TagsReply: {
      const auto* r = frame->body_as_TagsReply();
      ReplyMsg m;
      m.type = wire::Body::TagsReply;
      m.request_id = r->request_id();
      m.status = reply_status(r->status(), r->error(), &m.error);
      m.json = view_or_empty(r->json());
      *out = std::move(m);
      return true;
    }
    case wire::Body::TagValues: {
      const auto* r = frame->body_as_TagValues();
      TagValuesMsg m;
      m.request_id = r->request_id();
      m.status = reply_status(r->status(), r->error(), &m.error);
      m.values = r->values();
      *out = std::move(m);
      return true;
    }
    case wire::Body::TagChanges:
      *out = TagChangesMsg{frame->body_as_TagChanges()->changes()};
      return true;
    default:
      *why = std::string("a frame a daemon does not send (") +
             wire::EnumNameBody(frame->body_type()) + ")";
      return false;
  }
}

void decode_daemon_result(const wire::Result* r, ClientResult* out) {
  out->id = r->id();
  out->value = nullptr;
  out->status = reply_status(r->status(), r->error(), &out->error);
  if (out->status == wire::Status::Ok) {
    out->value = r->value();
    out->error.clear();
  }
}

}  // namespace outrun::protocol

// The tags frames (design/protocol.md "Tags frames", design/daemon.md "Tags"): DefineTags and
// RemoveTags (admins only, run on the tags thread), ListTags and its document, SourceUpdates,
// Subscribe, ReadTags.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "conn.h"
#include "error_wire.h"
#include "outrun/protocol/client_messages.h"
#include "outrun/protocol/frame.h"
#include "server.h"
#include "tags_file.h"
#include "tags_wire.h"

namespace outrun::daemon {

namespace {

void write_tags_reply(protocol::FrameWriter& w, uint64_t request_id, const Error& e,
                      const std::string& json) {
  flatbuffers::FlatBufferBuilder f(256 + json.size());
  w.write(protocol::encode_tags_reply(f, request_id, detail::wire_status(e.code), e.message, json));
}

std::string dump_json(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

// What a reply's values may take (the frame's limit, less room for its tables).
constexpr std::size_t kMaxReplyValues = protocol::kMaxFrameSize - (64u << 10);

// What one read value costs in a TagValues frame, near enough to stop before the frame is full.
std::size_t reply_cost(const std::string& id, const tags::DataValue& v) {
  return 64 + id.size() + tags::value_size(v.value) + v.diagnostics.size();
}

void refuse_admin(Conn& c, uint64_t rid, const char* what) REQUIRES(loop_thread) {
  spdlog::warn("client {} (pid {} uid {}): {} refused: not an admin", c.id, c.pid, c.uid, what);
  write_tags_reply(c.writer, rid,
                   Error{ErrorCode::invalid_argument,
                         "permission denied: uid " + std::to_string(c.uid) +
                             " may use tags but not define or remove them (daemon.admin_uids, "
                             "admin_gids)"},
                   {});
}

// parse_tags's error for a text over its max_tags.
bool fe_over_bound(const std::string& e) {
  return e.find("[[tag]] tables, more than") != std::string::npos;
}

void busy(Conn& c, uint64_t rid) {
  // Busy, as outrund has always answered it (an outrun::Client reads it as unavailable).
  flatbuffers::FlatBufferBuilder f(256);
  c.writer.write(protocol::encode_tags_reply(f, rid, wire::Status::Busy,
                                             "too many tag definitions waiting; try again", {}));
}

}  // namespace

void Server::handle_define_tags(const std::shared_ptr<Conn>& c, const protocol::DefineTagsMsg& d) {
  const uint64_t rid = d.request_id;
  if (!c->admin) {
    refuse_admin(*c, rid, "DefineTags");
    return;
  }
  if (!d.toml) {
    write_tags_reply(c->writer, rid, Error{ErrorCode::invalid_argument, "DefineTags needs toml"},
                     {});
    return;
  }
  spdlog::info("client {} (pid {}): define tags ({} bytes{})", c->id, c->pid, d.toml->size(),
               d.replace_all ? ", replace all" : "");
  auto job = [this, c, rid, text = std::string(*d.toml), replace = d.replace_all] {
    std::vector<tags::TagDefinition> defs;
    std::vector<std::string> file_errors;
    tags::file::Declarations decls;
    if (!tags::file::parse_tags(text, "", "", &defs, &file_errors, cfg_.max_tags_per_define,
                                &decls)) {
      std::string why;
      for (const auto& fe : file_errors) why += (why.empty() ? "" : "\n") + fe;
      if (file_errors.size() == 1 && fe_over_bound(file_errors[0]))
        why += " (max_tags_per_define, " + std::to_string(cfg_.max_tags_per_define) +
               "); send them in several requests";
      write_tags_reply(c->writer, rid, Error{ErrorCode::invalid_argument, why}, {});
      return;
    }
    if (defs.size() > cfg_.max_tags_per_define) {
      write_tags_reply(
          c->writer, rid,
          Error{ErrorCode::invalid_argument, "DefineTags carries " + std::to_string(defs.size()) +
                                                 " definitions, more than max_tags_per_define (" +
                                                 std::to_string(cfg_.max_tags_per_define) +
                                                 "); send them in several requests"},
          {});
      return;
    }
    tags::ApplyOptions o;
    o.replace_all = replace;
    o.strict = cfg_.tags_strict;
    tags::ApplyResult res;
    if (Error e = tags_.engine().apply(defs, o, &res)) {
      // Strict: the first error is the reply's; every one is in the message.
      std::string why = e.message;
      for (std::size_t i = 1; i < res.errors.size(); ++i)
        why += "\n" + (res.errors[i].location.empty() ? "" : res.errors[i].location + ": ") +
               res.errors[i].message;
      write_tags_reply(c->writer, rid, Error{e.code, why}, {});
      return;
    }
    tags_.set_declarations(std::move(decls), replace);
    write_tags_reply(c->writer, rid, {}, dump_json(tags::file::apply_result_json(res)));
  };
  if (!tags_.post_job(std::move(job))) busy(*c, rid);
}

void Server::handle_remove_tags(const std::shared_ptr<Conn>& c, const protocol::RemoveTagsMsg& r) {
  std::string why;
  const uint64_t rid = r.request_id;
  if (!c->admin) {
    refuse_admin(*c, rid, "RemoveTags");
    return;
  }
  std::vector<std::string> ids;
  if (!detail::decode_tag_ids(r.ids, &ids, &why)) {
    write_tags_reply(c->writer, rid, Error{ErrorCode::invalid_argument, why}, {});
    return;
  }
  auto job = [this, c, rid, ids = std::move(ids)] {
    // All or none: every id must be a virtual tag, and no tag that stays may use one.
    std::unordered_set<std::string> gone(ids.begin(), ids.end());
    const std::vector<std::string> all = tags_.engine().ids();  // topological order
    std::unordered_set<std::string> known(all.begin(), all.end());
    for (const auto& id : ids)
      if (!known.count(id)) {
        write_tags_reply(c->writer, rid,
                         Error{ErrorCode::invalid_argument, "unknown virtual tag '" + id + "'"},
                         {});
        return;
      }
    for (const auto& id : all) {
      if (gone.count(id)) continue;
      tags::TagInfo info;
      if (tags_.engine().info(id, &info)) continue;
      for (const auto& in : info.definition.inputs)
        if (gone.count(in.tag)) {
          write_tags_reply(
              c->writer, rid,
              Error{ErrorCode::invalid_argument, "'" + in.tag + "' is an input of '" + id + "'"},
              {});
          return;
        }
    }
    nlohmann::ordered_json removed = nlohmann::ordered_json::array();
    for (auto it = all.rbegin(); it != all.rend(); ++it) {  // dependents first
      if (!gone.count(*it)) continue;
      if (Error e = tags_.engine().remove(*it)) {
        write_tags_reply(c->writer, rid, e, {});
        return;
      }
      removed.push_back(*it);
    }
    write_tags_reply(c->writer, rid, {}, dump_json(nlohmann::ordered_json{{"removed", removed}}));
  };
  if (!tags_.post_job(std::move(job))) busy(*c, rid);
}

void Server::handle_list_tags(const std::shared_ptr<Conn>& c, const protocol::ListTagsMsg& l) {
  const uint64_t rid = l.request_id;
  std::string json;
  Error e = tags_.list_json(l.after, l.limit, &json);
  if (constexpr std::size_t kMaxDocument = protocol::kMaxFrameSize - 4096;
      !e && json.size() > kMaxDocument) {  // one tag whose value alone is larger than a frame
    e = Error{ErrorCode::unavailable, "the tags page is " + std::to_string(json.size()) +
                                          " bytes, more than a reply frame holds; ask for "
                                          "fewer tags (ListTags.limit)"};
  }
  if (e) json.clear();
  write_tags_reply(c->writer, rid, e, json);
}

void Server::handle_source_updates(const std::shared_ptr<Conn>& c,
                                   const protocol::SourceUpdatesMsg& u) {
  std::string why;
  const uint64_t rid = u.request_id;
  Error e;
  std::vector<tags::SourceUpdate> updates;
  if (const auto* items = u.updates) {
    if (items->size() > detail::kMaxUpdatesPerFrame) {
      e = Error{ErrorCode::invalid_argument, "more than " +
                                                 std::to_string(detail::kMaxUpdatesPerFrame) +
                                                 " updates in one SourceUpdates"};
    } else {
      updates.reserve(items->size());
      std::size_t budget = protocol::kMaxFrameSize;
      for (const wire::TagValue* tv : *items) {
        tags::Change ch;
        if (!detail::decode_tag_entry(tv, &ch, &budget, &why)) {
          e = Error{ErrorCode::invalid_argument, why};
          break;
        }
        updates.push_back(tags::SourceUpdate{std::move(ch.tag), std::move(ch.value)});
      }
    }
  }
  if (!e && !updates.empty()) {
    // The wave's time (the scripts' `now`, the server timestamps) is outrund's own clock; a
    // client's `time` is only the source timestamp of the updates that carry none
    // (design/tags.md "Clocks").
    if (u.time != 0)
      for (auto& up : updates)
        if (up.value.source_time == DateTime{}) up.value.source_time = DateTime{u.time};
    tags::UpdateOptions o;
    o.owner = c->id;
    o.uid = c->uid;
    o.may_create = c->admin;  // others update the sources that exist (design/daemon.md)
    o.max_uid_sources = cfg_.max_tag_sources_per_uid;
    o.max_uid_bytes = cfg_.max_tag_source_bytes_per_uid;
    if (c->admin) c->made_sources = true;
    e = tags_.engine().update(updates, o);
  }
  if (rid != 0 || e) write_tags_reply(c->writer, rid, e, {});
}

void Server::handle_subscribe(const std::shared_ptr<Conn>& c, const protocol::SubscribeMsg& sb) {
  std::string why;
  const uint64_t rid = sb.request_id;
  std::vector<std::string> ids;
  Error e;
  if (!detail::decode_tag_ids(sb.ids, &ids, &why)) {
    e = Error{ErrorCode::invalid_argument, why};
  } else {
    e = tags_.subscribe(c, sb.cancel, ids);
  }
  write_tags_reply(c->writer, rid, e, {});
}

namespace {
Error too_large(std::size_t bytes, std::size_t done, std::size_t of) {
  return Error{ErrorCode::invalid_argument,
               "the values of this ReadTags pass what a reply frame holds (" +
                   std::to_string(bytes) + " bytes after " + std::to_string(done) + " of " +
                   std::to_string(of) + " ids, more than " + std::to_string(kMaxReplyValues) +
                   "); read fewer ids at a time"};
}
}  // namespace

// A read that would evaluate an on_read tag first (its value older than its max_age) waits for
// that evaluation on the tags read thread: the loop thread, where the frame arrived, reads that
// evaluation's result and serves everyone else, and must never wait (design/daemon.md "One
// loop"). Every other read is answered here, in order with the connection's other frames. The
// reply's size is counted while the values are read, and the read stops at a frame's worth.
void Server::handle_read_tags(const std::shared_ptr<Conn>& c, const protocol::ReadTagsMsg& r) {
  std::string why;
  std::vector<std::string> ids;
  const uint64_t rid = r.request_id;
  auto reply = [c, rid](const Error& e, const std::vector<std::string>& read,
                        const std::vector<tags::DataValue>& values) {
    auto& f = t_changes_fbb;
    f.Clear();
    std::vector<flatbuffers::Offset<wire::TagValue>> offs;
    bool full = false;
    if (!e)
      for (std::size_t i = 0; i < read.size() && !full; ++i) {
        offs.push_back(detail::encode_tag_entry(f, read[i], values[i]));
        full = f.GetSize() > protocol::kMaxFrameSize;
      }
    auto frame_bytes =
        full ? std::span<const uint8_t>()
             : protocol::encode_tag_values(f, rid, detail::wire_status(e.code), e.message, offs);
    if (full || frame_bytes.size() > protocol::kMaxFrameSize) {
      f.Clear();
      frame_bytes = protocol::encode_tag_values(
          f, rid, wire::Status::InvalidArgument,
          "the values are more than a frame holds; read fewer ids at a time", {});
    }
    c->writer.write(frame_bytes);
  };
  if (!detail::decode_tag_ids(r.ids, &ids, &why)) {
    reply(Error{ErrorCode::invalid_argument, why}, {}, {});
    return;
  }
  // Answered here unless a tag would be evaluated first (Engine::read_now), all on the tags
  // read thread then, where read() may wait.
  std::vector<tags::DataValue> values(ids.size());
  bool would_wait = false;
  Error e;
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < ids.size() && !e && !would_wait; ++i) {
    e = tags_.engine().read_now(ids[i], &values[i], &would_wait);
    if (!e && !would_wait && (bytes += reply_cost(ids[i], values[i])) > kMaxReplyValues)
      e = too_large(bytes, i + 1, ids.size());
  }
  if (!would_wait) {
    reply(e, ids, values);
    return;
  }
  // The on_read tags it would evaluate (each distinct id once): at most max_read_evaluations.
  {
    std::unordered_set<std::string_view> distinct;
    for (const auto& id : ids) {
      if (!tags_.engine().read_would_wait(id)) continue;
      distinct.insert(id);
      if (distinct.size() > cfg_.max_read_evaluations) {
        reply(Error{ErrorCode::invalid_argument,
                    "this ReadTags would evaluate more than max_read_evaluations (" +
                        std::to_string(cfg_.max_read_evaluations) +
                        ") on_read tags; read fewer at a time"},
              {}, {});
        return;
      }
    }
  }
  values.assign(ids.size(), tags::DataValue());
  auto job = [this, reply, ids = std::move(ids), values = std::move(values)]() mutable {
    Error err;
    std::size_t total = 0;
    // Each distinct id is read once: a repeated on_read id is not evaluated again.
    std::unordered_map<std::string_view, std::size_t> first;
    for (std::size_t i = 0; i < ids.size() && !err; ++i) {
      if (tags_.stopping()) {
        err = Error{ErrorCode::unavailable, "outrund is stopping"};
        break;
      }
      if (auto [it, fresh] = first.emplace(ids[i], i); !fresh)
        values[i] = values[it->second];
      else
        err = tags_.engine().read(ids[i], &values[i]);
      if (!err && (total += reply_cost(ids[i], values[i])) > kMaxReplyValues)
        err = too_large(total, i + 1, ids.size());
    }
    reply(err, ids, values);
  };
  // The drain waits for it (on_drain_timer, TagsService::reads_waiting), as for an evaluation
  // in flight.
  if (tags_.post_read(c->id, std::move(job))) return;
  // TagValues, the body a ReadTags is always answered with (protocol.md), saying Busy.
  auto& f = t_changes_fbb;
  f.Clear();
  c->writer.write(protocol::encode_tag_values(
      f, rid, wire::Status::Busy,
      "too many tag reads waiting for on_read evaluations (this connection's "
      "max_tag_reads_per_client, or the daemon's); try again",
      {}));
}

}  // namespace outrun::daemon

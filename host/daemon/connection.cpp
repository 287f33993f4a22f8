// A client's connection on the loop thread: its poll events, reading and verifying its frames
// (the hello, then each body to its handler), closing it; and its byte budget: held while over
// max_client_queued_bytes, disconnected past kHardLimitFactor times it (design/daemon.md
// "Byte budget per client").
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <cstring>
#include <string>
#include <variant>

#include "conn.h"
#include "outrun/protocol/client_messages.h"
#include "outrun/protocol/frame.h"
#include "server.h"
#include "wire_codec.h"

namespace outrun::daemon {

namespace {
flatbuffers::Offset<wire::Result> build_item(flatbuffers::FlatBufferBuilder& f, uint64_t id,
                                             const Result& r) {
  const bool ok = r.status == Status::ok;
  const auto value = ok ? detail::encode_value(f, r.value) : flatbuffers::Offset<wire::Value>();
  return protocol::build_result(f, id, static_cast<wire::Status>(r.status), value,
                                ok ? std::string_view() : std::string_view(r.error),
                                detail::encode_logs(f, r.logs), r.logs_dropped);
}
}  // namespace

void send_result(Conn& c, uint64_t id, const Result& r) {
  auto& f = t_fbb;
  f.Clear();
  const auto item = build_item(f, id, r);
  c.writer.write(protocol::finish_results(f, {&item, 1}));
}

void send_results(Conn& c, std::span<const std::pair<uint64_t, Result>> rs) {
  auto& f = t_fbb;
  thread_local std::vector<flatbuffers::Offset<wire::Result>> items;
  std::size_t k = 0;
  while (k < rs.size()) {
    f.Clear();
    items.clear();
    // A result is at most ~8 MiB (the worker's kMaxResultBytes): a frame stays far below
    // kMaxFrameSize.
    for (; k < rs.size() && (items.empty() || f.GetSize() < kResultsCutBytes); ++k)
      items.push_back(build_item(f, rs[k].first, rs[k].second));
    c.writer.write(protocol::finish_results(f, items));
  }
}

void reply_error_hello(int fd, const std::string& why) {
  flatbuffers::FlatBufferBuilder f(256);
  auto bytes = protocol::encode_server_hello(f, OUTRUN_VERSION, 0, 0, why);
  (void)!::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

void Server::update_poll(Conn* c) {
  if (c->phase.closed()) return;
  int ev = 0;
  const bool held = c->held.load(std::memory_order_relaxed);
  if (c->write_wait)
    ev |= UV_WRITABLE;
  else if (life_.accepting() && c->phase.reads() && !held)
    ev |= UV_READABLE;  // a client that does not read its results is not read
  // Not read while over its budget (or checking): its disconnect is still seen (and cancels its
  // queue).
  if (held || c->phase.checking()) ev |= UV_DISCONNECT;
  if (ev == c->events) return;
  c->events = ev;
  if (ev == 0)
    uv_poll_stop(&c->poll);
  else
    uv_poll_start(&c->poll, ev, &Server::on_conn);
}

void Server::on_conn(uv_poll_t* h, int status, int events) {
  loop_thread.assert_here();
  auto* c = static_cast<Conn*>(h->data);
  c->server->conn_event(c, status, events);
}

void Server::conn_event(Conn* c, int status, int events) {
  if (c->phase.closed()) return;
  if (status < 0) {
    close_conn(c, uv_strerror(status));
    return;
  }
  auto self = conns_.at(c);
  if ((events & UV_DISCONNECT) && c->held.load(std::memory_order_relaxed)) {
    close_conn(c, "disconnected while over max_client_queued_bytes");
    return;
  }
  if ((events & UV_DISCONNECT) && c->phase.checking()) {
    close_conn(c, "disconnected while its register --check waited");
    return;
  }
  if (events & UV_WRITABLE) {
    switch (c->writer.flush_from_loop()) {
      case protocol::FrameWriter::Flush::kDone:
        c->write_wait = false;
        tags_.flush_subscriber(*c);  // a subscriber that was over its budget gets its latest values
        break;
      case protocol::FrameWriter::Flush::kMore:
        break;
      case protocol::FrameWriter::Flush::kClosed:
        close_conn(c, "write failed");
        return;
    }
    if (c->held.load(std::memory_order_relaxed))
      maybe_resume(c);  // may keep write_wait, read frames, or close
    if (c->phase.closed()) return;
    update_poll(c);
  }
  if ((events & UV_READABLE) && life_.accepting() && c->phase.reads() &&
      !c->held.load(std::memory_order_relaxed) && !c->paused_frame) {
    const long n = c->reader.read_from(c->fd);
    if (n == -EAGAIN) return;
    if (n <= 0) {
      close_conn(c, n == 0 ? "disconnected" : std::strerror(static_cast<int>(-n)));
      return;
    }
    handle_frames(self);
  }
}

void Server::close_conn(Conn* c, const char* why) {
  if (!c->phase.close()) return;  // closed already
  c->writer.close();
  cancel_queued(c);
  tags_.forget(*c);  // no changes to it; the source tags it made that no tag uses go
  spdlog::debug("client {} closed: {} ({} in flight dropped)", c->id, why, c->inflight.load());
  pending_.erase(c->id);
  auto it = conns_.find(c);
  // The poll handle lives in the Conn: keep the Conn until libuv is done with it.
  auto* keep = new std::shared_ptr<Conn>(it->second);
  conns_.erase(it);
  c->poll.data = keep;
  uv_close(reinterpret_cast<uv_handle_t*>(&c->poll),
           [](uv_handle_t* h) { delete static_cast<std::shared_ptr<Conn>*>(h->data); });
}

void Server::handle_frames(const std::shared_ptr<Conn>& c) {
  protocol::FrameView fv;
  frames_now_us_ = 0;  // the frames of one read arrived at once: one clock read serves them
  while (!c->phase.closed()) {
    if (c->held.load(std::memory_order_relaxed)) return;  // maybe_resume() goes on
    if (c->phase.checking()) return;  // the check's answer goes on (handle_register)
    if (const auto* ev = c->paused_frame) {
      c->paused_frame = nullptr;
      if (!evaluate_items(c, ev, c->paused_item)) return;  // over its budget again
      continue;
    }
    // Every frame may be answered: none is handled while the client is over its budget.
    if (sched_->over_budget(*c)) {
      hold(c.get());
      return;
    }
    if (!c->reader.next(fv)) break;
    if (!handle_frame(c, fv.frame)) {
      ++violations_;
      spdlog::warn("client {} (pid {}) violated the protocol; disconnected", c->id, c->pid);
      close_conn(c.get(), "protocol violation");
      return;
    }
  }
  if (!c->phase.closed() && c->reader.error() != protocol::FrameError::kNone) {
    ++violations_;
    spdlog::warn("client {} (pid {}) sent a bad frame ({}); disconnected", c->id, c->pid,
                 protocol::to_string(c->reader.error()));
    close_conn(c.get(), "bad frame");
  }
}

bool Server::handle_frame(const std::shared_ptr<Conn>& c, const wire::Frame* frame) {
  flatbuffers::FlatBufferBuilder& f = t_fbb;
  protocol::ClientMessage msg;
  std::string why;
  if (!protocol::decode_client_frame(frame, &msg, &why)) return false;
  if (c->phase.awaiting_hello()) {
    const auto* h = std::get_if<protocol::ClientHelloMsg>(&msg);
    if (!h) return false;
    if (h->protocol_version < protocol::kMinClientProtocolVersion ||
        h->protocol_version > protocol::kProtocolVersion) {
      reply_error_hello(c->fd, "protocol version " + std::to_string(h->protocol_version) +
                                   " not supported; outrund speaks " +
                                   std::to_string(protocol::kMinClientProtocolVersion) + " to " +
                                   std::to_string(protocol::kProtocolVersion));
      return false;
    }
    c->phase.said_hello();
    c->protocol = h->protocol_version;
    pending_.erase(c->id);
    c->name = std::string(h->client_name.substr(0, 64));
    f.Clear();
    c->writer.write(protocol::encode_server_hello(
        f, OUTRUN_VERSION, host_->shards(), cfg_.max_inflight_per_client, {}, h->protocol_version));
    return true;
  }
  switch (frame->body_type()) {
    case wire::Body::Register:
      handle_register(c, std::get<protocol::RegisterMsg>(msg));
      return true;
    case wire::Body::Evaluate:
      evaluate_items(c, std::get<protocol::EvaluateMsg>(msg).items, 0);
      return true;
    case wire::Body::Unregister:
      handle_unregister(c, std::get<protocol::UnregisterMsg>(msg));
      return true;
    case wire::Body::Control:
      handle_control(c, std::get<protocol::ControlMsg>(msg));
      return true;
    case wire::Body::DefineTags:
      handle_define_tags(c, std::get<protocol::DefineTagsMsg>(msg));
      return true;
    case wire::Body::RemoveTags:
      handle_remove_tags(c, std::get<protocol::RemoveTagsMsg>(msg));
      return true;
    case wire::Body::ListTags:
      handle_list_tags(c, std::get<protocol::ListTagsMsg>(msg));
      return true;
    case wire::Body::SourceUpdates:
      handle_source_updates(c, std::get<protocol::SourceUpdatesMsg>(msg));
      return true;
    case wire::Body::Subscribe:
      handle_subscribe(c, std::get<protocol::SubscribeMsg>(msg));
      return true;
    case wire::Body::ReadTags:
      handle_read_tags(c, std::get<protocol::ReadTagsMsg>(msg));
      return true;
    default:
      return false;  // a second hello (decode_client_frame refused a frame only the daemon sends)
  }
}

// Loop thread: the client is over its budget. Its frames are not handled (the one in progress
// waits in paused_frame), its socket is not read, its queued evaluations are not fed (the
// dispatchers drop it from their turns), until maybe_resume().
void Server::hold(Conn* c) {
  if (sched_->hold(*c)) {
    spdlog::debug(
        "client {}: over max_client_queued_bytes ({} bytes queued); not read until it "
        "drains",
        c->id, c->writer.queued_bytes());
  }
  c->write_wait = true;
  update_poll(c);
}

void Server::maybe_resume(Conn* c) {
  if (c->phase.closed() || !c->held.load(std::memory_order_relaxed)) return;
  if (c->writer.queued_bytes() > cfg_.max_client_queued_bytes / 2) {
    c->write_wait = true;  // keep watching it drain
    return;
  }
  sched_->resume(*c);  // fed again
  update_poll(c);
  handle_frames(conns_.at(c));  // the paused frame, then what was read
}

// Loop thread: a dispatcher saw the client's unread answers pass the hard limit.
void Server::disconnect_over_limit(Conn* c) {
  over_limit_.fetch_add(1, std::memory_order_relaxed);
  const auto now = std::chrono::steady_clock::now();
  if (now - last_limit_warning_ >= std::chrono::seconds(10)) {
    spdlog::warn(
        "client {} (pid {}) disconnected: {} bytes of answers unread, over {} × "
        "max_client_queued_bytes ({}){}",
        c->id, c->pid, c->writer.queued_bytes(), kHardLimitFactor, cfg_.max_client_queued_bytes,
        limit_warnings_skipped_
            ? " (" + std::to_string(limit_warnings_skipped_) + " more since the last warning)"
            : std::string());
    last_limit_warning_ = now;
    limit_warnings_skipped_ = 0;
  } else {
    ++limit_warnings_skipped_;
  }
  close_conn(c, "over the hard limit of queued answers");
}

}  // namespace outrun::daemon

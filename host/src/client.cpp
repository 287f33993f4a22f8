// outrun::Client: Runner over a Unix socket to outrund. One reader thread completes results;
// callers write their own frames through a protocol::FrameWriter (one write pass at a time,
// frames queued meanwhile go out with its next send). Design: design/daemon.md.
#include "outrun/client.h"

#include <flatbuffers/flatbuffers.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <unordered_map>

#include "error_wire.h"
#include "future_state.h"
#include "outrun/protocol/client_messages.h"
#include "outrun/protocol/frame.h"
#include "outrun/protocol/frame_writer.h"
#include "outrun/protocol/input_list.h"
#include "outrun/thread_annotations.h"
#include "script_record.h"
#include "tags_wire.h"
#include "wire_codec.h"

namespace outrun {

std::string default_client_socket() {
  if (const char* s = std::getenv("OUTRUN_SOCKET"); s && *s) return s;
  if (geteuid() == 0) return "/run/outrun/outrund.sock";
  if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x && *x)
    return std::string(x) + "/outrun/outrund.sock";
  return "/tmp/outrun-" + std::to_string(geteuid()) + "/outrund.sock";
}

namespace {
struct Reply {
  Error error;  // from the reply's wire status by detail::error_from_wire
  std::string json;
  uint64_t handle = 0;  // Registered.handle64
  int shard = -1;
  std::array<uint8_t, 32> sha{};
  std::vector<tags::Change> values;
};
Reply failed(ErrorCode code, std::string why) {
  Reply r;
  r.error = Error{code, std::move(why)};
  return r;
}
// How a request larger than a frame is refused (design/daemon.md "outrun::Client").
const std::string kMoreThanAFrame = "more than a frame holds (kMaxFrameSize, " +
                                    std::to_string(protocol::kMaxFrameSize) +
                                    " bytes); nothing was sent";
}  // namespace

struct Client::Impl {
  int fd = -1;
  int shards = 0;
  std::chrono::milliseconds reply_timeout{};
  std::thread reader_thread;
  std::atomic<bool> alive{true};

  // Writing: FrameWriter's passes (its sends never block: MSG_DONTWAIT). The client has no
  // event loop, so the thread whose write found the socket full finishes the backlog itself.
  std::optional<protocol::FrameWriter> writer;  // set once fd is connected

  // Completions.
  Mutex mu;
  CondVar cv;  // a reply arrived, or the reader ended
  std::unordered_map<uint64_t, Callback> evals GUARDED_BY(mu);  // by evaluation id
  // By request id, waiting.
  std::unordered_map<uint64_t, std::optional<Reply>> replies GUARDED_BY(mu);
  uint64_t next_eval GUARDED_BY(mu) = 1;
  uint64_t next_request GUARDED_BY(mu) = 1;
  bool dead GUARDED_BY(mu) = false;  // reader ended: nothing more will complete
  std::string dead_reason GUARDED_BY(mu);

  // Scripts by daemon handle, and each key's latest handle. The records are this client's own
  // (no registry): freed with the last handle.
  Mutex smu;
  std::unordered_map<uint64_t, Script> by_handle GUARDED_BY(smu);
  std::unordered_map<std::string, uint64_t> by_key GUARDED_BY(smu);

  // Tags subscription callback (reader thread).
  Mutex submu;
  std::shared_ptr<ChangesCallback> on_changes GUARDED_BY(submu);

  ~Impl() {
    if (fd >= 0) {
      ::shutdown(fd, SHUT_RDWR);
      if (reader_thread.joinable()) reader_thread.join();
      ::close(fd);
    }
  }

  // Sends `bytes`, blocking while the socket is full; frames other threads write meanwhile go
  // out with it. False: the connection is gone (the reader fails what is pending).
  bool send(std::span<const uint8_t> bytes) {
    using W = protocol::FrameWriter;
    switch (writer->write(bytes)) {
      case W::State::kWritten:
        return true;
      case W::State::kClosed:
        return false;
      case W::State::kHandedOff:
        break;
    }
    // This thread holds the backlog now (on_blocked ran here): it plays the loop's part, waiting
    // for room. A closed or shut-down socket polls POLLHUP/POLLERR and the flush says kClosed.
    for (;;) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, -1) < 0 && errno != EINTR) {
        writer->close();
        return false;
      }
      switch (writer->flush_from_loop()) {
        case W::Flush::kDone:
          return true;
        case W::Flush::kClosed:
          return false;
        case W::Flush::kMore:
          continue;
      }
    }
  }

  void fail_all(Status st, const std::string& why) EXCLUDES(mu) {
    std::unordered_map<uint64_t, Callback> e;
    {
      MutexLock lock(mu);
      dead = true;
      dead_reason = why;
      e.swap(evals);
      for (auto& [id, r] : replies)
        if (!r) r = failed(ErrorCode::unavailable, why);
    }
    cv.notify_all();
    for (auto& [id, cb] : e) cb(Result{st, {}, why, -1});
  }

  void read_loop() {
    protocol::FrameReader reader;
    std::string why = "the connection to outrund was lost";
    for (;;) {
      const long n = reader.read_from(fd);
      if (n <= 0) break;
      protocol::FrameView fv;
      while (reader.next(fv)) handle(fv.frame);
      if (reader.error() != protocol::FrameError::kNone) {
        why = std::string("outrund sent a bad frame: ") + protocol::to_string(reader.error());
        break;
      }
    }
    alive = false;
    fail_all(closing ? Status::cancelled : Status::unavailable,
             closing ? "the client was closed" : why);
  }
  std::atomic<bool> closing{false};

  void handle(const wire::Frame* f) EXCLUDES(mu, submu) {
    protocol::DaemonMessage m;
    std::string why;
    if (!protocol::decode_daemon_frame(f, &m, &why)) return;  // not for a client: ignored
    if (const auto* results = std::get_if<protocol::ResultsMsg>(&m)) {
      if (!results->items) return;
      protocol::ClientResult r;
      // What this frame's results may decode to, a shared part counted per use
      // (D-result-budget): past it, the rest of the frame's evaluations end runtime_error.
      std::size_t budget = detail::kMaxResultsDecodeBytes;
      static constexpr const char* invalid = "outrund sent an invalid value";
      static constexpr const char* spent =
          "outrund sent results past the decode budget (a shared part counts each time it is "
          "used)";
      for (const wire::Result* item : *results->items) {
        Callback cb;
        {
          MutexLock lock(mu);
          auto it = evals.find(item->id());
          if (it == evals.end()) continue;
          cb = std::move(it->second);
          evals.erase(it);
        }
        protocol::decode_daemon_result(item, &r);
        Result out;
        out.status = static_cast<Status>(r.status);
        const detail::ResultDecode d = detail::decode_result(
            out.status == Status::ok, r.value, r.error, &out.value, &out.error, &budget);
        if (d != detail::ResultDecode::ok)
          out = Result{
              Status::runtime_error, {}, d == detail::ResultDecode::spent ? spent : invalid, -1};
        if (item->logs() || item->logs_dropped()) [[unlikely]] {  // the script printed or logged
          out.logs_dropped = item->logs_dropped();
          detail::decode_logs(item->logs(), &out.logs, &out.logs_dropped, &budget);
        }
        cb(std::move(out));
      }
    } else if (auto* reg = std::get_if<protocol::RegisteredMsg>(&m)) {
      Reply rep;
      rep.error = detail::error_from_wire(reg->status, std::move(reg->error));
      rep.handle = reg->handle64;
      rep.shard = reg->shard;
      if (reg->sha256) rep.sha = *reg->sha256;
      complete(reg->request_id, std::move(rep));
    } else if (auto* reply = std::get_if<protocol::ReplyMsg>(&m)) {
      // Unregistered, ControlReply, TagsReply.
      Reply rep;
      rep.error = detail::error_from_wire(reply->status, std::move(reply->error));
      rep.json = std::string(reply->json);
      complete(reply->request_id, std::move(rep));
    } else if (auto* tv = std::get_if<protocol::TagValuesMsg>(&m)) {
      Reply rep;
      rep.error = detail::error_from_wire(tv->status, std::move(tv->error));
      if (tv->values) {
        std::size_t budget = detail::kMaxResultsDecodeBytes;
        for (const wire::TagValue* v : *tv->values) {
          tags::Change ch;
          if (!detail::decode_tag_entry(v, &ch, &budget, &why)) {
            rep = failed(ErrorCode::protocol_error, "outrund sent an invalid tag value: " + why);
            break;
          }
          rep.values.push_back(std::move(ch));
        }
      }
      complete(tv->request_id, std::move(rep));
    } else if (const auto* changes = std::get_if<protocol::TagChangesMsg>(&m)) {
      const auto* items = changes->changes;
      std::shared_ptr<ChangesCallback> cb;
      {
        MutexLock lock(submu);
        cb = on_changes;
      }
      if (!items || !cb) return;
      std::vector<tags::Change> out;
      out.reserve(items->size());
      std::size_t budget = detail::kMaxResultsDecodeBytes;
      for (const wire::TagValue* v : *items) {
        tags::Change ch;
        if (!detail::decode_tag_entry(v, &ch, &budget, &why)) return;  // dropped
        out.push_back(std::move(ch));
      }
      if (!out.empty()) (*cb)(out);
    }
    // A ServerHello after the connection's first frame is ignored.
  }

  void complete(uint64_t id, Reply&& r) EXCLUDES(mu) {
    {
      MutexLock lock(mu);
      auto it = replies.find(id);
      if (it == replies.end()) return;
      it->second = std::move(r);
    }
    cv.notify_all();
  }

  // Sends the request frame `build(builder, request_id)` returns and waits for its reply.
  template <class Build>
  Reply request(Build&& build) EXCLUDES(mu) {
    uint64_t id;
    {
      MutexLock lock(mu);
      if (dead) return failed(ErrorCode::unavailable, dead_reason);
      id = next_request++;
      replies.emplace(id, std::nullopt);
    }
    flatbuffers::FlatBufferBuilder f(1024);
    const std::span<const uint8_t> frame = build(f, id);
    // outrund would have to drop the whole connection for a frame past kMaxFrameSize: refused
    // here instead, before anything is sent (the connection goes on).
    if (frame.size() > protocol::kLengthPrefixSize + protocol::kMaxFrameSize) {
      {
        MutexLock lock(mu);
        replies.erase(id);
      }
      const auto* root = flatbuffers::GetSizePrefixedRoot<wire::Frame>(frame.data());
      return failed(ErrorCode::invalid_argument,
                    std::string("the ") + wire::EnumNameBody(root->body_type()) +
                        " frame would be " +
                        std::to_string(frame.size() - protocol::kLengthPrefixSize) + " bytes, " +
                        kMoreThanAFrame);
    }
    if (!send(frame)) {
      MutexLock lock(mu);
      replies.erase(id);
      return failed(ErrorCode::unavailable, "cannot write to outrund");
    }
    MutexLock lock(mu);
    const bool got =
        cv.wait_for(mu, reply_timeout, [&]() REQUIRES(mu) { return replies[id].has_value(); });
    Reply r = got ? std::move(*replies[id])
                  : failed(ErrorCode::unavailable, "outrund did not answer in time");
    replies.erase(id);
    return r;
  }

  Reply control(wire::ControlCommand cmd, int shard, std::string_view after = {},
                uint32_t limit = 0, std::string_view key = {}, uint64_t since = 0) {
    return request([&](flatbuffers::FlatBufferBuilder& f, uint64_t id) {
      return protocol::encode_control(f, id, cmd, shard, after, limit, key, since);
    });
  }
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Client::~Client() {
  impl_->closing = true;
  impl_.reset();
}

Error Client::connect(const ClientOptions& options, std::unique_ptr<Client>* out) {
  out->reset();
  const std::string path = options.socket.empty() ? default_client_socket() : options.socket;
  sockaddr_un a{};
  if (path.size() >= sizeof a.sun_path)
    return Error{ErrorCode::invalid_argument, "socket path too long: " + path};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.data(), path.size());
  auto impl = std::make_unique<Impl>();
  impl->reply_timeout = options.reply_timeout;
  impl->fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (impl->fd < 0)
    return Error{ErrorCode::unavailable, std::string("socket: ") + std::strerror(errno)};
  if (::connect(impl->fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
    return Error{ErrorCode::unavailable,
                 "cannot connect to outrund at " + path + ": " + std::strerror(errno)};
  impl->writer.emplace(impl->fd);
  // The socket is the owner's: whoever listens there must run as our uid or as root, else it
  // may be a squatter waiting for our scripts and inputs. Checked before anything is sent.
  {
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(impl->fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
      return Error{ErrorCode::unavailable,
                   "cannot check who listens at " + path + ": " + std::strerror(errno)};
    const auto& want = options.server_uids;
    const bool trusted = want.empty() ? cred.uid == ::geteuid() || cred.uid == 0
                                      : std::find(want.begin(), want.end(), cred.uid) != want.end();
    if (!trusted)
      return Error{ErrorCode::unavailable,
                   "refusing the server at " + path + ": it runs as uid " +
                       std::to_string(cred.uid) + " (pid " + std::to_string(cred.pid) + "), " +
                       (want.empty() ? "neither ours (" + std::to_string(::geteuid()) + ") nor root"
                                     : std::string("not one of ClientOptions::server_uids")) +
                       "; nothing was sent"};
  }

  // Hello, then wait for the daemon's (with a receive timeout, cleared afterwards).
  flatbuffers::FlatBufferBuilder f(256);
  // A daemon that refuses us may have closed before this send: its reason is still readable.
  const bool sent = impl->send(protocol::encode_client_hello(f, options.name));
  timeval tv{};
  tv.tv_sec = options.reply_timeout.count() / 1000;
  tv.tv_usec = (options.reply_timeout.count() % 1000) * 1000;
  ::setsockopt(impl->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  protocol::FrameReader reader(protocol::kMaxFrameSize, 4096);
  protocol::FrameView fv;
  bool got = false;
  while (!got) {
    const long n = reader.read_from(impl->fd);
    if (n <= 0) {
      return Error{ErrorCode::unavailable, n == 0 ? "outrund at " + path + " closed the connection"
                                                  : "no hello from outrund at " + path + ": " +
                                                        std::strerror(static_cast<int>(-n))};
    }
    if (reader.next(fv))
      got = true;
    else if (reader.error() != protocol::FrameError::kNone)
      return Error{ErrorCode::unavailable, "outrund sent a bad frame"};
  }
  protocol::DaemonMessage m;
  std::string why;
  const auto* sh = protocol::decode_daemon_frame(fv.frame, &m, &why)
                       ? std::get_if<protocol::ServerHelloMsg>(&m)
                       : nullptr;
  if (!sh) return Error{ErrorCode::unavailable, "outrund did not answer with its hello"};
  if (sh->error)
    return Error{ErrorCode::unavailable,
                 "outrund refused the connection: " + std::string(*sh->error)};
  if (!sent) return Error{ErrorCode::unavailable, "outrund at " + path + " closed the connection"};
  if (sh->protocol_version != protocol::kProtocolVersion)
    return Error{ErrorCode::unavailable,
                 "outrund speaks protocol " + std::to_string(sh->protocol_version)};
  impl->shards = sh->shards;
  if (reader.buffered() != 0)
    return Error{ErrorCode::unavailable, "outrund sent frames before its hello was answered"};
  tv = timeval{};
  ::setsockopt(impl->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  Impl* raw = impl.get();
  impl->reader_thread = std::thread([raw] { raw->read_loop(); });
  out->reset(new Client(std::move(impl)));
  return {};
}

int Client::shards() const {
  return impl_->shards;
}
bool Client::connected() const {
  return impl_->alive.load();
}

Error Client::register_script(std::string_view key, std::string_view source, Script* out) {
  return register_script(key, source, out, RegisterOptions{});
}

Error Client::register_script(std::string_view key, std::string_view source, Script* out,
                              const RegisterOptions& options) {
  *out = Script();
  // A key of the internal namespace (a tags engine over this client) is this client's own key
  // in the daemon, which refuses the namespace's byte (runner.h kInternalKeyPrefix).
  key = chunk_name_of(key);
  if (key.empty() || key.size() > kMaxKeySize)
    return Error{ErrorCode::invalid_argument,
                 "script key must be 1.." + std::to_string(kMaxKeySize) + " bytes"};
  if (source.size() > kMaxSourceSize)
    return Error{ErrorCode::invalid_argument, "script source larger than 1 MiB"};
  Reply r = impl_->request([&](flatbuffers::FlatBufferBuilder& f, uint64_t id) {
    return protocol::encode_register(f, id, key, source, options.check);
  });
  if (r.error) return std::move(r.error);
  Script dropped;  // released after the lock
  MutexLock lock(impl_->smu);
  auto it = impl_->by_handle.find(r.handle);
  if (it != impl_->by_handle.end() && it->second.sha256() == r.sha && it->second.key() == key) {
    *out = it->second;
    return {};
  }
  auto* rec = new detail::ScriptRecord();
  rec->owner = impl_.get();
  rec->id = static_cast<uint32_t>(r.handle);
  rec->serial = r.handle;  // the daemon's handle (script_record.h)
  rec->shard = static_cast<uint32_t>(std::max(0, r.shard));
  rec->key = std::string(key);
  rec->source = std::string(source);
  rec->sha256 = r.sha;
  rec->chunk_name = rec->key;
  Script script(rec);
  // The daemon retired the key's previous handle (design/daemon.md): forget it here too.
  auto [k, fresh] = impl_->by_key.try_emplace(rec->key, r.handle);
  if (!fresh) {
    if (k->second != r.handle) {
      if (auto old = impl_->by_handle.find(k->second); old != impl_->by_handle.end()) {
        dropped = std::move(old->second);
        impl_->by_handle.erase(old);
      }
    }
    k->second = r.handle;
  }
  impl_->by_handle[r.handle] = script;
  *out = std::move(script);
  return {};
}

Error Client::unregister_script(std::string_view key) {
  key = chunk_name_of(key);  // as register_script
  if (key.empty() || key.size() > kMaxKeySize)
    return Error{ErrorCode::invalid_argument,
                 "script key must be 1.." + std::to_string(kMaxKeySize) + " bytes"};
  Reply r = impl_->request([&](flatbuffers::FlatBufferBuilder& f, uint64_t id) {
    return protocol::encode_unregister(f, id, key);
  });
  if (r.error) return std::move(r.error);
  Script dropped;  // released after the lock
  MutexLock lock(impl_->smu);
  if (auto k = impl_->by_key.find(std::string(key)); k != impl_->by_key.end()) {
    if (auto h = impl_->by_handle.find(k->second); h != impl_->by_handle.end()) {
      const_cast<detail::ScriptRecord*>(h->second.record())->unregistered.store(true);
      dropped = std::move(h->second);
      impl_->by_handle.erase(h);
    }
    impl_->by_key.erase(k);
  }
  return {};
}

void Client::evaluate_batch(std::vector<Request> requests, BatchCallback done) {
  auto shared_done = std::make_shared<BatchCallback>(std::move(done));
  // Thread-local builder: nothing below runs caller code until the frames are sent (failures
  // are completed at the end), so a callback that submits again cannot clobber it.
  static thread_local protocol::HotBuilder f(4096);
  std::vector<flatbuffers::Offset<wire::Evaluation>> items;
  std::vector<std::size_t> in_frame;  // request indices in the frame being built
  std::vector<std::pair<uint64_t, std::size_t>> ids;
  std::vector<std::pair<std::size_t, Result>> failed;
  // Inputs go as an InputList of their own (Evaluation.inputs_buffer), which outrund passes to
  // the worker without decoding: encoded here in a second builder unless they came encoded.
  static thread_local flatbuffers::FlatBufferBuilder list_builder(1024);
  auto add = [&](std::size_t i, uint64_t id, std::string* err) {
    std::span<const uint8_t> bytes;
    if (const EncodedInputs& enc = requests[i].encoded; !enc.empty())
      bytes = detail::bytes_of(enc);
    else if (!requests[i].inputs.empty() &&
             !detail::encode_input_list(list_builder, requests[i].inputs, &bytes, err))
      return false;
    // Inputs within the counted limit may still encode larger (small values take more than
    // the 16 bytes they count for): outrund refuses a buffer past this, so it is not sent.
    if (bytes.size() > protocol::kMaxInputListBytes) {
      *err = "the inputs encode to more than " + std::to_string(protocol::kMaxInputListBytes) +
             " bytes";
      return false;
    }
    const detail::InputBufferOffset buffer =
        bytes.empty() ? detail::InputBufferOffset() : protocol::add_input_list(f, bytes);
    // The 64-bit handle, and its low 32 bits as script_id (design/protocol.md "Handles").
    const uint64_t handle = requests[i].script.record()->serial;
    items.push_back(protocol::build_evaluation(f, id, static_cast<uint32_t>(handle), 0, {}, nullptr,
                                               buffer, handle));
    return true;
  };
  auto flush = [&] {
    if (items.empty()) return;
    bool dead;
    std::string why;
    {
      MutexLock lock(impl_->mu);
      dead = impl_->dead;
      why = impl_->dead_reason;
      if (!dead)
        for (auto& [id, i] : ids)
          impl_->evals.emplace(
              id,
              [shared_done, i = i, shard = static_cast<int>(requests[i].script.shard())](Result r) {
                r.shard = shard;  // the shard the daemon routes this script to
                (*shared_done)(i, std::move(r));
              });
    }
    if (dead) {
      for (auto& [id, i] : ids) failed.emplace_back(i, Result{Status::unavailable, {}, why, -1});
    } else {
      impl_->send(protocol::finish_evaluate(f, items));  // if it fails, the reader fails them
    }
    items.clear();
    in_frame.clear();
    ids.clear();
    f.Clear();
  };
  f.Clear();
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const Script& sc = requests[i].script;
    if (!sc.valid() || sc.record()->owner != impl_.get()) {
      failed.emplace_back(
          i, Result{Status::invalid_argument, {}, "script handle is not from this client", -1});
      continue;
    }
    if (sc.record()->unregistered.load(std::memory_order_relaxed)) {
      failed.emplace_back(
          i,
          Result{Status::invalid_argument, {}, "script '" + sc.key() + "' was unregistered", -1});
      continue;
    }
    uint64_t id;
    {
      MutexLock lock(impl_->mu);
      id = impl_->next_eval++;
    }
    std::string err;
    if (!add(i, id, &err)) {
      // The builder holds garbage: rebuild this frame's earlier items (they encoded before).
      failed.emplace_back(i, Result{Status::invalid_argument, {}, err, -1});
      f.Clear();
      items.clear();
      for (std::size_t k = 0; k < in_frame.size(); ++k) add(in_frame[k], ids[k].first, &err);
      continue;
    }
    in_frame.push_back(i);
    ids.emplace_back(id, i);
    if (f.GetSize() > (4u << 20)) flush();
  }
  flush();
  for (auto& [i, r] : failed) (*shared_done)(i, std::move(r));
}

void Client::evaluate(const Script& script, Inputs inputs, Callback done) {
  std::vector<Request> one;
  one.push_back(Request{script, std::move(inputs)});
  evaluate_batch(std::move(one),
                 [done = std::move(done)](std::size_t, Result r) { done(std::move(r)); });
}

Future Client::evaluate(const Script& script, Inputs inputs) {
  auto p = std::make_shared<detail::Promise>();
  Future fut = p->future();
  evaluate(script, std::move(inputs), [p](Result r) { p->set(std::move(r)); });
  return fut;
}

namespace {
Error to_error(const Reply& r) {
  return r.error;
}
}  // namespace

Error Client::stats_json(std::string* out) {
  Reply r = impl_->control(wire::ControlCommand::Stats, 0);
  *out = r.json;
  return to_error(r);
}
Error Client::shards_json(std::string* out) {
  Reply r = impl_->control(wire::ControlCommand::Shards, 0);
  *out = r.json;
  return to_error(r);
}
Error Client::scripts_page_json(std::string_view after, uint32_t limit, std::string* out) {
  Reply r = impl_->control(wire::ControlCommand::ListScripts, 0, after, limit);
  *out = std::move(r.json);
  return to_error(r);
}
namespace {
// A ScriptLogs/TagLogs document (design/protocol.md "Script logs") into a LogPage.
Error parse_log_page(const std::string& json, LogPage* out) {
  const auto doc = nlohmann::json::parse(json, nullptr, false);
  const auto bad =
      Error{ErrorCode::protocol_error, "outrund sent a log page that is not valid JSON"};
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("lines") || !doc["lines"].is_array())
    return bad;
  *out = LogPage{};
  out->next = doc.value("next", uint64_t{1});
  out->missed = doc.value("missed", uint64_t{0});
  out->dropped = doc.value("dropped", uint64_t{0});
  for (const auto& l : doc["lines"]) {
    if (!l.is_object()) return bad;
    LogRecord& r = out->lines.emplace_back();
    r.seq = l.value("seq", uint64_t{0});
    DateTime t;
    if (parse_datetime(l.value("time", std::string()), &t)) r.unix_us = t.unix_micros();
    const std::string level = l.value("level", std::string("info"));
    r.level = level == "debug"   ? LogLevel::debug
              : level == "warn"  ? LogLevel::warn
              : level == "error" ? LogLevel::error
                                 : LogLevel::info;
    r.text = l.value("text", std::string());
  }
  return {};
}
}  // namespace

Error Client::script_logs_json(std::string_view key, uint64_t since, std::string* out) {
  Reply r = impl_->control(wire::ControlCommand::ScriptLogs, 0, {}, 0, key, since);
  *out = std::move(r.json);
  return to_error(r);
}
Error Client::tag_logs_json(std::string_view id, uint64_t since, std::string* out) {
  Reply r = impl_->control(wire::ControlCommand::TagLogs, 0, {}, 0, id, since);
  *out = std::move(r.json);
  return to_error(r);
}
Error Client::script_logs(std::string_view key, uint64_t since, LogPage* out) {
  std::string json;
  if (Error e = script_logs_json(key, since, &json)) return e;
  return parse_log_page(json, out);
}
Error Client::tag_logs(std::string_view id, uint64_t since, LogPage* out) {
  std::string json;
  if (Error e = tag_logs_json(id, since, &json)) return e;
  return parse_log_page(json, out);
}

Error Client::scripts_json(std::string* out) {
  out->assign("{\"scripts\":[");
  std::string after, page;
  bool first = true;
  for (;;) {
    if (Error e = scripts_page_json(after, 10000, &page)) return e;
    const auto doc = nlohmann::json::parse(page, nullptr, false);
    if (doc.is_discarded() || !doc.is_object())
      return {ErrorCode::protocol_error, "outrund sent a ListScripts page that is not JSON"};
    if (auto s = doc.find("scripts"); s != doc.end() && s->is_array()) {
      for (const auto& item : *s) {
        if (!first) *out += ',';
        first = false;
        *out += item.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      }
    }
    auto next = doc.find("next");  // absent: a daemon from before paging (one page)
    if (next == doc.end() || !next->is_string()) break;
    if (next->get<std::string>() == after)
      return {ErrorCode::protocol_error, "outrund sent the same ListScripts cursor twice"};
    after = next->get<std::string>();
  }
  *out += "]}";
  return {};
}
Error Client::kill_shard(int shard) {
  return to_error(impl_->control(wire::ControlCommand::KillShard, shard));
}
Error Client::restart_shard(int shard) {
  return to_error(impl_->control(wire::ControlCommand::RestartShard, shard));
}

namespace {
Error check_ids(const std::vector<std::string>& ids) {
  if (ids.size() > detail::kMaxTagIdsPerFrame)
    return Error{ErrorCode::invalid_argument,
                 "more than " + std::to_string(detail::kMaxTagIdsPerFrame) + " ids in one call"};
  for (const auto& id : ids)
    if (id.empty() || id.size() > tags::kMaxTagIdSize)
      return Error{ErrorCode::invalid_argument,
                   "a tag id must be 1.." + std::to_string(tags::kMaxTagIdSize) + " bytes"};
  return {};
}
// The strings, bytes and keys of `v` (a lower bound of what it takes in a frame), counted into
// `*n` until it passes `limit`.
void add_payload(const Value& v, std::size_t* n, std::size_t limit) {
  if (*n > limit) return;
  if (const auto* s = std::get_if<std::string>(&v.v)) {
    *n += s->size();
  } else if (const auto* b = std::get_if<Bytes>(&v.v)) {
    *n += b->data.size();
  } else if (const auto* a = std::get_if<Array>(&v.v)) {
    for (const auto& x : *a) add_payload(x, n, limit);
  } else if (const auto* m = std::get_if<Map>(&v.v)) {
    for (const auto& e : *m) {
      *n += e.key.size();
      add_payload(e.value, n, limit);
    }
  }
}
}  // namespace

Error Client::define_tags(std::string_view toml, bool replace_all, std::string* json) {
  if (toml.size() > protocol::kMaxFrameSize)
    return Error{ErrorCode::invalid_argument,
                 "the tags text is " + std::to_string(toml.size()) + " bytes, " + kMoreThanAFrame};
  Reply r = impl_->request([&](flatbuffers::FlatBufferBuilder& f, uint64_t id) {
    return protocol::encode_define_tags(f, id, toml, replace_all);
  });
  if (json) *json = r.json;
  return to_error(r);
}

Error Client::remove_tags(const std::vector<std::string>& ids) {
  if (Error e = check_ids(ids)) return e;
  Reply r = impl_->request([&](flatbuffers::FlatBufferBuilder& f, uint64_t id) {
    return protocol::encode_remove_tags(f, id, ids);
  });
  return to_error(r);
}

Error Client::list_tags_json(std::string* out) {
  Reply r = impl_->request([&](flatbuffers::FlatBufferBuilder& f, uint64_t id) {
    return protocol::encode_list_tags(f, id);
  });
  *out = r.json;
  return to_error(r);
}

Error Client::update_sources(const std::vector<tags::SourceUpdate>& updates, DateTime time) {
  if (updates.size() > detail::kMaxUpdatesPerFrame)
    return Error{
        ErrorCode::invalid_argument,
        "more than " + std::to_string(detail::kMaxUpdatesPerFrame) + " updates in one wave"};
  // Strings, bytes, keys, ids and diagnostics past a frame are refused before encoding; the
  // encoded frame is checked exactly by request().
  std::size_t payload = 0;
  for (const auto& u : updates) {
    if (u.tag.empty() || u.tag.size() > tags::kMaxTagIdSize)
      return Error{ErrorCode::invalid_argument,
                   "a tag id must be 1.." + std::to_string(tags::kMaxTagIdSize) + " bytes"};
    payload += u.tag.size() + u.value.diagnostics.size();
    add_payload(u.value.value, &payload, protocol::kMaxFrameSize);
    if (payload > protocol::kMaxFrameSize)
      return Error{ErrorCode::invalid_argument,
                   "the updates hold more than " + std::to_string(protocol::kMaxFrameSize) +
                       " bytes of strings, bytes and ids: " + kMoreThanAFrame};
  }
  Reply r = impl_->request([&](flatbuffers::FlatBufferBuilder& f, uint64_t id) {
    std::vector<flatbuffers::Offset<wire::TagValue>> v;
    v.reserve(updates.size());
    for (const auto& u : updates) v.push_back(detail::encode_tag_entry(f, u.tag, u.value));
    return protocol::encode_source_updates(f, id, time.ticks, v);
  });
  return to_error(r);
}

Error Client::read_tags(const std::vector<std::string>& ids, std::vector<tags::Change>* out) {
  out->clear();
  if (Error e = check_ids(ids)) return e;
  Reply r = impl_->request([&](flatbuffers::FlatBufferBuilder& f, uint64_t id) {
    return protocol::encode_read_tags(f, id, ids);
  });
  if (!r.error) *out = std::move(r.values);
  return to_error(r);
}

Error Client::subscribe(const std::vector<std::string>& ids, ChangesCallback on_changes) {
  if (Error e = check_ids(ids)) return e;
  {
    MutexLock lock(impl_->submu);
    impl_->on_changes = std::make_shared<ChangesCallback>(std::move(on_changes));
  }
  Reply r = impl_->request([&](flatbuffers::FlatBufferBuilder& f, uint64_t id) {
    return protocol::encode_subscribe(f, id, ids, false);
  });
  return to_error(r);
}

Error Client::unsubscribe(const std::vector<std::string>& ids) {
  if (Error e = check_ids(ids)) return e;
  Reply r = impl_->request([&](flatbuffers::FlatBufferBuilder& f, uint64_t id) {
    return protocol::encode_subscribe(f, id, ids, true);
  });
  return to_error(r);
}

}  // namespace outrun

// fuzz_daemon_client: outrund reading frames from a client connection. The fuzz input is what an
// arbitrary local process writes to the daemon's socket. The daemon is the real Server
// (host/daemon/server.cpp, compiled into this binary) with a real outrun::Host and real workers,
// created once and kept across inputs like a long-running daemon; each input is one more client:
// a real connect(2) to its listening socket, the real accept/SO_PEERCRED check, and the loop's
// own read, verify and frame handling (conn_event, handle_frames, handle_frame, close_conn,
// the FrameWriter and the Host's result callbacks). ServerTestAccess (a friend declared in
// server.h, defined here) only does what Server::run() does around the loop, minus signals.
//
// Bounded per input (reasoned in design/fuzzing.md): the daemon's T is 1 ms and G 50 ms (a
// client cannot choose timeouts: the daemon ignores Evaluation.timeout_us); inputs with more than
// 256 frames, 64 evaluations, 16 registrations or 100,000 input values (shared subtrees counted
// per reference), sources naming a Lua pattern function, or a KillShard/RestartShard of a real
// shard, are refused (return -1: not run, not kept).
//
// Checked, against an independent reading of design/protocol.md ("Client frames"): the daemon
// never crashes; ServerHello first, with the configured shards and max_inflight; a frame that
// breaks the rules (anything before ClientHello, a wrong version -- answered ServerHello{error}
// --, a second hello, a frame only the daemon sends, a bad length or a frame that fails
// verification) closes this connection and counts one violation, and a clean stream never does;
// Registered and ControlReply come in request order with the request ids, the right status, the
// SHA-256 of the source, the same handle for a key registered again with the same source and
// a new one for new source; every evaluation of the valid frames
// is answered exactly once (at most once when the connection was closed for a violation, since
// the daemon then drops what is in flight), never NeedSource, InvalidArgument for handles no
// registry can hold, never InvalidArgument for a known handle with acceptable inputs, Ok values
// the host accepts; Stats/Shards/ListScripts JSON parses and Stats sees this one client; the
// daemon's in-flight counter never passes max_inflight_per_client; everything it writes is
// verified frames (a frame cut at the end only after a violation); after the connection closes,
// the Conn is freed (its fd closed), the daemon has no connection and nothing in flight.
#include <fcntl.h>
#include <linux/sockios.h>
#include <openssl/sha.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_support.h"
#include "server.h"
#include "tags_lane.h"
#include "value_oracle.h"

namespace outrun::daemon {

struct ServerTestAccess {
  // Server::run() and start_serving(), without signals, logs and sd_notify, on a loop of its own
  // (the harness runs it step by step on this thread).
  static Error start(Server& s) {
    loop_thread.bind_to_current_thread();  // this thread runs the loop (uv_run below)
    loop_thread.assert_here();
    s.started_ = std::chrono::steady_clock::now();
    if (s.cfg_.host.callbacks_on_loop)
      s.cfg_.host.after_loop_callbacks = [&s] { s.flush_corked(); };
    if (Error e = Host::create(s.cfg_.host, &s.host_)) return e;
    s.counters_.shards = s.host_->shards();
    s.counters_.shard_latency = std::make_unique<LatencyHistogram[]>(s.counters_.shards);
    s.init_scheduler();
    if (s.tags_.start(*s.host_, [&s](Request rq, Callback done) {
          s.submit_tag_evaluation(std::move(rq), std::move(done));
        }) != 0)
      return Error{ErrorCode::unavailable, "the tags engine did not start"};
    std::string err;
    if (!s.acceptor_.open(&err)) return Error{ErrorCode::unavailable, err};
    s.loop_ = &s.own_loop_;  // outrund runs on the Host's loop; here its own, on this thread
    uv_loop_init(s.loop_);
    s.loop_->data = &s;
    s.acceptor_.start(s.loop_);
    s.life_.advance(Lifecycle::State::kListening);
    uv_async_init(s.loop_, &s.async_, &Server::on_async);
    s.async_.data = &s;
    s.start_refill_check();
    {
      MutexLock lock(s.wake_mu_);
      s.wake_open_ = true;
    }
    uv_timer_init(s.loop_, &s.drain_timer_);
    s.drain_timer_.data = &s;
    return {};
  }

  // What finish() and the end of run() do, for a daemon with no connection left.
  static void stop(Server& s) {
    loop_thread.assert_here();
    FUZZ_CHECK(s.conns_.empty());
    s.acceptor_.close();                           // the socket file goes
    s.life_.advance(Lifecycle::State::kFinished);  // no drain: no connection is left
    uv_close(reinterpret_cast<uv_handle_t*>(&s.drain_timer_), nullptr);
    s.close_refill_check();
    {
      MutexLock lock(s.wake_mu_);
      s.wake_open_ = false;
      s.want_write_.clear();
      uv_close(reinterpret_cast<uv_handle_t*>(&s.async_), nullptr);
    }
    uv_run(s.loop_, UV_RUN_DEFAULT);
    s.tags_.stop();
    s.destroy_host();
    FUZZ_CHECK(uv_loop_close(s.loop_) == 0);
  }

  static uv_loop_t* loop(Server& s) {
    loop_thread.assert_here();
    return s.loop_;
  }
  static std::size_t conns(const Server& s) {
    loop_thread.assert_here();
    return s.conns_.size();
  }
  static uint64_t next_conn_id(const Server& s) {
    loop_thread.assert_here();
    return s.next_conn_id_;
  }
  static std::weak_ptr<Conn> conn(const Server& s) {
    loop_thread.assert_here();
    FUZZ_CHECK(s.conns_.size() == 1);
    return s.conns_.begin()->second;
  }
  static uint64_t inflight(const Server& s) {
    return s.counters_.inflight.load(std::memory_order_relaxed);
  }
  static uint64_t violations(const Server& s) {
    loop_thread.assert_here();
    return s.violations_;
  }
  static std::size_t scripts(const Server& s) {
    loop_thread.assert_here();
    return s.scripts_.size();
  }
};

}  // namespace outrun::daemon

using namespace outrun;
using namespace outrun::fuzz;
using daemon::ServerTestAccess;

namespace {

constexpr std::size_t kMaxInput = 16384;
constexpr std::size_t kMaxFrames = 256;
constexpr std::size_t kMaxEvaluations = 64;
constexpr std::size_t kMaxRegisters = 16;
constexpr std::size_t kMaxValues = 100000;
constexpr uint32_t kMaxInflight = 4;
constexpr int kShards = 2;
constexpr int kWorkerShards = kShards + 1;  // the slow lane is the last (D-slow-lane)
// The registry only grows (and each worker keeps a state per script it ran): a fresh daemon
// once it holds this many scripts.
constexpr std::size_t kRecycleScripts = 1024;
constexpr auto kDeadline = std::chrono::seconds(20);

// Registered by every fresh daemon, in this order: handles 0..N-1, which the seeds use (a
// client registering the same key and source gets the same handle).
struct FixedScript {
  const char* key;
  const char* source;
};
constexpr FixedScript kFixed[] = {
    {"fuzz.sum", "return (inputs.a or 0) + (inputs.b or 0)"},
    {"fuzz.echo", "return inputs"},
    {"fuzz.loop", "while true do end"},
    {"fuzz.error", "error('boom')"},
    {"fuzz.memory", "local t = {} for i = 1, 1e9 do t[i] = ('x'):rep(64) end"},
    {"fuzz.compile_error", "return ("},
    {"fuzz.global", "n = (n or 0) + 1 return n"},
    {"fuzz.function", "return function() end"},
};
constexpr uint32_t kFixedCount = std::size(kFixed);

bool verbose() {
  return std::getenv("OUTRUN_FUZZ_VERBOSE") != nullptr;
}

// ---------------------------------------------------------------------------------------------
// What the stream asks for, read independently of the daemon (design/protocol.md).

struct Request {  // a Register, an Unregister or a Control, answered in order
  wire::Body type{};
  uint64_t request_id = 0;
  // Register, Unregister (key only)
  bool has_key = false, has_source = false;
  std::string key, source;
  // Control
  wire::ControlCommand command{};
  int32_t shard = 0;
  std::string after;  // ListScripts paging: absent reads as empty (the first page)
  uint32_t limit = 0;
};

// Whether `s` is a ListScripts cursor as design/protocol.md "Paged ListScripts" spells it:
// empty, or HEX(key):N with the key 1..256 bytes in lower-case hex and N a u32 in 1..10 digits.
bool cursor_ok(std::string_view s) {
  if (s.empty()) return true;
  const std::size_t colon = s.find(':');
  if (colon == std::string_view::npos || colon == 0 || colon % 2 || colon > 512) return false;
  for (std::size_t i = 0; i < colon; ++i)
    if (!std::isdigit(static_cast<unsigned char>(s[i])) && (s[i] < 'a' || s[i] > 'f')) return false;
  const std::string_view n = s.substr(colon + 1);
  if (n.empty() || n.size() > 10) return false;
  for (char c : n)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return std::stoull(std::string(n)) <= UINT32_MAX;
}

struct Evaluation {
  uint64_t id;
  uint64_t handle;  // handle64, or script_id when it is 0 (design/protocol.md "Handles")
  std::size_t requests_before;  // Register/Control requests earlier in the stream
  bool inputs_ok;               // every input a value the host accepts, not too many
};

struct Expectation {
  bool hello = false;        // a ClientHello with the right version was handled
  bool violation = false;    // the daemon must close the connection
  bool bad_version = false;  // ... after a ServerHello{error}
  uint16_t version = 0;      // the client's ClientHello.protocol_version, when accepted
  bool unregisters = false;  // the stream unregisters keys: the next input gets a fresh daemon
  // Tags frames (design/protocol.md "Tags frames"): answered by TagsReply/TagValues, and
  // TagChanges may be pushed; their count is not modelled (only: verified frames, no crash,
  // violations as for the other frames). The next input gets a fresh daemon.
  bool tags = false;
  std::vector<Request> requests;
  std::vector<Evaluation> evaluations;
  std::size_t replies() const {  // frames and results a clean stream gets back
    return (hello ? 1 : 0) + requests.size() + evaluations.size();
  }
};

// What a value costs the daemon's per-frame decode budget and the host's per-evaluation input
// budget, as protocol.md states them: 16 bytes per value plus its string or bytes, a map's keys,
// and its items, a shared subtree once per use.
std::size_t value_cost(const wire::Value* v) {
  if (v == nullptr) return 16;
  std::size_t n = 16;
  switch (v->kind()) {
    case wire::ValueKind::String:
      return n + (v->string_value() ? v->string_value()->size() : 0);
    case wire::ValueKind::Bytes:
      return n + (v->bytes_value() ? v->bytes_value()->size() : 0);
    case wire::ValueKind::Map:
      if (v->keys())
        for (const auto* k : *v->keys()) n += k->size();
      [[fallthrough]];
    case wire::ValueKind::Array:
      if (v->items())
        for (const auto* it : *v->items()) n += value_cost(it);
      return n;
    default:
      return n;
  }
}

// Counts value nodes (a shared subtree once per reference); false past kMaxValues.
bool count_values(const wire::Value* v, std::size_t* n, int depth = 0) {
  if (++*n > kMaxValues) return false;
  if (v == nullptr || depth > 64) return true;
  // Only a container's items: in a nested InputList nothing else was verified.
  if (v->kind() != wire::ValueKind::Array && v->kind() != wire::ValueKind::Map) return true;
  if (const auto* items = v->items())
    for (const auto* it : *items)
      if (!count_values(it, n, depth + 1)) return false;
  return true;
}

bool names_pattern_function(std::string_view s) {
  return s.find("find") != s.npos || s.find("match") != s.npos || s.find("gsub") != s.npos;
}

// Returns false to refuse the input (see the top of the file).
bool expect(std::span<const uint8_t> stream, Expectation* x) {
  const StreamModel m = model_stream(stream);
  if (m.frames.size() > kMaxFrames) return false;
  std::size_t values = 0, registers = 0;
  for (const auto& f : m.frames) {
    Aligned copy(stream.subspan(f.offset, f.size));
    const wire::Frame* frame = protocol::verify_frame(copy.data(), f.size);
    FUZZ_CHECK(frame != nullptr);
    if (!x->hello) {
      if (f.body != wire::Body::ClientHello) {
        x->violation = true;
        return true;
      }
      const uint16_t v = frame->body_as_ClientHello()->protocol_version();
      if (v < protocol::kMinClientProtocolVersion || v > protocol::kProtocolVersion) {
        x->violation = x->bad_version = true;
        return true;
      }
      x->version = v;
      x->hello = true;
      continue;
    }
    switch (f.body) {
      case wire::Body::Register: {
        if (++registers > kMaxRegisters) return false;
        const auto* r = frame->body_as_Register();
        Request q;
        q.type = wire::Body::Register;
        q.request_id = r->request_id();
        if ((q.has_key = r->key() != nullptr)) q.key = r->key()->str();
        if ((q.has_source = r->source() != nullptr)) q.source = r->source()->str();
        // Pattern matching can run for minutes in one C call, which only the hard kill at T+G
        // ends (and each kill delays the shard's restart); fuzz_compile fuzzes it bounded.
        if (names_pattern_function(q.source)) return false;
        x->requests.push_back(std::move(q));
        break;
      }
      case wire::Body::Unregister: {
        if (++registers > kMaxRegisters) return false;
        const auto* u = frame->body_as_Unregister();
        Request q;
        q.type = wire::Body::Unregister;
        q.request_id = u->request_id();
        if ((q.has_key = u->key() != nullptr)) q.key = u->key()->str();
        x->unregisters = true;
        x->requests.push_back(std::move(q));
        break;
      }
      case wire::Body::Control: {
        const auto* c = frame->body_as_Control();
        Request q;
        q.type = wire::Body::Control;
        q.request_id = c->request_id();
        q.command = c->command();
        q.shard = c->shard();
        if (c->after()) q.after = c->after()->str();
        q.limit = c->limit();
        // A drill on a real shard restarts a worker, and quick deaths double its restart delay
        // up to 5 s: refused; out-of-range shards go through (InvalidArgument).
        if ((q.command == wire::ControlCommand::KillShard ||
             q.command == wire::ControlCommand::RestartShard) &&
            q.shard >= 0 && q.shard < kWorkerShards)
          return false;
        x->requests.push_back(std::move(q));
        break;
      }
      case wire::Body::Evaluate: {
        const auto* items = frame->body_as_Evaluate()->items();
        if (!items) break;
        std::size_t frame_cost = 0;  // against the daemon's decode budget of kMaxFrameSize
        std::size_t copy_cost = 0;   // the frame's inputs_buffers, each use (also kMaxFrameSize)
        for (const wire::Evaluation* e : *items) {
          if (x->evaluations.size() == kMaxEvaluations) return false;
          // Protocol 2's nested InputList (verified and checked with one evaluation's limits;
          // its names and absent values count against the frame too) or protocol 1's inputs.
          const wire::InputList* list = nullptr;
          const bool nested_ok = protocol::evaluation_input_list(e, &list);
          if (e->inputs_buffer()) copy_cost += e->inputs_buffer()->size();
          const auto* ins = list ? list->inputs() : e->inputs_buffer() ? nullptr : e->inputs();
          bool ok = nested_ok && (!ins || ins->size() <= kMaxInputs);
          std::size_t host_cost = 0;  // against the host's kMaxInputBytes per evaluation
          if (ins) {
            for (const wire::Input* in : *ins) {
              if (!count_values(in->value(), &values)) return false;
              ok = ok && host_accepts(in->value());
              host_cost += in->name()->size();
              if (list) frame_cost += in->name()->size() + (in->value() ? 0 : 16);
              if (in->value()) {
                const std::size_t c = value_cost(in->value());
                host_cost += c;
                frame_cost += c;
              }
            }
          }
          // Past either budget the evaluation may end InvalidArgument (the frame's budget, once
          // spent, refuses every later evaluation of the frame that has an input value).
          ok = ok && host_cost <= detail::kMaxInputBytes && frame_cost <= protocol::kMaxFrameSize &&
               copy_cost <= protocol::kMaxFrameSize;
          x->evaluations.push_back(
              {e->id(), e->handle64() ? e->handle64() : e->script_id(), x->requests.size(), ok});
        }
        break;
      }
      case wire::Body::DefineTags:
      case wire::Body::RemoveTags:
      case wire::Body::ListTags:
      case wire::Body::SourceUpdates:
      case wire::Body::Subscribe:
      case wire::Body::ReadTags:
        x->tags = x->unregisters = true;
        break;
      default:  // a second hello, or a frame only the daemon sends
        x->violation = true;
        return true;
    }
  }
  if (m.error != protocol::FrameError::kNone) x->violation = true;
  return true;
}

// ---------------------------------------------------------------------------------------------
// The daemon

struct Daemon {
  std::string dir, socket;
  std::unique_ptr<daemon::Server> server;
};
Daemon* g_daemon = nullptr;

daemon::DaemonConfig config(const std::string& socket) {
  daemon::DaemonConfig cfg;
  cfg.socket = socket;
  cfg.socket_mode = 0600;
  cfg.allowed_uids = {static_cast<uint32_t>(getuid())};
  cfg.uids_set = true;
  cfg.max_clients = 4;
  cfg.max_inflight_per_client = kMaxInflight;
  cfg.log_level = "off";
  cfg.host.shards = kShards;
  cfg.host.timeout = std::chrono::milliseconds(1);
  cfg.host.grace = std::chrono::milliseconds(50);
  cfg.host.memory_limit = 1u << 20;
  cfg.host.worker_path = OUTRUN_FUZZ_WORKER;
  cfg.host.restart_delay = std::chrono::milliseconds(1);
  cfg.host.shutdown_timeout = std::chrono::milliseconds(500);
  // Registrations are expected Ok until the daemon is recycled: no per-uid quota below the
  // registry's own limit (which no input reaches either).
  cfg.max_registry_bytes_per_uid = cfg.host.max_script_bytes;
  return cfg;
}

using Frames = std::vector<ByteVec>;

ByteVec finish(flatbuffers::FlatBufferBuilder& f, wire::Body type, flatbuffers::Offset<void> body) {
  const auto frame = protocol::finish_frame(f, type, body);
  return ByteVec(frame.begin(), frame.end());
}

// One client: connects, writes `stream` while reading, waits for the answers (or for the daemon
// to close the connection when `x` says it must), half-closes, reads to the end. Returns the
// frames the daemon wrote; *cut: bytes of a frame cut at the end.
Frames converse(daemon::Server& s, std::span<const uint8_t> stream, const Expectation& x,
                std::size_t* cut) {
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  const uint64_t violations0 = ServerTestAccess::violations(s);
  FUZZ_CHECK(ServerTestAccess::conns(s) == 0);
  FUZZ_CHECK(ServerTestAccess::inflight(s) == 0);
  uv_loop_t* loop = ServerTestAccess::loop(s);

  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  FUZZ_CHECK(fd >= 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, g_daemon->socket.data(), g_daemon->socket.size());
  FUZZ_CHECK(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  // Accepted before anything is written, so the Conn can be watched to its end.
  while (ServerTestAccess::conns(s) == 0) {
    FUZZ_CHECK(std::chrono::steady_clock::now() < deadline);
    uv_run(loop, UV_RUN_ONCE);
  }
  const std::weak_ptr<daemon::Conn> conn = ServerTestAccess::conn(s);

  protocol::FrameReader reader;
  Frames frames;
  std::size_t replies = 0, sent = 0;
  bool shut = false, eof = false;
  while (!eof) {
    FUZZ_CHECK(std::chrono::steady_clock::now() < deadline);
    if (sent < stream.size()) {
      const ssize_t n = ::send(fd, stream.data() + sent, stream.size() - sent, MSG_NOSIGNAL);
      if (n > 0)
        sent += static_cast<std::size_t>(n);
      else if (errno == EPIPE || errno == ECONNRESET)
        sent = stream.size();  // the daemon closed the connection; the rest is never read
      else
        FUZZ_CHECK(errno == EAGAIN);
    }
    for (;;) {
      uint8_t buf[64 * 1024];
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n == 0 || (n < 0 && errno == ECONNRESET)) {
        eof = true;
        break;
      }
      if (n < 0) {
        FUZZ_CHECK(errno == EAGAIN);
        break;
      }
      reader.append({buf, static_cast<std::size_t>(n)});
      protocol::FrameView fv;
      while (reader.next(fv)) {
        const wire::Frame* f = fv.frame;
        replies += f->body_type() == wire::Body::Results && f->body_as_Results()->items()
                       ? f->body_as_Results()->items()->size()
                       : 1;
        frames.emplace_back(fv.bytes.begin(), fv.bytes.end());
      }
      // Everything the daemon writes is a frame that verifies.
      FUZZ_CHECK(reader.error() == protocol::FrameError::kNone);
    }
    FUZZ_CHECK(ServerTestAccess::inflight(s) <= kMaxInflight);
    // A clean stream: once every answer is in and the daemon has read everything, the client
    // leaves (the daemon then closes on end of stream).
    int unread = 0;
    if (!shut && !eof && !x.violation && sent == stream.size() && replies >= x.replies() &&
        ::ioctl(fd, SIOCOUTQ, &unread) == 0 && unread == 0 && ServerTestAccess::inflight(s) == 0) {
      FUZZ_CHECK(::shutdown(fd, SHUT_WR) == 0);
      shut = true;
    }
    if (eof) break;
    uv_run(loop, UV_RUN_NOWAIT);
    pollfd p[2] = {{fd, static_cast<short>(POLLIN | (sent < stream.size() ? POLLOUT : 0)), 0},
                   {uv_backend_fd(loop), POLLIN, 0}};
    const int t = uv_backend_timeout(loop);
    ::poll(p, 2, t < 0 || t > 5 ? 5 : t);
  }
  ::close(fd);
  if (verbose())
    std::fprintf(stderr,
                 "hello %d violation %d: %zu requests, %zu evaluations; %zu frames, %zu replies, "
                 "%zu bytes cut\n",
                 x.hello, x.violation, x.requests.size(), x.evaluations.size(), frames.size(),
                 replies, reader.buffered());
  // The daemon closed the connection exactly when the stream broke a rule.
  FUZZ_CHECK(x.violation ? !shut : shut);
  FUZZ_CHECK(ServerTestAccess::violations(s) == violations0 + (x.violation ? 1 : 0));
  // The fd closes in ~Conn, after the last callback: the connection is gone, nothing in flight.
  // A DefineTags/RemoveTags job on the tags thread holds the connection until it has answered.
  for (int i = 0; x.tags && !conn.expired() && i < 20000; ++i) {
    uv_run(loop, UV_RUN_NOWAIT);
    ::usleep(500);
  }
  FUZZ_CHECK(conn.expired());
  FUZZ_CHECK(ServerTestAccess::conns(s) == 0);
  FUZZ_CHECK(ServerTestAccess::inflight(s) == 0);
  *cut = reader.buffered();
  return frames;
}

// Set by check_answers when the daemon must start afresh before the next input: a key known here
// (a fixed one too) got a new record, whose registration dropped the old handle, or an id was
// reused often (a protocol 1 or 2 client gets no handle past 1,023 reuses of an id).
bool g_restart = false;

// Checks the daemon's answers against the expectation. Returns the handles of the registrations
// the daemon accepted (for the start-up registrations).
std::vector<uint64_t> check_answers(const Frames& frames, std::size_t cut, const Expectation& x) {
  // A frame cut at the end: only when the daemon dropped its queue at a violation.
  if (cut > 0) FUZZ_CHECK(x.violation);
  std::size_t next_request = 0;
  std::map<uint64_t, std::size_t> pending;  // evaluation id -> answers still due
  for (const auto& e : x.evaluations) ++pending[e.id];
  std::size_t answered = 0;
  std::map<std::string, std::pair<std::string, uint64_t>> last;  // key -> its last registration
  std::vector<uint64_t> registered;
  std::vector<std::vector<uint64_t>> known(1);  // known[k]: valid handles after k requests
  for (uint32_t h = 0; h < kFixedCount; ++h) known[0].push_back(h);
  std::map<uint64_t, std::string> handle_key;  // the key of each handle known here
  for (uint32_t h = 0; h < kFixedCount; ++h) handle_key[h] = kFixed[h].key;

  for (std::size_t i = 0; i < frames.size(); ++i) {
    Aligned copy(frames[i]);
    const wire::Frame* f = protocol::verify_frame(copy.data(), copy.size());
    FUZZ_CHECK(f != nullptr);
    touch_frame(f);
    if (i == 0) {
      FUZZ_CHECK(f->body_type() == wire::Body::ServerHello);
      const auto* h = f->body_as_ServerHello();
      // Answered in the client's version; a refusal in outrund's own.
      FUZZ_CHECK(h->protocol_version() == (x.bad_version ? protocol::kProtocolVersion : x.version));
      if (x.bad_version) {
        FUZZ_CHECK(h->error() != nullptr && h->error()->size() > 0);
        FUZZ_CHECK(frames.size() == 1);
      } else {
        FUZZ_CHECK(x.hello);
        FUZZ_CHECK(h->error() == nullptr);
        FUZZ_CHECK(h->shards() == kWorkerShards);
        FUZZ_CHECK(h->max_inflight() == kMaxInflight);
      }
      continue;
    }
    switch (f->body_type()) {
      case wire::Body::Registered: {
        FUZZ_CHECK(next_request < x.requests.size());
        const Request& q = x.requests[next_request++];
        FUZZ_CHECK(q.type == wire::Body::Register);
        const auto* r = f->body_as_Registered();
        FUZZ_CHECK(r->request_id() == q.request_id);
        known.push_back(known.back());
        const bool valid = q.has_key && q.has_source && !q.key.empty() &&
                           q.key.size() <= kMaxKeySize && q.source.size() <= kMaxSourceSize &&
                           !is_internal_key(q.key);  // the tags' namespace (runner.h)
        if (!valid) {
          FUZZ_CHECK(r->status() == wire::Status::InvalidArgument);
          FUZZ_CHECK(r->error() != nullptr && r->error()->size() > 0);
          break;
        }
        FUZZ_CHECK(r->status() == wire::Status::Ok);
        FUZZ_CHECK(r->error() == nullptr);
        // Record ids stay below what a daemon that is recycled at kRecycleScripts entries holds;
        // the high bits are the generation of a reused id (design/daemon.md).
        FUZZ_CHECK((r->handle64() & daemon::kHandleIdMask) < kRecycleScripts + 2 * kMaxRegisters);
        // Protocols 1 and 2 get its 32-bit form, protocol 3 none (design/protocol.md "Handles").
        FUZZ_CHECK(r->handle() ==
                   (x.version < 3 ? static_cast<uint32_t>(r->handle64()) : uint32_t{0}));
        FUZZ_CHECK(r->shard() >= 0 && r->shard() < kShards);
        std::array<uint8_t, 32> sha;
        SHA256(reinterpret_cast<const unsigned char*>(q.source.data()), q.source.size(),
               sha.data());
        FUZZ_CHECK(r->sha256() != nullptr && r->sha256()->size() == 32);
        FUZZ_CHECK(std::memcmp(r->sha256()->data(), sha.data(), 32) == 0);
        // A key registered again with the source it last had keeps its handle; with other
        // source it gets a new one (outrun::Runner::register_script). Only this input's own
        // registrations count: earlier clients may have replaced any key, the fixed ones too.
        if (const auto it = last.find(q.key); it != last.end()) {
          if (it->second.first == q.source)
            FUZZ_CHECK(r->handle64() == it->second.second);
          else
            FUZZ_CHECK(r->handle64() != it->second.second);
        }
        // A new record for the key drops the key's other handles (design/daemon.md D-tenancy).
        auto& k = known.back();
        const std::size_t before = k.size();
        if (std::find(k.begin(), k.end(), r->handle64()) == k.end())
          k.erase(std::remove_if(k.begin(), k.end(),
                                 [&](uint64_t h) {
                                   auto it = handle_key.find(h);
                                   return it != handle_key.end() && it->second == q.key;
                                 }),
                  k.end());
        if (k.size() != before || (r->handle64() >> daemon::kHandleIdBits) >= 512) g_restart = true;
        last[q.key] = {q.source, r->handle64()};
        handle_key[r->handle64()] = q.key;
        k.push_back(r->handle64());
        registered.push_back(r->handle64());
        break;
      }
      case wire::Body::Unregistered: {
        FUZZ_CHECK(next_request < x.requests.size());
        const Request& q = x.requests[next_request++];
        FUZZ_CHECK(q.type == wire::Body::Unregister);
        const auto* r = f->body_as_Unregistered();
        FUZZ_CHECK(r->request_id() == q.request_id);
        known.push_back(known.back());
        if (!q.has_key) FUZZ_CHECK(r->status() == wire::Status::InvalidArgument);
        if (r->status() != wire::Status::Ok) {
          FUZZ_CHECK(r->status() == wire::Status::InvalidArgument);  // no such key
          FUZZ_CHECK(r->error() != nullptr && r->error()->size() > 0);
          break;
        }
        FUZZ_CHECK(r->error() == nullptr);
        // Every handle of the key is gone; registering it again gives a fresh record.
        auto& k = known.back();
        k.erase(std::remove_if(k.begin(), k.end(),
                               [&](uint64_t h) {
                                 auto it = handle_key.find(h);
                                 return it != handle_key.end() && it->second == q.key;
                               }),
                k.end());
        last.erase(q.key);
        break;
      }
      case wire::Body::ControlReply: {
        FUZZ_CHECK(next_request < x.requests.size());
        const Request& q = x.requests[next_request++];
        FUZZ_CHECK(q.type == wire::Body::Control);
        known.push_back(known.back());
        const auto* r = f->body_as_ControlReply();
        FUZZ_CHECK(r->request_id() == q.request_id);
        switch (q.command) {
          case wire::ControlCommand::Stats:
          case wire::ControlCommand::Shards:
          case wire::ControlCommand::ListScripts: {
            if (q.command == wire::ControlCommand::ListScripts && !cursor_ok(q.after)) {
              FUZZ_CHECK(r->status() == wire::Status::InvalidArgument);
              FUZZ_CHECK(r->error() != nullptr && r->json() == nullptr);
              break;
            }
            FUZZ_CHECK(r->status() == wire::Status::Ok);
            FUZZ_CHECK(r->json() != nullptr);
            const auto j = nlohmann::json::parse(r->json()->string_view(), nullptr, false);
            FUZZ_CHECK(j.is_object());
            if (q.command == wire::ControlCommand::Stats) {
              FUZZ_CHECK(j.value("clients", -1) == 1);  // this client, alone
              FUZZ_CHECK(j.value("inflight", uint64_t{99}) <= kMaxInflight);
            }
            if (q.command != wire::ControlCommand::ListScripts) {
              FUZZ_CHECK(j["shards"].is_array() && j["shards"].size() == kWorkerShards);
            } else {  // one page: at most `limit` (0: 1000; at most 10000) and 4 MiB
              const uint32_t limit = q.limit == 0 ? 1000 : std::min<uint32_t>(q.limit, 10000);
              FUZZ_CHECK(r->json()->size() <= (std::size_t{4} << 20));
              FUZZ_CHECK(j["scripts"].is_array() && j["scripts"].size() <= limit);
              FUZZ_CHECK(j["next"].is_null() || j["next"].is_string());
              FUZZ_CHECK(!j["next"].is_string() || cursor_ok(j["next"].get<std::string>()));
              FUZZ_CHECK(j["total"].is_number_unsigned());
            }
            break;
          }
          default:  // unknown commands, drills on shards that do not exist
            FUZZ_CHECK(r->status() == wire::Status::InvalidArgument);
            FUZZ_CHECK(r->error() != nullptr && r->error()->size() > 0);
        }
        break;
      }
      case wire::Body::Results: {
        const auto* items = f->body_as_Results()->items();
        FUZZ_CHECK(items != nullptr && items->size() > 0);
        for (const wire::Result* r : *items) {
          auto it = pending.find(r->id());
          FUZZ_CHECK(it != pending.end() && it->second > 0);  // asked for, answered once
          --it->second;
          ++answered;
          FUZZ_CHECK(r->status() <= wire::Status::InvalidArgument);  // never NeedSource
          if (r->status() == wire::Status::Ok) {
            FUZZ_CHECK(r->value() != nullptr && host_accepts(r->value()));
            Value v;
            FUZZ_CHECK(detail::decode_value(r->value(), &v));
          } else {
            FUZZ_CHECK(r->error() != nullptr);
          }
          // Ids may repeat (the client chooses them): a rule on the status holds when it holds
          // for every evaluation with this id.
          bool all_impossible = true, all_known = true;
          for (const Evaluation& e : x.evaluations) {
            if (e.id != r->id()) continue;
            // No record id that high is ever given out (see Registered above).
            all_impossible = all_impossible && (e.handle & daemon::kHandleIdMask) >= (1u << 21);
            const auto& k = known[std::min(e.requests_before, known.size() - 1)];
            all_known = all_known && e.inputs_ok && e.requests_before < known.size() &&
                        std::find(k.begin(), k.end(), e.handle) != k.end();
          }
          if (all_impossible) FUZZ_CHECK(r->status() == wire::Status::InvalidArgument);
          if (all_known) FUZZ_CHECK(r->status() != wire::Status::InvalidArgument);
        }
        break;
      }
      case wire::Body::TagsReply:
      case wire::Body::TagValues:
      case wire::Body::TagChanges:
        FUZZ_CHECK(x.tags);  // only to a client that sent tags frames
        break;
      default:
        FUZZ_CHECK(false);  // nothing else goes to a client
    }
  }
  if (!x.violation) {
    FUZZ_CHECK(x.hello || frames.empty());
    FUZZ_CHECK(next_request == x.requests.size());
    FUZZ_CHECK(answered == x.evaluations.size());
  }
  return registered;
}

// A fresh daemon with the fixed scripts registered (through a client, the real way).
void start_daemon() {
  auto& d = *g_daemon;
  d.server = std::make_unique<daemon::Server>(config(d.socket));
  if (Error e = ServerTestAccess::start(*d.server)) {
    std::fprintf(stderr, "fuzz_daemon_client: cannot start the daemon: %s\n", e.message.c_str());
    std::abort();
  }
  ByteVec stream;
  auto add = [&stream](const ByteVec& b) { stream.insert(stream.end(), b.begin(), b.end()); };
  flatbuffers::FlatBufferBuilder f(256);
  add(finish(
      f, wire::Body::ClientHello,
      wire::CreateClientHello(f, protocol::kProtocolVersion, f.CreateString("setup")).Union()));
  for (uint32_t i = 0; i < kFixedCount; ++i) {
    f.Clear();
    add(finish(
        f, wire::Body::Register,
        wire::CreateRegister(f, i, f.CreateString(kFixed[i].key), f.CreateString(kFixed[i].source))
            .Union()));
  }
  Expectation x;
  FUZZ_CHECK(expect(stream, &x) && !x.violation);
  std::size_t cut = 0;
  const Frames frames = converse(*d.server, stream, x, &cut);
  const std::vector<uint64_t> handles = check_answers(frames, cut, x);
  FUZZ_CHECK(handles.size() == kFixedCount);
  for (uint32_t i = 0; i < kFixedCount; ++i) FUZZ_CHECK(handles[i] == i);
}

void stop_daemon() {
  if (!g_daemon || !g_daemon->server) return;
  ServerTestAccess::stop(*g_daemon->server);
  g_daemon->server.reset();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);  // violations and refusals are expected, and logged
  g_daemon = new Daemon;
  char dir[] = "/tmp/outrun-fuzz-daemon-XXXXXX";
  FUZZ_CHECK(::mkdtemp(dir) != nullptr);
  g_daemon->dir = dir;
  g_daemon->socket = g_daemon->dir + "/outrund.sock";
  start_daemon();
  std::atexit([] {
    stop_daemon();
    ::rmdir(g_daemon->dir.c_str());
    delete g_daemon;
    g_daemon = nullptr;
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxInput) return -1;
  const std::span<const uint8_t> stream(data, size);
  Expectation x;
  if (!expect(stream, &x)) return -1;
  std::size_t cut = 0;
  const Frames frames = converse(*g_daemon->server, stream, x, &cut);
  check_answers(frames, cut, x);
  // Unregistered keys (the fixed ones too) would break the next input's expectations.
  if (x.unregisters || g_restart ||
      ServerTestAccess::scripts(*g_daemon->server) > kRecycleScripts) {
    g_restart = false;
    stop_daemon();
    start_daemon();
  }
  return 0;
}

// outrund's connection to one client (design/daemon.md "Threads and ownership"): its socket, reader
// and writer, its per-shard queues and budget state, its tags subscription; and the two ways a
// frame is written to a client outside a reply (a result, a refusing ServerHello).
#pragma once

#include <flatbuffers/flatbuffers.h>
#include <sys/types.h>
#include <unistd.h>
#include <uv.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "conn_phase.h"
#include "outrun/protocol/frame.h"
#include "outrun/protocol/frame_writer.h"
#include "outrun/protocol/messages.h"
#include "outrun/runner.h"
#include "outrun/tags.h"
#include "outrun/thread_annotations.h"
#include "scheduler.h"
#include "server.h"

namespace outrun::daemon {

// One client. Shared by the loop (conns_, the poll handle) and every callback of an evaluation
// it submitted, so a result that arrives after the client left writes to a closed writer and
// is dropped; the fd is closed when the last reference goes (never reused under a writer).
struct Conn : std::enable_shared_from_this<Conn> {
  Conn(Server* s, int fd_, uint64_t id_)
      : server(s), fd(fd_), id(id_), writer(fd_, [this] {
          if (server) server->want_write(shared_from_this());
        }) {}
  ~Conn() {
    if (fd >= 0) ::close(fd);  // -1: the tags lane (Scheduler::lane_), no socket
  }

  // Null: the tags lane, or a client of the Scheduler's unit tests (no daemon).
  Server* server;
  const int fd;
  const uint64_t id;
  protocol::FrameWriter writer;
  std::atomic<uint32_t> inflight{0};  // admitted: queued in the daemon or in the Host
  // Scheduler (design/daemon.md "Scheduler"): a queue per shard, each guarded by its shard's
  // ShardSched::mu. `held`: over max_client_queued_bytes, neither read nor fed until it drains
  // below half (set by the loop or a dispatcher, cleared by the loop). `over_limit`: past the
  // hard limit, the loop disconnects it.
  std::unique_ptr<ConnShard[]> sched;
  std::atomic<bool> held{false};
  std::atomic<bool> over_limit{false};

  // Loop thread only.
  uv_poll_t poll{};
  protocol::FrameReader reader GUARDED_BY(loop_thread);
  // Awaiting its hello, open, checking a Register, closed (design/daemon.md "Connection
  // phases"). Whether it is read also depends on the daemon's lifecycle (none is read once it
  // drains), its budget (held) and a paused frame; whether it is written to on write_wait.
  ConnPhase phase GUARDED_BY(loop_thread);
  // The items of an Evaluate frame, handled up to paused_item when the client went over its
  // budget; the reader is not touched until it is finished (the frame stays valid).
  const EvaluationItems* paused_frame GUARDED_BY(loop_thread) = nullptr;
  uint32_t paused_item GUARDED_BY(loop_thread) = 0;
  // What the rest of its inputs may decode to.
  std::size_t paused_budget GUARDED_BY(loop_thread) = 0;
  // What the frame's inputs_buffers may still copy (each use of one counts).
  std::size_t paused_copy_budget GUARDED_BY(loop_thread) = 0;
  // Polling for writability (the socket was full): orthogonal to the phase (a client is
  // written to in every phase but kClosed, whether read or not).
  bool write_wait GUARDED_BY(loop_thread) = false;
  int events GUARDED_BY(loop_thread) = 0;
  uid_t uid GUARDED_BY(loop_thread) = 0;
  gid_t gid GUARDED_BY(loop_thread) = 0;
  pid_t pid GUARDED_BY(loop_thread) = 0;
  // May send KillShard/RestartShard, replace or unregister another uid's key
  // (daemon.admin_uids, admin_gids).
  bool admin GUARDED_BY(loop_thread) = false;
  uint16_t protocol GUARDED_BY(loop_thread) = 0;  // the version of its ClientHello
  std::chrono::steady_clock::time_point accepted GUARDED_BY(loop_thread);
  std::string name GUARDED_BY(loop_thread);

  // Results of the Host loop's current run of callbacks, written as one frame when the run ends
  // (Server::flush_corked). The Host's loop thread only.
  std::vector<std::pair<uint64_t, Result>> corked;

  // Tags subscription (design/daemon.md "Subscribers"), guarded by TagsService::sub_mu_.
  bool gone = false;  // closed: never subscribed again
  // It sent SourceUpdates that may have created source tags: at close, those no tag uses go
  // (Engine::forget_sources). Loop thread.
  bool made_sources = false;
  bool sub_all = false;
  std::unordered_set<std::string> sub_ids;
  bool sub_overflow = false;  // over max_subscriber_bytes: only the latest value per tag is kept
  std::map<std::string, tags::DataValue> sub_latest;
};

// The thread's builder for what the daemon writes to clients (replies, results); kept for its
// capacity. Tags changes use their own (t_changes_fbb).
inline thread_local protocol::HotBuilder t_fbb(4096);
// Changes are encoded with their own builder: TagsService::on_changes can run inside a frame's
// handling (an update whose wave completes at once), which uses t_fbb.
inline thread_local flatbuffers::FlatBufferBuilder t_changes_fbb(4096);

// One Results frame of one result, to the client's writer (any thread).
void send_result(Conn& c, uint64_t id, const Result& r);
// `rs` as Results frames of up to ~kResultsCutBytes each (one, nearly always), to the client's
// writer: one send(2) where the socket takes them.
inline constexpr std::size_t kResultsCutBytes = 256u << 10;
void send_results(Conn& c, std::span<const std::pair<uint64_t, Result>> rs);
// A ServerHello with `why` as its error, straight to the socket (best effort, never blocks):
// for a client refused before or at its hello.
void reply_error_hello(int fd, const std::string& why);

}  // namespace outrun::daemon

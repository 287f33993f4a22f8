// The operating system's side of a worker process (design/windows.md "The platform seam"): its
// two channels, its status page, its creation and kill, and the reading of its exit. One header,
// two implementations, as libuv's src/unix and src/win: host/platform/posix/ (socketpairs,
// uv_spawn in its own process group, kill(-pid, SIGKILL), a POSIX shared memory page) and
// host/platform/win/ (named pipes, CreateProcess into its own Job Object, TerminateJobObject, a
// named section). The code above it (WorkerProcess, the worker's main loop, the tests) does not
// know which one it runs on but for the spawn's loop form (below).
//
// Two libraries: outrun_platform_io (channels' blocking I/O, the worker's side of the status
// page: what outrun-worker links) and outrun_platform (the host's side: the rest).
#pragma once

#include <uv.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace boost::interprocess {
class mapped_region;
}

namespace outrun::protocol {
class FrameReader;
}

namespace outrun::platform {

// --- channels ------------------------------------------------------------------------------------

// One end of a channel: a socket (POSIX) or a named pipe HANDLE (Windows).
#ifdef _WIN32
using Channel = void*;
inline constexpr Channel kNoChannel = nullptr;
#else
using Channel = int;
inline constexpr Channel kNoChannel = -1;
#endif

// A worker's two channels, one per direction: a worker blocked reading frames is never woken by
// the host draining its results. The host's ends do not block (POSIX: O_NONBLOCK; Windows:
// overlapped); the worker's ends do, and are the only handles the worker inherits.
struct WorkerChannels {
  Channel host_write = kNoChannel;   // frames to the worker
  Channel host_read = kNoChannel;    // results from the worker
  Channel worker_read = kNoChannel;  // the worker's ends: closed in the host once it is spawned
  Channel worker_write = kNoChannel;
};

// Creates both channels; on failure nothing is left open and the text says what failed.
std::string open_worker_channels(WorkerChannels* out);
void close_channel(Channel* c);  // idempotent; *c becomes kNoChannel
void close_worker_ends(WorkerChannels* c);
void close_all(WorkerChannels* c);

// The arguments that name the worker's ends and its status page to outrun-worker:
// "--fd N --out-fd M --status-page NAME". POSIX: fds 3 and 4 (uv_spawn maps them there);
// Windows: the inherited handles' values.
std::vector<std::string> worker_channel_args(const WorkerChannels& c, const std::string& page_name);
// outrun-worker's side: the channel an --fd/--out-fd value names (false: not a valid one).
bool channel_from_arg(unsigned long long value, Channel* out);

// Blocking I/O on either end (the worker; the tests). POSIX: read(), send(MSG_NOSIGNAL) and
// recv(MSG_PEEK | MSG_DONTWAIT) -- the calls the worker's seccomp filter allows; Windows:
// ReadFile/WriteFile (waiting on an overlapped end), PeekNamedPipe.
//   channel_read: > 0 bytes read, 0 the other end closed, < 0 an error (channel_error_text).
long channel_read(Channel c, void* buf, std::size_t size);
bool channel_write_all(Channel c, std::span<const uint8_t> data);  // false: the channel failed
// True unless nothing has arrived yet: bytes, the other end's close or an error are for the
// read to deal with. Never blocks.
bool channel_input_waiting(Channel c);
std::string channel_error_text(long error);  // of a negative channel_read
// Reads what has arrived into `reader` (FrameReader::read_from's contract: > 0, 0 at the end,
// < 0 an error), blocking until something has.
long read_frames(protocol::FrameReader& reader, Channel c);

// This process's id (getpid(), GetCurrentProcessId()): the worker's hello names it.
int current_pid();

// --- the status page -----------------------------------------------------------------------------

// The host's side of a worker's status page: created and mapped before the worker starts, its
// name handed to the worker, which maps it before it says hello.
class HostStatusPage {
 public:
  HostStatusPage();
  ~HostStatusPage();  // does not forget the name (forget_name() says when)
  HostStatusPage(const HostStatusPage&) = delete;
  HostStatusPage& operator=(const HostStatusPage&) = delete;

  // A new page of protocol::kStatusPageSize bytes, zeroed, under a name unique to this process
  // and `shard`. "" or what failed.
  std::string create(int shard);
  const std::string& name() const { return name_; }
  const std::shared_ptr<boost::interprocess::mapped_region>& region() const { return region_; }
  // The name is no longer needed (the worker mapped the page, or never will): POSIX removes it
  // from /dev/shm; Windows closes the handle that keeps the name alive (the mapping stays).
  // Idempotent.
  void forget_name();

 private:
  std::string name_;
  std::shared_ptr<boost::interprocess::mapped_region> region_;
  std::shared_ptr<void> keeper_;  // Windows: the windows_shared_memory that holds the name
};

// The worker's side: maps the page `name` names. "" or what failed.
std::string map_status_page(const std::string& name,
                            std::unique_ptr<boost::interprocess::mapped_region>* out);

// --- the process ---------------------------------------------------------------------------------

// What the host holds of a started worker.
struct WorkerChild {
  int pid = 0;
#ifdef _WIN32
  void* process = nullptr;  // HANDLE: its exit is a wait on it
  void* job = nullptr;      // HANDLE: its own Job Object; closing it kills the worker too
#endif
};

struct SpawnRequest {
  std::string path;               // the worker executable
  std::vector<std::string> args;  // after argv[0], worker_channel_args() included
  char** env = nullptr;           // null: the host's own environment
  const WorkerChannels* channels = nullptr;
  // Windows: the job's limit on the process's committed memory (0: none); RLIMIT_AS's stand-in.
  std::size_t memory_limit = 0;
};

// The loop's handle on a worker's exit. POSIX: libuv's process handle (uv_spawn reaps it).
// Windows: an async handle a wait on the process handle (RegisterWaitForSingleObject) sends once
// it is signalled; the loop then reads its exit code. Either way `on_exit(handle, code, signal)`
// runs once on the loop, and as_uv_handle() is what uv_close and `data` take.
#ifdef _WIN32
struct ProcessHandle {
  uv_async_t async;         // first: as_uv_handle() is this handle
  void* wait = nullptr;     // the registered wait, until it has fired (or the handle closes)
  void* process = nullptr;  // the process HANDLE (owned by WorkerChild)
  void (*on_exit)(ProcessHandle*, int64_t, int) = nullptr;
};
#else
using ProcessHandle = uv_process_t;
#endif
using ExitCallback = void (*)(ProcessHandle* handle, int64_t exit_status, int term_signal);
inline uv_handle_t* as_uv_handle(ProcessHandle* p) {
  return reinterpret_cast<uv_handle_t*>(p);
}
// uv_close, after (Windows) the wait is unregistered: no callback can touch `p` after this.
void close_process_handle(ProcessHandle* p, uv_close_cb cb);

// Starts a worker on `loop`: POSIX uv_spawn, the worker in its own session and process group, its
// channels as fds 3 and 4; Windows CreateProcess suspended into its own Job Object (below). Its
// stderr is a pipe (`err_pipe`) the host reads on the loop. `process` and `err_pipe` are
// initialised whatever the outcome (the caller closes them); "" or what failed, and
// child->pid on success. `on_exit` runs on the loop when the process has ended.
std::string spawn_worker(uv_loop_t* loop, ProcessHandle* process, uv_pipe_t* err_pipe,
                         ExitCallback on_exit, const SpawnRequest& request, WorkerChild* child);

#ifdef _WIN32
// The spawn itself, without the loop (the seam's tests, spawn_helper): CreateProcess suspended
// (EXTENDED_STARTUPINFO_PRESENT, only the channels' worker ends and `err` inherited), assigned to
// its own Job Object (kill on job close, one active process, die on an unhandled exception, UI
// restrictions, the memory limit), then resumed. Its stderr is `err` (null: none). "" or what
// failed; on failure nothing is left.
std::string spawn_worker(const SpawnRequest& request, void* err, WorkerChild* child);
// Waits up to `timeout_ms` for its exit. True with its exit code (an NTSTATUS for a crash).
bool wait_worker_exit(const WorkerChild& child, uint32_t timeout_ms, int64_t* code);
#endif
// Closes what the host holds of it (Windows: the process and job handles; the job's close kills
// the worker if it still runs). Nothing on POSIX. Idempotent.
void release_worker(WorkerChild* child);

// --- the worker's channels on the loop -----------------------------------------------------------

// Reading a worker's results on the loop. POSIX: a uv_poll_t says the socket is readable and
// read() reads it into the FrameReader. Windows: a uv_pipe_t reads the pipe (IOCP) straight into
// the FrameReader's space, and read() hands over what it read (or, outside a read callback, reads
// what is waiting without blocking). It owns the channel from open() on.
class ResultStream {
 public:
  // Readable (status 0) or failed (status < 0, POSIX: EPOLLERR). Loop thread.
  using Callback = void (*)(ResultStream* stream, int status);
  ResultStream() = default;
  ~ResultStream();  // POSIX: closes the socket; Windows: libuv closed the pipe with the handle
  ResultStream(const ResultStream&) = delete;
  ResultStream& operator=(const ResultStream&) = delete;

  // Not before the spawn succeeded; then the handle is open and must be closed (handle()).
  void open(uv_loop_t* loop, Channel c, protocol::FrameReader* reader, Callback cb);
  void start();
  void stop();
  // FrameReader::read_from's contract: > 0 bytes now in the reader, 0 the end of the stream,
  // -EAGAIN nothing now, < 0 another error. Never blocks.
  long read();
  uv_handle_t* handle() { return reinterpret_cast<uv_handle_t*>(&h_); }
  Channel channel() const { return c_; }

 private:
  protocol::FrameReader* reader_ = nullptr;
  Callback cb_ = nullptr;
#ifdef _WIN32
  static void on_alloc(uv_handle_t* h, std::size_t suggested, uv_buf_t* buf);
  static void on_read(uv_stream_t* s, ssize_t nread, const uv_buf_t* buf);
  uv_pipe_t h_{};
  Channel c_ = kNoChannel;  // for the reads outside the loop's callback; libuv closes it
  long pending_ = 0;        // read by libuv into the reader, not yet handed over by read()
  bool ended_ = false;
  bool reading_ = false;
#else
  static void on_poll(uv_poll_t* h, int status, int events);
  uv_poll_t h_{};
  Channel c_ = kNoChannel;
#endif
};

// Waiting for room on the channel to a worker, while a handed-off write waits (FrameWriter's
// flush_from_loop). POSIX: a uv_poll_t for writability; Windows, whose pipes say nothing of
// room: a 1 ms timer while it is started. Does not own the channel.
class WriteWatch {
 public:
  using Callback = void (*)(WriteWatch* watch, int status);  // status < 0: the channel failed
  void open(uv_loop_t* loop, Channel c, Callback cb);
  void start();
  void stop();
  uv_handle_t* handle() { return reinterpret_cast<uv_handle_t*>(&h_); }

 private:
  Callback cb_ = nullptr;
#ifdef _WIN32
  static void on_timer(uv_timer_t* t);
  uv_timer_t h_{};
#else
  static void on_poll(uv_poll_t* h, int status, int events);
  uv_poll_t h_{};
#endif
};

// --- the host process ----------------------------------------------------------------------------

// The worker executable's file name: "outrun-worker" (POSIX), "outrun-worker.exe" (Windows).
const char* worker_file_name();
// This executable's path ("" if unknown): /proc/self/exe, GetModuleFileName.
std::string executable_path();
// "" if `path` is a file this process may execute, else why not.
std::string check_executable(const std::string& path);
// A process's resident memory in bytes (0 if unknown): /proc/<pid>/statm, the working set.
uint64_t resident_bytes(int pid);

// The kill: its whole process group (POSIX: SIGKILL to -pid; the pid must not have been reaped)
// or its Job Object (Windows: TerminateJobObject with kKilledExitCode).
void kill_worker(const WorkerChild& child);

// --- its exit ------------------------------------------------------------------------------------

// How a process ended, as the host charges it.
enum class ExitKind : uint8_t {
  kExited,  // it exited with a code (its own decision, or the C runtime's)
  kFault,   // its own fault or abort (SIGSEGV, STATUS_ACCESS_VIOLATION, ...): a script's crash
  kKilled,  // from outside (SIGKILL, SIGTERM, the host's TerminateJobObject): says nothing of it
};
// `code` and `signal` as libuv's exit callback reports them (Windows: the exit code, signal 0).
ExitKind exit_kind(int64_t code, int signal);
// How it reads in messages: "was killed by signal 11 (Segmentation fault)",
// "crashed: access violation (STATUS_ACCESS_VIOLATION, 0xC0000005)", "exited with code 3".
std::string describe_exit(int64_t code, int signal);

// The Windows forms, pure and built on both platforms (their unit test runs on both): the exit
// code as GetExitCodeProcess gives it. exit_kind() and describe_exit() are these on Windows.
ExitKind windows_exit_kind(uint32_t code);
std::string describe_windows_exit(uint32_t code);

// Windows: the exit code TerminateJobObject gives a worker the host kills. Outside the NTSTATUS
// codes Windows uses (the customer bit, 0x20000000, is set).
inline constexpr uint32_t kKilledExitCode = 0xE0D1E009u;

}  // namespace outrun::platform

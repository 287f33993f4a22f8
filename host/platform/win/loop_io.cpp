// A worker on the loop, and the host process, on Windows (worker_os.h): the spawn's loop form
// (its exit a wait on the process handle, posted to the loop; its stderr a third named pipe read
// by libuv), the result pipe read by libuv (IOCP) into the FrameReader, and a timer standing in
// for the frame pipe's writability (design/windows.md "The Host on Windows").
#include <windows.h>
// after <windows.h>, which they need:
#include <fcntl.h>
#include <io.h>
#include <psapi.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <vector>

#include "outrun/platform/worker_os.h"
#include "outrun/protocol/frame.h"
#include "win_pipes.h"

namespace outrun::platform {

using win::win_error;

namespace {

// Hands a HANDLE to a libuv pipe (which then owns it: uv_close closes it). 0 or a libuv error.
int open_uv_pipe(uv_pipe_t* pipe, HANDLE h) {
  const int fd = _open_osfhandle(reinterpret_cast<intptr_t>(h), _O_RDONLY);
  if (fd < 0) {
    CloseHandle(h);
    return UV_EBADF;
  }
  const int rc = uv_pipe_open(pipe, fd);
  if (rc != 0) _close(fd);
  return rc;
}

// The thread pool's wait fired (the process ended): post it to the loop.
void CALLBACK on_signalled(void* context, BOOLEAN) {
  uv_async_send(&static_cast<ProcessHandle*>(context)->async);
}

void unregister(ProcessHandle* p) {
  // INVALID_HANDLE_VALUE: returns once a callback that is running has returned.
  if (p->wait) UnregisterWaitEx(p->wait, INVALID_HANDLE_VALUE);
  p->wait = nullptr;
}

void on_async(uv_async_t* a) {
  auto* p = reinterpret_cast<ProcessHandle*>(a);
  if (!p->wait) return;  // not this process's end (never sent otherwise)
  unregister(p);
  DWORD code = 0;
  GetExitCodeProcess(p->process, &code);
  if (p->on_exit) p->on_exit(p, static_cast<int64_t>(code), 0);
}

}  // namespace

std::string spawn_worker(uv_loop_t* loop, ProcessHandle* process, uv_pipe_t* err_pipe,
                         ExitCallback on_exit, const SpawnRequest& request, WorkerChild* child) {
  uv_async_init(loop, &process->async, &on_async);
  process->on_exit = on_exit;
  uv_pipe_init(loop, err_pipe, 0);
  // Its stderr: a pipe like the results' (the host's end read by libuv).
  HANDLE err_host = nullptr, err_worker = nullptr;
  if (std::string e = win::make_pipe(true, &err_host, &err_worker); !e.empty()) return e;
  std::string e = spawn_worker(request, err_worker, child);
  CloseHandle(err_worker);  // the worker's, inherited (or not: it failed)
  if (!e.empty()) {
    CloseHandle(err_host);
    return e;
  }
  process->process = child->process;
  HANDLE wait = nullptr;
  if (!RegisterWaitForSingleObject(&wait, static_cast<HANDLE>(child->process), &on_signalled,
                                   process, INFINITE, WT_EXECUTEONLYONCE)) {
    e = win_error("RegisterWaitForSingleObject");
    CloseHandle(err_host);
    kill_worker(*child);
    release_worker(child);
    return e;
  }
  process->wait = wait;
  if (const int rc = open_uv_pipe(err_pipe, err_host); rc != 0)
    return std::string("reading the worker's stderr: ") + uv_strerror(rc);  // it runs: exit due
  return {};
}

void close_process_handle(ProcessHandle* p, uv_close_cb cb) {
  unregister(p);
  uv_close(as_uv_handle(p), cb);
}

// --- the result pipe -----------------------------------------------------------------------------

// The channel is libuv's from open() on (uv_close closes it); before, the spawn's own cleanup
// (close_all) closes it.
ResultStream::~ResultStream() = default;

void ResultStream::open(uv_loop_t* loop, Channel c, protocol::FrameReader* reader, Callback cb) {
  reader_ = reader;
  cb_ = cb;
  c_ = c;
  uv_pipe_init(loop, &h_, 0);
  if (open_uv_pipe(&h_, c) != 0) ended_ = true;  // read() says so; the handle closes as usual
}

void ResultStream::start() {
  if (reading_ || ended_) return;
  reading_ = uv_read_start(reinterpret_cast<uv_stream_t*>(&h_), &ResultStream::on_alloc,
                           &ResultStream::on_read) == 0;
}

void ResultStream::stop() {
  if (!reading_) return;
  reading_ = false;
  uv_read_stop(reinterpret_cast<uv_stream_t*>(&h_));
}

void ResultStream::on_alloc(uv_handle_t* h, std::size_t, uv_buf_t* buf) {
  auto* s =
      reinterpret_cast<ResultStream*>(reinterpret_cast<char*>(h) - offsetof(ResultStream, h_));
  const std::span<uint8_t> space = s->reader_->read_space();
  *buf = uv_buf_init(reinterpret_cast<char*>(space.data()), static_cast<unsigned>(space.size()));
}

void ResultStream::on_read(uv_stream_t* st, ssize_t nread, const uv_buf_t*) {
  auto* s =
      reinterpret_cast<ResultStream*>(reinterpret_cast<char*>(st) - offsetof(ResultStream, h_));
  if (nread == 0) return;  // nothing (libuv's EAGAIN)
  if (nread > 0) {
    s->reader_->commit(static_cast<std::size_t>(nread));
    s->pending_ += static_cast<long>(nread);
  } else {  // UV_EOF, or an error (the worker's end broke): either way its end
    s->ended_ = true;
    s->stop();
  }
  s->cb_(s, 0);
}

long ResultStream::read() {
  if (pending_ > 0) return std::exchange(pending_, 0);
  if (ended_) return 0;
  // Outside the read callback (a dying worker's last results, drained at its death): what is
  // waiting, without blocking, as libuv itself reads after its zero-byte read.
  DWORD avail = 0;
  if (!PeekNamedPipe(c_, nullptr, 0, nullptr, &avail, nullptr)) {
    ended_ = true;
    stop();
    return 0;
  }
  if (avail == 0) return -EAGAIN;
  const std::span<uint8_t> space = reader_->read_space();
  DWORD n = 0;
  if (!ReadFile(c_, space.data(), std::min<DWORD>(avail, static_cast<DWORD>(space.size())), &n,
                nullptr)) {
    ended_ = true;
    stop();
    return 0;
  }
  reader_->commit(n);
  return static_cast<long>(n);
}

// --- the frame pipe's room -----------------------------------------------------------------------

void WriteWatch::open(uv_loop_t* loop, Channel, Callback cb) {
  cb_ = cb;
  uv_timer_init(loop, &h_);
}

void WriteWatch::start() {
  uv_timer_start(&h_, &WriteWatch::on_timer, 1, 1);
}

void WriteWatch::stop() {
  uv_timer_stop(&h_);
}

void WriteWatch::on_timer(uv_timer_t* t) {
  auto* w = reinterpret_cast<WriteWatch*>(reinterpret_cast<char*>(t) - offsetof(WriteWatch, h_));
  w->cb_(w, 0);  // the writer finds out: it writes what fits, or learns of the close
}

// --- the host process ----------------------------------------------------------------------------

const char* worker_file_name() {
  return "outrun-worker.exe";
}

std::string executable_path() {
  std::vector<char> buf(MAX_PATH);
  for (;;) {
    const DWORD n = GetModuleFileNameA(nullptr, buf.data(), static_cast<DWORD>(buf.size()));
    if (n == 0) return {};
    if (n < buf.size()) return std::string(buf.data(), n);
    buf.resize(buf.size() * 2);
  }
}

std::string check_executable(const std::string& path) {
  const DWORD attrs = GetFileAttributesA(path.c_str());
  if (attrs == INVALID_FILE_ATTRIBUTES)
    return channel_error_text(-static_cast<long>(GetLastError()));
  if (attrs & FILE_ATTRIBUTE_DIRECTORY) return "is a directory";
  return {};
}

uint64_t resident_bytes(int pid) {
  HANDLE p = OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, FALSE, static_cast<DWORD>(pid));
  if (!p) return 0;
  PROCESS_MEMORY_COUNTERS c{};
  const BOOL ok = GetProcessMemoryInfo(p, &c, sizeof c);
  CloseHandle(p);
  return ok ? c.WorkingSetSize : 0;
}

}  // namespace outrun::platform

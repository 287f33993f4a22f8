// A worker process on Windows (worker_os.h): CreateProcess suspended into its own Job Object,
// TerminateJobObject as the kill, its exit code read from its process handle, its status page a
// named section (boost::interprocess::windows_shared_memory).
#include <windows.h>

#include <atomic>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/windows_shared_memory.hpp>
#include <memory>
#include <random>

#include "outrun/platform/worker_os.h"
#include "outrun/protocol/status_page.h"
#include "win_pipes.h"

namespace outrun::platform {

namespace bip = boost::interprocess;
using win::win_error;

namespace {

// One argument as CommandLineToArgvW and the C runtime read it back.
void append_quoted(std::string* line, const std::string& arg) {
  if (!line->empty()) line->push_back(' ');
  if (!arg.empty() && arg.find_first_of(" \t\n\v\"") == std::string::npos) {
    line->append(arg);
    return;
  }
  line->push_back('"');
  for (std::size_t i = 0;; ++i) {
    std::size_t backslashes = 0;
    while (i < arg.size() && arg[i] == '\\') ++i, ++backslashes;
    if (i == arg.size()) {
      line->append(backslashes * 2, '\\');
      break;
    }
    if (arg[i] == '"') {
      line->append(backslashes * 2 + 1, '\\');
    } else {
      line->append(backslashes, '\\');
    }
    line->push_back(arg[i]);
  }
  line->push_back('"');
}

// The job every worker runs in, alone: the host's handle is the only one, so the host's death
// (its handles closed by the system) kills the worker, as PR_SET_PDEATHSIG does on Linux.
std::string make_job(std::size_t memory_limit, HANDLE* out) {
  HANDLE job = CreateJobObjectA(nullptr, nullptr);
  if (!job) return win_error("CreateJobObject");
  JOBOBJECT_EXTENDED_LIMIT_INFORMATION limits{};
  auto& basic = limits.BasicLimitInformation;
  basic.LimitFlags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE | JOB_OBJECT_LIMIT_ACTIVE_PROCESS |
                     JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION;
  basic.ActiveProcessLimit = 1;  // RLIMIT_NPROC's stand-in: it starts nothing
  if (memory_limit > 0) {        // RLIMIT_AS's stand-in: committed memory
    basic.LimitFlags |= JOB_OBJECT_LIMIT_PROCESS_MEMORY;
    limits.ProcessMemoryLimit = memory_limit;
  }
  JOBOBJECT_BASIC_UI_RESTRICTIONS ui{};
  ui.UIRestrictionsClass = JOB_OBJECT_UILIMIT_DESKTOP | JOB_OBJECT_UILIMIT_DISPLAYSETTINGS |
                           JOB_OBJECT_UILIMIT_EXITWINDOWS | JOB_OBJECT_UILIMIT_GLOBALATOMS |
                           JOB_OBJECT_UILIMIT_HANDLES | JOB_OBJECT_UILIMIT_READCLIPBOARD |
                           JOB_OBJECT_UILIMIT_SYSTEMPARAMETERS | JOB_OBJECT_UILIMIT_WRITECLIPBOARD;
  if (!SetInformationJobObject(job, JobObjectExtendedLimitInformation, &limits, sizeof limits) ||
      !SetInformationJobObject(job, JobObjectBasicUIRestrictions, &ui, sizeof ui)) {
    const std::string err = win_error("SetInformationJobObject");
    CloseHandle(job);
    return err;
  }
  *out = job;
  return {};
}

std::string page_name(int shard) {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return "Local\\outrun-" + std::to_string(GetCurrentProcessId()) + "-" + std::to_string(shard) +
         "-" + std::to_string(counter.fetch_add(1)) + "-" + std::to_string(rng() & 0xffffff);
}

}  // namespace

HostStatusPage::HostStatusPage() = default;
HostStatusPage::~HostStatusPage() = default;

std::string HostStatusPage::create(int shard) {
  name_ = page_name(shard);
  try {
    auto shm = std::make_shared<bip::windows_shared_memory>(
        bip::create_only, name_.c_str(), bip::read_write, protocol::kStatusPageSize);
    region_ =
        std::make_shared<bip::mapped_region>(*shm, bip::read_write, 0, protocol::kStatusPageSize);
    keeper_ = std::move(shm);
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

void HostStatusPage::forget_name() {
  keeper_.reset();
}

std::string spawn_worker(const SpawnRequest& request, void* err, WorkerChild* child) {
  std::string line;
  append_quoted(&line, request.path);
  for (const std::string& a : request.args) append_quoted(&line, a);
  std::string env;  // "k=v\0...\0\0"; empty: the host's own
  if (request.env) {
    for (char** e = request.env; *e; ++e) env.append(*e).push_back('\0');
    env.push_back('\0');
  }

  HANDLE job = nullptr;
  if (std::string e = make_job(request.memory_limit, &job); !e.empty()) return e;
  std::unique_ptr<void, decltype(&CloseHandle)> job_guard(job, &CloseHandle);

  // Only the worker's two ends (and its stderr) are inherited, whatever else is inheritable.
  HANDLE inherit[3] = {request.channels->worker_read, request.channels->worker_write, err};
  const DWORD n_inherit = err ? 3 : 2;
  SIZE_T size = 0;
  InitializeProcThreadAttributeList(nullptr, 1, 0, &size);
  std::unique_ptr<char[]> storage(new char[size]);
  auto* attrs = reinterpret_cast<LPPROC_THREAD_ATTRIBUTE_LIST>(storage.get());
  if (!InitializeProcThreadAttributeList(attrs, 1, 0, &size))
    return win_error("InitializeProcThreadAttributeList");
  std::unique_ptr<_PROC_THREAD_ATTRIBUTE_LIST, decltype(&DeleteProcThreadAttributeList)>
      attrs_guard(attrs, &DeleteProcThreadAttributeList);
  if (!UpdateProcThreadAttribute(attrs, 0, PROC_THREAD_ATTRIBUTE_HANDLE_LIST, inherit,
                                 n_inherit * sizeof(HANDLE), nullptr, nullptr))
    return win_error("UpdateProcThreadAttribute");

  STARTUPINFOEXA si{};
  si.StartupInfo.cb = sizeof si;
  si.StartupInfo.dwFlags = STARTF_USESTDHANDLES;
  si.StartupInfo.hStdError = err;  // no stdin, no stdout
  si.lpAttributeList = attrs;
  PROCESS_INFORMATION pi{};
  // Suspended: it runs no instruction before it is in its job. Detached: no console (and no
  // console host process that would outlive it holding the host's stdio, as Wine's conhost does).
  if (!CreateProcessA(request.path.c_str(), line.data(), nullptr, nullptr, TRUE,
                      CREATE_SUSPENDED | EXTENDED_STARTUPINFO_PRESENT | DETACHED_PROCESS,
                      env.empty() ? nullptr : env.data(), nullptr, &si.StartupInfo, &pi))
    return win_error("CreateProcess '" + request.path + "'");
  if (!AssignProcessToJobObject(job, pi.hProcess)) {
    const std::string e = win_error("AssignProcessToJobObject");
    TerminateProcess(pi.hProcess, kKilledExitCode);
    CloseHandle(pi.hThread);
    CloseHandle(pi.hProcess);
    return e;
  }
  ResumeThread(pi.hThread);
  CloseHandle(pi.hThread);
  child->pid = static_cast<int>(pi.dwProcessId);
  child->process = pi.hProcess;
  child->job = job_guard.release();
  return {};
}

bool wait_worker_exit(const WorkerChild& child, uint32_t timeout_ms, int64_t* code) {
  if (WaitForSingleObject(child.process, timeout_ms) != WAIT_OBJECT_0) return false;
  DWORD c = 0;
  GetExitCodeProcess(child.process, &c);
  *code = c;
  return true;
}

void release_worker(WorkerChild* child) {
  if (child->process) CloseHandle(child->process);
  if (child->job) CloseHandle(child->job);
  child->process = child->job = nullptr;
}

void kill_worker(const WorkerChild& child) {
  if (child.job) TerminateJobObject(child.job, kKilledExitCode);
}

ExitKind exit_kind(int64_t code, int) {
  return windows_exit_kind(static_cast<uint32_t>(code));
}

std::string describe_exit(int64_t code, int) {
  return describe_windows_exit(static_cast<uint32_t>(code));
}

}  // namespace outrun::platform

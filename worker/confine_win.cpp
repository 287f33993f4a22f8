// Process confinement of a worker on Windows (confine.h; design/sandbox.md "On Windows"). There is
// no seccomp: the host has already put the worker in its own Job Object (one active process, kill
// on job close, die on an unhandled exception, UI restrictions, a memory limit: host/platform/win)
// before it ran. What a process can still set on itself, and does here before its first frame,
// are mitigation policies, which cannot be turned off again:
//   - no child processes (ProcessChildProcessPolicy; Windows 10 1709+);
//   - no dynamic code: no executable memory it makes or changes (ProcessDynamicCodePolicy; Lua
//     is an interpreter, mimalloc maps no executable pages);
//   - no legacy extension point DLLs (AppInit DLLs, winsock LSPs: ExtensionPointDisablePolicy);
//   - no images from remote shares or with the low mandatory label (ProcessImageLoadPolicy);
//   - an invalid handle is a fault, not an error code (ProcessStrictHandleCheckPolicy).
// It also checks it is in a Job Object: a worker that is not never serves.
// Wine accepts these calls and enforces none of them (design/windows.md).
#include <windows.h>

#include <string>

#include "confine.h"

namespace outrun::worker {

bool built_with_sanitizer() {
  return false;
}

namespace {

std::string win_error(const char* what) {
  return std::string(what) + ": error " + std::to_string(GetLastError());
}

template <class Policy>
bool set_policy(PROCESS_MITIGATION_POLICY which, Policy policy, const char* name,
                std::string* error) {
  if (SetProcessMitigationPolicy(which, &policy, sizeof policy)) return true;
  *error = win_error(name);
  return false;
}

}  // namespace

std::string confine(const ConfineOptions&) {
  // No error dialogs: a fault ends the process (the job's DIE_ON_UNHANDLED_EXCEPTION too).
  SetErrorMode(SEM_FAILCRITICALERRORS | SEM_NOGPFAULTERRORBOX | SEM_NOOPENFILEERRORBOX);

  BOOL in_job = FALSE;
  if (!IsProcessInJob(GetCurrentProcess(), nullptr, &in_job)) return win_error("IsProcessInJob");
  if (!in_job) return "not in a Job Object (the host starts workers in their own)";

  std::string error;
  PROCESS_MITIGATION_CHILD_PROCESS_POLICY child{};
  child.NoChildProcessCreation = 1;
  PROCESS_MITIGATION_DYNAMIC_CODE_POLICY code{};
  code.ProhibitDynamicCode = 1;
  PROCESS_MITIGATION_EXTENSION_POINT_DISABLE_POLICY ext{};
  ext.DisableExtensionPoints = 1;
  PROCESS_MITIGATION_IMAGE_LOAD_POLICY image{};
  image.NoRemoteImages = 1;
  image.NoLowMandatoryLabelImages = 1;
  PROCESS_MITIGATION_STRICT_HANDLE_CHECK_POLICY handles{};
  handles.RaiseExceptionOnInvalidHandleReference = 1;
  handles.HandleExceptionsPermanentlyEnabled = 1;
  if (!set_policy(ProcessChildProcessPolicy, child, "no child processes", &error) ||
      !set_policy(ProcessDynamicCodePolicy, code, "no dynamic code", &error) ||
      !set_policy(ProcessExtensionPointDisablePolicy, ext, "no extension points", &error) ||
      !set_policy(ProcessImageLoadPolicy, image, "image load policy", &error) ||
      !set_policy(ProcessStrictHandleCheckPolicy, handles, "strict handle checks", &error))
    return error;
  return {};
}

}  // namespace outrun::worker

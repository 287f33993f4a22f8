// Compiled into a program that links an installed outrun::host (find_package(outrun)): tells the
// library where the package's worker is. OUTRUN_PACKAGE_WORKER is set by outrunConfig.cmake from
// the package's own location, so the path follows the package wherever it was installed.
extern "C" const char* outrun_package_worker() {
  return OUTRUN_PACKAGE_WORKER;
}

# The Windows cross-build (included by the top-level CMakeLists.txt when WIN32; configure with
# -DCMAKE_TOOLCHAIN_FILE=scripts/cmake/mingw-w64.cmake, or run scripts/test-windows). It builds the
# libraries that compile for Windows unchanged and a doctest binary of their tests, which CTest
# runs under Wine (scripts/cmake/wine-run). design/windows.md says what is in and what is not yet.
#
# The dependencies come from scripts/windows-deps (OUTRUN_WIN_PREFIX): static libraries
# cross-built from Debian's sources, and include-shared/, links to the system's header-only
# libraries. They are given the Linux build's target names (PkgConfig::LUA, mimalloc,
# flatbuffers::flatbuffers, ...), so that protocol/ and worker/ define their libraries here as
# they do there.
if(NOT EXISTS "${OUTRUN_WIN_PREFIX}/outrun-deps.stamp")
  message(FATAL_ERROR "No Windows dependencies in ${OUTRUN_WIN_PREFIX}: run scripts/windows-deps")
endif()
set(_w "${OUTRUN_WIN_PREFIX}")

# gmtime_r() and localtime_r() from MinGW's <time.h>; no min()/max() macros from <windows.h>.
# WIN32_LEAN_AND_MEAN: <windows.h> without winsock.h, so that libuv's <winsock2.h> may follow it.
add_compile_definitions(_POSIX_THREAD_SAFE_FUNCTIONS NOMINMAX WIN32_LEAN_AND_MEAN)
# Static executables: no MinGW runtime DLLs (libstdc++, winpthread) to find under Wine.
add_link_options(-static)

find_program(FLATC flatc REQUIRED)  # the build machine's
find_package(Threads REQUIRED)
find_package(spdlog REQUIRED)  # from the prefix, with its fmt

function(_outrun_win_import name)  # name INCLUDE dir... LIBS lib...
  cmake_parse_arguments(A "" "" "INCLUDE;LIBS" ${ARGN})
  add_library(${name} INTERFACE IMPORTED GLOBAL)
  set_target_properties(${name} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${A_INCLUDE}"
    INTERFACE_LINK_LIBRARIES "${A_LIBS}")
endfunction()
_outrun_win_import(PkgConfig::LUA INCLUDE ${_w}/include/lua LIBS ${_w}/lib/liblua.a)
_outrun_win_import(PkgConfig::LIBUV INCLUDE ${_w}/include
  LIBS ${_w}/lib/libuv.a ws2_32 iphlpapi userenv psapi user32 dbghelp ole32 shell32)
_outrun_win_import(mimalloc INCLUDE ${_w}/include LIBS ${_w}/lib/libmimalloc-static.a advapi32 psapi bcrypt)
# Header-only: the system's trees, through links that expose nothing else of /usr/include.
foreach(t flatbuffers::flatbuffers Boost::headers nlohmann_json::nlohmann_json CLI11::CLI11
    tomlplusplus::tomlplusplus)
  _outrun_win_import(${t} INCLUDE ${_w}/include-shared)
endforeach()
_outrun_win_import(doctest::doctest INCLUDE ${_w}/include-shared)

# --- the libraries -------------------------------------------------------------------------------
# protocol/ (all of it), worker/'s outrun_sandbox, host/'s outrun_codec and outrun_log_ring: their
# own CMakeLists.txt, which stop there under WIN32.
add_subdirectory(protocol)
# FrameWriter writes a non-blocking named pipe there (WriteFile); FrameReader::read_from() read()s
# an fd, through MinGW's read() whose length is an unsigned int (the host reads pipes with libuv,
# into read_space()/commit()).
set_source_files_properties(${CMAKE_SOURCE_DIR}/protocol/frame_reader.cpp DIRECTORY protocol
  PROPERTIES COMPILE_OPTIONS -Wno-conversion)
# The platform seam (host/platform/win: named pipes, Job Objects) and outrun-worker.exe on it, in
# bin/ with the test programs, which start it from their own directory.
add_subdirectory(host/platform)
add_subdirectory(worker)
add_subdirectory(host)

# SHA-256 (the script registry's source digests): Windows' BCrypt behind OpenSSL's one-shot
# SHA256(), the only OpenSSL call outrun makes; host/platform/win/include/openssl/sha.h declares it.
add_library(outrun_win_sha256 STATIC host/platform/win/sha256_bcrypt.cpp)
target_include_directories(outrun_win_sha256 PUBLIC ${CMAKE_SOURCE_DIR}/host/platform/win/include)
target_link_libraries(outrun_win_sha256 PUBLIC bcrypt)

# The host library: outrun::Host (worker processes through the platform seam, supervision, the
# leader off: design/windows.md "The Host on Windows"), outrun::InProcess, the tags engine. Not
# the client (outrun::Client speaks to outrund over a Unix socket).
add_library(outrun_win_host STATIC
  host/src/common.cpp host/src/log.cpp host/src/script_registry.cpp host/src/completion.cpp
  host/src/host.cpp host/src/submit.cpp host/src/leader.cpp host/src/read_token.cpp
  host/src/workers.cpp host/src/supervise.cpp host/src/quarantine.cpp host/src/slow_lane.cpp
  host/src/shard_reader.cpp host/src/supervisor.cpp host/src/restart_policy.cpp
  host/src/slot_table.cpp host/src/worker_process.cpp host/src/in_process.cpp
  host/src/compiler.cpp
  host/tags/codes.cpp host/tags/engine.cpp
  host/codec/json_values.cpp)
target_include_directories(outrun_win_host PUBLIC ${CMAKE_SOURCE_DIR}/host/include
  ${CMAKE_SOURCE_DIR}/host/src ${CMAKE_SOURCE_DIR}/host/codec)
target_link_libraries(outrun_win_host PUBLIC outrun_sandbox outrun_codec outrun_protocol outrun_platform outrun_log_ring
  outrun_win_sha256 PkgConfig::LIBUV spdlog::spdlog nlohmann_json::nlohmann_json Boost::headers
  Threads::Threads)

# outrun.exe: `outrun eval` (host/cli/main_win.cpp; the other commands need outrund), beside
# outrun-worker.exe in bin/, where it looks for it.
add_executable(outrun host/cli/main_win.cpp host/cli/eval_cmd.cpp)
target_compile_definitions(outrun PRIVATE OUTRUN_VERSION="${PROJECT_VERSION}")
target_link_libraries(outrun PRIVATE outrun_win_host CLI11::CLI11)
add_dependencies(outrun outrun-worker)

# --- the tests, under Wine -----------------------------------------------------------------------
set(OUTRUN_WIN_TESTS
  protocol/messages_test.cpp
  worker/sandbox_test.cpp
  host/values_test.cpp
  host/latency_histogram_test.cpp
  host/restart_policy_test.cpp
  host/slot_table_test.cpp
  host/status_codes_test.cpp)
set(_t ${CMAKE_SOURCE_DIR}/tests)
list(TRANSFORM OUTRUN_WIN_TESTS PREPEND ${_t}/ OUTPUT_VARIABLE _win_test_src)
# tests/windows/: the platform seam's tests (a worker through it: worker_process_test.cpp starts
# outrun-worker.exe and outrun_win_spawn_helper.exe from its own directory).
set(OUTRUN_WIN_SEAM_TESTS windows/sha256_test.cpp windows/exit_kind_test.cpp
  windows/worker_process_test.cpp windows/host_test.cpp windows/frame_writer_win_test.cpp)
list(TRANSFORM OUTRUN_WIN_SEAM_TESTS PREPEND ${_t}/ OUTPUT_VARIABLE _win_seam_src)
add_executable(outrun_win_tests ${_t}/main.cpp ${_win_test_src} ${_win_seam_src})
target_include_directories(outrun_win_tests PRIVATE ${_t} ${CMAKE_SOURCE_DIR}/host/metrics)
target_link_libraries(outrun_win_tests PRIVATE outrun_win_host outrun_platform doctest::doctest)
add_executable(outrun_win_spawn_helper ${_t}/windows/spawn_helper.cpp)
target_include_directories(outrun_win_spawn_helper PRIVATE ${_t})
target_link_libraries(outrun_win_spawn_helper PRIVATE outrun_platform)
# outrun-test-worker.exe: the worker with the one test fault the Windows tests use.
add_executable(outrun-test-worker ${_t}/windows/test_faults_win.cpp)
target_include_directories(outrun-test-worker PRIVATE ${CMAKE_SOURCE_DIR}/worker)
target_link_libraries(outrun-test-worker PRIVATE outrun_worker_core)
add_dependencies(outrun_win_tests outrun-worker outrun-test-worker outrun_win_spawn_helper outrun)
target_compile_definitions(outrun_win_tests PRIVATE OUTRUN_TEST_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
# One CTest test per test file (doctest's --source-file filter): a Wine start costs ~1 s, so not
# one per test case as the Linux build registers them.
enable_testing()
foreach(f ${OUTRUN_WIN_TESTS} ${OUTRUN_WIN_SEAM_TESTS})
  get_filename_component(_name ${f} NAME_WE)
  # --test-case=*: tests/main.cpp then fails a file that ran no test case.
  add_test(NAME win.${_name} COMMAND outrun_win_tests --source-file=*${_name}.cpp --test-case=*)
  set_tests_properties(win.${_name} PROPERTIES TIMEOUT 300 LABELS windows
    ENVIRONMENT OUTRUN_WINEPREFIX=${CMAKE_BINARY_DIR}/wine)
endforeach()

# outrun.exe itself, as a user runs it (issue #32's "done when"): its output checked, under Wine.
add_test(NAME win.cli_eval COMMAND outrun eval -e "return 1 + 1")
add_test(NAME win.cli_eval_timeout COMMAND outrun eval --timeout 50 -e "while true do end")
add_test(NAME win.cli_eval_killed COMMAND outrun eval --timeout 50 --grace 100
  -e "return (('a'):rep(200000)):find('.-.-.-.-.-.-.-.-b')")
add_test(NAME win.cli_eval_json COMMAND outrun eval --json -i a=20 -i b=22 -e "return inputs.a + inputs.b")
add_test(NAME win.cli_daemon_command COMMAND outrun stats)
set_tests_properties(win.cli_eval PROPERTIES PASS_REGULAR_EXPRESSION "^2\n?$")
set_tests_properties(win.cli_eval_timeout PROPERTIES PASS_REGULAR_EXPRESSION "timeout: script exceeded its timeout of 50 ms")
set_tests_properties(win.cli_eval_killed PROPERTIES PASS_REGULAR_EXPRESSION "killed: script ran past its timeout of 50 ms and grace of 100 ms")
set_tests_properties(win.cli_eval_json PROPERTIES PASS_REGULAR_EXPRESSION "\"status\":\"ok\",\"value\":42")
set_tests_properties(win.cli_daemon_command PROPERTIES
  PASS_REGULAR_EXPRESSION "unavailable: 'outrun stats' needs outrund, which does not run on Windows")
set_tests_properties(win.cli_eval win.cli_eval_timeout win.cli_eval_killed win.cli_eval_json
  win.cli_daemon_command
  PROPERTIES TIMEOUT 120 LABELS windows ENVIRONMENT OUTRUN_WINEPREFIX=${CMAKE_BINARY_DIR}/wine)

# outrun-perf.exe: the rows of outrun-perf that make sense on Windows (perf/outrun_perf_win.cpp:
# idle round trip, kill latency after T+G), under the Linux row ids. Its smoke run checks that
# every row has a value and every result is right; no timing is asserted.
add_executable(outrun-perf perf/outrun_perf_win.cpp)
target_include_directories(outrun-perf PRIVATE ${CMAKE_SOURCE_DIR}/host/metrics)
target_link_libraries(outrun-perf PRIVATE outrun_win_host CLI11::CLI11 nlohmann_json::nlohmann_json)
add_dependencies(outrun-perf outrun-worker)
add_test(NAME win.perf_smoke COMMAND outrun-perf --iterations 200 --kill-rounds 2)
set_tests_properties(win.perf_smoke PROPERTIES TIMEOUT 180 LABELS windows
  ENVIRONMENT OUTRUN_WINEPREFIX=${CMAKE_BINARY_DIR}/wine)

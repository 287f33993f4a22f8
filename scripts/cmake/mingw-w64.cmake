# Cross-compiling outrun's portable libraries for 64-bit Windows with Debian's mingw-w64
# (design/windows.md). The posix thread model compilers: std::thread, std::mutex and
# std::condition_variable come from winpthreads, which the portable code needs as it is.
#   cmake -S . -B build-win -DCMAKE_TOOLCHAIN_FILE=scripts/cmake/mingw-w64.cmake
# scripts/test-windows does this, with the dependencies scripts/windows-deps builds.
set(CMAKE_SYSTEM_NAME Windows)
set(CMAKE_SYSTEM_PROCESSOR x86_64)
set(OUTRUN_MINGW_TRIPLE x86_64-w64-mingw32)
set(CMAKE_C_COMPILER ${OUTRUN_MINGW_TRIPLE}-gcc-posix)
set(CMAKE_CXX_COMPILER ${OUTRUN_MINGW_TRIPLE}-g++-posix)
set(CMAKE_RC_COMPILER ${OUTRUN_MINGW_TRIPLE}-windres)
set(CMAKE_AR ${OUTRUN_MINGW_TRIPLE}-gcc-ar-posix CACHE FILEPATH "")
set(CMAKE_RANLIB ${OUTRUN_MINGW_TRIPLE}-gcc-ranlib-posix CACHE FILEPATH "")

# Libraries and headers of the target only from the MinGW sysroot and the cross-built
# dependencies' prefix (OUTRUN_WIN_PREFIX, default build-win/deps/prefix); programs (flatc) from
# the build machine.
get_filename_component(_outrun_root "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
if(NOT OUTRUN_WIN_PREFIX)
  set(OUTRUN_WIN_PREFIX "${_outrun_root}/build-win/deps/prefix" CACHE PATH
      "The cross-built dependencies (scripts/windows-deps)")
endif()
set(CMAKE_FIND_ROOT_PATH /usr/${OUTRUN_MINGW_TRIPLE} ${OUTRUN_WIN_PREFIX})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# Test programs run under Wine (CTest, doctest_discover_tests): scripts/cmake/wine-run gives each build
# directory its own WINEPREFIX and strips the CR of Wine's console line ends.
set(CMAKE_CROSSCOMPILING_EMULATOR "${_outrun_root}/scripts/cmake/wine-run")

#!/usr/bin/env bash
# cmake --install into a temporary prefix, then build and run a project that find_package(outrun)
# and evaluates a script with the installed library and worker.
set -euo pipefail
build="$1"
consumer="$2"
sanitize="${3:-}"   # the build's OUTRUN_SANITIZE: its static libraries need the same runtime
flags=()
case "$sanitize" in
  address) flags=(-DCMAKE_CXX_FLAGS=-fsanitize=address,undefined -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined) ;;
  thread) flags=(-DCMAKE_CXX_FLAGS=-fsanitize=thread -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread) ;;
esac
tmp="$(mktemp -d /tmp/outrun-install-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log"
for f in sbin/outrund bin/outrun libexec/outrun/outrun-worker include/outrun/host.h include/outrun/client.h \
         lib/systemd/system/outrund.service lib/cmake/outrun/outrunConfig.cmake; do
  [ -e "$tmp/prefix/$f" ] || { echo "not installed: $f"; exit 1; }
done
# The worker with the test faults is for the build tree only; the installed one has none.
if grep -q OUTRUN_TEST_FAULT "$tmp/prefix/libexec/outrun/outrun-worker"; then
  echo "the installed outrun-worker reads OUTRUN_TEST_FAULT"
  exit 1
fi
if find "$tmp/prefix" -name 'outrun-test-worker*' | grep -q .; then
  echo "installed, but must not be: $(find "$tmp/prefix" -name 'outrun-test-worker*')"
  exit 1
fi
unit="$tmp/prefix/lib/systemd/system/outrund.service"
grep -q "ExecStart=$tmp/prefix/sbin/outrund" "$unit"
grep -q "ExecReload=$tmp/prefix/bin/outrun .* reload" "$unit"
grep -q "^DynamicUser=yes" "$unit"
# Every document the unit names is installed.
docs="$(sed -n 's/^Documentation=//p' "$unit")"
[ -n "$docs" ] || { echo "the unit names no Documentation="; exit 1; }
for d in $docs; do
  f="${d#file://}"
  [ -e "$f" ] || { echo "Documentation= names $d, which is not installed"; exit 1; }
done
if command -v systemd-analyze >/dev/null 2>&1; then
  # Offline check of the unit's syntax (the binaries it names exist in the prefix).
  systemd-analyze verify "$unit" 2>"$tmp/verify.log" || true
  if grep -Ei "unknown|invalid|failed to parse" "$tmp/verify.log"; then
    echo "systemd-analyze verify found problems"; exit 1
  fi
fi
# The tags' state store lives in the unit's state directory (design/daemon.md "State store").
grep -qx "StateDirectory=outrund" "$unit" || { echo "the unit has no StateDirectory=outrund"; exit 1; }
# Moved as a whole after the install: the consumer (which sets no worker_path) must find the
# moved package's worker, not the build's install prefix (/usr/local) nor the old location.
mv "$tmp/prefix" "$tmp/moved"
cmake -S "$consumer" -B "$tmp/build" -G Ninja -DCMAKE_PREFIX_PATH="$tmp/moved" -DCMAKE_BUILD_TYPE=Release "${flags[@]}" >"$tmp/configure.log"
cmake --build "$tmp/build" >"$tmp/build.log" || { cat "$tmp/build.log"; exit 1; }
unset OUTRUN_WORKER
out="$("$tmp/build/consumer")"
echo "consumer printed: $out"
[ "$out" = "1.5" ]

#!/usr/bin/env bash
# Soak test: one exec-server (websocket + remote mode through a rendezvous) under a mixed
# workload from several clients for MINUTES; fails when the server's RSS, descriptors,
# threads or processes grow without bound (last third of the run against the first), when
# a request errs that should not, or when output is lost. What it runs and the growth rule:
# benches/src/soak/mod.rs and monitor.rs.
#
#   scripts/soak.sh [MINUTES] [exec-server-soak options]     default: 2 minutes
#
# Builds the release binaries first. Every process it starts is stopped at the end, also
# on failure or Ctrl-C: the soak stops its own; then any process still carrying this run's
# marker in its environment is killed here (and the run fails, since none should be left).
set -euo pipefail
cd "$(dirname "$0")/.."

minutes="${1:-2}"
shift || true

echo "== building the release binaries (exec-server, exec-server-soak)"
cargo build --release --quiet -p exec-server --bin exec-server -p exec-server-bench --bins

marker="soak-$$-$(date +%s)"
export EXEC_SERVER_SOAK_RUN="$marker"

# The run uses copies, so a rebuild meanwhile does not swap the binaries under a long soak
# (the soak finds exec-server beside itself).
bin="$(mktemp -d "${TMPDIR:-/tmp}/exec-server-soak-bin.XXXXXX")"
cp target/release/exec-server target/release/exec-server-soak "$bin/"

# Kills every process whose environment holds this run's marker; prints what it found.
sweep() {
  local found=0 pid
  for dir in /proc/[0-9]*; do
    pid="${dir#/proc/}"
    [ "$pid" = "$$" ] && continue
    if grep -qzx "EXEC_SERVER_SOAK_RUN=$marker" "$dir/environ" 2>/dev/null; then
      echo "soak.sh: killing leftover process $pid: $(tr '\0' ' ' < "$dir/cmdline" 2>/dev/null)" >&2
      kill -KILL "$pid" 2>/dev/null || true
      found=1
    fi
  done
  return "$found"
}

echo "== soak for $minutes minute(s)"
status=0
"$bin/exec-server-soak" --minutes "$minutes" "$@" &
soak=$!
trap 'kill -INT "$soak" 2>/dev/null || true' INT TERM
# `wait` returns early when a trapped signal arrives; wait again until the soak is gone.
while true; do
  wait "$soak" && status=0 || status=$?
  kill -0 "$soak" 2>/dev/null || break
done
trap - INT TERM
# The sweep's own commands must not carry the marker.
export -n EXEC_SERVER_SOAK_RUN

if ! sweep; then
  echo "soak.sh: processes of this run outlived the soak" >&2
  [ "$status" -eq 0 ] && status=1
fi
rm -rf "$bin"
exit "$status"

#!/usr/bin/env bash
# Runs every fuzz target (fuzz/fuzz_targets) for SECONDS each, one after another, under
# libFuzzer with AddressSanitizer; exits non-zero as soon as a target fails to build or
# finds a crash (its input is kept in fuzz/artifacts/<target>/).
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]     default: 60 seconds, every target
#
# The committed seeds (fuzz/seeds/<target>) are read; what the fuzzer finds goes to
# fuzz/corpus/<target> (not committed), so a longer run starts where the last one ended.
# cargo-fuzz must be installed (`cargo install cargo-fuzz --locked`). The sanitizer flags
# are unstable compiler flags: RUSTC_BOOTSTRAP=1 lets the stable toolchain take them.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-60}"
shift || true
if [ "$#" -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^exec-server-fuzz$')
fi

export RUSTC_BOOTSTRAP=1
echo "== building ${#targets[@]} fuzz targets (AddressSanitizer)"
cargo fuzz build --sanitizer address

for target in "${targets[@]}"; do
  corpus="fuzz/corpus/$target"
  mkdir -p "$corpus" "fuzz/artifacts/$target"
  args=(-max_total_time="$seconds" -rss_limit_mb=2048 -timeout=20 -print_final_stats=1)
  case "$target" in
    # A server with its own threads and caches: a leak check after each input reports
    # what the caches hold. Growth is caught by -rss_limit_mb and scripts/soak.sh instead.
    jsonrpc) args+=(-detect_leaks=0 -print_funcs=0) ;;
  esac
  if [ -f "fuzz/dict/$target.dict" ]; then
    args+=(-dict="fuzz/dict/$target.dict")
  fi
  echo "== $target: ${seconds}s"
  log="$(mktemp)"
  if ! cargo fuzz run --sanitizer address "$target" "$corpus" "fuzz/seeds/$target" -- "${args[@]}" >"$log" 2>&1; then
    tail -n 60 "$log"
    rm -f "$log"
    echo "== $target FAILED: the input is in fuzz/artifacts/$target/" >&2
    exit 1
  fi
  # One line per target: executions per second, coverage, corpus size.
  # (a report line missing is no failure: the fuzzer's exit status already said how it went)
  grep -E '^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)' "$log" | tr '\n' ' ' || true
  grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1 || true
  rm -f "$log"
done
echo "== fuzz: every target ran ${seconds}s without a crash"

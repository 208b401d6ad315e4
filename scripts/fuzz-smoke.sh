#!/usr/bin/env bash
# Fuzz smoke test for sluice-proto's decoders, on STABLE Rust.
#
#   scripts/fuzz-smoke.sh [SECONDS_PER_TARGET] [TARGET...]
#
# Builds the libFuzzer targets in fuzz/ with plain `cargo build` and the
# SanitizerCoverage flags that cargo-fuzz would pass (all stable -C options, no
# nightly, no RUSTC_BOOTSTRAP, no cargo-fuzz needed), then runs each target for
# SECONDS_PER_TARGET (default 20) seconds on fuzz/corpus/TARGET (kept between
# runs, git-ignored) plus the committed seeds in fuzz/seeds/TARGET.
# Exits non-zero if any target crashes, and prints the crashing input's path
# and the command that reproduces it.
#
# Needs: cargo/rustc (stable) and a C++ compiler (libfuzzer-sys builds
# libFuzzer from source). Environment: FUZZ_MAX_LEN (default 8192),
# FUZZ_RSS_LIMIT_MB (default 2048), CARGO_TARGET_DIR (default fuzz/target).
set -euo pipefail

SECS="${1:-20}"
shift || true
ALL_TARGETS=(framer connect_data identify reservation discovery_log sqe_fields dsm volume_records drive_record auth_exchange target_queue flint_view view_frame nbd_server fuse_request host_queue auth_host)
if [ "$#" -gt 0 ]; then TARGETS=("$@"); else TARGETS=("${ALL_TARGETS[@]}"); fi
case "$SECS" in (''|*[!0-9]*) echo "usage: $0 [SECONDS_PER_TARGET] [TARGET...]" >&2; exit 2;; esac

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FUZZ="$ROOT/fuzz"
cd "$FUZZ"

# --- prerequisites (idempotent) -------------------------------------------
command -v cargo >/dev/null || { echo "fuzz-smoke: cargo not found" >&2; exit 1; }
if ! command -v c++ >/dev/null && ! command -v g++ >/dev/null && ! command -v clang++ >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "fuzz-smoke: installing g++ (needed to build libFuzzer)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ >/dev/null
  else
    echo "fuzz-smoke: a C++ compiler (g++) is required to build libFuzzer" >&2; exit 1
  fi
fi

# --- build ------------------------------------------------------------------
HOST="$(rustc -vV | sed -n 's/^host: //p')"
# An explicit --target keeps these flags off build scripts and proc macros
# (thiserror-impl), which must not be instrumented. Same flags as cargo-fuzz.
unset CARGO_ENCODED_RUSTFLAGS
export RUSTFLAGS="-Cpasses=sancov-module \
 -Cllvm-args=-sanitizer-coverage-level=4 \
 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
 -Cllvm-args=-sanitizer-coverage-pc-table \
 -Cllvm-args=-sanitizer-coverage-trace-compares \
 -Cllvm-args=-sanitizer-coverage-stack-depth \
 --cfg fuzzing"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$FUZZ/target}"
BIN_ARGS=()
for t in "${TARGETS[@]}"; do BIN_ARGS+=(--bin "$t"); done
echo "fuzz-smoke: building ${TARGETS[*]} (release, debug assertions + overflow checks, target $HOST)"
start=$(date +%s)
"$ROOT/scripts/install-build-deps.sh"  # sluice-export reaches the control plane's gRPC code, which needs protoc
cargo build --release --target "$HOST" "${BIN_ARGS[@]}"
echo "fuzz-smoke: build took $(( $(date +%s) - start ))s"
BIN_DIR="$CARGO_TARGET_DIR/$HOST/release"

# --- run --------------------------------------------------------------------
failed=()
for t in "${TARGETS[@]}"; do
  corpus="$FUZZ/corpus/$t"
  artifacts="$FUZZ/artifacts/$t"
  mkdir -p "$corpus" "$artifacts"
  seeds=()
  [ -d "$FUZZ/seeds/$t" ] && seeds=("$FUZZ/seeds/$t")
  log="$artifacts/last-run.log"
  echo "fuzz-smoke: $t for ${SECS}s"
  set +e
  "$BIN_DIR/$t" \
    -max_total_time="$SECS" \
    -max_len="${FUZZ_MAX_LEN:-8192}" \
    -rss_limit_mb="${FUZZ_RSS_LIMIT_MB:-2048}" \
    -timeout=10 \
    -print_final_stats=1 \
    -artifact_prefix="$artifacts/" \
    "$corpus" "${seeds[@]}" >"$log" 2>&1
  rc=$?
  set -e
  grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)' "$log" | sed 's/^/    /' || true
  if [ "$rc" -ne 0 ]; then
    failed+=("$t")
    echo "fuzz-smoke: $t FAILED (exit $rc); log: $log" >&2
    # The panic's message is the line after "panicked at".
    grep -A1 -E "panicked at|^thread '|assertion|ERROR: libFuzzer|SUMMARY" "$log" | head -20 | sed 's/^/    /' >&2 || true
    for a in $(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log"); do
      echo "fuzz-smoke: crashing input: $a" >&2
      echo "fuzz-smoke: reproduce with: $BIN_DIR/$t $a" >&2
      # The input itself, so a crash found on a machine that is gone (CI)
      # can be replayed: base64 -d > crash.
      if [ -f "$a" ] && [ "$(stat -c %s "$a")" -le 16384 ]; then
        echo "fuzz-smoke: crashing input as base64: $(base64 -w0 "$a")" >&2
      fi
    done
  fi
done

if [ "${#failed[@]}" -gt 0 ]; then
  echo "fuzz-smoke: FAILED targets: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz-smoke: all ${#TARGETS[@]} targets ran ${SECS}s without a crash"

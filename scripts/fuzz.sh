#!/usr/bin/env bash
# Fuzzes every reader of untrusted bytes (the targets in fuzz/fuzz_targets, entry points in
# crates/formats/src/fuzz.rs) with libFuzzer through cargo-fuzz, SECONDS per target, two targets at a time.
#
#   scripts/fuzz.sh SECONDS [TARGET...]
#
# Needs the nightly toolchain (`rustup toolchain install nightly`); installs cargo-fuzz when it is missing. Each
# target starts from fuzz/corpus/TARGET (seeds from scripts/fuzz-seeds.py) and adds the inputs that reach new
# code there; the corpus is then minimised (`cargo fuzz cmin`). A crash, timeout (10 s per input) or an input that
# takes more than 2 GiB lands in fuzz/artifacts/TARGET/; crates/formats/tests/fuzz_corpus.rs replays the corpus
# and every artifact on the stable toolchain, so commit both. Prints a table: executions, coverage (libFuzzer's
# edge count `cov` and feature count `ft`), corpus size, and the failures this run found; exits non-zero if any.
#
# Builds with overflow checks and debug assertions, no sanitizer (the readers are safe Rust: a panic, an abort or
# an allocation past the limit is what there is to find), in the shared target directory.
set -euo pipefail
cd "$(dirname "$0")/.."

[ $# -ge 1 ] && [[ "$1" =~ ^[0-9]+$ ]] || { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
seconds=$1
shift
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(ls fuzz/fuzz_targets | sed 's/\.rs$//')
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
fuzz=(cargo +nightly fuzz)
flags=(--sanitizer none --debug-assertions)
"${fuzz[@]}" build "${flags[@]}"

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
# The failures found before this run (committed, replayed by the tests) are not this run's.
for target in "${targets[@]}"; do
  ls "fuzz/artifacts/$target" 2>/dev/null | sort >"$logs/$target.before" || true
done
run() {
  local target=$1
  mkdir -p "fuzz/corpus/$target" "fuzz/artifacts/$target"
  "${fuzz[@]}" run "${flags[@]}" "$target" "fuzz/corpus/$target" -- \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 -print_final_stats=1 \
    >"$logs/$target.log" 2>&1 || true
  "${fuzz[@]}" cmin "${flags[@]}" "$target" "fuzz/corpus/$target" >"$logs/$target.cmin.log" 2>&1 || true
}
# Two at a time: one target per core.
for ((i = 0; i < ${#targets[@]}; i += 2)); do
  run "${targets[i]}" &
  [ $((i + 1)) -lt ${#targets[@]} ] && run "${targets[i + 1]}" &
  wait
done

failures=0
echo
echo "| target | seconds | executions | exec/s | cov | ft | corpus files | crashes, timeouts, out-of-memory |"
echo "|---|---:|---:|---:|---:|---:|---:|---|"
for target in "${targets[@]}"; do
  log="$logs/$target.log"
  stat() { grep -Eo "stat::$1: *[0-9]+" "$log" | tail -n 1 | grep -Eo '[0-9]+$' || echo "?"; }
  last=$(grep -E '^#[0-9]+' "$log" | tail -n 1)
  cov=$(grep -Eo 'cov: [0-9]+' <<<"$last" | grep -Eo '[0-9]+' || echo "?")
  ft=$(grep -Eo 'ft: [0-9]+' <<<"$last" | grep -Eo '[0-9]+' || echo "?")
  found=$(ls "fuzz/artifacts/$target" 2>/dev/null | sort | comm -13 "$logs/$target.before" - | wc -l)
  problems=$(grep -Eo '(deadly signal|panicked at|ERROR: libFuzzer: [a-z-]+)' "$log" | sort -u | paste -sd, - || true)
  [ "$found" = 0 ] && [ -z "$problems" ] || failures=$((failures + 1))
  echo "| $target | $seconds | $(stat number_of_executed_units) | $(stat average_exec_per_sec) | $cov | $ft |" \
    "$(ls "fuzz/corpus/$target" | wc -l) | ${problems:-none}$([ "$found" = 0 ] || echo " ($found new in fuzz/artifacts/$target)") |"
done
if [ "$failures" -gt 0 ]; then
  echo "$failures target(s) failed; the inputs are in fuzz/artifacts/ and each log's end says why" >&2
  for target in "${targets[@]}"; do grep -q -E 'deadly signal|panicked at|ERROR: libFuzzer' "$logs/$target.log" && tail -n 30 "$logs/$target.log" >&2; done
  exit 1
fi

#!/usr/bin/env bash
# Builds every libFuzzer target (src/kimirt/*/*_fuzz.cpp, see cmake/kimirt_fuzz.cmake) with
# clang + ASan/UBSan into a separate build directory and runs each for a while, one after the
# other, printing one summary line per target. Exits non-zero if any target crashed, hung,
# ran out of memory or failed to build; the input that did it is kept under BUILD/crashes/.
#
#   scripts/fuzz.sh [-t SECONDS] [-b BUILD_DIR] [TARGET...]
#     -t  seconds per target (default 60; libFuzzer's -max_total_time)
#     -b  build directory (default build-fuzz)
#     TARGET...  only these targets (default: all)
#   Extra libFuzzer flags: FUZZ_FLAGS="-max_len=65536" scripts/fuzz.sh
#
# Seed corpora live in BUILD/corpus/<target> and grow between runs. Each run first (re)writes
# the target's own seeds: a target may define LLVMFuzzerInitialize that writes valid inputs
# into $KIMIRT_FUZZ_WRITE_SEEDS (safetensors_header_fuzz does, using SafetensorsWriter); it is
# run with -runs=0, so a target without a generator just does nothing. Then files that fit
# the target are added: the fixture shards' headers (8-byte length + JSON, data cut off) for
# safetensors targets, the configs for config targets (tests/fixtures, configs/).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=60
build=build-fuzz
while getopts "t:b:h" opt; do
  case "$opt" in
    t) seconds="$OPTARG" ;;
    b) build="$OPTARG" ;;
    *) sed -n '2,20p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))

# Until the top CMakeLists includes cmake/kimirt_fuzz.cmake itself, include it right after
# project(). The flags below instrument every library wherever the include sits.
extra=()
if ! grep -q "kimirt_fuzz.cmake" CMakeLists.txt; then
  extra+=("-DCMAKE_PROJECT_kimirt_INCLUDE=$PWD/cmake/kimirt_fuzz.cmake")
fi
san="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKIMIRT_FUZZ=ON -DKIMIRT_TESTS=OFF -DKIMIRT_BENCH=OFF \
  -DCMAKE_CXX_FLAGS="$san" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  "${extra[@]}" >"$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
rm -f "$build.configure.log"
cmake --build "$build"

if [ $# -gt 0 ]; then
  targets=("$@")
else
  targets=()
  for f in src/kimirt/*/*_fuzz.cpp; do targets+=("$(basename "$f" .cpp)"); done
fi

# Tokens worth splicing into JSON inputs.
dict="$build/json.dict"
cat >"$dict" <<'EOF'
"{"
"}"
"["
"]"
":"
","
"\""
"\\u"
"\\ud83d\\ude00"
"true"
"false"
"null"
"-0"
"1e3"
"18446744073709551616"
"9223372036854775808"
"\"dtype\""
"\"shape\""
"\"data_offsets\""
"\"__metadata__\""
"\"BF16\""
"\"F8_E4M3\""
"\"F8_E8M0\""
"\"U8\""
"\"F32\""
"\"weight_map\""
"\"metadata\""
"\"total_size\""
EOF

mkdir -p "$build/crashes" "$build/logs"
failed=0
for name in "${targets[@]}"; do
  bin="$build/fuzz/$name"
  if [ ! -x "$bin" ]; then
    printf '%-28s FAILED  not built (%s missing)\n' "$name" "$bin"
    failed=1
    continue
  fi
  corpus="$build/corpus/$name"
  mkdir -p "$corpus"
  KIMIRT_FUZZ_WRITE_SEEDS="$corpus" "$bin" -runs=0 >/dev/null 2>&1 || true
  case "$name" in
    *safetensors*)
      for f in tests/fixtures/*/*.safetensors; do
        [ -f "$f" ] || continue
        n=$(od -An -tu8 -N8 "$f" | tr -d ' ')
        head -c $((8 + n)) "$f" >"$corpus/fixture-$(basename "$(dirname "$f")")-$(basename "$f")"
      done ;;
    *config*)
      for f in configs/*.json tests/fixtures/*/config.json; do
        [ -f "$f" ] && cp "$f" "$corpus/seed-$(basename "$(dirname "$f")")-$(basename "$f")"
      done ;;
  esac
  log="$build/logs/$name.log"
  rc=0
  # shellcheck disable=SC2086
  "$bin" "$corpus" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -dict="$dict" -artifact_prefix="$build/crashes/$name-" \
    ${FUZZ_FLAGS:-} >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\)\/.*/\1/p' <<<"$last")
  if [ "$rc" -eq 0 ]; then
    printf '%-28s OK      %ss, %s execs, cov %s, corpus %s\n' "$name" "$seconds" \
      "${execs:-?}" "${cov:-?}" "${corp:-?}"
  else
    artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
    printf '%-28s FAILED  exit %s after %s execs: %s (log %s)\n' "$name" "$rc" "${execs:-?}" \
      "${artifact:-no input saved}" "$log"
    grep -m1 -E 'ERROR: (AddressSanitizer|libFuzzer|UndefinedBehaviorSanitizer)|runtime error' \
      "$log" | sed 's/^/    /' || true
    failed=1
  fi
done
exit "$failed"

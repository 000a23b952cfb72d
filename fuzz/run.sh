#!/usr/bin/env bash
# Runs the libFuzzer targets of fuzz/ (built by fuzz/build.sh).
#
#   fuzz/run.sh run [TARGET...]     fuzz each target in turn, on a working
#                                   copy of its corpus (build/fuzz/scratch/)
#   fuzz/run.sh replay [TARGET...]  run every input of each committed corpus
#                                   once; fail if any crashes
#
# run, from the environment:
#   FUZZ_SECONDS=180   time per target (-max_total_time)
#   FUZZ_RUNS=N        stop a target after N runs instead (-runs)
#   FUZZ_MERGE=1       then minimize: merge the committed and the working
#                      corpus into fuzz/corpus/<target> (-merge=1)
#   FUZZ_TIMEOUT=10    seconds one input may take before it is a timeout
#   FUZZ_ARGS=...      more libFuzzer options
#
# A crash, leak, timeout or out-of-memory input found by `run` is copied
# into fuzz/corpus/<target>/ under libFuzzer's name (crash-<sha1>, ...), so
# that `replay` (make test) fails on it until the core is fixed; `run`
# then exits non-zero, naming it.  Files named seed-* (hand-written
# examples of each API shape) and regress-* (inputs of past bugs) survive
# minimization, as do crash-*, leak-*, timeout-* and oom-*.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/build/fuzz"
corpus="$root/fuzz/corpus"
dict="$root/fuzz/json.dict"

mode=${1:-}
if [ $# -gt 0 ]; then
    shift
fi

case "$mode" in
run|replay) ;;
*)
    echo "usage: fuzz/run.sh run|replay [TARGET...]" >&2
    exit 2
    ;;
esac

if [ $# -gt 0 ]; then
    targets=("$@")
else
    targets=()
    for src in "$root"/fuzz/fuzz_*.cpp; do
        targets+=("$(basename "$src" .cpp)")
    done
fi

seconds=${FUZZ_SECONDS:-180}
timeout=${FUZZ_TIMEOUT:-10}
extra=()
if [ -n "${FUZZ_ARGS:-}" ]; then
    read -r -a extra <<< "$FUZZ_ARGS"
fi

# Stack traces for UBSan reports too; a report ends the run.
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

"$root/fuzz/build.sh"

failed=()

# Whether a corpus file is a failure found by fuzzing.
is_artifact() {
    case "$(basename "$1")" in
    crash-*|leak-*|timeout-*|oom-*) return 0 ;;
    esac
    return 1
}

# Whether a corpus file is kept whatever the merge says.
is_kept() {
    is_artifact "$1" && return 0
    case "$(basename "$1")" in
    seed-*|regress-*) return 0 ;;
    esac
    return 1
}

repro() {
    echo "    reproduce: build/fuzz/$1 ${2#"$root"/}" >&2
}

# ---- replay ---------------------------------------------------------------

replay() {
    local t=$1 bin="$out/$1" files=() f log start end
    local artifacts="$out/replay-artifacts/$t/"

    for f in "$corpus/$t"/*; do
        [ -f "$f" ] && files+=("$f")
    done
    if [ ${#files[@]} -eq 0 ]; then
        echo "$t: no corpus in fuzz/corpus/$t"
        return
    fi

    mkdir -p "$artifacts" "$out/logs"
    log="$out/logs/$t-replay.log"
    start=$(date +%s%N)

    # All inputs in one process; if that fails, each alone, to name every
    # input that fails.
    if "$bin" -rss_limit_mb=2048 -timeout="$timeout" \
        -artifact_prefix="$artifacts" "${files[@]}" > "$log" 2>&1
    then
        end=$(date +%s%N)
        echo "$t: ${#files[@]} inputs replayed, no failure" \
             "($(( (end - start) / 1000000 )) ms)"
        return
    fi

    local bad=0
    for f in "${files[@]}"; do
        if ! "$bin" -rss_limit_mb=2048 -timeout="$timeout" \
            -artifact_prefix="$artifacts" "$f" > "$log.one" 2>&1
        then
            bad=$((bad + 1))
            echo "$t: FAILED on ${f#"$root"/}:" >&2
            grep -m3 -E 'ERROR: |runtime error|check failed|SUMMARY' \
                "$log.one" | sed 's/^/    /' >&2 || true
            repro "$t" "$f"
            failed+=("$t: ${f#"$root"/}")
        fi
    done
    if [ $bad -eq 0 ]; then
        # Only the whole run failed: an input that breaks a later one.
        echo "$t: FAILED replaying the corpus in one process" \
             "(each input alone passes); log: ${log#"$root"/}" >&2
        echo "    reproduce: build/fuzz/$t fuzz/corpus/$t/*" >&2
        failed+=("$t: whole corpus, see ${log#"$root"/}")
    fi
}

# ---- run --------------------------------------------------------------------

merge() {
    local t=$1 bin="$out/$1" f
    local stage="$out/merge/$t" input="$out/merge/$t-input"
    local before after

    rm -rf "$stage" "$input"
    mkdir -p "$stage" "$input"

    before=$(find "$corpus/$t" -type f | wc -l)

    # The kept files start the merged corpus; the others compete with the
    # working corpus.  Failures stay out of the merge (they would crash it).
    for f in "$corpus/$t"/*; do
        [ -f "$f" ] || continue
        if is_artifact "$f"; then
            continue
        elif is_kept "$f"; then
            cp "$f" "$stage/"
        else
            cp "$f" "$input/"
        fi
    done

    if ! "$bin" -merge=1 -rss_limit_mb=2048 -timeout="$timeout" \
        "$stage" "$input" "$out/scratch/$t" > "$out/logs/$t-merge.log" 2>&1
    then
        echo "$t: merge failed, corpus left as it was;" \
             "log: build/fuzz/logs/$t-merge.log" >&2
        failed+=("$t: merge")
        return
    fi

    for f in "$corpus/$t"/*; do
        [ -f "$f" ] && ! is_artifact "$f" && rm -f "$f"
    done
    cp "$stage"/* "$corpus/$t/"

    after=$(find "$corpus/$t" -type f | wc -l)
    echo "$t: corpus merged: $before -> $after files," \
         "$(du -sk "$corpus/$t" | cut -f1) KB"
}

fuzz() {
    local t=$1 bin="$out/$1" f rc=0 log done_line found=0
    local work="$out/scratch/$t" artifacts="$out/artifacts/$t/"
    local limit=(-max_total_time="$seconds")

    if [ -n "${FUZZ_RUNS:-}" ]; then
        limit=(-runs="$FUZZ_RUNS")
    fi

    rm -rf "$artifacts"
    mkdir -p "$work" "$artifacts" "$out/logs"
    log="$out/logs/$t.log"

    # The working corpus: what earlier runs found, and the committed one
    # (without its failures, which would stop the run at once).
    for f in "$corpus/$t"/*; do
        [ -f "$f" ] && ! is_artifact "$f" && cp "$f" "$work/"
    done

    echo "$t: fuzzing (${limit[*]}), log: build/fuzz/logs/$t.log"
    "$bin" "${limit[@]}" -dict="$dict" -rss_limit_mb=2048 \
        -timeout="$timeout" -artifact_prefix="$artifacts" \
        -print_final_stats=1 "${extra[@]}" "$work" > "$log" 2>&1 || rc=$?

    done_line=$(grep -E '^Done [0-9]+ runs in [0-9]+ second' "$log" \
                | tail -n1 || true)
    if [ -n "$done_line" ]; then
        local rate
        rate=$(grep -m1 -oE 'stat::average_exec_per_sec: *[0-9]+' "$log" \
               | grep -oE '[0-9]+$' || true)
        echo "$t: $done_line (${rate:-?} exec/s)"
    else
        echo "$t: stopped early ($(grep -oE '^#[0-9]+' "$log" | tail -n1 \
             || true) runs)"
    fi

    for f in "$artifacts"*; do
        [ -f "$f" ] || continue
        is_artifact "$f" || continue
        found=1
        cp "$f" "$corpus/$t/"
        echo "$t: FOUND $(basename "$f"):" >&2
        grep -m3 -E 'ERROR: |runtime error|check failed|SUMMARY' "$log" \
            | sed 's/^/    /' >&2 || true
        repro "$t" "$corpus/$t/$(basename "$f")"
        failed+=("$t: fuzz/corpus/$t/$(basename "$f")")
    done

    if [ $rc -ne 0 ] && [ $found -eq 0 ]; then
        echo "$t: libFuzzer failed (exit $rc) without an input;" \
             "log: build/fuzz/logs/$t.log" >&2
        failed+=("$t: exit $rc")
    fi

    if [ "${FUZZ_MERGE:-0}" = 1 ]; then
        merge "$t"
    fi
}

for t in "${targets[@]}"; do
    if [ ! -x "$out/$t" ]; then
        echo "fuzz/run.sh: no target $t" >&2
        exit 2
    fi
    if [ "$mode" = run ]; then
        fuzz "$t"
    else
        replay "$t"
    fi
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz/run.sh $mode: FAILED:" >&2
    printf '    %s\n' "${failed[@]}" >&2
    exit 1
fi

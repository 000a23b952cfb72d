#!/usr/bin/env bash
# Instructions per request through nginx, counted by callgrind: the module
# against nginx's own consistent hash, deterministic where requests per
# second are not:
#   session_affinity against "hash $http_x_session_id consistent"
#   (GET with X-Session-ID, 1000 sessions);
#   prefix_affinity against "hash $request_body consistent" (POST of 4 KB
#   chat bodies, 100 conversations).
# One nginx process (master_process off) runs under valgrind
# --tool=callgrind, with four "return 200" backends in it and upstream
# keepalive; bench/instructions_client.py sends its requests one at a
# time.  Each side runs twice, with WARMUP_REQUESTS and with REQUESTS
# requests, and Ir per request is the difference over the difference, so
# start-up, configuration and exit cancel out.  One valgrind at a time.
# Counts move by up to 1% with the memory layout, which depends on the
# length of the paths in nginx.conf and on the environment: every run is
# in the same temporary directory, with the module copied to the same
# name, and nginx starts with an empty environment.  Each run's
# callgrind.out and logs are kept in build/bench-instructions/; the table
# goes to build/bench/instructions.md, or with RECORD=1 to the committed
# bench/results/instructions.md, stamped with its command, commit, module
# version and date (bench/stamp.sh).
#
#   bench/bench-instructions.sh [output.md]
#   REQUESTS=3000 WARMUP_REQUESTS=300 BENCH_PORT=19480 (and the next 4)
#   AFFINITY_MODULE_BASE=other.so   another build of the module, compared
#                                   in two more columns (before and after)
set -euo pipefail

# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/../scripts/lib.sh"     # repo, module, nginx
# shellcheck source=bench/stamp.sh
. "$(dirname "$0")/stamp.sh"              # result_path, stamp, shown
out="${1:-$(result_path instructions.md)}"
requests="${REQUESTS:-3000}"
warmup="${WARMUP_REQUESTS:-300}"
base="${AFFINITY_MODULE_BASE:-}"
python="${PYTHON:-python3}"
dir="$repo/build/bench-instructions"
port="${BENCH_PORT:-19480}"

if ! valgrind=$(command -v valgrind); then
    say "valgrind is missing (scripts/install-deps.sh installs it)"
    exit 1
fi
if ! found=$(command -v "$nginx"); then
    say "no nginx at $nginx"
    exit 1
fi
nginx="$found"
for so in "$module" ${base:+"$base"}; do
    if [ ! -f "$so" ]; then
        say "no module at $so"
        exit 1
    fi
done
if [ "$requests" -le "$warmup" ]; then
    say "REQUESTS must be more than WARMUP_REQUESTS"
    exit 1
fi

# shellcheck source=bench/loopback.sh
. "$(dirname "$0")/loopback.sh"           # b, servers, backends_server

mkdir -p "$dir" "$(dirname "$out")"

# listening PORT: whether something listens on 127.0.0.1:PORT.
listening() { (: > "/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

for p in "$port" "${b[@]}"; do
    if listening "$p"; then
        say "port $p is in use (BENCH_PORT=... for others)"
        exit 1
    fi
done

# Every run in the same directory, with paths of the same length.
scratch=$(mktemp -d "${TMPDIR:-/tmp}/bench-instructions.XXXXXX")
run="$scratch/run"

vpid=""
stop() {
    if [ -n "$vpid" ] && kill -0 "$vpid" 2>/dev/null; then
        kill -KILL "$vpid" 2>/dev/null || true
        wait "$vpid" 2>/dev/null || true
    fi
    vpid=""
}
trap 'stop; rm -rf "$scratch" "$out.tmp"' EXIT
trap 'exit 130' INT TERM

# conf RUNDIR SO|none POLICY: an nginx.conf with one upstream of POLICY.
conf() {
    local rundir="$1" so="$2" policy="$3"
    {
        [ "$so" = none ] || echo "load_module $rundir/module.so;"
        cat <<CONF
daemon off;
master_process off;
worker_processes 1;
error_log $rundir/error.log warn;
pid $rundir/nginx.pid;
events { worker_connections 1024; }

http {
    access_log off;
    client_body_temp_path $rundir/tmp;
    proxy_temp_path $rundir/tmp;

    upstream up {
        $servers
        $policy
        keepalive 64;
    }

$(backends_server "")

    server {
        listen 127.0.0.1:$port;
        client_body_buffer_size 256k;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        location / { proxy_pass http://up; }
    }
}
CONF
    } > "$rundir/nginx.conf"
}

# totals FILE: the total Ir of a callgrind.out ("totals:", else
# "summary:").
totals() {
    awk '$1 == "totals:" { t = $2 } $1 == "summary:" { s = $2 }
         END { if (t != "") print t; else if (s != "") print s; else exit 1 }' \
        "$1"
}

# run NAME SO|none POLICY MODE N: nginx under callgrind, N requests of
# MODE (session|prefix), stopped with SIGQUIT; sets ir to the total Ir.
# (No command substitution around it: the trap must see vpid.)
ir=""
run() {
    local name="$1" so="$2" policy="$3" mode="$4" n="$5" i
    local kept="$dir/$name-$n"
    rm -rf "$run" "$kept"
    mkdir -p "$run/tmp"
    [ "$so" = none ] || cp "$so" "$run/module.so"
    conf "$run" "$so" "$policy"
    say "$name, $n requests"
    env -i "$valgrind" --tool=callgrind \
        --callgrind-out-file="$run/callgrind.out" \
        "$nginx" -p "$run" -c "$run/nginx.conf" \
        > "$run/valgrind.log" 2>&1 &
    vpid=$!
    for ((i = 0; ; i++)); do
        listening "$port" && break
        if ! kill -0 "$vpid" 2>/dev/null || [ "$i" -ge 600 ]; then
            keep "$kept"
            say "nginx did not start: $(shown "$kept")/error.log"
            exit 1
        fi
        sleep 0.2
    done
    if ! "$python" "$repo/bench/instructions_client.py" "$port" "$mode" "$n" \
            > "$run/client.log" 2>&1; then
        keep "$kept"
        say "client failed: $(cat "$kept/client.log")"
        exit 1
    fi
    kill -QUIT "$vpid"
    wait "$vpid" || true
    vpid=""
    keep "$kept"
    if grep -E '\[(alert|emerg|crit)\]' "$kept/error.log" >&2; then
        say "nginx reported errors: $(shown "$kept")/error.log"
        exit 1
    fi
    ir=$(totals "$kept/callgrind.out")
}

# keep DIR: the run's files, but the module and temporary files, into DIR.
keep() {
    stop
    rm -rf "$run/tmp" "$run/module.so"
    mv "$run" "$1"
}

# per NAME SO|none POLICY MODE: sets per_request to the Ir per request.
per_request=""
per() {
    local lo
    run "$@" "$warmup"; lo="$ir"
    run "$@" "$requests"
    per_request=$(awk -v lo="$lo" -v hi="$ir" -v n=$((requests - warmup)) \
        'BEGIN { printf "%.0f", (hi - lo) / n }')
}

# thousands N: N with thousands separators.
thousands() {
    echo "$1" | sed -e ':a' -e 's/\([0-9]\)\([0-9]\{3\}\)\($\|,\)/\1,\2\3/; ta'
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }

# row LABEL MODE POLICY REFERENCE: a table row, appended to the output.
row() {
    local label="$1" mode="$2" policy="$3" reference="$4" m r line
    per "module-$mode" "$module" "$policy" "$mode"; m="$per_request"
    per "nginx-$mode" none "$reference" "$mode"; r="$per_request"
    line="| $label | $(thousands "$m") | $(thousands "$r") | $(ratio "$m" "$r") |"
    if [ -n "$base" ]; then
        per "base-$mode" "$base" "$policy" "$mode"
        line="$line $(thousands "$per_request") | $(ratio "$m" "$per_request") |"
    fi
    echo "$line" >> "$out.tmp"
}

started=$(date +%s)
version=$("$nginx" -v 2>&1 | sed 's/^nginx version: //')
# The stamp is taken before the runs: the commit they measured.
stamped=$(stamp markdown "bench/bench-instructions.sh${1:+ $(shown "$1")}" \
          REQUESTS WARMUP_REQUESTS AFFINITY_MODULE_BASE)

{
    echo "## Instructions per request (callgrind, 1 nginx process, upstream keepalive)"
    echo
    echo "$stamped"
    echo
    echo "$version under \`valgrind --tool=callgrind\` ($(valgrind --version)),"
    echo "\`master_process off\`; backends are nginx \`return 200\` in the same"
    echo "process.  Requests are sent one at a time over 4 keep-alive"
    echo "connections."
    echo
    echo "Ir per request = (Ir of $requests requests − Ir of $warmup requests) / $((requests - warmup));"
    echo "ratio = module ÷ nginx's own hash."
    echo
    if [ -n "$base" ]; then
        echo "| scenario | module Ir/request | nginx's own hash Ir/request | ratio | base module Ir/request | module ÷ base |"
        echo "|---|---:|---:|---:|---:|---:|"
    else
        echo "| scenario | module Ir/request | nginx's own hash Ir/request | ratio |"
        echo "|---|---:|---:|---:|"
    fi
} > "$out.tmp"
# shellcheck disable=SC2016  # nginx's variables, for nginx.conf
row "\`session_affinity\` / \`hash \$http_x_session_id consistent\`, GET, 1000 sessions" \
    session 'session_affinity header=X-Session-ID zone=bench_sessions:8m;' \
    'hash $http_x_session_id consistent;'
# shellcheck disable=SC2016
row "\`prefix_affinity\` / \`hash \$request_body consistent\`, POST, 4 KB chat bodies, 100 conversations" \
    prefix 'prefix_affinity zone=bench_prefixes:16m;' \
    'hash $request_body consistent;'
{
    echo
    echo "Module: $(shown "$module")."
    if [ -n "$base" ]; then
        echo "Base module: $(shown "$base")."
    fi
} >> "$out.tmp"
mv "$out.tmp" "$out"
cat "$out"
elapsed=$(($(date +%s) - started))
note "$(shown "$out"), in $((elapsed / 60)) min $((elapsed % 60)) s"

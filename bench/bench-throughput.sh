#!/usr/bin/env bash
# Requests per second through nginx on loopback, runs alternated so that
# drift hits both sides alike:
#   session_affinity against nginx's own "hash $http_x_session_id
#   consistent" (1000 sessions, GET);
#   prefix_affinity against "hash $request_body consistent" (100 chat
#   conversations, POST bodies of 4 KB, 32 KB and 128 KB).
#
# The table goes to build/bench/throughput.md, or with RECORD=1 to the
# committed bench/results/throughput.md, stamped with its command, commit,
# module version and date (bench/stamp.sh).
#
#   bench/bench-throughput.sh [output.md]
#   ROUNDS=3 SECONDS_PER_RUN=8 CONNECTIONS=32
set -euo pipefail

# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/../scripts/lib.sh"     # repo, module, nginx
# shellcheck source=bench/stamp.sh
. "$(dirname "$0")/stamp.sh"              # result_path, stamp, shown
out="${1:-$(result_path throughput.md)}"
rounds="${ROUNDS:-3}"
secs="${SECONDS_PER_RUN:-8}"
conns="${CONNECTIONS:-32}"
dir="$repo/build/bench-throughput"
port="${BENCH_PORT:-19080}"

# shellcheck source=bench/loopback.sh
. "$(dirname "$0")/loopback.sh"           # b, servers, backends_server

mkdir -p "$dir/tmp" "$(dirname "$out")"

cat > "$dir/nginx.conf" <<CONF
load_module $module;
worker_processes 1;
error_log $dir/error.log warn;
pid $dir/nginx.pid;
events { worker_connections 4096; }

http {
    access_log off;
    client_body_temp_path $dir/tmp;
    proxy_temp_path $dir/tmp;

    log_format port '\$server_port';

    upstream affinity {
        $servers
        session_affinity header=X-Session-ID zone=bench_sessions:8m;
        keepalive 64;
    }

    upstream chash {
        $servers
        hash \$http_x_session_id consistent;
        keepalive 64;
    }

    upstream prefix {
        $servers
        prefix_affinity zone=bench_prefixes:16m;
        keepalive 64;
    }

    upstream bodyhash {
        $servers
        hash \$request_body consistent;
        keepalive 64;
    }

$(backends_server "access_log $dir/backends.log port buffer=64k;")

    server {
        listen 127.0.0.1:$port;
        client_body_buffer_size 256k;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        location /affinity { proxy_pass http://affinity; }
        location /chash { proxy_pass http://chash; }
        location /prefix { proxy_pass http://prefix; }
        location /bodyhash { proxy_pass http://bodyhash; }
    }
}
CONF

cat > "$dir/sessions.lua" <<'LUA'
-- 1000 sessions, in turn.
local n = 0
request = function()
    n = n + 1
    return wrk.format("GET", nil, {["X-Session-ID"] = "session-" .. (n % 1000)})
end
LUA

# chat.lua: 100 conversations of a chat body of BODY_BYTES, in turn.
cat > "$dir/chat.lua" <<'LUA'
local size = tonumber(os.getenv("BODY_BYTES"))
local filler = string.rep("The quick brown fox jumps over the lazy dog. ", size / 45 + 1)
local bodies = {}
for c = 1, 100 do
    local text = "Conversation " .. c .. ": " .. filler
    bodies[c] = '{"model":"llm","messages":[{"role":"user","content":"'
                .. string.sub(text, 1, size - 60) .. '"}]}'
end
local n = 0
request = function()
    n = n + 1
    return wrk.format("POST", nil, {["Content-Type"] = "application/json"},
                      bodies[n % 100 + 1])
end
LUA

"$nginx" -p "$dir" -c "$dir/nginx.conf"
trap '"$nginx" -p "$dir" -c "$dir/nginx.conf" -s quit 2>/dev/null || true' EXIT
sleep 0.5

# run POLICY [SCRIPT]: requests/s of one wrk run, and the max/mean of the
# backends' request counts.
run() {
    local policy="$1" script="${2:-sessions.lua}" rps spread
    : > "$dir/backends.log"
    rps=$(wrk -t1 -c"$conns" -d"${secs}s" -s "$dir/$script" \
              "http://127.0.0.1:$port/$policy" \
          | awk '/Requests\/sec/ { print $2 }')
    "$nginx" -p "$dir" -c "$dir/nginx.conf" -s reopen 2>/dev/null
    sleep 0.3
    spread=$(sort "$dir/backends.log" | uniq -c \
             | awk '{ n++; s += $1; if ($1 > m) m = $1 }
                    END { if (n) printf "%.3f", m / (s / 4); else print "-" }')
    echo "$rps $spread"
}

# compare A B [SCRIPT]: alternated runs; prints a table row for each side.
compare() {
    local pa="$1" pb="$2" script="${3:-sessions.lua}" i rps spread
    local -a ra rb sa sb
    run "$pa" "$script" > /dev/null    # warm up both paths
    run "$pb" "$script" > /dev/null
    for ((i = 0; i < rounds; i++)); do
        read -r rps spread < <(run "$pa" "$script"); ra+=("$rps"); sa+=("$spread")
        read -r rps spread < <(run "$pb" "$script"); rb+=("$rps"); sb+=("$spread")
    done
    local ma mb
    ma=$(median "${ra[@]}"); mb=$(median "${rb[@]}")
    echo "| ${LABEL_A} | ${ra[*]} | $ma | ${sa[0]} |"
    echo "| ${LABEL_B} | ${rb[*]} | $mb | ${sb[0]} |"
    echo "| *ratio* | | **$(awk -v a="$ma" -v b="$mb" 'BEGIN { printf "%.3f", a / b }')** | |"
}

# The median of alternated runs: one disturbed run does not move it.
median() {
    printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END {
        if (NR % 2) m = v[(NR + 1) / 2]; else m = (v[NR / 2] + v[NR / 2 + 1]) / 2
        printf "%.0f", m }'
}

stamped=$(stamp markdown "bench/bench-throughput.sh${1:+ $(shown "$1")}" \
          ROUNDS SECONDS_PER_RUN CONNECTIONS)

{
    echo "## Throughput on loopback (wrk, 1 nginx worker, upstream keepalive)"
    echo
    echo "$stamped"
    echo
    echo "$rounds alternated runs of ${secs}s per side, $conns connections;"
    echo "backends are nginx \`return 200\` on the same worker."
    echo
    echo "| policy | runs (req/s) | median req/s | backend max/mean |"
    echo "|---|---|---:|---:|"
    LABEL_A="session_affinity, 1000 sessions" \
    LABEL_B="hash \$http_x_session_id consistent" compare affinity chash
    for kb in 4 32 128; do
        export BODY_BYTES=$((kb * 1024))
        LABEL_A="prefix_affinity, ${kb} KB chat bodies" \
        LABEL_B="hash \$request_body consistent, ${kb} KB" \
            compare prefix bodyhash chat.lua
    done
} | tee "$out"

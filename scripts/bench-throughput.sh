#!/usr/bin/env bash
# Requests per second through nginx on loopback: session_affinity against
# nginx's own "hash $http_x_session_id consistent", same backends, same
# traffic (1000 sessions), runs alternated so that drift hits both alike.
#
#   scripts/bench-throughput.sh [output.md]
#   ROUNDS=3 SECONDS_PER_RUN=8 CONNECTIONS=32
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
module="${AFFINITY_MODULE:-$repo/build/ngx_http_upstream_affinity_module.so}"
nginx="${NGINX_BIN:-/usr/sbin/nginx}"
out="${1:-$repo/bench/results/throughput.md}"
rounds="${ROUNDS:-3}"
secs="${SECONDS_PER_RUN:-8}"
conns="${CONNECTIONS:-32}"
dir="$repo/build/bench-throughput"
port="${BENCH_PORT:-19080}"

mkdir -p "$dir/tmp" "$(dirname "$out")"
b=($((port + 1)) $((port + 2)) $((port + 3)) $((port + 4)))

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
        server 127.0.0.1:${b[0]}; server 127.0.0.1:${b[1]};
        server 127.0.0.1:${b[2]}; server 127.0.0.1:${b[3]};
        session_affinity header=X-Session-ID zone=bench_sessions:8m;
        keepalive 64;
    }

    upstream chash {
        server 127.0.0.1:${b[0]}; server 127.0.0.1:${b[1]};
        server 127.0.0.1:${b[2]}; server 127.0.0.1:${b[3]};
        hash \$http_x_session_id consistent;
        keepalive 64;
    }

    server {
        listen 127.0.0.1:${b[0]} reuseport; listen 127.0.0.1:${b[1]};
        listen 127.0.0.1:${b[2]}; listen 127.0.0.1:${b[3]};
        access_log $dir/backends.log port buffer=64k;
        location / { return 200 "ok\n"; }
    }

    server {
        listen 127.0.0.1:$port;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        location /affinity { proxy_pass http://affinity; }
        location /chash { proxy_pass http://chash; }
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

"$nginx" -p "$dir" -c "$dir/nginx.conf"
trap '"$nginx" -p "$dir" -c "$dir/nginx.conf" -s quit 2>/dev/null || true' EXIT
sleep 0.5

# run POLICY: requests/s of one wrk run, and the max/mean of backend counts.
run() {
    local policy="$1" rps spread
    : > "$dir/backends.log"
    rps=$(wrk -t1 -c"$conns" -d"${secs}s" -s "$dir/sessions.lua" \
              "http://127.0.0.1:$port/$policy" \
          | awk '/Requests\/sec/ { print $2 }')
    "$nginx" -p "$dir" -c "$dir/nginx.conf" -s reopen 2>/dev/null
    sleep 0.3
    spread=$(sort "$dir/backends.log" | uniq -c \
             | awk '{ n++; s += $1; if ($1 > m) m = $1 }
                    END { if (n) printf "%.3f", m / (s / 4); else print "-" }')
    echo "$rps $spread"
}

run affinity > /dev/null    # warm up both paths
run chash > /dev/null

declare -a A C AS CS
for ((i = 0; i < rounds; i++)); do
    read -r rps spread < <(run affinity); A+=("$rps"); AS+=("$spread")
    read -r rps spread < <(run chash);    C+=("$rps"); CS+=("$spread")
done

mean() { printf '%s\n' "$@" | awk '{ s += $1 } END { printf "%.0f", s / NR }'; }
ma=$(mean "${A[@]}"); mc=$(mean "${C[@]}")
ratio=$(awk -v a="$ma" -v c="$mc" 'BEGIN { printf "%.3f", a / c }')

{
    echo "## Throughput on loopback (wrk, 1 nginx worker, 1000 sessions)"
    echo
    echo "| policy | runs (req/s) | mean req/s | backend max/mean |"
    echo "|---|---|---:|---:|"
    echo "| session_affinity | ${A[*]} | $ma | ${AS[0]} |"
    echo "| hash \$http_x_session_id consistent | ${C[*]} | $mc | ${CS[0]} |"
    echo
    echo "session_affinity / hash consistent = **$ratio** ($rounds alternated" \
         "runs of ${secs}s each, $conns connections, upstream keepalive)."
} | tee "$out"

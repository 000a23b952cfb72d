#!/usr/bin/env bash
# make demo: a simulated LLM fleet (four mock OpenAI-compatible replicas with
# KV caches) behind nginx with the affinity module.  Shows where requests go
# with session ids and without, replays a slice of a real trace through
# round robin and through the module to compare cache hit ratios, runs a
# short chat with the OpenAI Node client, and a Responses API conversation
# (previous_response_id) through the module and through round robin.
# Everything listens on 127.0.0.1, under build/demo/.
#
#   DEMO_PORT=18080   nginx port (replicas on the next four ports, nginx's
#                     round robin on the fifth)
#   DEMO_KEEP=1       leave nginx and the fleet running at the end
set -euo pipefail

# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/../scripts/lib.sh"     # repo, module, nginx
python="${PYTHON:-/usr/bin/python3}"
port="${DEMO_PORT:-18080}"
dir="$repo/build/demo"
replicas=($((port + 1)) $((port + 2)) $((port + 3)) $((port + 4)))
rr_port=$((port + 5))
stats=$(printf 'http://127.0.0.1:%s/stats,' "${replicas[@]}")
stats=${stats%,}

[ -f "$module" ] || { echo "demo: $module missing; run make" >&2; exit 1; }

mock_pid=""

# stop: nginx and the fleet, this run's or a previous run's, and waits (up
# to 5 s) until they are gone.
stop() {
    local pids=() pid alive _
    if [ -f "$dir/nginx.pid" ]; then
        pid=$(cat "$dir/nginx.pid" 2>/dev/null || true)
        "$nginx" -p "$dir" -c "$dir/nginx.conf" -s quit 2>/dev/null \
            || { [ -n "$pid" ] && kill -QUIT "$pid" 2>/dev/null; } || true
        [ -n "$pid" ] && pids+=("$pid")
    fi
    if [ -f "$dir/mock.pid" ]; then
        pid=$(cat "$dir/mock.pid" 2>/dev/null || true)
        [ -n "$pid" ] && kill "$pid" 2>/dev/null && pids+=("$pid")
        rm -f "$dir/mock.pid"
    fi
    # the fleet started by this run, if it never wrote its pid file
    if [ -n "$mock_pid" ] && kill "$mock_pid" 2>/dev/null; then
        pids+=("$mock_pid")
    fi
    for _ in $(seq 50); do
        alive=""
        for pid in "${pids[@]}"; do
            kill -0 "$pid" 2>/dev/null && alive=1
        done
        [ -z "$alive" ] && break
        sleep 0.1
    done
}

mkdir -p "$dir/tmp"
stop
rm -f "$dir"/*.log
# From here on, however the script ends (an error, Ctrl-C), the fleet and
# nginx are stopped, unless DEMO_KEEP=1.
trap '[ "${DEMO_KEEP:-0}" = 1 ] || stop' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

servers=$(printf '        server 127.0.0.1:%s;\n' "${replicas[@]}")

cat > "$dir/nginx.conf" <<CONF
load_module $module;
worker_processes 2;
error_log $dir/error.log notice;
pid $dir/nginx.pid;
events { worker_connections 4096; }

http {
    log_format llm '\$affinity_route \$affinity_session \$affinity_prefix_len';
    access_log $dir/access.log llm;
    client_body_temp_path $dir/tmp;
    proxy_temp_path $dir/tmp;
    client_body_buffer_size 1m;
    client_max_body_size 16m;

    # The module: sessions by id (header, cookie or the request's "user"),
    # ids generated for clients that send none; requests without an id are
    # routed by their prompt; Responses API follow-ups (previous_response_id,
    # /v1/responses/{id}) go to the replica that stored the response.
    upstream llm {
$servers
        session_affinity header=X-Session-ID cookie=llm_session field=user
                         zone=demo_sessions:4m timeout=1h;
        prefix_affinity zone=demo_prefixes:8m;
        response_affinity zone=demo_responses:4m timeout=1h;
        affinity_balance factor=1.25 slack=2;
    }

    # The same fleet with nginx's default balancer, for comparison: under
    # /round-robin/v1/ and on port $rr_port.
    upstream llm_round_robin {
$servers
    }

    server {
        listen 127.0.0.1:$port backlog=4096;

        proxy_http_version 1.1;
        proxy_buffering off;
        proxy_read_timeout 300s;

        location /v1/ {
            proxy_pass http://llm;
            add_header X-Affinity-Route \$affinity_route always;
        }

        location /round-robin/v1/ {
            proxy_pass http://llm_round_robin/v1/;
        }
    }

    server {
        listen 127.0.0.1:$rr_port backlog=4096;

        proxy_http_version 1.1;
        proxy_buffering off;
        proxy_read_timeout 300s;

        location /v1/ {
            proxy_pass http://llm_round_robin;
        }
    }
}
CONF

# The fleet answers 20 times faster than real replicas, to replay 20x.
"$python" "$repo/bench/sim/mock_backend.py" \
    --ports "$(IFS=,; echo "${replicas[*]}")" --time-scale 0.05 \
    --cache-tokens 4194304 --pidfile "$dir/mock.pid" \
    > "$dir/mock.log" 2>&1 &
mock_pid=$!
for _ in $(seq 50); do
    grep -q ready "$dir/mock.log" 2>/dev/null && break
    sleep 0.1
done
if ! grep -q ready "$dir/mock.log" 2>/dev/null; then
    echo "demo: the mock replicas did not start; see $dir/mock.log:" >&2
    tail -n 5 "$dir/mock.log" >&2
    exit 1
fi

"$nginx" -p "$dir" -c "$dir/nginx.conf"
sleep 0.5

# chat SESSION-ID TEXT...: one chat request; prints the replica, the route
# and the cached prompt tokens the replica reported.
chat() {
    local id="$1" body="$2" label="${3:-$1}"
    local args=(-s -D "$dir/headers" -o "$dir/body"
                -H 'Content-Type: application/json' -d "$body")
    [ -n "$id" ] && args+=(-H "X-Session-ID: $id")
    curl "${args[@]}" "http://127.0.0.1:$port/v1/chat/completions"
    local replica route cached
    replica=$(grep -i '^X-Replica:' "$dir/headers" | tr -d '\r' | cut -d' ' -f2)
    route=$(grep -i '^X-Affinity-Route:' "$dir/headers" | tr -d '\r' | cut -d' ' -f2)
    cached=$("$python" -c 'import json,sys; u=json.load(open(sys.argv[1]))["usage"]; print("%d of %d" % (u["prompt_tokens_details"]["cached_tokens"], u["prompt_tokens"]))' "$dir/body")
    printf '  %-24s -> %-10s %-13s cached prompt tokens: %s\n' \
        "$label" "$replica" "$route" "$cached"
}

# body TURN WHO: a conversation of WHO after TURN user turns.
body() {
    "$python" - "$1" "$2" <<'PY'
import json, sys
turn, who = int(sys.argv[1]), sys.argv[2]
system = "You are the platform team's assistant. " * 60
msgs = [{"role": "system", "content": system}]
for k in range(1, turn + 1):
    msgs.append({"role": "user", "content": f"{who} asks question {k}: " + "why is the sky blue? " * 20})
    if k < turn:
        msgs.append({"role": "assistant", "content": f"answer {k} to {who}: " + "Rayleigh scattering. " * 20})
print(json.dumps({"model": "demo-llm", "messages": msgs, "max_tokens": 32}))
PY
}

echo
echo "nginx with ngx_http_upstream_affinity_module on 127.0.0.1:$port, in front"
echo "of four mock inference replicas (ports ${replicas[*]}) that keep a KV"
echo "cache and report cached prompt tokens as vLLM does."
echo
echo "1. Conversations with a session id (X-Session-ID): every turn goes to the"
echo "   replica that holds the conversation, and the cache serves its history."
echo
for turn in 1 2 3; do
    for who in alice bob; do
        chat "conv-$who" "$(body "$turn" "$who")" "conv-$who turn $turn"
    done
done

echo
echo "2. Conversations without any id are routed by their prompt: the longest"
echo "   prefix seen before wins. They all share a 2,400-character system prompt,"
echo "   yet spread over the replicas and stick from their second turn."
echo
for turn in 1 2 3; do
    for who in carol dave erin; do
        chat "" "$(body "$turn" "$who")" "$who turn $turn"
    done
done

echo
echo "3. A slice of a real trace (Mooncake, 600 requests, 20x faster), replayed"
echo "   through nginx's round robin and through the module:"
echo
for policy in round-robin affinity; do
    path=/v1/chat/completions
    [ "$policy" = round-robin ] && path=/round-robin/v1/chat/completions
    rm -f "$dir/replay-$policy.json"
    "$python" "$repo/bench/sim/replay.py" --limit 600 --speed 20 \
        --session-header --stats-urls "$stats" --label "$policy" \
        --url "http://127.0.0.1:$port$path" --output "$dir/replay-$policy.json" \
        > "$dir/replay-$policy.log" 2>&1 || true
    if [ ! -s "$dir/replay-$policy.json" ]; then
        echo "  $policy: no replay ($(tail -n 1 "$dir/replay-$policy.log");"
        echo "  see $dir/replay-$policy.log)"
        continue
    fi
    "$python" - "$dir/replay-$policy.json" "$policy" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["summary"]
print("  %-12s cache hit ratio %.3f   TTFT p50 %.2f s, p90 %.2f s   errors %d"
      % (sys.argv[2], s["hit_ratio"], s["ttft_trace_s"]["p50"],
         s["ttft_trace_s"]["p90"], s["errors"]))
PY
done

echo
echo "4. A chat with the OpenAI Node client (defaultHeaders: X-Session-ID):"
echo
# The openai package at the version package-lock.json names (npm ci).
client="$repo/demo/client"
locked=$(node -p 'require(process.argv[1]).packages["node_modules/openai"].version' \
             "$client/package-lock.json" 2>/dev/null || true)
installed=$(node -p 'require(process.argv[1]).version' \
                "$client/node_modules/openai/package.json" 2>/dev/null || true)
if [ -z "$installed" ] || [ "$installed" != "$locked" ]; then
    (cd "$client" && npm ci --no-audit --no-fund --silent > /dev/null 2>&1) \
        || echo "  (npm ci failed; skipping the Node client)"
fi
node_client=0
[ -f "$client/node_modules/openai/package.json" ] && node_client=1
if [ "$node_client" = 1 ]; then
    node "$client/chat.mjs" "http://127.0.0.1:$port/v1" "node-demo-$$"
fi

echo
echo "5. A Responses API conversation with the OpenAI Node client: each turn"
echo "   sends only its new input and previous_response_id, and the replicas"
echo "   keep stored responses in their own memory, as vLLM does. Through the"
echo "   module every follow-up and the retrieve reach the replica that stored"
echo "   the response (\$affinity_route response_hit). Round robin sends them"
echo "   anywhere: a replica without the response answers 404, and the client"
echo "   carries on from the last response it got."
echo
if [ "$node_client" = 1 ]; then
    node "$client/responses.mjs" "http://127.0.0.1:$port/v1" \
        "http://127.0.0.1:$rr_port/v1"
fi

echo
echo "Log variables: \$affinity_route, \$affinity_session, \$affinity_prefix_len"
echo "(see $dir/access.log).  Config: $dir/nginx.conf"
if [ "${DEMO_KEEP:-0}" = 1 ]; then
    echo "Still running (DEMO_KEEP=1); stop with:"
    echo "  $nginx -p $dir -c $dir/nginx.conf -s quit; kill \$(cat $dir/mock.pid)"
fi

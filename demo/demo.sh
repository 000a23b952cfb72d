#!/usr/bin/env bash
# make demo: a simulated LLM fleet (four mock OpenAI-compatible replicas with
# KV caches) behind nginx with the affinity module.  Shows where requests go
# with session ids and without, replays a slice of a real trace through
# round robin and through the module to compare cache hits and times to
# first token, on those four and on four more, every other one of which is
# 2.5 times slower (a mixed fleet), runs a
# short chat with the OpenAI Node client, and a Responses API conversation
# (previous_response_id) through the module and through round robin; ends
# with the module's status page and a bar chart of its routes.
# Everything listens on 127.0.0.1; its files are under build/demo/.
#
# The ports are free ones, picked when the demo starts, unless set:
#
#   DEMO_PORT=8080           nginx with the module
#   DEMO_RR_PORT=8081        nginx with its default round robin, in front
#                            of the same replicas (for the comparison)
#   DEMO_REPLICA_PORT=9001   the first mock replica; the other seven on the
#                            next seven ports (9002 to 9008)
#   DEMO_KEEP=1              leave nginx and the replicas running at the end
#   PYTHON=python3           the Python for the mock replicas and the replay
#                            (default: /usr/bin/python3)
#
# However the demo ends (at the end, on an error, a port already in use,
# Ctrl-C), it stops everything it started, and waits until it is gone.
set -euo pipefail

# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/../scripts/lib.sh"     # repo, module, nginx, say
python="${PYTHON:-/usr/bin/python3}"
dir="$repo/build/demo"
client="$repo/demo/client"
report="$repo/demo/report.py"

[ -f "$module" ] || { say "$module missing; run make"; exit 1; }

# port_value NAME: the port in the variable NAME, if set; exits if it is
# not a port number.
port_value() {
    local value="${!1:-}"
    [ -z "$value" ] && return 0
    case "$value" in
        *[!0-9]*) ;;
        *) if [ "$value" -ge 1 ] && [ "$value" -le 65535 ]; then
               echo "$((10#$value))"
               return 0
           fi ;;
    esac
    say "$1=$value is not a port number (1 to 65535)"
    exit 2
}

fixed_port=$(port_value DEMO_PORT)
fixed_rr_port=$(port_value DEMO_RR_PORT)
first_replica=$(port_value DEMO_REPLICA_PORT)
if [ -n "$first_replica" ] && [ "$first_replica" -gt 65528 ]; then
    say "DEMO_REPLICA_PORT=$first_replica: the eight replicas need" \
        "$first_replica to $((first_replica + 7)), above 65535"
    exit 2
fi
if [ -n "$fixed_port" ] && [ "$fixed_port" = "$fixed_rr_port" ]; then
    say "DEMO_PORT and DEMO_RR_PORT are both $fixed_port"
    exit 2
fi
for p in $fixed_port $fixed_rr_port; do
    if [ -n "$first_replica" ] && [ "$p" -ge "$first_replica" ] \
           && [ "$p" -le $((first_replica + 7)) ]; then
        say "port $p is both nginx's and a replica's" \
            "(DEMO_REPLICA_PORT=$first_replica takes" \
            "$first_replica to $((first_replica + 7)))"
        exit 2
    fi
done

# ---------------------------------------------------------------------------
# Processes.  Each one the demo starts runs in a session and process group
# of its own (setsid), so that stopping its group stops whatever it started
# too, and Ctrl-C on the terminal reaches this script alone, which then
# stops them all in order.  nginx runs in the foreground (daemon off), so
# it is a child of this script like the others.

children=()        # the process group leaders this run started
nginx_pid=""
mock_pid=""

# spawn COMMAND...: COMMAND in the background, as the leader of a new
# session; its pid ($!) is its process group's id.  (setsid(1) does not
# fork here: a background job of a script is no group leader.)
spawn() {
    setsid "$@" 8>&- 9>&- &
    children+=("$!")
}

# forget PID: PID has ended and been waited for; no signal goes to its
# group any more (the number could be reused).
forget() {
    local keep=() pid
    for pid in "${children[@]}"; do
        [ "$pid" = "$1" ] || keep+=("$pid")
    done
    children=("${keep[@]+"${keep[@]}"}")
}

# run COMMAND...: COMMAND started as spawn starts it, and waited for;
# returns its status.  The wait returns at once on Ctrl-C or a TERM, and
# the trap below stops COMMAND.
run() {
    local pid status=0
    spawn "$@"
    pid=$!
    wait "$pid" || status=$?
    forget "$pid"
    return "$status"
}

# alive PID...: whether any of the process groups still has a process.
alive() {
    local pid
    for pid in "$@"; do
        kill -0 -- "-$pid" 2>/dev/null && return 0
        kill -0 "$pid" 2>/dev/null && return 0
    done
    return 1
}

# stop_groups SIGNAL PID...: SIGNAL to the process groups, then waits up to
# 5 s until their processes are gone; what is left gets SIGKILL.  The
# children among them are reaped.
stop_groups() {
    local signal="$1" pid _
    shift
    [ "$#" -gt 0 ] || return 0
    for pid in "$@"; do
        kill "-$signal" -- "-$pid" 2>/dev/null \
            || kill "-$signal" "$pid" 2>/dev/null || true
    done
    for _ in $(seq 50); do
        alive "$@" || break
        sleep 0.1
    done
    if alive "$@"; then
        say "still running after 5 s; killing: $*"
        for pid in "$@"; do
            kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" \
                2>/dev/null || true
        done
    fi
    for pid in "$@"; do
        wait "$pid" 2>/dev/null || true
    done
}

# stop_all: everything this run started: the clients first, then nginx,
# then the replicas behind it.
stop_all() {
    local pid others=()
    for pid in "${children[@]+"${children[@]}"}"; do
        [ "$pid" = "$nginx_pid" ] || [ "$pid" = "$mock_pid" ] \
            || others+=("$pid")
    done
    stop_groups TERM "${others[@]+"${others[@]}"}"
    [ -n "$nginx_pid" ] && stop_groups TERM "$nginx_pid"
    [ -n "$mock_pid" ] && stop_groups TERM "$mock_pid"
    children=()
    nginx_pid=""
    mock_pid=""
    rm -f "$dir/nginx.pid" "$dir/mock.pid"
}

# stop_previous: the nginx and replicas a previous run left running
# (DEMO_KEEP=1), found by their pid files; a pid is signalled only if its
# command line is still that of the demo's nginx or replicas.
stop_previous() {
    local file pid what
    for file in nginx mock; do
        pid=$(cat "$dir/$file.pid" 2>/dev/null || true)
        case "$pid" in ''|*[!0-9]*) continue ;; esac
        what=$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null || true)
        case "$what" in
            *"$dir/nginx.conf"*|*"$dir/mock.pid"*)
                note "stopping the $file of a previous run ($pid)"
                kill -TERM -- "-$pid" 2>/dev/null \
                    || kill -TERM "$pid" 2>/dev/null || true
                for _ in $(seq 50); do
                    kill -0 "$pid" 2>/dev/null || break
                    sleep 0.1
                done ;;
        esac
        rm -f "$dir/$file.pid"
    done
}

# on_exit: the demo's end, whatever it is.  DEMO_KEEP=1 keeps nginx and the
# replicas only after a run that went through.
on_exit() {
    local status=$?
    trap - EXIT INT TERM
    set +e
    exec 1>&8 2>&9
    if [ "$status" -ne 0 ] || [ "${DEMO_KEEP:-0}" != 1 ]; then
        if [ "${#children[@]}" -gt 0 ] && [ "$status" -ne 0 ]; then
            say "stopping what the demo started (exit status $status)"
        fi
        stop_all
    fi
    exit "$status"
}

mkdir -p "$dir/tmp"
stop_previous
rm -f "$dir"/*.log "$dir"/*.json "$dir/rows.tsv" "$dir/demo.png"
# The traps may run while a command's output goes to a log (run ... >
# log): they write to the script's own output, kept as 8 and 9.
exec 8>&1 9>&2
trap on_exit EXIT
trap 'exec 1>&8 2>&9; echo; say "interrupted"; exit 130' INT
trap 'exec 1>&8 2>&9; say "terminated"; exit 143' TERM

# ---------------------------------------------------------------------------
# The replicas: port 0 lets the kernel pick free ports as they bind, with no
# window in which another program could take them.

if [ -n "$first_replica" ]; then
    ports=$(seq -s, "$first_replica" $((first_replica + 7)))
else
    ports=0,0,0,0,0,0,0,0
fi
# The fleet answers 20 times faster than real replicas, to replay 20x.  It
# is a fleet where routing matters, as the benchmark's tight profile: 4
# running slots a replica, and caches that hold a quarter of what the
# trace's slice below sends (370,208 tokens each, bench/sim/bounds.py).
# The last four are a mixed fleet: every other one 2.5 times slower.
spawn "$python" "$repo/bench/sim/mock_backend.py" --ports "$ports" \
    --time-scale 0.05 --max-running 4 --cache-tokens 370208 \
    --slowdowns 1,1,1,1,1,2.5,1,2.5 \
    --pidfile "$dir/mock.pid" > "$dir/mock.log" 2>&1
mock_pid=$!
for _ in $(seq 100); do
    grep -q '^ready' "$dir/mock.log" 2>/dev/null && break
    alive "$mock_pid" || break
    sleep 0.1
done
if ! grep -q '^ready' "$dir/mock.log" 2>/dev/null; then
    # "... bind on address ('127.0.0.1', PORT): address already in use"
    busy=$(sed -n "s/.*('[0-9.]*', \([0-9]*\)): address already in use.*/\1/p" \
               "$dir/mock.log" | head -n 1)
    if [ -n "$busy" ]; then
        say "the mock replicas could not listen on 127.0.0.1:$busy: the" \
            "port is in use (DEMO_REPLICA_PORT=$first_replica takes" \
            "$first_replica to $((first_replica + 7))); choose another, or" \
            "unset DEMO_REPLICA_PORT for free ones"
        exit 1
    fi
    say "the mock replicas did not start; see $dir/mock.log:"
    tail -n 3 "$dir/mock.log" >&2
    exit 1
fi
# "listening replica-1 127.0.0.1:PORT", in the replicas' order
mapfile -t replicas < <(sed -n 's/^listening [^ ]* [0-9.]*:\([0-9]*\)$/\1/p' \
                            "$dir/mock.log")
if [ "${#replicas[@]}" -ne 8 ]; then
    say "the mock replicas reported ${#replicas[@]} ports, not 8; see" \
        "$dir/mock.log"
    exit 1
fi
for p in $fixed_port $fixed_rr_port; do
    case " ${replicas[*]} " in
        *" $p "*) say "a replica got port $p, which DEMO_PORT or" \
                      "DEMO_RR_PORT names; choose another"
                  exit 1 ;;
    esac
done
mixed=("${replicas[@]:4:4}")
replicas=("${replicas[@]:0:4}")
stats=$(printf 'http://127.0.0.1:%s/stats,' "${replicas[@]}")
stats=${stats%,}
mixed_stats=$(printf 'http://127.0.0.1:%s/stats,' "${mixed[@]}")
mixed_stats=${mixed_stats%,}

# ---------------------------------------------------------------------------
# nginx

# free_ports N: N different ports nothing listens on now.  The sockets are
# bound all at once, then closed; nginx binds them a moment later, and if
# another program took one in between, start_nginx picks again.
free_ports() {
    "$python" - "$1" <<'PY'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(('127.0.0.1', 0))
print(' '.join(str(s.getsockname()[1]) for s in socks))
PY
}

write_conf() {
    local servers mixed_servers
    servers=$(printf '        server 127.0.0.1:%s;\n' "${replicas[@]}")
    mixed_servers=$(printf '        server 127.0.0.1:%s;\n' "${mixed[@]}")
    cat > "$dir/nginx.conf" <<CONF
load_module $module;
worker_processes 2;
daemon off;
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

    # The mixed fleet, with the module and with round robin: under /mixed/v1/
    # and /mixed-round-robin/v1/.
    upstream llm_mixed {
$mixed_servers
        session_affinity header=X-Session-ID zone=demo_mixed_sessions:4m
                         timeout=1h;
        prefix_affinity zone=demo_mixed_prefixes:8m;
    }

    upstream llm_mixed_round_robin {
$mixed_servers
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

        location /mixed/v1/ {
            proxy_pass http://llm_mixed/v1/;
        }

        location /mixed-round-robin/v1/ {
            proxy_pass http://llm_mixed_round_robin/v1/;
        }

        location = /affinity/status {
            affinity_status;
            allow 127.0.0.1;
            deny all;
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
}

# nginx -e: startup errors go to the demo's log, not the system's (which a
# user without root cannot open); nginx 1.19.5 and later.
nginx_args=(-p "$dir" -c "$dir/nginx.conf")
if "$nginx" -h 2>&1 | grep -q -- '^ *-e '; then
    nginx_args=(-e "$dir/error.log" "${nginx_args[@]}")
fi

# start_nginx: nginx on DEMO_PORT and DEMO_RR_PORT, or on free ports; up to
# three tries while a port it picked itself is taken meanwhile.
start_nginx() {
    local picked free busy variable _
    for _ in 1 2 3; do
        picked=""
        free=$(free_ports 2)
        port=${fixed_port:-${free% *}}
        rr_port=${fixed_rr_port:-${free#* }}
        [ -z "$fixed_port" ] && picked="$port"
        [ -z "$fixed_rr_port" ] && picked="$picked $rr_port"
        write_conf
        rm -f "$dir/nginx.pid"
        spawn "$nginx" "${nginx_args[@]}" > "$dir/nginx.out" 2>&1
        nginx_pid=$!
        # The pid file is written once every port listens.
        for _ in $(seq 100); do
            [ -s "$dir/nginx.pid" ] && return 0
            kill -0 "$nginx_pid" 2>/dev/null || break
            sleep 0.1
        done
        [ -s "$dir/nginx.pid" ] && return 0
        stop_groups TERM "$nginx_pid"
        forget "$nginx_pid"
        nginx_pid=""
        # "bind() to 127.0.0.1:PORT failed (98: Address already in use)"
        busy=$(sed -n 's/.*bind() to [0-9.]*:\([0-9]*\) failed (98.*/\1/p' \
                   "$dir/nginx.out" | head -n 1)
        if [ -z "$busy" ]; then
            say "nginx did not start; see $dir/error.log:"
            grep -m 3 'emerg\|alert' "$dir/nginx.out" >&2 \
                || tail -n 3 "$dir/nginx.out" >&2
            return 1
        fi
        case " $picked " in
            *" $busy "*) continue ;;      # taken since free_ports saw it
        esac
        variable=DEMO_PORT
        [ "$busy" = "$rr_port" ] && variable=DEMO_RR_PORT
        say "nginx could not listen on 127.0.0.1:$busy ($variable): the" \
            "port is in use; choose another, or unset $variable for a" \
            "free one"
        return 1
    done
    say "nginx could not listen on free ports three times; see" \
        "$dir/error.log"
    return 1
}
start_nginx

# ---------------------------------------------------------------------------
# The requests

# header NAME: the value of the response header NAME of the last chat.
header() {
    grep -i "^$1:" "$dir/headers" | tr -d '\r' | cut -d' ' -f2
}

# chat SECTION CONVERSATION TURN SESSION-ID BODY: one chat request through
# the module; prints the replica, the route and the cached prompt tokens
# the replica reported, and adds them to rows.tsv for report.py.
chat() {
    local section="$1" who="$2" turn="$3" id="$4" body="$5"
    local args=(-s --max-time 60 -D "$dir/headers" -o "$dir/body"
                -w '%{http_code}' -H 'Content-Type: application/json'
                -d "$body")
    local code replica route cached prompt
    [ -n "$id" ] && args+=(-H "X-Session-ID: $id")
    code=$(curl "${args[@]}" "http://127.0.0.1:$port/v1/chat/completions") \
        || true
    if [ "$code" != 200 ]; then
        [ "${code:-000}" = 000 ] && code="no answer" || code="HTTP $code"
        say "request $who turn $turn: $code; see $dir/error.log"
        exit 1
    fi
    replica=$(header X-Replica)
    route=$(header X-Affinity-Route)
    read -r cached prompt < <("$python" - "$dir/body" <<'PY'
import json, sys
usage = json.load(open(sys.argv[1]))["usage"]
print(usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"])
PY
) || { say "request $who turn $turn: no usage in $dir/body"; exit 1; }
    printf '  %-24s -> %-10s %-13s cached prompt tokens: %s of %s\n' \
        "${id:-$who} turn $turn" "$replica" "$route" "$cached" "$prompt"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$section" "${id:-$who}" "$turn" \
        "$replica" "$route" "$cached" "$prompt" >> "$dir/rows.tsv"
}

# body TURN WHO: a conversation of WHO after TURN user turns.
body() {
    "$python" - "$1" "$2" <<'PY'
import json, sys
turn, who = int(sys.argv[1]), sys.argv[2]
system = "You are the platform team's assistant. " * 60
msgs = [{"role": "system", "content": system}]
for k in range(1, turn + 1):
    msgs.append({"role": "user", "content":
                 f"{who} asks question {k}: " + "why is the sky blue? " * 20})
    if k < turn:
        msgs.append({"role": "assistant", "content":
                     f"answer {k} to {who}: " + "Rayleigh scattering. " * 20})
print(json.dumps({"model": "demo-llm", "messages": msgs, "max_tokens": 32}))
PY
}

echo
echo "nginx with ngx_http_upstream_affinity_module on 127.0.0.1:$port, in front"
echo "of four mock inference replicas (ports ${replicas[*]}) that keep a KV"
echo "cache and report cached prompt tokens as vLLM does; nginx's round robin"
echo "in front of the same replicas on port $rr_port.  Four more replicas, every"
echo "other one 2.5 times slower, are a mixed fleet for part 3."
echo
echo "1. Two conversations with a session id (X-Session-ID), three turns each."
echo "   A known id goes to the replica it is pinned to while that replica is"
echo "   within the load bound; a new id is placed by its prompt, or by a hash."
echo
for turn in 1 2 3; do
    for who in alice bob; do
        chat 1 "$who" "$turn" "conv-$who" "$(body "$turn" "$who")"
    done
done
echo
"$python" "$report" turns "$dir/rows.tsv" 1 "${#replicas[@]}"

echo
echo "2. Three conversations without any id, three turns each, routed by their"
echo "   prompt: to the replica that holds its longest known prefix, within"
echo "   the load bound. They share a 2,400-character system prompt."
echo
for turn in 1 2 3; do
    for who in carol dave erin; do
        chat 2 "$who" "$turn" "" "$(body "$turn" "$who")"
    done
done
echo
"$python" "$report" turns "$dir/rows.tsv" 2 "${#replicas[@]}"

echo
# replay NAME URLS RATE RR_PATH PATH: the trace's slice at RATE times its
# rate through round robin (RR_PATH) and the module (PATH), the replicas'
# /stats at URLS; each one's figures, then the comparison, from
# replay-NAMEround-robin.json and replay-NAMEaffinity.json.
replay() {
    local name="$1" urls="$2" rate="$3" policy path out
    for policy in round-robin affinity; do
        path="$5"
        [ "$policy" = round-robin ] && path="$4"
        out="$dir/replay-$name$policy"
        run "$python" "$repo/bench/sim/replay.py" --start 5000 --limit 600 \
            --rate-multiplier "$rate" --speed 20 \
            --session-header --stats-urls "$urls" --label "$policy" \
            --url "http://127.0.0.1:$port$path" \
            --output "$out.json" > "$out.log" 2>&1 || true
        if [ ! -s "$out.json" ]; then
            echo "  $policy: no replay ($(tail -n 1 "$out.log");"
            echo "  see $out.log)"
            continue
        fi
        "$python" - "$out.json" "$policy" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["summary"]
ttft = s["ttft_trace_s"]
if ttft["p50"] is None:                 # no request got an answer
    print("  %-12s errors %d of %d requests" % (sys.argv[2], s["errors"],
                                              s["requests"]))
    sys.exit(1)
print("  %-12s cache hit ratio %.3f   TTFT p50 %.2f s, p90 %.2f s   errors %d"
      % (sys.argv[2], s["hit_ratio"], ttft["p50"], ttft["p90"], s["errors"]))
PY
    done
    echo
    "$python" "$report" replay "$dir/replay-${name}round-robin.json" \
        "$dir/replay-${name}affinity.json"
}

echo "3. A slice of a real trace (Mooncake, 600 requests from the 5,000th, at"
echo "   half its rate, 20x faster), replayed through nginx's round robin and"
echo "   through the module, on replicas of 4 running slots each:"
echo
replay "" "$stats" 0.5 /round-robin/v1/chat/completions /v1/chat/completions

echo
echo "   The same slice at 0.3 times its rate on the mixed fleet (ports"
echo "   ${mixed[*]}: every other replica 2.5 times slower):"
echo
replay mixed- "$mixed_stats" 0.3 /mixed-round-robin/v1/chat/completions \
    /mixed/v1/chat/completions

echo
echo "4. A chat with the OpenAI Node client (defaultHeaders: X-Session-ID):"
echo
# The openai package at the version package-lock.json names (npm ci).
locked=$(node -p \
    'require(process.argv[1]).packages["node_modules/openai"].version' \
    "$client/package-lock.json" 2>/dev/null || true)
installed=$(node -p 'require(process.argv[1]).version' \
                "$client/node_modules/openai/package.json" 2>/dev/null || true)
if [ -z "$installed" ] || [ "$installed" != "$locked" ]; then
    run npm --prefix "$client" ci --no-audit --no-fund --silent \
        > /dev/null 2>&1 || echo "  (npm ci failed; skipping the Node client)"
fi
node_client=0
[ -f "$client/node_modules/openai/package.json" ] && node_client=1
if [ "$node_client" = 1 ]; then
    run node "$client/chat.mjs" "http://127.0.0.1:$port/v1" "node-demo-$$"
fi

echo
echo "5. A Responses API conversation with the OpenAI Node client: each turn"
echo "   sends only its new input and previous_response_id, and the replicas"
echo "   keep stored responses in their own memory, as vLLM does, so a"
echo "   follow-up needs the replica that stored the response; another one"
echo "   answers 404, and the client carries on from the last response it got."
echo "   The module sends follow-ups there (\$affinity_route response_hit);"
echo "   round robin takes the replicas in turn (each nginx worker keeps its"
echo "   own turn), whatever a request continues."
echo
if [ "$node_client" = 1 ]; then
    run node "$client/responses.mjs" "http://127.0.0.1:$port/v1" \
        "http://127.0.0.1:$rr_port/v1"
fi

echo
echo "6. What the module counted, from its status page (affinity_status at"
echo "   http://127.0.0.1:$port/affinity/status; trimmed):"
echo
if curl -s --max-time 10 -o "$dir/status.json" \
        "http://127.0.0.1:$port/affinity/status"; then
    "$python" "$report" status "$dir/status.json" "$dir/mock.log" \
        "$dir/replay-round-robin.json" "$dir/replay-affinity.json" \
        --png "$dir/demo.png"
else
    say "no status page; see $dir/error.log"
    exit 1
fi

echo
echo "Log variables: \$affinity_route, \$affinity_session,"
echo "\$affinity_prefix_len (see $dir/access.log)."
echo "Config: $dir/nginx.conf"
if [ "${DEMO_KEEP:-0}" = 1 ]; then
    echo "Still running (DEMO_KEEP=1); stop them with:"
    echo "  kill $(cat "$dir/nginx.pid") $(cat "$dir/mock.pid")"
    echo "or run the demo again, which stops them first."
fi

#!/usr/bin/env bash
# make demo: start nginx with the affinity module in front of three local
# backends, send a few conversations' requests with curl, and show which
# backend served each.  Everything runs on 127.0.0.1 under build/demo/.
#
#   DEMO_PORT=18080   port of the demo nginx (backends use the next three)
#   DEMO_KEEP=1       leave nginx running at the end
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
module="${AFFINITY_MODULE:-$repo/build/ngx_http_upstream_affinity_module.so}"
nginx="${NGINX_BIN:-/usr/sbin/nginx}"
port="${DEMO_PORT:-18080}"
dir="$repo/build/demo"

b1=$((port + 1)); b2=$((port + 2)); b3=$((port + 3))

[ -f "$module" ] || { echo "demo: $module missing; run make" >&2; exit 1; }

write_conf() {
    local b2_state="$1"
    cat > "$dir/nginx.conf" <<CONF
load_module $module;
worker_processes 2;
error_log $dir/error.log notice;
pid $dir/nginx.pid;
events { worker_connections 256; }

http {
    access_log $dir/access.log;
    client_body_temp_path $dir/tmp;
    proxy_temp_path $dir/tmp;

    upstream llm {
        server 127.0.0.1:$b1;
        server 127.0.0.1:$b2 $b2_state;
        server 127.0.0.1:$b3;

        session_affinity header=X-Session-ID cookie=llm_session
                         field=user generate zone=demo_sessions:1m timeout=1h;
        affinity_balance factor=1.25 slack=2;
    }

    # Three stand-ins for inference replicas: each answers with its name.
    server {
        listen 127.0.0.1:$b1;
        listen 127.0.0.1:$b2;
        listen 127.0.0.1:$b3;
        location / {
            default_type text/plain;
            return 200 "replica on port \$server_port\n";
        }
    }

    server {
        listen 127.0.0.1:$port;
        location / {
            proxy_pass http://llm;
            add_header X-Affinity-Route \$affinity_route always;
        }
    }
}
CONF
}

stop() {
    if [ -f "$dir/nginx.pid" ]; then
        "$nginx" -p "$dir" -c "$dir/nginx.conf" -s quit 2>/dev/null || true
        sleep 0.5
    fi
}

# ask SESSION-HEADER-VALUE [extra curl args...]: one request, one line.
# LABEL, when set, is printed instead of the session id.
ask() {
    local id="$1"; shift
    local args=(-s -D "$dir/headers" -o "$dir/body")
    [ -n "$id" ] && args+=(-H "X-Session-ID: $id")
    curl "${args[@]}" "$@" "http://127.0.0.1:$port/v1/chat/completions"
    local route echo
    route=$(grep -i '^X-Affinity-Route:' "$dir/headers" | tr -d '\r' | cut -d' ' -f2)
    echo=$(grep -i '^X-Session-ID:' "$dir/headers" | tr -d '\r' | cut -d' ' -f2)
    printf '  %-38s -> %-26s %-14s\n' "${LABEL:-${id:-(no session id)}}" \
        "$(tr -d '\n' < "$dir/body")" "$route"
    LAST_ECHO="$echo"
}

mkdir -p "$dir/tmp"
stop
rm -f "$dir"/*.log
write_conf ""
"$nginx" -p "$dir" -c "$dir/nginx.conf"
trap '[ "${DEMO_KEEP:-0}" = 1 ] || stop' EXIT
sleep 0.5

echo
echo "nginx with ngx_http_upstream_affinity_module listens on 127.0.0.1:$port,"
echo "balancing upstream 'llm' over three replicas (ports $b1, $b2, $b3)."
echo
echo "1. Three conversations, three turns each: every turn of a conversation"
echo "   goes to the replica that holds its KV cache."
echo
for turn in 1 2 3; do
    for who in alice bob carol; do
        ask "conversation-$who"
    done
done

echo
echo "2. A client without a session id gets one generated (UUID v4), echoed"
echo "   in X-Session-ID and Set-Cookie; sending it back sticks."
echo
ask ""
generated="$LAST_ECHO"
grep -i '^Set-Cookie' "$dir/headers" | tr -d '\r' | sed 's/^/     /'
ask "$generated"
ask "$generated"

echo
echo "3. The session key can also come from the JSON body ('user' field)."
echo
for i in 1 2; do
    LABEL='(body: "user": "dave")' ask "" -H 'Content-Type: application/json' \
        -d '{"model":"demo","user":"dave","messages":[]}'
done

echo
echo "4. Replica $b2 is marked down (nginx -s reload): only its conversations"
echo "   move, and the others keep their replica - and their cache."
echo
write_conf down
"$nginx" -p "$dir" -c "$dir/nginx.conf" -s reload 2>/dev/null
sleep 1
for who in alice bob carol; do
    ask "conversation-$who"
done

echo
echo "Route log variables: \$affinity_route (session_hit, session_new,"
echo "session_moved, fallback) and \$affinity_session.  Config: $dir/nginx.conf"
if [ "${DEMO_KEEP:-0}" = 1 ]; then
    echo "nginx keeps running (DEMO_KEEP=1); stop it with:"
    echo "  $nginx -p $dir -c $dir/nginx.conf -s quit"
fi

#!/bin/sh
# Build the nginx container image with the module, and smoke-test it.
#
#   scripts/build-image.sh          (make image)
#
# 1. A Debian base image made from Debian's packages with mmdebstrap (the
#    release this machine runs, e.g. bookworm), imported as
#    localhost/affinity-base:<release>.
# 2. conf-examples/docker/Dockerfile built FROM it with buildah (chroot
#    isolation: no container daemon needed), into
#    localhost/nginx-affinity:<version> (version: make version).
# 3. The smoke test, in a container of that image: its configuration passes
#    "nginx -t", and so does one with session_affinity and prefix_affinity;
#    nginx started as the image's CMD routes requests to two backends (on
#    this machine: the chroot shares its network) so that one session stays
#    on one backend, sessions spread over both, a repeated prompt finds its
#    backend, the status location answers, logs reach stdout, and SIGQUIT
#    (the image's STOPSIGNAL) stops it.
#
# The image stays in the local container storage (buildah images); the
# base image and the test container are removed.  Docker is not needed;
# buildah, podman and mmdebstrap are installed from Debian if missing.
#
#   AFFINITY_IMAGE    image name (default localhost/nginx-affinity:<version>)
#   AFFINITY_MARCH    the core's instruction set level (default x86-64-v2)
#   IMAGE_SUITE       Debian release of the base (default: this machine's)
set -eu

# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"

# buildah and mmdebstrap as root; rootless builds need subordinate ids set
# up, which this script does not do.
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        exec sudo -E sh "$0" "$@"
    fi
    say "run as root (buildah and mmdebstrap need it here)"
    exit 1
fi

# The tools of this build, installed as the module's own dependencies are.
sh "$(dirname "$0")/install-deps.sh" buildah podman mmdebstrap uidmap curl \
    perl containers-storage fuse-overlayfs slirp4netns

version=$(sed -n 's/^#define AFFINITY_VERSION  *"\(.*\)"$/\1/p' \
              "$repo/src/core/include/affinity_core.h")
if [ -z "$version" ]; then
    say "no AFFINITY_VERSION in src/core/include/affinity_core.h"
    exit 1
fi
image="${AFFINITY_IMAGE:-localhost/nginx-affinity:$version}"
suite="${IMAGE_SUITE:-$(. /etc/os-release && echo "${VERSION_CODENAME:-}")}"
if [ -z "$suite" ]; then
    say "cannot tell this machine's Debian release: set IMAGE_SUITE"
    exit 1
fi
base="localhost/affinity-base:$suite"
march="${AFFINITY_MARCH:-x86-64-v2}"

work=$(mktemp -d -t build-image.XXXXXX)
ctr=""
nginx_job=""
master=""
backends=""
built=""
ok=""

# Everything this script started goes away however it ends; a failed run
# also shows what nginx said.
cleanup() {
    status=$?
    set +e
    if [ -n "$master" ] && kill -0 "$master" 2>/dev/null; then
        kill -TERM "$master"
    fi
    if [ -n "$nginx_job" ]; then
        kill -TERM "$nginx_job" 2>/dev/null
        wait "$nginx_job" 2>/dev/null
    fi
    for pid in $backends; do
        kill -TERM "$pid" 2>/dev/null
    done
    if [ -z "$ok" ] && [ -s "$work/build.log" ] && [ -z "$built" ]; then
        say "end of the build's output:"
        tail -n 40 "$work/build.log" | sed 's/^/    /' >&2
    fi
    if [ -z "$ok" ] && [ -s "$work/nginx.out" ]; then
        say "nginx output:"
        sed 's/^/    /' "$work/nginx.out" >&2
    fi
    if [ -n "$ctr" ]; then
        buildah umount "$ctr" >/dev/null 2>&1
        buildah rm "$ctr" >/dev/null 2>&1
    fi
    rm -rf "$work"
    if [ -z "$ok" ]; then
        say "failed"
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

now() { date +%s; }
t_start=$(now)

# --- 1. The base image -----------------------------------------------------

# Like Debian's own container images: no documentation, manual pages or
# translations (the copyright files stay), and package scripts never start
# services.  mmdebstrap adds the -updates and -security suites of a stable
# release by itself.
note "base: Debian $suite from Debian's packages (mmdebstrap)"
# shellcheck disable=SC2016  # $1: the new root, in mmdebstrap's hooks
rcd='"$1/usr/sbin/policy-rc.d"'
nice mmdebstrap --variant=apt --quiet \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook="printf '#!/bin/sh\\nexit 101\\n' > $rcd" \
    --customize-hook="chmod 755 $rcd" \
    "$suite" "$work/base.tar"
podman import --quiet --change 'CMD ["bash"]' "$work/base.tar" "$base" \
    >/dev/null
rm -f "$work/base.tar"
t_base=$(now)

# --- 2. The image ----------------------------------------------------------

old_id=$(buildah images --quiet --no-trunc "$image" 2>/dev/null || true)
note "building $image (nginx of $base, core for $march)"
nice buildah bud --isolation=chroot --format docker --quiet \
    --build-arg "BASE=$base" --build-arg "AFFINITY_MARCH=$march" \
    --file "$repo/conf-examples/docker/Dockerfile" \
    --ignorefile "$repo/conf-examples/docker/Dockerfile.dockerignore" \
    --tag "$image" "$repo" > "$work/build.log" 2>&1
built=1
t_build=$(now)

# The base is made again on every run; its layer stays in the image.
buildah rmi "$base" >/dev/null 2>&1 || true
new_id=$(buildah images --quiet --no-trunc "$image")
if [ -n "$old_id" ] && [ "$old_id" != "$new_id" ]; then
    # The previous build of this tag, now untagged.
    buildah rmi "$old_id" >/dev/null 2>&1 || true
fi

# --- 3. The smoke test -----------------------------------------------------

fail() {
    say "smoke test: $*"
    exit 1
}

check_config() {
    got=$(buildah inspect --type image --format "$1" "$image")
    [ "$got" = "$2" ] || fail "image $3 is '$got', not '$2'"
    note "  image $3: $got"
}
note "smoke test of $image"
check_config '{{.Docker.Config.Cmd}}' '[nginx -g daemon off;]' CMD
check_config '{{.Docker.Config.StopSignal}}' 'SIGQUIT' STOPSIGNAL
# shellcheck disable=SC2016  # a Go template
check_config '{{range $p, $_ := .Docker.Config.ExposedPorts}}{{$p}} {{end}}' \
    '80/tcp ' EXPOSE

ctr=$(buildah from --quiet --pull=never --name "nginx-affinity-smoke-$$" \
          "$image")
run() { buildah run --isolation=chroot "$ctr" -- "$@"; }

note "  $(run nginx -v 2>&1)"
run nginx -t -q || fail "the image's own configuration fails nginx -t"
note "  the image's configuration passes nginx -t"

# The backends run on this machine and nginx reaches them over loopback:
# buildah's chroot isolation leaves the container in this network
# namespace.  Checked rather than assumed.
host_net=$(readlink /proc/self/ns/net)
ctr_net=$(run readlink /proc/self/ns/net)
[ "$host_net" = "$ctr_net" ] \
    || fail "the container has a network namespace of its own ($ctr_net)"

free_port() {
    perl -MIO::Socket::INET -e \
        'print IO::Socket::INET->new(Listen => 1, LocalAddr => "127.0.0.1",
                                     LocalPort => 0)->sockport'
}
listen=$(free_port)
b1=$(free_port)
b2=$(free_port)
while [ "$b2" = "$b1" ] || [ "$b2" = "$listen" ]; do b2=$(free_port); done

for port in "$b1" "$b2"; do
    perl "$repo/t/backend.pl" --port "$port" --watch-pid "$$" \
        > "$work/backend-$port.log" 2>&1 &
    backends="$backends $!"
done

# The test server replaces the image's default one (port 80 here would be
# this machine's port 80).  Its log format shows how each request was
# routed; the access log is the image's, i.e. stdout.
cat > "$work/smoke.conf" <<EOF
log_format smoke 'smoke route=\$affinity_route upstream=\$upstream_addr '
                 'status=\$status session=\$affinity_session';

upstream llm {
    server 127.0.0.1:$b1;
    server 127.0.0.1:$b2;
    session_affinity header=X-Session-ID zone=smoke_sessions:1m;
    prefix_affinity zone=smoke_prefixes:1m;
}

server {
    listen 127.0.0.1:$listen;
    access_log /var/log/nginx/access.log smoke;
    client_body_buffer_size 1m;

    location /v1/ {
        proxy_pass http://llm;
    }

    location = /affinity/status {
        affinity_status;
    }
}
EOF
run rm -f /etc/nginx/conf.d/default.conf
buildah copy --quiet "$ctr" "$work/smoke.conf" /etc/nginx/conf.d/smoke.conf \
    >/dev/null
run nginx -t -q || fail "a configuration with the affinity directives fails"
note "  session_affinity and prefix_affinity pass nginx -t"

# The image's CMD, in the background; nginx's stdout and stderr are the
# container's logs.
t_nginx=$(now)
run nginx -g 'daemon off;' > "$work/nginx.out" 2>&1 &
nginx_job=$!
mnt=$(buildah mount "$ctr")
tries=0
until curl -s -o /dev/null "http://127.0.0.1:$listen/affinity/status"; do
    tries=$((tries + 1))
    [ "$tries" -lt 100 ] || fail "nginx did not answer within 10 s"
    kill -0 "$nginx_job" 2>/dev/null || fail "nginx exited"
    sleep 0.1
done
# The container shares this machine's process ids too: the master's pid
# in its pid file is the one to signal.
master=$(cat "$mnt/run/nginx.pid")
t_started=$(now)

# backend_of ID [PROMPT]: the backend port (X-Backend-Port of t/backend.pl)
# that served a chat request with session id ID ("-": none) and the prompt
# PROMPT.
backend_of() {
    body="{\"model\":\"m\",\"messages\":[{\"role\":\"user\","
    body="$body\"content\":\"${2:-hello}\"}]}"
    if [ "$1" = - ]; then
        set -- -H 'Content-Type: application/json'
    else
        set -- -H 'Content-Type: application/json' -H "X-Session-ID: $1"
    fi
    curl -s -o /dev/null -D - "$@" --data "$body" \
        "http://127.0.0.1:$listen/v1/chat/completions" \
        | tr -d '\r' | sed -n 's/^[Xx]-[Bb]ackend-[Pp]ort: //p'
}

first=$(backend_of smoke-a)
[ -n "$first" ] || fail "no answer from a backend through nginx"
for i in 1 2 3 4 5; do
    got=$(backend_of smoke-a "turn $i")
    [ "$got" = "$first" ] || fail "session smoke-a went to $got, then $first"
done
note "  6 requests of session smoke-a: all on backend $first"

# Each with a prompt of its own: a new session is placed where its prompt
# is known to be, so sessions that all said "hello" would follow it.
seen=""
for i in $(seq 1 20); do
    seen="$seen $(backend_of "spread-$i" "conversation number $i")"
done
for port in "$b1" "$b2"; do
    case " $seen " in
        *" $port "*) ;;
        *) fail "20 new sessions, none on backend $port:$seen" ;;
    esac
done
note "  20 new sessions spread over both backends"

prompt="Summarise the design document that follows, section by section."
p1=$(backend_of - "$prompt")
p2=$(backend_of - "$prompt")
if [ -z "$p1" ] || [ "$p1" != "$p2" ]; then
    fail "the same prompt without a session went to $p1, then $p2"
fi
note "  a repeated prompt without a session: both on backend $p1"

status=$(curl -s -w '\n%{http_code}' "http://127.0.0.1:$listen/affinity/status")
[ "$(echo "$status" | tail -n 1)" = 200 ] || fail "status: not 200"
echo "$status" | grep -q '"llm"' || fail "status does not list upstream llm"
echo "$status" | grep -q "127.0.0.1:$b1" || fail "status lacks backend $b1"
prom=$(curl -s "http://127.0.0.1:$listen/affinity/status?format=prometheus")
echo "$prom" | grep -q '^nginx_upstream_affinity_peer_requests_total' \
    || fail "no Prometheus metrics at ?format=prometheus"
note "  affinity_status answers (JSON and Prometheus)"

# SIGQUIT, as a container runtime sends it for STOPSIGNAL: nginx lets its
# workers finish and exits 0.
kill -QUIT "$master"
tries=0
while kill -0 "$master" 2>/dev/null; do
    tries=$((tries + 1))
    [ "$tries" -lt 100 ] || fail "nginx still running 10 s after SIGQUIT"
    sleep 0.1
done
master=""
rc=0
wait "$nginx_job" || rc=$?
nginx_job=""
[ "$rc" -eq 0 ] || fail "nginx exited with $rc after SIGQUIT"
note "  SIGQUIT: nginx stopped gracefully"

routes=$(sed -n 's/^smoke route=\([a-z_]*\) .*/\1/p' "$work/nginx.out" \
             | sort | uniq -c | awk '{ printf "%s %s, ", $2, $1 }')
for want in session_new session_hit prefix_hit; do
    case "$routes" in
        *"$want "*) ;;
        *) fail "no $want in the access log on stdout: $routes" ;;
    esac
done
note "  access log on stdout: ${routes%, }"
t_end=$(now)
ok=1

size=$(buildah images --format '{{.Size}}' "$image" | head -n 1)
note "image $image: $size"
note "times: base $((t_base - t_start)) s, build $((t_build - t_base)) s," \
     "smoke test $((t_end - t_build)) s (nginx answering" \
     "$((t_started - t_nginx)) s after its start), total" \
     "$((t_end - t_start)) s"

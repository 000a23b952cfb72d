#!/bin/sh
# The Debian package in build/deb/ (make deb), installed into the system
# nginx: it installs with its dependencies, enables the module through
# /etc/nginx/modules-enabled, passes "nginx -t", loads into an nginx that
# only includes modules-enabled and routes real requests to three backends
# (a session sticks to its backend, a known prompt goes back to where it
# was served, $affinity_route says so); then removing it disables the
# module and purging it leaves nothing behind.
#
#   sh t/package/deb.sh          (make test-deb)
#
# Runs as root, or through sudo.  The test nginx is the system's binary
# with its own configuration, pid file, logs and temporary files in a
# temporary directory.  Installing and removing the package trigger
# Debian's nginx-reload, so a system nginx that is running reloads twice
# (it then loads the module, which does nothing until an upstream uses
# it); one that is stopped stays stopped.  Whatever fails, the package is
# purged and the test nginx and
# backends are stopped.  It refuses to run when the package, or a "make
# install" of the module, is there already: purging would take it away
# from the system nginx.
#
# Prints one line per check and a PASS or FAIL summary; exits non-zero on
# failure.
set -eu

# lib.sh takes the repository to be the parent of the script's directory;
# here it is two levels up.
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/../../scripts/lib.sh"
repo=$(cd "$(dirname "$0")/../.." && pwd)
tool=test-deb

package=libnginx-mod-http-upstream-affinity
so=/usr/lib/nginx/modules/ngx_http_upstream_affinity_module.so
snippet=/usr/share/nginx/modules-available/mod-http-upstream-affinity.conf
link=/etc/nginx/modules-enabled/50-mod-http-upstream-affinity.conf
system_nginx=/usr/sbin/nginx

started=$(date +%s)
checks=0
failed=0

# check DESCRIPTION COMMAND [ARG...]: runs COMMAND, counts and prints the
# outcome; the test goes on either way.
check() {
    _what=$1
    shift
    checks=$((checks + 1))
    if "$@"; then
        printf 'ok %d - %s\n' "$checks" "$_what"
    else
        failed=$((failed + 1))
        printf 'not ok %d - %s\n' "$checks" "$_what"
    fi
}

# abort MESSAGE: a step the rest depends on failed.
abort() {
    checks=$((checks + 1))
    failed=$((failed + 1))
    printf 'not ok %d - %s\n' "$checks" "$*"
    exit 1
}

# summary EXIT-STATUS
summary() {
    _secs=$(($(date +%s) - started))
    if [ "$1" -eq 0 ] && [ "$failed" -eq 0 ] && [ "$checks" -gt 0 ]; then
        note "PASS ($checks checks, ${_secs}s)"
    elif [ "$failed" -gt 0 ]; then
        note "FAIL ($failed of $checks checks failed, ${_secs}s)"
    else
        note "FAIL (stopped with status $1 after $checks checks, ${_secs}s)"
    fi
}

if ! can_be_root; then
    say "installs a package: run as root or install sudo"
    exit 1
fi

# The version scripts/build-deb.sh gave the package.
version=$(dpkg-parsechangelog -l "$repo/debian/changelog" -S Version)
arch=$(dpkg --print-architecture)
deb=$repo/build/deb/${package}_${version}_$arch.deb
dbgsym=$repo/build/deb/${package}-dbgsym_${version}_$arch.deb
if [ ! -f "$deb" ]; then
    say "${deb#"$repo"/} not found; run make deb"
    exit 1
fi

status=$(dpkg-query -W -f='${db:Status-Status}' "$package" 2>/dev/null) \
    || true
if [ -n "$status" ] && [ "$status" != not-installed ]; then
    say "$package is $status already; purge it first:"
    say "  apt-get purge $package"
    exit 1
fi
if [ -e "$so" ] || [ -e "$snippet" ] || [ -L "$link" ]; then
    say "the module is installed without the package (make install?);"
    say "remove it first: make uninstall"
    exit 1
fi

tmp=$(mktemp -d -t affinity-test-deb.XXXXXX)
# nginx's workers (nobody) reach their temporary directories through it.
chmod 0755 "$tmp"
installed=""
backend_pids=""

stop_nginx() {
    if [ -s "$tmp/nginx.pid" ]; then
        _pid=$(cat "$tmp/nginx.pid")
        as_root kill -QUIT "$_pid" 2>/dev/null || true
        _n=0
        while as_root kill -0 "$_pid" 2>/dev/null && [ "$_n" -lt 50 ]; do
            sleep 0.1
            _n=$((_n + 1))
        done
        as_root kill -KILL "$_pid" 2>/dev/null || true
        as_root rm -f "$tmp/nginx.pid"
    fi
}

stop_backends() {
    for _pid in $backend_pids; do
        kill "$_pid" 2>/dev/null || true
    done
    for _pid in $backend_pids; do
        wait "$_pid" 2>/dev/null || true
    done
    backend_pids=""
}

cleanup() {
    _rc=$?
    trap - EXIT INT TERM
    stop_nginx
    stop_backends
    if [ -n "$installed" ]; then
        say "purging $package"
        as_root dpkg --purge "$package" > "$tmp/cleanup.log" 2>&1 \
            || cat "$tmp/cleanup.log" >&2
    fi
    if [ "$_rc" -ne 0 ] && [ -s "$tmp/error.log" ]; then
        say "test nginx error log:"
        tail -n 20 "$tmp/error.log" >&2
    fi
    as_root rm -rf "$tmp"
    [ "$_rc" -ne 0 ] || [ "$failed" -eq 0 ] || _rc=1
    summary "$_rc"
    exit "$_rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- install ---------------------------------------------------------------

# A system whose nginx -t fails already says nothing about the package.
system_ok=1
as_root "$system_nginx" -q -t > "$tmp/nginx-t.log" 2>&1 || system_ok=""
[ -n "$system_ok" ] || say "nginx -t fails before the package is installed"

note "installing ${deb#"$repo"/}"
installed=1
if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        --no-install-recommends "$deb" > "$tmp/apt.log" 2>&1; then
    cat "$tmp/apt.log" >&2
    abort "apt-get install $package"
fi
check "apt-get install $package" true

installed_version=$(dpkg-query -W -f='${Version}' "$package")
check "installed version $installed_version is $version" \
    test "$installed_version" = "$version"
check "module in ${so%/*}" test -f "$so"
check "module stripped (no .symtab)" \
    sh -c "! readelf -S '$so' | grep -q '\\.symtab'"
check "snippet loads it from modules/" \
    grep -qx 'load_module modules/ngx_http_upstream_affinity_module.so;' \
    "$snippet"
check "postinst enabled it: ${link##*/} -> ${snippet##*/}" \
    test "$(readlink "$link")" = "$snippet"

# The debug symbols of this very file are in the -dbgsym package.
build_id=$(readelf -n "$so" | sed -n 's/^ *Build ID: *//p')
debug_file=usr/lib/debug/.build-id/$(printf %s "$build_id" | cut -c1-2)
debug_file=$debug_file/$(printf %s "$build_id" | cut -c3-).debug
check "-dbgsym has $debug_file" \
    sh -c "dpkg-deb -c '$dbgsym' | grep ' ./$debug_file\$' >/dev/null"

if [ -n "$system_ok" ]; then
    check "nginx -t with the module enabled" \
        as_root "$system_nginx" -q -t
else
    note "skipped: nginx -t (it failed before the install)"
fi

# ---- a test nginx that loads what modules-enabled says -----------------------

free_ports() {
    perl -MIO::Socket::INET -e '
        my @s = map {
            IO::Socket::INET->new(Listen => 1, LocalAddr => "127.0.0.1:0")
                or die "no free port: $!\n"
        } 1 .. $ARGV[0];
        print join(" ", map { $_->sockport } @s), "\n";' "$1"
}

# shellcheck disable=SC2046  # one port per word
set -- $(free_ports 4)
listen=$1
shift
ports="$*"

for port in $ports; do
    perl "$repo/t/backend.pl" --port "$port" --watch-pid $$ \
        > "$tmp/backend-$port.log" 2>&1 &
    backend_pids="$backend_pids $!"
done

servers=""
for port in $ports; do
    servers="$servers        server 127.0.0.1:$port;
"
done

cat > "$tmp/nginx.conf" <<EOF
include /etc/nginx/modules-enabled/*.conf;

worker_processes 2;
pid $tmp/nginx.pid;
error_log $tmp/error.log notice;

events {
    worker_connections 256;
}

http {
    access_log $tmp/access.log;
    client_body_temp_path $tmp/client_body;
    proxy_temp_path $tmp/proxy;
    fastcgi_temp_path $tmp/fastcgi;
    uwsgi_temp_path $tmp/uwsgi;
    scgi_temp_path $tmp/scgi;

    upstream fleet {
$servers
        session_affinity;
        prefix_affinity;
    }

    server {
        listen 127.0.0.1:$listen;
        client_body_buffer_size 1m;

        location / {
            proxy_pass http://fleet;
            add_header X-Affinity-Route \$affinity_route always;
            add_header X-Affinity-Prefix-Len \$affinity_prefix_len always;
        }
    }
}
EOF

# wait_for URL WHAT: until URL answers, for 5 s at most.
wait_for() {
    n=0
    until curl -s -o /dev/null "$1"; do
        n=$((n + 1))
        [ "$n" -lt 50 ] || abort "$2"
        sleep 0.1
    done
}

for port in $ports; do
    wait_for "http://127.0.0.1:$port/__stats" "backend on port $port answers"
done

# nginx's own prefix (no -p): the snippet's "load_module modules/..." is
# relative to it, as for the system nginx.  Every path nginx writes to is
# in the temporary directory.
if ! as_root "$system_nginx" -c "$tmp/nginx.conf" -e "$tmp/error.log" \
        > "$tmp/start.log" 2>&1; then
    cat "$tmp/start.log" >&2
    abort "test nginx starts with the module from modules-enabled"
fi
wait_for "http://127.0.0.1:$listen/" "test nginx answers on port $listen"
check "test nginx starts with the module from modules-enabled" true

# ---- routing ---------------------------------------------------------------

# req [CURL ARG...]: "BACKEND-PORT ROUTE PREFIX-LEN" of one request.
req() {
    curl -s -o /dev/null -D - "$@" "http://127.0.0.1:$listen/v1/chat" \
        | tr -d '\r' | awk -F': ' '
            tolower($1) == "x-backend-port"       { port = $2 }
            tolower($1) == "x-affinity-route"     { route = $2 }
            tolower($1) == "x-affinity-prefix-len" { len = $2 }
            END { print port, route, len }'
}

# Sessions: the first request places the session, the next ones reach the
# same backend as hits; twelve sessions land on more than one backend.
sticky=1
hits=1
used=""
for s in 1 2 3 4 5 6 7 8 9 10 11 12; do
    # shellcheck disable=SC2046
    set -- $(req -H "X-Session-ID: deb-session-$s")
    first_port=${1:-none}
    [ "${2:-}" = session_new ] || hits=""
    for _ in 1 2 3; do
        # shellcheck disable=SC2046
        set -- $(req -H "X-Session-ID: deb-session-$s")
        [ "${1:-}" = "$first_port" ] || sticky=""
        [ "${2:-}" = session_hit ] || hits=""
    done
    case " $used " in *" $first_port "*) ;; *) used="$used $first_port" ;; esac
done
check "each of 12 sessions stays on its backend" test -n "$sticky"
check "\$affinity_route: session_new, then session_hit" test -n "$hits"
# shellcheck disable=SC2086
set -- $used
check "the sessions spread over backends ($*)" test "$#" -ge 2

# Prompts: a conversation without a session id is placed by its prompt, and
# its next turn (which starts with the first) reaches the same backend.
words() {
    _i=1
    _out=""
    while [ "$_i" -le "$2" ]; do
        _out="$_out $1-w$_i"
        _i=$((_i + 1))
    done
    printf %s "$_out"
}
msg() { printf '{"role":"%s","content":"%s"}' "$1" "$(words "$2" 80)"; }
turn1="{\"model\":\"m\",\"messages\":[$(msg user q1)]}"
turn2="{\"model\":\"m\",\"messages\":[$(msg user q1),$(msg assistant a1),"
turn2="$turn2$(msg user q2)]}"

# shellcheck disable=SC2046
set -- $(req -H 'Content-Type: application/json' --data-binary "$turn1")
prompt_port=${1:-none}
check "a new prompt: prefix_new (got ${2:-nothing})" \
    test "${2:-}" = prefix_new
# shellcheck disable=SC2046
set -- $(req -H 'Content-Type: application/json' --data-binary "$turn2")
check "its next turn: prefix_hit (got ${2:-nothing})" \
    test "${2:-}" = prefix_hit
check "on the same backend (${1:-none}, first turn $prompt_port)" \
    test "${1:-}" = "$prompt_port"
check "\$affinity_prefix_len of the hit > 0 (got ${3:-nothing})" \
    test "${3:-0}" -gt 0

# No session id, no JSON body: by load.
# shellcheck disable=SC2046
set -- $(req)
check "no key and no prompt: fallback (got ${2:-nothing})" \
    test "${2:-}" = fallback

check "no emerg, alert or crit in the test nginx's error log" \
    sh -c "! grep -E '\\[(emerg|alert|crit)\\]' '$tmp/error.log'"

stop_nginx
stop_backends

# ---- remove and purge --------------------------------------------------------

if as_root dpkg --remove "$package" > "$tmp/remove.log" 2>&1; then
    check "dpkg --remove $package" true
else
    cat "$tmp/remove.log" >&2
    check "dpkg --remove $package" false
fi
check "remove: module gone" test ! -e "$so"
check "remove: snippet gone" test ! -e "$snippet"
check "remove: module disabled (no ${link##*/})" test ! -L "$link"
if [ -n "$system_ok" ]; then
    check "nginx -t after remove" as_root "$system_nginx" -q -t
fi

if as_root dpkg --purge "$package" > "$tmp/purge.log" 2>&1; then
    installed=""
    check "dpkg --purge $package" true
else
    cat "$tmp/purge.log" >&2
    check "dpkg --purge $package" false
fi
check "purge: nothing left in modules-enabled" \
    sh -c "! ls /etc/nginx/modules-enabled | grep -q affinity"
status=$(dpkg-query -W -f='${db:Status-Status}' "$package" 2>/dev/null) \
    || true
case "$status" in ""|not-installed) gone=1 ;; *) gone="" ;; esac
check "purge: $package is not installed (${status:-gone})" test -n "$gone"

#!/bin/sh
# The environment an nginx that is not sanitized itself (Debian's
# /usr/sbin/nginx) needs to load the sanitizer build of the module
# (scripts/build-module.sh --sanitize, build/asan/):
#
#   LD_PRELOAD      the AddressSanitizer runtime (it has to come before every
#                   other library; the module's own dependency on it is too
#                   late), the libasan the module is linked against
#   ASAN_OPTIONS    no leak detection (nginx does not free everything at
#                   exit), reports to files DIR/asan.PID
#   UBSAN_OPTIONS   stack traces, stop at the first error, reports to files
#                   DIR/ubsan.PID
#
#   scripts/sanitizer-env.sh DIR                  prints export lines:
#       eval "$(scripts/sanitizer-env.sh build/reports)"
#   scripts/sanitizer-env.sh DIR COMMAND [ARG...] runs COMMAND with them:
#       scripts/sanitizer-env.sh build/reports nginx -c "$PWD/nginx.conf"
#
#   AFFINITY_MODULE   the module whose libasan to preload (default:
#                     build/asan/ngx_http_upstream_affinity_module.so)
#
# DIR is created, writable by all (nginx workers do not run as root).  nginx
# empties its workers' environment, but they are forked from the master and
# keep the runtime and its options.  Any file in DIR afterwards is a report.
# ASAN_OPTIONS and UBSAN_OPTIONS already set are kept, ahead of these.
set -eu

# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"

if [ $# -lt 1 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
    usage
    [ $# -ge 1 ] && exit 0
    exit 2
fi

module="${AFFINITY_MODULE:-$repo/build/asan/$module_so}"

mkdir -p "$1"
chmod 1777 "$1"
dir=$(cd "$1" && pwd)
shift
# The sanitizers split their options at spaces and colons.
case "$dir" in
    *[[:space:]:]*)
        say "$dir: no spaces or colons, please"
        exit 1 ;;
esac

runtime=""
if [ -f "$module" ]; then
    runtime=$(ldd "$module" 2>/dev/null \
              | awk '$1 ~ /^libasan\.so/ && $3 ~ /^\// { print $3; exit }')
fi
if [ -z "$runtime" ]; then
    runtime=$("${CC:-gcc}" -print-file-name=libasan.so 2>/dev/null || true)
    case "$runtime" in
        /*) ;;
        *) say "libasan not found"; exit 1 ;;
    esac
fi

LD_PRELOAD="$runtime${LD_PRELOAD:+ $LD_PRELOAD}"
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0:halt_on_error=1:log_path=$dir/asan"
UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}print_stacktrace=1:halt_on_error=1:log_path=$dir/ubsan"

if [ $# -gt 0 ]; then
    export LD_PRELOAD ASAN_OPTIONS UBSAN_OPTIONS
    exec "$@"
fi
# Single-quoted for the shell that evals them.
quote() { printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")"; }
echo "export LD_PRELOAD=$(quote "$LD_PRELOAD")"
echo "export ASAN_OPTIONS=$(quote "$ASAN_OPTIONS")"
echo "export UBSAN_OPTIONS=$(quote "$UBSAN_OPTIONS")"

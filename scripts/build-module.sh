#!/usr/bin/env bash
# Build build/ngx_http_upstream_affinity_module.so.
#
#   scripts/build-module.sh              against the installed nginx, using the
#                                        headers and configure flags shipped in
#                                        Debian's nginx-dev
#   scripts/build-module.sh <nginx-src>  against another nginx source tree,
#                                        configured --with-compat
#   scripts/build-module.sh --sanitize [<nginx-src>]
#   AFFINITY_SANITIZE=1 scripts/build-module.sh [<nginx-src>]
#                                        the same with AddressSanitizer and
#                                        UndefinedBehaviorSanitizer, and the
#                                        core's assertions kept (no -DNDEBUG),
#                                        into build/asan/ instead
#   scripts/build-module.sh --trace [<nginx-src>]
#                                        a module that writes a line to the
#                                        error log for every routing decision
#                                        (src/core/trace.h, read by
#                                        bench/diagnostics/decisions.py), into
#                                        build/trace/; as nginx's --with-debug,
#                                        not for production
#
# The nginx tree is copied under build/ and configured there, so the source
# tree given is never modified; the sanitizer build has a tree of its own
# (build/nginx-dev-asan, build/nginx-NAME-asan).  Re-running only recompiles
# what changed.
#
# The .so is replaced by a rename, never written in place: an nginx running
# with the old file mapped keeps working.  It runs the new one once restarted
# (a reload keeps the module loaded: dlopen of the same path returns it).
#
# A sanitizer build loads into an nginx that is not sanitized (Debian's
# /usr/sbin/nginx) only with the sanitizer runtime preloaded; see
# scripts/sanitizer-env.sh.
set -euo pipefail

# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
build="$repo/build"

sanitize=""
trace=""
case "${AFFINITY_SANITIZE:-}" in ""|0) ;; *) sanitize=1 ;; esac
while [ $# -gt 0 ]; do
    case "$1" in
        --sanitize) sanitize=1; shift ;;
        --trace)    trace=1; shift ;;
        *)          break ;;
    esac
done
if [ -n "$sanitize" ] && [ -n "$trace" ]; then
    say "--sanitize and --trace are separate builds: choose one"
    exit 1
fi
src="${1:-}"

if [ -z "$src" ]; then
    src=/usr/share/nginx/src
    if [ ! -f "$src/conf_flags" ]; then
        say "$src/conf_flags not found; install nginx-dev"
        exit 1
    fi
    # conf_flags defines NGX_CONF_FLAGS, the flags Debian built nginx with;
    # a module must be configured with the same ones to load.
    # shellcheck disable=SC1091
    . "$src/conf_flags"
    flags=("${NGX_CONF_FLAGS[@]}")
    tree="$build/nginx-dev"
else
    src=$(cd "$src" && pwd)
    if [ ! -x "$src/configure" ] && [ ! -x "$src/auto/configure" ]; then
        say "$src is not an nginx source tree"
        exit 1
    fi
    # shellcheck disable=SC2206  # NGINX_CONFIGURE_FLAGS is a word list
    flags=(--with-compat ${NGINX_CONFIGURE_FLAGS:-})
    tree="$build/nginx-$(basename "$src")"
fi

out="$build"
if [ -n "$sanitize" ]; then
    # For the nginx C files of the module (the shim) and the C++ core.
    san_flags="-fsanitize=address,undefined -fno-omit-frame-pointer"
    san_flags="$san_flags -fno-sanitize-recover=undefined"
    tree="$tree-asan"
    out="$build/asan"
    # libubsan is linked into the module: the shared one, loaded after the
    # preloaded libasan, would have libasan's report file set (both export
    # that function) and go on writing its own reports to stderr, whatever
    # log_path says.  The module's version script keeps the copy to itself;
    # scripts/ubsan-init.cpp has it read its options when the module loads.
    ubsan_init="$out/ubsan-init.o"
    flags+=(--with-cc-opt="$san_flags"
            --with-ld-opt="-fsanitize=address,undefined -static-libubsan $ubsan_init")
    # Read by config.make when configure runs.  _GLIBCXX_ASSERTIONS: bounds
    # checks in the standard containers (no change of ABI).
    export AFFINITY_NDEBUG=0
    export AFFINITY_CXXFLAGS_EXTRA="$san_flags -O1 -D_GLIBCXX_ASSERTIONS"
    # configure runs some of its test programs, which are sanitized too.
    export ASAN_OPTIONS="detect_leaks=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
fi

if [ -n "$trace" ]; then
    tree="$tree-trace"
    out="$build/trace"
    export AFFINITY_CXXFLAGS_EXTRA="-DAFFINITY_TRACE"
fi

mkdir -p "$build" "$out"

# One build of a tree at a time: two configures or makes in one tree at once
# (make module run twice in parallel) spoil each other's output.
exec 9> "$tree.lock"
flock 9

if [ -n "$sanitize" ] \
   && [ ! "$ubsan_init" -nt "$repo/scripts/ubsan-init.cpp" ]; then
    "${CXX:-g++}" -c -fPIC -O1 -fno-exceptions -fno-rtti \
        -o "$ubsan_init" "$repo/scripts/ubsan-init.cpp"
    # Not a dependency objs/Makefile knows of.
    rm -f "$tree/objs/ngx_http_upstream_affinity_module.so"
fi

if [ ! -f "$tree/.copied" ]; then
    rm -rf "$tree"
    cp -a "$src" "$tree"
    touch "$tree/.copied"
fi

cd "$tree"
configure=./configure
[ -x "$configure" ] || configure=./auto/configure

# Configure again when the flags, the addon scripts or the list of sources
# changed.
stamp="$tree/.configured"
signature=$(printf '%s\n' "${flags[@]}" \
                "AFFINITY_NDEBUG=${AFFINITY_NDEBUG:-}" \
                "AFFINITY_CXXFLAGS_EXTRA=${AFFINITY_CXXFLAGS_EXTRA:-}";
            addon_signature)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$signature" ]; then
    rm -f "$stamp"
    "$configure" "${flags[@]}" --add-dynamic-module="$repo" \
        > "$out/configure.log" 2>&1 || {
        tail -n 30 "$out/configure.log" >&2
        say "configure failed, see ${out#"$repo"/}/configure.log"
        exit 1
    }
    printf '%s' "$signature" > "$stamp"
fi

# The top-level Makefile is not written in every tree (nginx-dev), so
# call the generated one directly.
make -j"$(nproc)" -f objs/Makefile modules
if cmp -s "objs/$module_so" "$out/$module_so"; then
    note "${out#"$repo"/}/$module_so is up to date"
else
    replace_file "objs/$module_so" "$out/$module_so"
    note "wrote ${out#"$repo"/}/$module_so"
fi

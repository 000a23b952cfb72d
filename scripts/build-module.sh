#!/usr/bin/env bash
# Build build/ngx_http_upstream_affinity_module.so.
#
#   scripts/build-module.sh              against the installed nginx, using the
#                                        headers and configure flags shipped in
#                                        Debian's nginx-dev
#   scripts/build-module.sh <nginx-src>  against another nginx source tree,
#                                        configured --with-compat
#
# The nginx tree is copied under build/ and configured there, so the source
# tree given is never modified.  Re-running only recompiles what changed.
#
# The .so is replaced by a rename, never written in place: an nginx running
# with the old file mapped keeps working.  It runs the new one once restarted
# (a reload keeps the module loaded: dlopen of the same path returns it).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
build="$repo/build"
src="${1:-}"

# Replaces $2 by a copy of $1: written next to it under a temporary name,
# then renamed over it (the rename is atomic within a directory).
replace_file() {
    local from=$1 to=$2 tmp
    tmp="$(dirname "$to")/.$(basename "$to").tmp.$$"
    if ! cp "$from" "$tmp" || ! mv -f "$tmp" "$to"; then
        rm -f "$tmp"
        echo "build-module: could not write $to" >&2
        return 1
    fi
}

if [ -z "$src" ]; then
    src=/usr/share/nginx/src
    if [ ! -f "$src/conf_flags" ]; then
        echo "build-module: $src/conf_flags not found; install nginx-dev" >&2
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
        echo "build-module: $src is not an nginx source tree" >&2
        exit 1
    fi
    flags=(--with-compat ${NGINX_CONFIGURE_FLAGS:-})
    tree="$build/nginx-$(basename "$src")"
fi

mkdir -p "$build"

# One build of a tree at a time: two configures or makes in one tree at once
# (make module run twice in parallel) spoil each other's output.
exec 9> "$tree.lock"
flock 9

if [ ! -f "$tree/.copied" ]; then
    rm -rf "$tree"
    cp -a "$src" "$tree"
    touch "$tree/.copied"
fi

cd "$tree"
configure=./configure
[ -x "$configure" ] || configure=./auto/configure

# Configure again when the addon scripts or the list of sources changed.
stamp="$tree/.configured"
signature=$(cat "$repo/config" "$repo/config.make";
            ls "$repo"/src/*.c "$repo"/src/core/*.cpp "$repo"/src/core/*.h;
            sh "$repo/scripts/cpu-level.sh")
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$signature" ]; then
    "$configure" "${flags[@]}" --add-dynamic-module="$repo" \
        > "$build/configure.log" 2>&1 || {
        tail -n 30 "$build/configure.log" >&2
        echo "build-module: configure failed, see build/configure.log" >&2
        exit 1
    }
    printf '%s' "$signature" > "$stamp"
fi

# The top-level Makefile is not written in every tree (nginx-dev), so
# call the generated one directly.
make -j"$(nproc)" -f objs/Makefile modules
so=ngx_http_upstream_affinity_module.so
if cmp -s "objs/$so" "$build/$so"; then
    echo "build-module: build/$so is up to date"
else
    replace_file "objs/$so" "$build/$so"
    echo "build-module: wrote build/$so"
fi

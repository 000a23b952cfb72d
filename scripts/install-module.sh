#!/bin/sh
# Install or uninstall build/ngx_http_upstream_affinity_module.so the way
# Debian's libnginx-mod-* packages lay a dynamic module out:
#
#   <modules dir>/ngx_http_upstream_affinity_module.so      (stripped)
#   PREFIX/lib/debug/.build-id/xx/yyyy.debug                 its debug symbols
#   PREFIX/share/nginx/modules-available/mod-http-upstream-affinity.conf
#       load_module modules/ngx_http_upstream_affinity_module.so;
#   SYSCONFDIR/nginx/modules-enabled/50-mod-http-upstream-affinity.conf
#       symlink to the file above
#
#   scripts/install-module.sh install | uninstall
#
# The debug symbols are laid out as Debian's -dbgsym packages have them:
# named by the module's build id (xx/yyyy: its first two hex digits, then
# the rest), which gdb, eu-unstrip and debuginfod look up in
# /usr/lib/debug; the stripped module also names the file in its
# .gnu_debuglink.  Under another PREFIX, point gdb to PREFIX/lib/debug
# (set debug-file-directory).
#
# Environment (make install / make uninstall pass them through):
#
#   DESTDIR               staging root for packaging (default: none)
#   PREFIX                /usr
#   SYSCONFDIR            /etc
#   NGINX_BIN             the nginx whose modules dir to use (/usr/sbin/nginx)
#   NGINX_MODULES_DIR     default: --modules-path= of "nginx -V", else
#                         <nginx --prefix>/modules, else /usr/lib/nginx/modules;
#                         PREFIX/lib/nginx/modules when PREFIX is not /usr
#   NGINX_MODULE_ENABLE   0: no modules-enabled symlink (a package would
#                         create it in its postinst, as dh_nginx does)
#   NGINX_MODULE_STRIP    0: install the module as built, debug symbols in
#                         it (for package builds whose tools strip it, as
#                         dh_strip does)
#   NGINX_LOAD_MODULE     the path written after load_module; default
#                         modules/<so> when <nginx prefix>/modules is the
#                         modules dir (Debian), else the absolute path
#
# uninstall removes the files and symlink, the debug file of the installed
# module (found by its build id), and the directories install had to create
# (recorded in build/install-manifest; only if empty).
set -eu

# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
conf=mod-http-upstream-affinity.conf
link=50-$conf

DESTDIR=${DESTDIR:-}
DESTDIR=${DESTDIR%/}
PREFIX=${PREFIX:-/usr}
SYSCONFDIR=${SYSCONFDIR:-/etc}
NGINX_BIN=${NGINX_BIN:-/usr/sbin/nginx}
enable=${NGINX_MODULE_ENABLE:-1}
strip_module=${NGINX_MODULE_STRIP:-1}

# Configure arguments of the nginx binary, if there is one.
nginx_args=""
if [ -x "$NGINX_BIN" ]; then
    nginx_args=$("$NGINX_BIN" -V 2>&1 | sed -n 's/^configure arguments: //p')
fi
nginx_arg() {
    printf '%s\n' "$nginx_args" | tr ' ' '\n' | sed -n "s/^--$1=//p" | tail -n 1
}

nginx_prefix=""
if [ -x "$NGINX_BIN" ]; then
    nginx_prefix=$(nginx_arg prefix)
    nginx_prefix=${nginx_prefix:-/usr/local/nginx}
fi

if [ -n "${NGINX_MODULES_DIR:-}" ]; then
    moddir=$NGINX_MODULES_DIR
elif [ "$PREFIX" != /usr ]; then
    moddir=$PREFIX/lib/nginx/modules
else
    moddir=$(nginx_arg modules-path)
    if [ -z "$moddir" ] && [ -n "$nginx_prefix" ]; then
        moddir=$nginx_prefix/modules
    fi
    moddir=${moddir:-/usr/lib/nginx/modules}
fi
available=$PREFIX/share/nginx/modules-available
debugdir=$PREFIX/lib/debug/.build-id
enabled=$SYSCONFDIR/nginx/modules-enabled

load=${NGINX_LOAD_MODULE:-}
if [ -z "$load" ]; then
    if [ -n "$nginx_prefix" ] && [ "$(readlink -m "$nginx_prefix/modules")" = \
                                   "$(readlink -m "$moddir")" ]; then
        load=modules/$module_so
    else
        load=$moddir/$module_so
    fi
fi

manifest=$repo/build/install-manifest
[ -z "$DESTDIR" ] || manifest=$manifest$(printf '%s' "$DESTDIR" | tr '/' '_')

# mkdir -p that records, in the manifest, each directory it creates under
# DESTDIR (DESTDIR itself is created if needed, and not recorded).
make_dir() {
    [ -z "$DESTDIR" ] || mkdir -p "$DESTDIR"
    dir=$1
    missing=""
    while [ "$dir" != / ] && [ ! -d "$DESTDIR$dir" ]; do
        missing="$dir $missing"
        dir=$(dirname "$dir")
    done
    for dir in $missing; do
        mkdir -m 0755 "$DESTDIR$dir"
        say "created $DESTDIR$dir"
        echo "$dir" >> "$manifest"
    done
}

# build_id FILE: the hex build id of an ELF file, empty without one.
build_id() {
    readelf -n "$1" 2>/dev/null | sed -n 's/^ *Build ID: *\([0-9a-f]*\)$/\1/p' \
        | head -n 1
}

# debug_path ID: where the debug file of build id ID goes, under debugdir.
debug_path() {
    printf '%s/%s/%s.debug\n' "$debugdir" "$(printf %s "$1" | cut -c1-2)" \
        "$(printf %s "$1" | cut -c3-)"
}

# install_stripped: the module without its debug symbols and the symbols in
# a file of their own, as dh_strip makes them: objcopy --only-keep-debug
# (compressed), strip --strip-unneeded without .comment and .note, and a
# .gnu_debuglink to the debug file.  Both are made from one copy of the
# build, so they match even if the build is replaced meanwhile.
install_stripped() {
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    cp "$repo/build/$module_so" "$work/$module_so"
    id=$(build_id "$work/$module_so")
    if [ -z "$id" ]; then
        say "build/$module_so has no build id; installing it unstripped"
        install -m 0644 "$work/$module_so" "$DESTDIR$moddir/$module_so"
        return
    fi
    debug=$(debug_path "$id")
    if ! objcopy --only-keep-debug --compress-debug-sections \
             "$work/$module_so" "$work/${debug##*/}" \
       || ! strip --strip-unneeded --remove-section=.comment \
             --remove-section=.note -o "$work/stripped" "$work/$module_so" \
       || ! objcopy --add-gnu-debuglink="$work/${debug##*/}" \
             "$work/stripped"; then
        say "could not strip build/$module_so"
        exit 1
    fi
    # The debug file of a module this one replaces goes with it.
    if [ -f "$DESTDIR$moddir/$module_so" ]; then
        old=$(build_id "$DESTDIR$moddir/$module_so")
        if [ -n "$old" ] && [ "$old" != "$id" ] \
           && [ -f "$DESTDIR$(debug_path "$old")" ]; then
            rm -f "$DESTDIR$(debug_path "$old")"
            say "removed $DESTDIR$(debug_path "$old")"
        fi
    fi
    make_dir "${debug%/*}"
    install -m 0644 "$work/${debug##*/}" "$DESTDIR$debug"
    say "installed $DESTDIR$debug"
    install -m 0644 "$work/stripped" "$DESTDIR$moddir/$module_so"
}

install_module() {
    if [ ! -f "$repo/build/$module_so" ]; then
        say "build/$module_so not found; run make first"
        exit 1
    fi
    mkdir -p "$repo/build"
    touch "$manifest"

    make_dir "$moddir"
    make_dir "$available"
    if [ "$strip_module" != 0 ]; then
        install_stripped
    else
        install -m 0644 "$repo/build/$module_so" "$DESTDIR$moddir/$module_so"
    fi
    say "installed $DESTDIR$moddir/$module_so"

    printf 'load_module %s;\n' "$load" > "$DESTDIR$available/$conf.tmp"
    chmod 0644 "$DESTDIR$available/$conf.tmp"
    mv -f "$DESTDIR$available/$conf.tmp" "$DESTDIR$available/$conf"
    say "installed $DESTDIR$available/$conf (load_module $load;)"

    if [ "$enable" != 0 ]; then
        make_dir "$enabled"
        ln -sfn "$available/$conf" "$DESTDIR$enabled/$link"
        say "linked $DESTDIR$enabled/$link -> $available/$conf"
    fi
}

uninstall_module() {
    # The debug file is the one of the module installed, whatever the build
    # is now.
    debug=""
    if [ -f "$DESTDIR$moddir/$module_so" ]; then
        id=$(build_id "$DESTDIR$moddir/$module_so")
        [ -z "$id" ] || debug=$DESTDIR$(debug_path "$id")
    fi
    for f in "$DESTDIR$enabled/$link" "$DESTDIR$available/$conf" \
             "$DESTDIR$moddir/$module_so" ${debug:+"$debug"}; do
        if [ -e "$f" ] || [ -L "$f" ]; then
            rm -f "$f"
            say "removed $f"
        fi
    done
    # Directories install created, deepest first, if nothing else is there.
    if [ -f "$manifest" ]; then
        sort -r -u "$manifest" | while read -r dir; do
            if [ -d "$DESTDIR$dir" ] && rmdir "$DESTDIR$dir" 2>/dev/null; then
                say "removed $DESTDIR$dir"
            fi
        done
        rm -f "$manifest"
    fi
}

case "${1:-}" in
    install)   install_module ;;
    uninstall) uninstall_module ;;
    *)         echo "usage: $0 install|uninstall" >&2; exit 2 ;;
esac

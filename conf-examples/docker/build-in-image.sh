#!/bin/sh
# Runs in the build stage of conf-examples/docker/Dockerfile and
# conf-examples/nginx-ingress-controller/Dockerfile, as root, in a Debian
# based image: compiles the module against the nginx the final image will
# run, and leaves in /out
#
#   ngx_http_upstream_affinity_module.so   the module
#   runtime-packages                       the Debian packages of the
#                                          libraries it links to
#   nginx-packages                         what the final stage must install
#                                          to have that nginx (empty when
#                                          the image already has it)
#
# Two cases:
#
#   - no nginx in the image (debian:bookworm-slim, or a base made with
#     mmdebstrap): Debian's nginx, and the module built against its
#     nginx-dev with Debian's own configure flags;
#   - an nginx already there (the official nginx image, F5 NGINX Ingress
#     Controller; nginx.org's packages, built --with-compat): the release
#     source of that exact version, downloaded from NGINX_DOWNLOAD (checked
#     against NGINX_SHA256 when set), configured --with-compat.
#
# The module's sources are in the directory above this script's (config,
# config.make, auto/, src/, scripts/build-module.sh and scripts/lib.sh).
#
#   AFFINITY_MARCH   instruction set level of the module's core: the build
#                    machine says nothing about the nodes that will run the
#                    image, so the Dockerfiles fix it (x86-64-v2 by
#                    default); ignored on other architectures
set -eu

src=$(cd "$(dirname "$0")/.." && pwd)
out=/out
NGINX_DOWNLOAD="${NGINX_DOWNLOAD:-https://nginx.org/download}"
NGINX_SHA256="${NGINX_SHA256:-}"
export DEBIAN_FRONTEND=noninteractive

say() { printf 'build-in-image: %s\n' "$*" >&2; }

# Package scripts must not start the nginx they install: there is no init
# here, and with chroot isolation the build shares the host's network, so
# an nginx started now would listen on the host's port 80.  policy-rc.d is
# what invoke-rc.d asks; Debian's container images ship one like it.
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
fi

# What the module links to (config: ngx_module_libs) and what scripts/
# build-module.sh runs (bash, flock from util-linux, make).
deps="build-essential util-linux libsimdjson-dev libjansson-dev
      libssl-dev libxxhash-dev"

mkdir -p "$out"
apt-get update -qq

if command -v nginx >/dev/null 2>&1; then
    version=$(nginx -v 2>&1 | sed -n 's|^nginx version: nginx/||p')
    if [ -z "$version" ]; then
        say "cannot read the version of $(command -v nginx)"
        exit 1
    fi
    # A module built separately loads only into an nginx built with
    # --with-compat (or with exactly the same flags).
    case " $(nginx -V 2>&1) " in
        *" --with-compat "*) ;;
        *) say "nginx $version was not built --with-compat"; exit 1 ;;
    esac
    say "nginx $version is in the image: building against its source"
    # configure's own requirements: PCRE (rewrite) and zlib (gzip).
    # shellcheck disable=SC2086  # one argument per package
    apt-get install -y -qq --no-install-recommends $deps \
        ca-certificates curl libpcre2-dev zlib1g-dev >/dev/null
    tarball="nginx-$version.tar.gz"
    curl -fsSL -o "/usr/src/$tarball" "$NGINX_DOWNLOAD/$tarball"
    if [ -n "$NGINX_SHA256" ]; then
        (cd /usr/src && echo "$NGINX_SHA256  $tarball" | sha256sum -c -)
    fi
    tar -xzf "/usr/src/$tarball" -C /usr/src
    tree="/usr/src/nginx-$version"
    : > "$out/nginx-packages"
else
    say "no nginx in the image: Debian's nginx and nginx-dev"
    # nginx-dev depends on the nginx of the same version: the final stage
    # installs that version, so the module matches it even if the archive
    # moves on between the two stages.
    # shellcheck disable=SC2086
    apt-get install -y -qq --no-install-recommends $deps nginx-dev \
        >/dev/null
    tree=""
    printf 'nginx=%s\n' "$(dpkg-query -W -f='${Version}' nginx)" \
        > "$out/nginx-packages"
fi

case "$(uname -m)" in
    x86_64) ;;
    *) AFFINITY_MARCH=none ;;        # the x86-64 levels mean nothing here
esac
export AFFINITY_MARCH="${AFFINITY_MARCH:-x86-64-v2}"
say "core built for ${AFFINITY_MARCH}"

# shellcheck disable=SC2086  # no tree: the installed nginx-dev
bash "$src/scripts/build-module.sh" $tree
so="$src/build/ngx_http_upstream_affinity_module.so"
cp "$so" "$out/"

if ldd "$so" | grep -q 'not found'; then
    ldd "$so" >&2
    say "the module links to a library that is not installed"
    exit 1
fi

# The packages of the shared libraries the module links to, so that the
# final stage installs exactly those, whatever the Debian release calls
# them (libsimdjson14 in bookworm, another soname elsewhere).  With merged
# /usr, ldd may name /lib/x where the package lists /usr/lib/x, or the
# other way round: both are asked.
ldd "$so" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' > "$out/libs"
: > "$out/packages"
while read -r lib; do
    found=""
    for path in "$lib" "/usr$lib" "${lib#/usr}"; do
        if dpkg -S "$path" >> "$out/packages" 2>/dev/null; then
            found=1
            break
        fi
    done
    if [ -z "$found" ]; then
        say "no package holds $lib"
        exit 1
    fi
done < "$out/libs"
cut -d: -f1 "$out/packages" | sort -u > "$out/runtime-packages"
rm -f "$out/libs" "$out/packages"
say "runtime packages: $(tr '\n' ' ' < "$out/runtime-packages")"

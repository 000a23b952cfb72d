#!/bin/sh
# Build the Debian package of the module for the installed nginx, with
# debian/ and Debian's tools (dpkg-buildpackage, debhelper, dh_nginx of
# nginx-dev), and check it with lintian:
#
#   build/deb/libnginx-mod-http-upstream-affinity_<version>_<arch>.deb
#   build/deb/libnginx-mod-http-upstream-affinity-dbgsym_<version>_<arch>.deb
#   build/deb/..._<arch>.buildinfo, ..._<arch>.changes, build.log, lintian.log
#
#   scripts/build-deb.sh          (make deb)
#
# The package is built in a copy of the repository in a temporary
# directory, so neither the working tree nor build/ (but build/deb/) is
# written to.  <version> is that of debian/changelog, AFFINITY_VERSION of
# affinity_core.h (make version) and a Debian revision: 0.9.0-1.
#
# Environment:
#
#   AFFINITY_MARCH       instruction set level of the core (debian/rules;
#                        default: the architecture's Debian baseline)
#   DEB_BUILD_OPTIONS    as dpkg-buildpackage takes it (nocheck, ...)
#   AFFINITY_LINTIAN=0   do not run lintian
set -eu

# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
package=libnginx-mod-http-upstream-affinity
out=$repo/build/deb

for cmd in dpkg-buildpackage dpkg-parsechangelog dh; do
    if ! command -v "$cmd" >/dev/null 2>&1; then
        say "$cmd not found; run make deps"
        exit 1
    fi
done

# The version is written once, in affinity_core.h; the package's is that
# version and a Debian revision (0.9.0-1), which counts builds of one
# release: a rebuild for a new nginx ABI is 0.9.0-2.  debian/changelog is
# checked against the header rather than generated: its entries are
# written by hand (what changed, by whom, when), and an entry made up at
# build time would give one version a different changelog and date on each
# build.  A release changes both; this catches one without the other.
version=$(make -s -C "$repo" --no-print-directory version)
if [ -z "$version" ]; then
    say "no AFFINITY_VERSION in src/core/include/affinity_core.h"
    exit 1
fi
debversion=$(dpkg-parsechangelog -l "$repo/debian/changelog" -S Version)
if [ "${debversion%-*}" != "$version" ]; then
    say "debian/changelog is at $debversion, affinity_core.h at $version;"
    say "add an entry for $version: dch -c debian/changelog -v $version-1"
    exit 1
fi

work=$(mktemp -d -t affinity-deb.XXXXXX)
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# A package of a tree with uncommitted changes is not the package of any
# commit: say so (the build goes on, for trying changes).
if git -C "$repo" rev-parse --git-dir >/dev/null 2>&1 \
   && [ -n "$(git -C "$repo" status --porcelain --untracked-files=no)" ]
then
    note "warning: the working tree has uncommitted changes; they are" \
         "in this package"
fi

# The copy: the sources without what the build and git keep (.gitignore).
src=$work/$package-$version
mkdir "$src"
tar -C "$repo" --exclude=./build --exclude=./.git --exclude=node_modules \
    --exclude=__pycache__ -cf - . | tar -C "$src" -xf -

mkdir -p "$out"
log=$out/build.log
note "building $package $debversion (log in ${log#"$repo"/})"
# -b: binary packages only; the source is the repository itself.
if ! (cd "$src" && nice dpkg-buildpackage -b --no-sign) > "$log" 2>&1; then
    tail -n 40 "$log" >&2
    say "dpkg-buildpackage failed, see ${log#"$repo"/}"
    exit 1
fi

arch=$(dpkg-architecture -qDEB_HOST_ARCH)
changes=${package}_${debversion}_$arch.changes
# Only this version's files are left in build/deb.
rm -f "$out/${package}_"* "$out/${package}-dbgsym_"*
for f in "$work"/*.deb "$work"/*.buildinfo "$work/$changes"; do
    cp "$f" "$out/"
done
deb=$out/${package}_${debversion}_$arch.deb
note "wrote ${deb#"$repo"/} ($(stat -c %s "$deb") bytes)"
note "Depends: $(dpkg-deb -f "$deb" Depends)"

if [ "${AFFINITY_LINTIAN:-1}" = 0 ]; then
    exit 0
fi
if ! command -v lintian >/dev/null 2>&1; then
    say "lintian not found: package not checked (make deps installs it)"
    exit 0
fi
# Errors and warnings fail the build; informational tags are shown.  The
# tags that remain are explained in debian/*lintian-overrides.  Its notice
# that it runs as root is left out.
lintlog=$out/lintian.log
status=0
lintian --display-info --fail-on error,warning "$out/$changes" \
    > "$lintlog" 2> "$work/lintian.err" || status=$?
grep -v 'running with root privileges' "$work/lintian.err" >> "$lintlog" \
    || true
cat "$lintlog"
if [ "$status" -ne 0 ]; then
    say "lintian found errors or warnings (${lintlog#"$repo"/})"
    exit 1
fi
note "lintian: no errors or warnings"

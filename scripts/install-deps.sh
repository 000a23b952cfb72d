#!/bin/sh
# Install the Debian packages needed to build, test, demo and benchmark the
# module, or, given package names, those instead (make image asks for its
# own tools this way).  Idempotent: does nothing when everything is present.
# Runs apt-get as root, or through sudo when invoked by another user.
#
#   scripts/install-deps.sh [PACKAGE ...]
set -eu

# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"

PACKAGES="
    build-essential
    clang
    cmake
    curl
    haproxy
    libbenchmark-dev
    libclang-rt-dev
    libgtest-dev
    libjansson-dev
    libpcre2-dev
    libsimdjson-dev
    libssl-dev
    libxxhash-dev
    lintian
    nginx
    nginx-dev
    openssl
    perl
    python3
    python3-matplotlib
    python3-yaml
    redis-server
    valgrind
    wrk
    zlib1g-dev
"

if [ $# -gt 0 ]; then
    PACKAGES="$*"

# The demo's chat client runs on Node.js; any node and npm on PATH will do.
elif ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1
then
    PACKAGES="$PACKAGES nodejs npm"
fi

missing=""
for pkg in $PACKAGES; do
    status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
    if [ "$status" != "installed" ]; then
        missing="$missing $pkg"
    fi
done

if [ -z "$missing" ]; then
    exit 0
fi

if ! can_be_root; then
    say "missing packages:$missing"
    say "run as root or install sudo"
    exit 1
fi

note "installing$missing"

# The distribution's nginx service is not wanted here: tests and the demo
# start their own nginx with a private prefix.
export DEBIAN_FRONTEND=noninteractive
as_root apt-get update -qq
# shellcheck disable=SC2086  # one argument per package
as_root apt-get install -y -qq --no-install-recommends $missing >/dev/null

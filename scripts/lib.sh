# shellcheck shell=sh
# What the repository's shell scripts share; POSIX sh, sourced by sh and
# bash scripts alike, after their `set -e...`:
#
#   . "$(dirname "$0")/lib.sh"                  (scripts/)
#   . "$(dirname "$0")/../scripts/lib.sh"       (bench/, demo/)
#
# Sets:
#   repo        the repository: the parent of the script's directory
#   tool        the script's name without .sh; its messages start with it
#   module_so   the file name of the module
#   module      the module to run: AFFINITY_MODULE, else build/<module_so>
#   nginx       the nginx to run: NGINX_BIN, else /usr/sbin/nginx

repo=$(cd "$(dirname "$0")/.." && pwd)
tool=$(basename "$0" .sh)
module_so=ngx_http_upstream_affinity_module.so
# shellcheck disable=SC2034  # for the scripts that source this
module="${AFFINITY_MODULE:-$repo/build/$module_so}"
# shellcheck disable=SC2034
nginx="${NGINX_BIN:-/usr/sbin/nginx}"

# say MESSAGE...: "tool: MESSAGE" on stderr (errors, progress).
say() { printf '%s: %s\n' "$tool" "$*" >&2; }

# note MESSAGE...: "tool: MESSAGE" on stdout (what was done).
note() { printf '%s: %s\n' "$tool" "$*"; }

# The comment at the top of the script, without its "#", up to its `set -e`.
usage() { sed -n '2,/^set -e/{/^set -e/d; s/^# \{0,1\}//; p}' "$0"; }

# Whether as_root can run a command: we are root, or sudo is there.
can_be_root() {
    [ "$(id -u)" -eq 0 ] || command -v sudo >/dev/null 2>&1
}

# as_root COMMAND [ARG...]: COMMAND as root, through sudo unless we are
# root; fails without running it when neither is possible.
as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        return 1
    fi
}

# replace_file FROM TO: TO becomes a copy of FROM, written next to it under
# a temporary name and renamed over it (atomic within a directory).  An
# nginx running the old binary or module keeps its mapping of the old file;
# writing into it in place would make it crash, or fail with ETXTBSY for a
# running binary.
replace_file() {
    _tmp="$(dirname "$2")/.$(basename "$2").tmp.$$"
    if ! cp "$1" "$_tmp" || ! mv -f "$_tmp" "$2"; then
        rm -f "$_tmp"
        say "could not write ${2#"$repo"/}"
        return 1
    fi
}

# What configuring nginx with the module depends on besides its flags: the
# addon scripts, the list of sources and the CPU level the core is built
# for.  Printed into the stamp that tells when to configure again.
addon_signature() {
    cat "$repo/config" "$repo/config.make"
    ls "$repo"/src/*.c "$repo"/src/core/*.cpp "$repo"/src/core/*.h
    sh "$repo/auto/cpu-level"
}

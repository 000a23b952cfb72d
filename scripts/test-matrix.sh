#!/usr/bin/env bash
# Run the end-to-end tests (t/*.t) against several nginx versions.
#
#   scripts/test-matrix.sh [VERSION|TREE...]   default: 1.22.1 1.26.3
#
# An entry that contains a "/" or names an existing directory is an nginx
# source tree (TREE); any other is a version number.  For each:
#
#   - the version of Debian's installed nginx package: the installed
#     /usr/sbin/nginx with the module that scripts/build-module.sh builds
#     against nginx-dev (build/ngx_http_upstream_affinity_module.so);
#
#   - any other version: the upstream source as Debian ships it
#     (nginx_VERSION.orig.tar.gz, from a deb-src entry of the Debian archive;
#     one for the next release is added when no configured suite has the
#     version), configured in build/matrix/VERSION/ with the module as a
#     dynamic module, so that the nginx binary and the module are built from
#     the same tree.  Both are copied to build/matrix/VERSION/.
#
#   - a source tree, as released (./configure at its top) or a git checkout
#     of nginx (auto/configure): VERSION is the NGINX_VERSION of its
#     src/core/nginx.h.  The tree is copied to build/matrix/VERSION/ (again
#     when it changed since) and built there as above; the tree given is
#     never written to, so it may be read-only or shared.
#
# Then `prove -j JOBS t/` with NGINX_BIN and AFFINITY_MODULE set to them.
# One summary line per entry at the end; exits non-zero if any failed.
#
# Re-running downloads, unpacks, copies and configures nothing again; the
# builds only recompile what changed (nginx itself is not rebuilt at all
# unless the tree has to be configured again).
#
#   MATRIX_SUITES="trixie"   suites to add deb-src entries for when a
#                            version is not in the configured ones (sid,
#                            unstable and experimental: without -updates
#                            and -security, which they do not have)
#   JOBS=N                   parallel make and prove jobs (default: nproc)
#   NGINX_CONFIGURE_FLAGS    extra configure flags for source builds
#
# For example:
#
#   scripts/test-matrix.sh 1.22.1 ../nginx       a git checkout of nginx
#   make test-matrix MATRIX_VERSIONS="1.26.3 /src/nginx-1.28.3"
set -euo pipefail

# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
matrix="$repo/build/matrix"
jobs="${JOBS:-$(nproc 2>/dev/null || echo 2)}"
suites="${MATRIX_SUITES:-trixie}"
installed_nginx=/usr/sbin/nginx

if [ $# -eq 0 ]; then
    set -- 1.22.1 1.26.3
fi

# Options are not taken: "-h" would otherwise be looked up as a version.
for arg in "$@"; do
    case "$arg" in
        -h|--help) usage; exit 0 ;;
        -*) say "unknown option $arg"; usage >&2; exit 2 ;;
    esac
done

# Upstream version of an installed Debian package ("" if not installed).
installed_version() {
    local v
    v=$(dpkg-query -W -f='${db:Status-Status} ${Version}' "$1" 2>/dev/null) \
        || return 0
    case "$v" in installed\ *) ;; *) return 0 ;; esac
    v=${v#installed }
    v=${v#*:}
    echo "${v%-*}"
}

# The Debian versions of source package nginx whose upstream version is $1,
# among the configured deb-src entries, newest first (one a line).
debian_versions() {
    local want=$1 v
    local -a found=()
    while read -r v; do
        case "$v" in "$want"-*|"$want") found+=("$v") ;; esac
    done < <(apt-cache showsrc nginx 2>/dev/null \
                 | sed -n 's/^Version: \(.*:\)\{0,1\}//p' | sort -u)
    # Selection sort with dpkg's ordering; there are only a few.
    while [ ${#found[@]} -gt 0 ]; do
        local best=0 i
        for i in "${!found[@]}"; do
            dpkg --compare-versions "${found[$i]}" gt "${found[$best]}" \
                && best=$i
        done
        echo "${found[$best]}"
        unset "found[$best]"
        found=("${found[@]}")
    done
}

# Adds deb-src entries for $suites (with the URIs and keyrings of the
# configured Debian entries) unless present, then updates the package lists.
# Once per run.
apt_updated=""
add_source_suites() {
    [ -z "$apt_updated" ] || return 0
    apt_updated=1

    local configured missing="" s
    # shellcheck disable=SC2016  # apt's own $(FIELD) syntax
    configured=$(apt-get indextargets --no-release-info \
                     --format '$(TARGET_OF) $(RELEASE)' 2>/dev/null \
                     | awk '$1 == "deb-src" { print $2 }' | sort -u)
    for s in $suites; do
        grep -qx "$s" <<< "$configured" || missing="$missing $s"
    done

    if [ -n "$missing" ] && ! can_be_root; then
        say "adding deb-src entries for$missing needs root (or sudo)"
        return 1
    fi
    if [ -n "$missing" ]; then
        local codename stanzas
        # shellcheck disable=SC1091
        codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
        # shellcheck disable=SC2086  # one argument per suite
        stanzas=$(source_stanzas "$codename" $missing)
        if [ -z "$stanzas" ]; then
            say "no Debian archive entry found in /etc/apt to copy for:$missing"
            return 1
        fi
        local sources_file
        sources_file=/etc/apt/sources.list.d/debian$(echo "$missing" | tr ' ' '-')-src.sources
        say "adding deb-src entries for$missing to $sources_file"
        printf '%s\n' "$stanzas" | as_root tee "$sources_file" >/dev/null
    fi
    say "apt-get update"
    as_root apt-get update -qq || say "apt-get update failed"
}

# deb822 deb-src stanzas for suites "$2..." copied from the Debian entries
# for release $1 in /etc/apt/sources.list.d/debian.sources or, without it,
# /etc/apt/sources.list: "bookworm" becomes the suite, "bookworm-updates"
# and "bookworm-security" become "<suite>-updates" and "<suite>-security".
# sid (unstable) and experimental have neither of those: for them only the
# base suite, and no stanza at all from an entry of the security archive
# (apt-get update would fail on the suites it does not have).
source_stanzas() {
    local codename=$1
    shift
    [ -n "$codename" ] || return 0
    local f=/etc/apt/sources.list.d/debian.sources
    {
        if [ -f "$f" ]; then
            cat "$f"
        elif [ -f /etc/apt/sources.list ]; then
            # One-line entries, as deb822 stanzas.
            awk '$1 == "deb" {
                    i = 2; signed = ""
                    if ($2 ~ /^\[/) {
                        for (; i <= NF; i++) {
                            if ($i ~ /signed-by=/) {
                                signed = $i
                                sub(/.*signed-by=/, "", signed)
                                sub(/\]$/, "", signed)
                            }
                            if ($i ~ /\]$/) { i++; break }
                        }
                    }
                    comps = ""
                    for (j = i + 2; j <= NF; j++) comps = comps " " $j
                    print "Types: deb"
                    print "URIs: " $i
                    print "Suites: " $(i + 1)
                    print "Components:" comps
                    if (signed != "") print "Signed-By: " signed
                    print ""
                }' /etc/apt/sources.list
        fi
    } | awk -v codename="$codename" -v targets="$*" '
        function flush(   n, i, j, t, s, out, parts, only_base) {
            if (uris != "" && types ~ /(^| )deb( |$)/ && suites != "") {
                n = split(suites, parts, " ")
                split(targets, t, " ")
                out = ""
                for (j = 1; j in t; j++) {
                    only_base = t[j] ~ /^(sid|unstable|experimental)$/
                    for (i = 1; i <= n; i++)
                        if (index(parts[i], codename) == 1) {
                            s = substr(parts[i], length(codename) + 1)
                            if (only_base && s != "")
                                continue
                            s = t[j] s
                            out = out (out == "" ? "" : " ") s
                        }
                }
                if (out != "") {
                    print "Types: deb-src"
                    print "URIs: " uris
                    print "Suites: " out
                    print "Components: " (comps == "" ? "main" : comps)
                    if (signed != "") print "Signed-By: " signed
                    print ""
                }
            }
            types = uris = suites = comps = signed = ""
        }
        /^[ \t]*#/ { next }
        /^[ \t]*$/ { flush(); next }
        { key = $1; sub(/:$/, "", key); $1 = ""; sub(/^ /, "") }
        key == "Types"      { types = $0 }
        key == "URIs"       { uris = $0 }
        key == "Suites"     { suites = $0 }
        key == "Components" { comps = $0 }
        key == "Signed-By"  { signed = $0 }
        END { flush() }
    '
}

# Downloads nginx_$1.orig.tar.gz into $2 from the Debian archive: with
# apt-get source from the newest Debian revision of that version; failing
# that, the one file from the URI and checksum apt gives for it; then the
# same with older revisions.
fetch_orig() {
    local version=$1 dir=$2 orig="nginx_$1.orig.tar.gz" debvers debver

    debvers=$(debian_versions "$version")
    if [ -z "$debvers" ]; then
        add_source_suites || true
        debvers=$(debian_versions "$version")
    fi
    if [ -z "$debvers" ]; then
        say "nginx $version: no Debian source package nginx $version-* in" \
            "the deb-src entries (added: $suites); see apt-cache showsrc nginx"
        return 1
    fi

    rm -rf "$dir/dl"
    mkdir -p "$dir/dl" || return 1
    # apt downloads as _apt when it can write there (no sandbox warning).
    if [ "$(id -u)" -eq 0 ] && getent passwd _apt >/dev/null; then
        chown _apt "$dir/dl" || true
    fi

    for debver in $debvers; do
        say "nginx $version: apt-get source --download-only nginx=$debver"
        # Only the upstream tarball is needed: a failure to fetch the .dsc
        # or the Debian tarball does not matter as long as it arrived.
        if ! (cd "$dir/dl" && apt-get source -qq --download-only \
                  "nginx=$debver"); then
            if [ -f "$dir/dl/$orig" ]; then
                say "nginx $version: $orig arrived (all that is needed)"
            else
                say "nginx $version: apt-get source nginx=$debver failed"
            fi
        fi
        [ -f "$dir/dl/$orig" ] && break

        local uri="" hash=""
        read -r uri hash < <(apt-get source -qq --print-uris \
                "nginx=$debver" 2>/dev/null \
            | awk -v f="$orig" '$2 == f { gsub("\047", "", $1);
                                          print $1, $4; exit }') || true
        if [ -n "$uri" ]; then
            say "nginx $version: apt-helper download-file $uri"
            /usr/lib/apt/apt-helper download-file "$uri" "$dir/dl/$orig" \
                "$hash" >&2 || rm -f "$dir/dl/$orig"
        fi
        [ -f "$dir/dl/$orig" ] && break
    done

    if [ ! -f "$dir/dl/$orig" ] || ! gzip -t "$dir/dl/$orig" 2>/dev/null; then
        say "nginx $version: could not download $orig from the Debian archive"
        return 1
    fi
    mv "$dir/dl/$orig" "$dir/$orig" && rm -rf "$dir/dl"
}

# Builds nginx $1 and the module from Debian's upstream source into
# build/matrix/$1/.
build_from_source() {
    local version=$1 dir="$matrix/$1"
    local tree="$dir/nginx-$1" orig="$dir/nginx_$1.orig.tar.gz"

    mkdir -p "$dir"
    if [ ! -f "$tree/.unpacked" ]; then
        if [ ! -f "$orig" ]; then
            fetch_orig "$version" "$dir" || return 1
        fi
        say "nginx $version: unpacking $(basename "$orig")"
        rm -rf "$tree" "$dir/unpack"
        if ! { mkdir -p "$dir/unpack" \
               && tar -xzf "$orig" --no-same-owner -C "$dir/unpack" \
               && mv "$dir/unpack/nginx-$version" "$tree" \
               && rmdir "$dir/unpack" \
               && touch "$tree/.unpacked"; }; then
            say "nginx $version: could not unpack $(basename "$orig")"
            return 1
        fi
    fi
    build_tree "$version"
}

# Whether matrix entry $1 is a source tree rather than a version number.
is_tree() {
    case "$1" in */*) return 0 ;; esac
    [ -d "$1" ]
}

# The NGINX_VERSION of the nginx source tree $1.
tree_version() {
    local v
    v=$(awk '$1 == "#define" && $2 == "NGINX_VERSION" {
                 gsub(/"/, "", $3); print $3; exit }' \
            "$1/src/core/nginx.h" 2>/dev/null) || true
    # It names directories under build/matrix/.
    case "$v" in ""|*[!0-9A-Za-z.+~_-]*) return 1 ;; esac
    echo "$v"
}

# Builds nginx and the module from the source tree $2, of version $1, into
# build/matrix/$1/.  The tree is copied to build/matrix/$1/nginx-$1 first,
# unless that is a copy of it already (.copied-from has its real path) and
# nothing in it is newer than the copy: a file added, deleted or renamed
# changes its directory's time too.  Its .git and the objs/ and Makefile of
# a build of its own are not copied (nor looked at): the build does not
# need them, and git or that build touching them would make every run copy
# the tree again.
build_from_tree() {
    local version=$1 src dir="$matrix/$1" tree="$matrix/$1/nginx-$1"
    local mark="$tree/.copied-from"

    src=$(cd "$2" && pwd -P) || return 1
    if [ ! -f "$src/configure" ] && [ ! -f "$src/auto/configure" ]; then
        say "nginx $version: $src has neither configure nor auto/configure"
        return 1
    fi
    mkdir -p "$dir"
    # Given its own copy (build/matrix/VERSION/nginx-VERSION) it builds that.
    if [ "$src" != "$(cd "$tree" 2>/dev/null && pwd -P)" ] \
       && { [ ! -f "$mark" ] || [ "$(cat "$mark")" != "$src" ] \
            || [ -n "$(find "$src" \( -path "$src/.git" -o -path "$src/objs" \
                       \) -prune -o -newer "$mark" -print -quit)" ]; }; then
        say "nginx $version: copying $src"
        rm -rf "$tree" "$dir/copy"
        # Writable: a read-only tree would be copied as read-only.
        if ! { mkdir -p "$dir/copy" \
               && (shopt -s dotglob nullglob
                   for f in "$src"/*; do
                       case "${f##*/}" in .git|objs|Makefile) continue ;; esac
                       cp -a "$f" "$dir/copy/" || exit 1
                   done) \
               && rm -f "$dir/copy/.configured" "$dir/copy/.unpacked" \
               && chmod -R u+w "$dir/copy" \
               && mv "$dir/copy" "$tree" \
               && printf '%s\n' "$src" > "$mark"; }; then
            say "nginx $version: could not copy $src to ${tree#"$repo"/}"
            return 1
        fi
    fi
    build_tree "$version"
}

# Configures nginx and the module in build/matrix/$1/nginx-$1 (unless done
# already with the same flags and addon), builds both and copies them to
# build/matrix/$1/.
build_tree() {
    local version=$1 dir="$matrix/$1" tree="$matrix/$1/nginx-$1"

    # shellcheck disable=SC2206  # NGINX_CONFIGURE_FLAGS is a word list
    local flags=(--prefix="$dir/prefix" --with-compat --with-http_ssl_module
                 --with-threads ${NGINX_CONFIGURE_FLAGS:-}
                 --add-dynamic-module="$repo")
    # Configure again when the flags, the addon scripts or the list of
    # sources changed (as scripts/build-module.sh does).
    local signature
    signature=$(printf '%s\n' "${flags[@]}"; addon_signature)
    # A release has ./configure; a git checkout of nginx only auto/configure,
    # which is meant to be run from the top of the tree all the same.
    local configure=./configure
    [ -f "$tree/configure" ] || configure=auto/configure
    if [ ! -f "$tree/.configured" ] \
       || [ "$(cat "$tree/.configured")" != "$signature" ]; then
        say "nginx $version: $configure"
        rm -f "$tree/.configured"
        (cd "$tree" && "$configure" "${flags[@]}") \
            > "$dir/configure.log" 2>&1 || {
            tail -n 30 "$dir/configure.log" >&2
            say "nginx $version: configure failed," \
                "see ${dir#"$repo"/}/configure.log"
            return 1
        }
        printf '%s' "$signature" > "$tree/.configured"
    fi

    say "nginx $version: make binary modules"
    if ! make -C "$tree" -f objs/Makefile -j"$jobs" binary modules \
            > "$dir/build.log" 2>&1; then
        grep -E -B2 -A6 'error|Error' "$dir/build.log" | tail -n 60 >&2 \
            || tail -n 60 "$dir/build.log" >&2
        say "nginx $version: build failed, see ${dir#"$repo"/}/build.log"
        return 1
    fi
    local f
    for f in nginx "$module_so"; do
        cmp -s "$tree/objs/$f" "$dir/$f" \
            || replace_file "$tree/objs/$f" "$dir/$f" || return 1
    done
}

# Runs the e2e suite with prove; prints its counts for the summary and, on
# failure, the failed test files and numbers.  The whole output is in
# build/matrix/VERSION/prove.log.
run_tests() {
    local version=$1 nginx=$2 module=$3 log="$matrix/$1/prove.log"
    mkdir -p "$matrix/$1"
    say "nginx $version: prove -j $jobs t/ (NGINX_BIN=${nginx#"$repo"/}" \
        "AFFINITY_MODULE=${module#"$repo"/})"
    local rc=0
    (cd "$repo" && NGINX_BIN="$nginx" AFFINITY_MODULE="$module" \
        prove -j "$jobs" t/) > "$log" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ]; then
        # The diagnostics of the failed tests, then prove's summary.
        grep -v -E '^t/.* ok$' "$log" | sed 's/^/    /' >&2
    fi
    awk '
        /^Files=/      { sub(/, *[0-9.]+ wallclock secs.*/, ""); counts = $0 }
        /^Bailout called/ { bail = $0 }
        /^Test Summary Report/ { report = 1; next }
        report && /^t\/[^ ]+\.t/ { file = $1; failed[file] = failed[file] "" }
        report && /Failed tests?:/ { sub(/.*Failed tests?: */, "");
                                     failed[file] = "#" $0 }
        END {
            printf "%s", (counts == "" ? "no counts" : counts)
            if (bail != "") printf "; %s", bail
            sep = "; failed: "
            for (f in failed) {
                printf "%s%s%s", sep, f, (failed[f] == "" ? "" : " " failed[f])
                sep = ", "
            }
        }' "$log"
    return "$rc"
}

installed=$(installed_version nginx)
dev=$(installed_version nginx-dev)
failed=0
summary=()

for entry in "$@"; do
    start=$SECONDS
    version=$entry
    why="build failed"
    if is_tree "$entry"; then
        what="source tree"
        nginx="" module=""
        if ! version=$(tree_version "$entry"); then
            version=$entry
            why="not an nginx source tree"
            say "$entry: no NGINX_VERSION in src/core/nginx.h; $why"
            ok=""
        else
            say "nginx $version: source tree $entry"
            if build_from_tree "$version" "$entry"; then ok=1; else ok=""; fi
            nginx="$matrix/$version/nginx"
            module="$matrix/$version/$module_so"
        fi
    elif [ -n "$installed" ] && [ "$version" = "$installed" ]; then
        what="installed nginx"
        if [ "$dev" != "$installed" ]; then
            say "nginx $version: nginx-dev ${dev:-missing}, not $installed"
            ok=""
        else
            say "nginx $version: installed; scripts/build-module.sh"
            mkdir -p "$matrix/$version"
            if "$repo/scripts/build-module.sh" > "$matrix/$version/build.log" 2>&1
            then
                ok=1
            else
                grep -E -B2 -A6 'error|Error' "$matrix/$version/build.log" \
                    | tail -n 60 >&2 || tail -n 60 "$matrix/$version/build.log" >&2
                say "nginx $version: build failed, see build/matrix/$version/build.log"
                ok=""
            fi
        fi
        nginx=$installed_nginx
        module="$repo/build/$module_so"
    else
        what="source build"
        if build_from_source "$version"; then ok=1; else ok=""; fi
        nginx="$matrix/$version/nginx"
        module="$matrix/$version/$module_so"
    fi

    if [ -z "$ok" ]; then
        result="FAIL  $why"
    elif counts=$(run_tests "$version" "$nginx" "$module"); then
        result="PASS  $counts"
    else
        result="FAIL  ${counts:-prove failed}; log: build/matrix/$version/prove.log"
    fi
    [ "${result%% *}" = PASS ] || failed=1
    summary+=("$(printf 'nginx %-8s %-17s %s (%ds)' "$version" "($what)" \
                        "$result" $((SECONDS - start)))")
done

echo
echo "test-matrix summary:"
printf '  %s\n' "${summary[@]}"
exit "$failed"

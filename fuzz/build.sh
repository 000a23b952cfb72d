#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/*.cpp into build/fuzz/.
#
# The core (src/core/*.cpp) is compiled into every target, with the same
# instruction set as the module (auto/cpu-level), without -DNDEBUG so
# that its and simdjson's assertions are live, and with AddressSanitizer and
# UndefinedBehaviorSanitizer set to abort on the first report.  Its objects
# are compiled once, into build/fuzz/obj/, and shared by the targets'
# links.  A re-run compiles only what changed: an object is rebuilt when it
# is older than its source, than any header of the core, than this script,
# or when the flags changed.
#
#   CXX=clang++-14 fuzz/build.sh        another clang (default: clang++)
#   FUZZ_CORE=build/snap/src/core ...    the core from another tree (e.g. a
#                                       `git archive` of a commit while the
#                                       working tree's core is mid-edit)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/build/fuzz"
obj="$out/obj"
cxx=${CXX:-clang++}
core=$(cd "${FUZZ_CORE:-$root/src/core}" && pwd)

if ! "$cxx" --version 2>/dev/null | grep -q clang; then
    echo "fuzz/build.sh: $cxx is not clang (libFuzzer needs clang)" >&2
    exit 1
fi

march=$(sh "$root/auto/cpu-level")

common=(-std=c++17 -g -O1 -fno-omit-frame-pointer
        -fsanitize=address,undefined -fno-sanitize-recover=all
        -I"$core/include" -I"$core")
if [ -n "$march" ]; then
    common+=(-march="$march")
fi
# The core gets libFuzzer's coverage instrumentation, not its main().
# (Its warnings are the unit tests' business, not shown here.)
core_flags=("${common[@]}" -fsanitize=fuzzer-no-link)
target_flags=("${common[@]}" -fsanitize=fuzzer -Wall -Wextra)
libs=(-lsimdjson -lcrypto)

mkdir -p "$obj"

# One build at a time in build/fuzz/ (make test and make fuzz may overlap).
exec 9> "$obj/lock"
flock 9

# Flags changed (another compiler, another CPU level): rebuild everything.
flags_now="$core | $cxx ${core_flags[*]} | ${target_flags[*]} | ${libs[*]}"
if [ ! -f "$obj/flags" ] || [ "$(cat "$obj/flags")" != "$flags_now" ]; then
    rm -f "$obj"/*.o "$out"/fuzz_*
    printf '%s\n' "$flags_now" > "$obj/flags"
fi

# Whether $1 is missing or older than any of the files after it.
stale() {
    local target=$1 f
    shift
    [ -e "$target" ] || return 0
    for f in "$@"; do
        [ "$f" -nt "$target" ] && return 0
    done
    return 1
}

headers=("$core"/*.h "$core"/include/*.h)
script="$root/fuzz/build.sh"

core_objs=()
for src in "$core"/*.cpp; do
    o="$obj/core_$(basename "$src" .cpp).o"
    core_objs+=("$o")
    if stale "$o" "$src" "${headers[@]}" "$script" "$obj/flags"; then
        echo "  CXX   $src"
        "$cxx" "${core_flags[@]}" -c "$src" -o "$o"
    fi
done

for src in "$root"/fuzz/fuzz_*.cpp; do
    name=$(basename "$src" .cpp)
    o="$obj/$name.o"
    if stale "$o" "$src" "$core"/include/affinity_*.h \
             "$script" "$obj/flags"
    then
        echo "  CXX   fuzz/$name.cpp"
        "$cxx" "${target_flags[@]}" -c "$src" -o "$o"
    fi
    if stale "$out/$name" "$o" "${core_objs[@]}"; then
        echo "  LINK  build/fuzz/$name"
        "$cxx" "${target_flags[@]}" "$o" "${core_objs[@]}" "${libs[@]}" \
            -o "$out/$name"
    fi
done

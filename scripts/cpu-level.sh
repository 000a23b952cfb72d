#!/bin/sh
# Prints the -march level to build the core with.  The JSON parser needs
# none: simdjson's DOM parser lives in libsimdjson, which picks its SIMD
# kernel when it runs.  The core's own per-request work does: counting code
# points and hashing prompt text (XXH3) take AVX2 at x86-64-v3, which makes
# prompt hashing about 2.5 times faster than a baseline build (README,
# "Performance").  So the core is built for the best level the build host
# has, which is what the hosts that run the module have in the usual case.
# The module checks the CPU when it loads and refuses to start on a CPU
# below that level.
#
#   AFFINITY_MARCH=x86-64 | x86-64-v2 | x86-64-v3 | none   overrides
set -eu

if [ -n "${AFFINITY_MARCH:-}" ]; then
    [ "$AFFINITY_MARCH" = none ] || echo "$AFFINITY_MARCH"
    exit 0
fi

[ "$(uname -m)" = x86_64 ] || exit 0      # arm64: NEON is always there

flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
has() { case " $flags " in *" $1 "*) return 0 ;; esac; return 1; }

# x86-64-v3: AVX2, BMI1/2, F16C, FMA, LZCNT (abm), MOVBE; v2: SSE4.2, POPCNT
if has avx && has avx2 && has bmi1 && has bmi2 && has f16c && has fma \
   && has movbe && { has abm || has lzcnt; }; then
    echo x86-64-v3
elif has sse4_2 && has pclmulqdq && has popcnt; then
    echo x86-64-v2
fi

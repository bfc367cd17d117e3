#!/bin/sh
# Executed instructions per super-block (256 values, one token, T = 1) of the integer path's
# row kernels on aarch64: the scalar reference, the NEON kernels (on a Cortex-A53: no SDOT)
# and the NEON+dotprod ones (qemu's max CPU), for Q4_K, Q6_K, Q8_0, Q4_0, Q4_1 at int2 and
# int3. Counted under qemu-user, one instruction per translation block (-singlestep) with
# every block's execution logged (-d exec,nochain): the difference between 2 calls and 1 at
# K 2304 less the same at K 256, over 8 super-blocks. Counts, not times.
#
#   make -C native build/iq2xxs_tables.h build/nibble_tables.h
#   scripts/figures/int_insn_count.sh [CC]   # CC: aarch64-linux-gnu-gcc (default), or
#                                            # "clang --target=aarch64-linux-gnu"
set -eu
CC=${1:-aarch64-linux-gnu-gcc}
QEMU=${QEMU_AARCH64:-qemu-aarch64}
N=$(cd "$(dirname "$0")/../../native" && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
CF="-O3 -std=c11 -Wall -Wextra -Wno-unused-parameter -pthread -D_GNU_SOURCE -I$N -I$N/build"
$CC $CF -march=armv8.2-a+dotprod -c "$N/quants_int_neon_dotprod.c" -o "$T/dotprod.o"
(cd "$N" && $CC -static $CF quants.c quants_int.c simd.c threadpool.c matmul.c profile.c \
  quants_neon.c matmul_neon.c quants_int_neon.c "$T/dotprod.o" \
  "$N/../scripts/figures/int_insn_count.c" -o "$T/count" -lm)
count() { # cpu level type limbs K reps
  "$QEMU" -cpu "$1" -singlestep -d exec,nochain -D "$T/log" "$T/count" "$2" "$3" "$4" "$5" "$6" >/dev/null
  grep -c '^Trace' "$T/log"
}
per_sb() { # cpu level type limbs
  a=$(count "$1" "$2" "$3" "$4" 2304 2); b=$(count "$1" "$2" "$3" "$4" 2304 1)
  c=$(count "$1" "$2" "$3" "$4" 256 2); d=$(count "$1" "$2" "$3" "$4" 256 1)
  echo $(( ((a - b) - (c - d)) / 8 ))
}
echo "| type | limbs | scalar | neon | neon+dotprod |"
echo "|---|---|---|---|---|"
for t in Q4_K:12 Q6_K:14 Q8_0:8 Q4_0:2 Q4_1:3; do
  for L in 2 3; do
    echo "| ${t%:*} | int$L | $(per_sb cortex-a53 0 "${t#*:}" $L) | $(per_sb cortex-a53 2 "${t#*:}" $L) | $(per_sb max 2 "${t#*:}" $L) |"
  done
done

#!/usr/bin/env bash
# Gateway instructions per proxied request, counted by valgrind's callgrind: repeatable whatever
# else the machine is doing (unlike CPU seconds on a shared 2-core VM), so an A/B of two checkouts
# is exact for the code the gateway runs; system calls' own cost (dear under gVisor) is not counted.
# `chimera serve` runs under callgrind with instrumentation off; after a warm-up it is switched
# on for REQUESTS requests (closed loop, CONCURRENCY at a time, streamed unless MODE=json), then off.
#   GATEWAY_SRC=DIR (default: this tree)  REQUESTS=1000  CONCURRENCY=8  MODE=stream|json
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
GW_PORT=18090 W_PORT=18002; . "$here/fleet.sh"
(cd "${GATEWAY_SRC:-.}" && exec valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$d/cg.%p" \
   ${PYTHON:-python} -m router.cli serve --config "$d/cfg.yaml") > "$d/gw.log" 2>&1 & G=$!
cleanup() { kill -INT $G 2>/dev/null; sleep 2; kill $G $W 2>/dev/null; wait 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$d"; }
trap cleanup EXIT
for _ in $(seq 600); do curl -sf -m 2 localhost:18090/health > /dev/null && break; sleep 0.5; done
load() { ${PYTHON:-python} "$here/count_load.py" http://127.0.0.1:18090 "$1" "${CONCURRENCY:-8}" "${MODE:-stream}"; }
load 300                                  # warm-up, not counted
callgrind_control -i on $G > /dev/null
load "${REQUESTS:-1000}"
callgrind_control -i off $G > /dev/null
callgrind_control -d $G > /dev/null; sleep 1
total=$(for f in "$d"/cg.*; do callgrind_annotate "$f" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'; done \
        | sort -n | tail -1)
python3 -c "print(f'gateway instructions per request: {$total / ${REQUESTS:-1000} / 1e6:.3f} M (${MODE:-stream}, concurrency ${CONCURRENCY:-8}, ${REQUESTS:-1000} requests)')"

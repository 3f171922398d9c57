#!/usr/bin/env bash
# System calls the gateway makes per proxied request (strace -c over every thread), where system
# calls are dear (gVisor here) the part of a request's cost that instruction counts miss.
# `chimera serve` as in run.sh; after a warm-up, strace attaches for REQUESTS closed-loop requests.
#   GATEWAY_SRC=DIR (default: this tree)  REQUESTS=2000  CONCURRENCY=8  MODE=stream|json
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
GW_PORT=18091 W_PORT=18003; . "$here/fleet.sh"
(cd "${GATEWAY_SRC:-.}" && exec ${PYTHON:-python} -m router.cli serve --config "$d/cfg.yaml") > "$d/gw.log" 2>&1 & G=$!
cleanup() { kill -INT $G 2>/dev/null; sleep 1; kill $G $W 2>/dev/null; wait 2>/dev/null; rm -rf "$d"; }
trap cleanup EXIT
for _ in $(seq 100); do curl -sf -m 2 localhost:18091/health > /dev/null && break; sleep 0.2; done
load() { ${PYTHON:-python} "$here/count_load.py" http://127.0.0.1:18091 "$1" "${CONCURRENCY:-8}" "${MODE:-stream}"; }
load 300
strace -f -c -o "$d/strace.txt" -p $G & S=$!
sleep 2
load "${REQUESTS:-2000}"
sleep 1; kill -INT $S; wait $S 2>/dev/null || true
awk -v n="${REQUESTS:-2000}" '$NF ~ /^[a-z_0-9]+$/ && $4 ~ /^[0-9]+$/ && $NF != "total" {printf "  %-16s %6.2f per request\n", $NF, $4 / n}
     $NF == "total" {printf "  %-16s %6.2f per request\n", "all", $4 / n}' "$d/strace.txt" | sort -k2 -rn | head -12

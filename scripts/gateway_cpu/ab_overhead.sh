#!/usr/bin/env bash
# Gateway overhead, before vs after, alternated in one sitting (docs/BENCH.md, "Gateway overhead").
# For each seed: `chimera bench --workload overhead` from the BEFORE checkout, then from this tree;
# then `run.sh` (gateway CPU per request) for both. Meant for a machine with idle cores (the lent
# GPU host has 16): the bench pins the gateway to core 0, the worker and the client to core 1.
#   BEFORE=DIR (a checkout to compare with; required)  SEEDS="0 1 2"  RATES=200,500,1000  OUT=DIR
# Without a venv (the lent host): PY_WHEELS=DIR installs the wheels there into /tmp/site first.
set -u
here=$(cd "$(dirname "$0")/../.." && pwd); cd "$here"
OUT=${OUT:-/tmp/ab-overhead}; mkdir -p "$OUT"
if [ -n "${PY_WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$PY_WHEELS"/*.whl 2>&1 | grep -v "Target directory" | tail -2
  export PYTHONPATH=/tmp/site
fi
PY=${PY:-python3}
$PY -c "import router.cli, aiohttp, orjson, uvloop, httpx2; print('deps ok')" || exit 1
for seed in ${SEEDS:-0 1 2}; do
  for side in before after; do
    dir=$([ $side = before ] && echo "$BEFORE" || echo "$here")
    echo "== seed $seed $side $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    (cd "$dir" && $PY -m router.cli bench --workload overhead --rate "${RATES:-200,500,1000}" --duration 5 --warmup 1 \
       --seed "$seed" --out "$OUT/$side-$seed" 2>&1 | grep -v "^\s*$" | tail -8)
  done
done
for side in before after; do
  echo "== cpu $side"
  dir=$([ $side = before ] && echo "$BEFORE" || echo "$here")
  GATEWAY_SRC=$dir PYTHON=$PY bash scripts/gateway_cpu/run.sh 2>&1 | grep concurrency
done
find "$OUT" -name '*.prof' -delete

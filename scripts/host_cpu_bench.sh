#!/usr/bin/env bash
# CPU-side benchmarks on a fast, otherwise idle host: the gateway's added latency and CPU per request
# (issue #7) and the predictive policy's decision time (issue #5). No GPU is used; the lent GPU machine
# is simply the one quiet multi-core host we have (the 2-core development VM is shared and ~2x slower).
#
# On the lent machine (see ../shared/gpu/README.md; vLLM itself is not needed, only its small deps):
#   git archive HEAD -o .gpu/head.tar            # the committed tree, nothing uncommitted
#   mkdir -p .gpu/logs && cp logs/collect-*/logs/requests-*.jsonl .gpu/logs/   # training logs (optional)
#   .gpu/c as for scripts/h200_validate.sh; .gpu/cpu: from .gpu/a/deps, the wheels of starlette, uvicorn, pydantic(-core),
#   openai, httpx2, httpcore2 (+ truststore), httptools, anyio and their small deps (the image has numpy, scikit-learn, httpx, pyyaml)
#   run, carry [.gpu/cpu, .gpu/c, .gpu/head.tar, .gpu/logs]:
#     mkdir -p /tmp/head && tar -xf .gpu/head.tar -C /tmp/head && ln -sfn $PWD/.gpu /tmp/head/.gpu && \
#       cd /tmp/head && bash scripts/host_cpu_bench.sh
# Locally (any Linux host with the venv active): bash scripts/host_cpu_bench.sh
# Knobs: OUT (default /tmp/host-out), SEEDS ("0 1 2"), RATES (200,500,1000), PARTS ("overhead cpu decision").
# Writes $OUT/host.txt (CPU model, load) and $OUT/host-cpu-bench.tgz: overhead-s*/results.json, gateway_cpu.txt,
# decision-*.txt.
set -uo pipefail
fail=0
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}:/tmp/site PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
OUT=${OUT:-/tmp/host-out}; mkdir -p "$OUT"
PY=${PYTHON:-python3}
for w in .gpu/cpu .gpu/c; do  # carried wheels (the lent machine has no network): our deps the image lacks
  if ls $w/*.whl > /dev/null 2>&1; then
    mkdir -p /tmp/site
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $w/*.whl 2>&1 \
      | grep -v "Target directory" | tail -2
  fi
done
{ date -u; $PY --version; echo "cores: $(env -u OMP_NUM_THREADS nproc) (affinity: $(taskset -pc $$ 2>/dev/null | cut -d: -f2))"; grep -m1 "model name" /proc/cpuinfo; uptime; git log -1 --format=%H 2>/dev/null || true; } \
  > "$OUT/host.txt"
cat "$OUT/host.txt"
for part in ${PARTS:-overhead cpu decision}; do
  case $part in
  overhead)
    for s in ${SEEDS:-0 1 2}; do
      $PY -m router.cli bench --workload overhead --rate "${RATES:-200,500,1000}" --duration 5 --warmup 1 \
        --seed "$s" --no-plots --out "$OUT/overhead-s$s" 2>&1 | tail -8 || fail=1
    done ;;
  cpu)
    PYTHON=$PY bash scripts/gateway_cpu/run.sh 2>&1 | tee "$OUT/gateway_cpu.txt" || fail=1 ;;
  decision)
    $PY scripts/predictor/bench_decision.py 2>&1 | tee "$OUT/decision-prior.txt" || fail=1
    if ls .gpu/logs/*.jsonl > /dev/null 2>&1; then
      $PY -m router.cli predictor train $(for f in .gpu/logs/*.jsonl; do echo --log "$f"; done) --out /tmp/hetero.pkl \
        2>&1 | tail -3 || fail=1
      for r in 1 2 3; do $PY scripts/predictor/bench_decision.py --model /tmp/hetero.pkl 2>&1 | tee "$OUT/decision-learned-$r.txt" || fail=1; done
    fi ;;
  esac
done
uptime >> "$OUT/host.txt"
# one archive: the lent machine brings back only a few files per call
(cd "$OUT" && tar -czf host-cpu-bench.tgz --warning=no-file-changed --exclude='*.prof' --exclude=host-cpu-bench.tgz \
  overhead-s* ./*.txt && find . -mindepth 1 -maxdepth 1 -name 'overhead-s*' -exec rm -rf {} +)
ls -la "$OUT"
exit $fail

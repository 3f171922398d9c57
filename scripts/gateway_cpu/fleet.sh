# Sourced by run.sh, instructions.sh and syscalls.sh: a temp dir $d with cfg.yaml for a gateway on
# port $GW_PORT in front of one zero-latency worker on $W_PORT, and that worker started ($W), run
# under the prefix "$@" (e.g. taskset -c 1).
d=$(mktemp -d)
cat > "$d/cfg.yaml" <<YAML
gateway: {port: $GW_PORT, policy: least_outstanding, default_agent: chat, request_log: $d/req.jsonl}
backends:
  - {name: w, url: "http://127.0.0.1:$W_PORT", model: m, kv_budget_tokens: 100000}
agents:
  - {name: chat, models: [m]}
YAML
"$@" ${PYTHON:-python} -m router.bench.fastworker --port "$W_PORT" --model m > /dev/null 2>&1 & W=$!

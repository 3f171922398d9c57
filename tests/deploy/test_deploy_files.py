"""deploy/ parses and agrees with the contract: configs load, probes hit real routes, ports line up,
and every metric the dashboard queries is one the gateway or vLLM exposes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from router.app import create_app
from router.checks import exposure
from router.core.config import Config, parse_config
from router.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
# vLLM 0.26's metric families as an H200 run listed them, as Prometheus names them
VLLM_METRICS = {
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:num_requests_waiting_by_reason",
    "vllm:kv_cache_usage_perc", "vllm:cache_config_info", "vllm:num_preemptions", "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits", "vllm:prompt_tokens", "vllm:prompt_tokens_cached", "vllm:generation_tokens",
    "vllm:iteration_tokens_total", "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
    "vllm:request_time_per_output_token_seconds", "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
    "vllm:request_inference_time_seconds", "vllm:request_prompt_tokens", "vllm:request_generation_tokens",
    "vllm:request_params_max_tokens", "vllm:request_success",
}  # fmt: skip
SUFFIXES = ("", "_total", "_bucket", "_sum", "_count", "_created")
# what the shipped configs read from the environment (compose: deploy/.env; Kubernetes: the Secret chimera-secrets)
SECRETS = {"CHIMERA_CHAT_KEY": "chat-key", "CHIMERA_ADMIN_KEY": "admin-key", "REDIS_PASSWORD": "0a1b2c"}


def _vllm_options(argv: list[str]) -> dict[str, str | bool]:
    """`vllm serve` options: `--flag value`, or `--flag` alone (True)."""
    out: dict[str, str | bool] = {}
    for i, a in enumerate(argv):
        if a.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            out[a] = True if nxt is None or nxt.startswith("--") else nxt
    return out


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def k8s() -> list[dict[str, Any]]:
    return [d for f in sorted((DEPLOY / "k8s").glob("*.yaml")) for d in docs(f)]


def kind(objs: list[dict[str, Any]], k: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objs if o.get("kind") == k}


def configmap_config() -> Config:
    """The config kustomize turns into the gateways' ConfigMap (configMapGenerator: rolled on every edit)."""
    kustom = docs(DEPLOY / "k8s" / "kustomization.yaml")[0]
    (gen,) = kustom["configMapGenerator"]
    assert gen["name"] == "chimera-config" and gen["files"] == ["config.yaml"]
    return parse_config((DEPLOY / "k8s" / "config.yaml").read_text(), file="deploy/k8s/config.yaml", env=SECRETS)


def app_paths(cfg: Config) -> set[str]:
    return {getattr(r, "path", "") for r in create_app(cfg, probe=False).routes}


def test_every_file_parses() -> None:
    files = [p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml", ".json")]
    assert len(files) >= 12
    for p in files:
        assert json.loads(p.read_text()) if p.suffix == ".json" else docs(p), p


@pytest.mark.parametrize("which", ["compose", "k8s"])
def test_gateway_config_is_valid_and_shared_through_redis(which: str) -> None:
    if which == "compose":
        cfg = parse_config((DEPLOY / "chimera.yaml").read_text(), file="deploy/chimera.yaml", env=SECRETS)
    else:
        cfg = configmap_config()
    assert cfg.gateway.state.startswith("redis://:0a1b2c@redis:6379")
    assert cfg.gateway.host == "0.0.0.0" and cfg.gateway.port == 8080


def _config_vars(path: Path) -> set[str]:
    """The ``${VAR}``s a config reads, comments left out."""
    return {m for line in path.read_text().splitlines() for m in re.findall(r"\$\{(\w+)\}", line.split("#")[0])}


@pytest.mark.parametrize("which", ["compose", "k8s"])
def test_shipped_configs_are_closed_and_read_their_secrets(which: str) -> None:
    path = DEPLOY / ("chimera.yaml" if which == "compose" else "k8s/config.yaml")
    assert _config_vars(path) == set(SECRETS)
    cfg = parse_config(path.read_text(), file=str(path), env=SECRETS)
    assert exposure(cfg) == []  # keys on every agent, an admin key, a Redis password: nothing to warn of
    assert all(a.api_keys for a in cfg.agents) and cfg.gateway.default_agent is None
    with pytest.raises(ConfigError, match=r"environment variable \w+ is not set"):  # a secret left out stops it
        parse_config(path.read_text(), file=str(path), env={})


def test_compose_passes_every_secret_and_keeps_the_rest_on_loopback() -> None:
    services = docs(DEPLOY / "docker-compose.yaml")[0]["services"]
    for name, svc in services.items():
        if svc.get("image") == "chimera-router:latest":  # required (`:?`): compose refuses to start without one
            assert {k: v.startswith(f"${{{k}:?") for k, v in svc["environment"].items()} == dict.fromkeys(SECRETS, True)
        for port in svc.get("ports", []):
            assert svc.get("image") == "chimera-router:latest" or port.startswith("127.0.0.1:"), (name, port)
    redis = services["redis"]
    assert "requirepass" in " ".join(redis["entrypoint"]) and "requirepass" not in " ".join(redis.get("command", []))
    assert redis["environment"]["REDIS_PASSWORD"].startswith("${REDIS_PASSWORD:?")
    grafana = services["grafana"]["environment"]
    assert grafana["GF_AUTH_ANONYMOUS_ENABLED"] == "false" and "GF_SECURITY_ADMIN_PASSWORD" in grafana
    assert services["prometheus"]["secrets"] == ["chimera-admin-key"]
    secret = docs(DEPLOY / "docker-compose.yaml")[0]["secrets"]["chimera-admin-key"]
    assert secret == {"environment": "CHIMERA_ADMIN_KEY"}


def test_k8s_reads_every_secret_from_one_secret() -> None:
    deployments = kind(k8s(), "Deployment")
    keys = {"CHIMERA_CHAT_KEY": "chat-api-key", "CHIMERA_ADMIN_KEY": "admin-key", "REDIS_PASSWORD": "redis-password"}

    def env(name: str) -> dict[str, tuple[str, str]]:
        (c,) = deployments[name]["spec"]["template"]["spec"]["containers"]
        refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c.get("env", [])}
        return {k: (r["name"], r["key"]) for k, r in refs.items()}

    assert env("chimera-gateway") == {k: ("chimera-secrets", v) for k, v in keys.items()}
    assert env("redis")["REDIS_PASSWORD"] == env("redis")["REDISCLI_AUTH"] == ("chimera-secrets", "redis-password")
    (redis,) = deployments["redis"]["spec"]["template"]["spec"]["containers"]
    assert "requirepass" in " ".join(redis["command"]) and "args" not in redis


@pytest.mark.parametrize("which", ["compose", "k8s"])
def test_prometheus_scrapes_the_gateways_with_the_admin_key(which: str) -> None:
    (job,) = [j for j in prometheus(which)["scrape_configs"] if j["job_name"] == "chimera-gateway"]
    where = {"compose": "/run/secrets/chimera-admin-key", "k8s": "/etc/prometheus/secrets/chimera-secrets/admin-key"}
    where = where[which]
    assert job["authorization"] == {"type": "Bearer", "credentials_file": where}


def test_compose_services() -> None:
    compose = docs(DEPLOY / "docker-compose.yaml")[0]
    services = compose["services"]
    cfg = parse_config((DEPLOY / "chimera.yaml").read_text(), env=SECRETS)
    gateways = [s for s in services.values() if s.get("image") == "chimera-router:latest"]
    assert len(gateways) >= 2 and all("./chimera.yaml:/etc/chimera/config.yaml:ro" in g["volumes"] for g in gateways)
    assert "redis" in services
    seen_gpus: set[str] = set()
    for b in cfg.backends:
        svc = services[urlsplit(b.url).hostname or ""]
        args = svc["command"]
        opt = _vllm_options(args)
        assert opt["--served-model-name"] == b.model and int(opt["--port"]) == b.port
        assert opt["--enable-auto-tool-choice"] is True and opt["--tool-call-parser"] == "hermes"  # Qwen2.5
        assert int(opt["--max-model-len"]) == b.max_model_len and int(opt["--kv-cache-memory-bytes"]) > 0
        (device,) = svc["deploy"]["resources"]["reservations"]["devices"]
        assert device["capabilities"] == ["gpu"] and len(device["device_ids"]) == 1
        assert device["device_ids"][0] not in seen_gpus  # one worker per GPU
        seen_gpus.add(device["device_ids"][0])


def test_k8s_objects_line_up() -> None:
    objs = k8s()
    deployments, services = kind(objs, "Deployment"), kind(objs, "Service")
    cfg = configmap_config()
    paths = app_paths(cfg)
    gw = deployments["chimera-gateway"]
    assert gw["spec"]["replicas"] == 2
    (container,) = gw["spec"]["template"]["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready" in paths
    assert container["livenessProbe"]["httpGet"]["path"] == "/health" in paths
    assert any(
        v.get("configMap", {}).get("name") == "chimera-config" for v in gw["spec"]["template"]["spec"]["volumes"]
    )
    assert services["chimera-gateway"]["spec"]["ports"][0]["port"] == cfg.gateway.port
    assert "redis" in services and "redis" in deployments
    assert len(cfg.backends) == len([n for n in deployments if n.startswith("vllm-")])
    for b in cfg.backends:
        name = urlsplit(b.url).hostname or ""
        assert services[name]["spec"]["ports"][0]["port"] == b.port
        (c,) = deployments[name]["spec"]["template"]["spec"]["containers"]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"]["path"] == "/health"
        opt = _vllm_options(c["args"])
        assert opt["--served-model-name"] == b.model and int(opt["--port"]) == b.port
        assert opt["--enable-auto-tool-choice"] is True and opt["--tool-call-parser"] == "hermes"
        assert int(opt["--kv-cache-memory-bytes"]) > 0
    kustom = docs(DEPLOY / "k8s" / "kustomization.yaml")[0]
    assert sorted(kustom["resources"]) == sorted(
        p.name for p in (DEPLOY / "k8s").glob("*.yaml") if p.name not in ("kustomization.yaml", "config.yaml")
    )
    # shutdown: out of the endpoints before SIGTERM closes the socket, and time to drain after it
    pod = gw["spec"]["template"]["spec"]
    assert container["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] > int(container["lifecycle"]["preStop"]["exec"]["command"][1]) + 60


def prometheus(which: str) -> dict[str, Any]:
    return docs(DEPLOY / "prometheus" / ("prometheus.yml" if which == "compose" else "prometheus-k8s.yml"))[0]


def static_targets(job: dict[str, Any]) -> dict[str, dict[str, str]]:
    """A job's static targets, each with its labels."""
    return {t: sc.get("labels", {}) for sc in job.get("static_configs", []) for t in sc["targets"]}


@pytest.mark.parametrize("which", ["compose", "k8s"])
def test_prometheus_scrapes_gateways_and_every_worker(which: str) -> None:
    prom = prometheus(which)
    jobs = {job["job_name"]: job for job in prom["scrape_configs"]}
    assert sorted(jobs) == ["chimera-gateway", "vllm"]
    assert all(job.get("metrics_path", "/metrics") == "/metrics" for job in jobs.values())
    assert "/metrics" in app_paths(configmap_config())
    if which == "compose":
        services = docs(DEPLOY / "docker-compose.yaml")[0]["services"]
        gateways = {n for n, s in services.items() if s.get("image") == "chimera-router:latest"}
        assert {t.split(":")[0] for t in static_targets(jobs["chimera-gateway"])} == gateways
        cfg, suffix = parse_config((DEPLOY / "chimera.yaml").read_text(), env=SECRETS), ""
    else:
        assert not static_targets(jobs["chimera-gateway"])  # the pods, discovered (test_each_target_...)
        cfg, suffix = configmap_config(), ".chimera.svc"
    want = {f"{urlsplit(b.url).hostname}{suffix}:{b.port}": {"backend": b.name, "model": b.model} for b in cfg.backends}
    assert static_targets(jobs["vllm"]) == want


def relabel(rules: list[dict[str, Any]], labels: dict[str, str]) -> dict[str, str] | None:
    """Prometheus' relabelling of one discovered target (the actions our configs use); None: dropped."""
    out = dict(labels)
    for rule in rules:
        action = rule.get("action", "replace")
        value = rule.get("separator", ";").join(out.get(name, "") for name in rule.get("source_labels", []))
        m = re.fullmatch(rule.get("regex", "(.*)"), value)  # Prometheus anchors its regexes at both ends
        if (action == "keep" and m is None) or (action == "drop" and m is not None):
            return None
        if action == "replace" and m is not None:
            out[rule["target_label"]] = m.expand(re.sub(r"\$\{?(\d+)\}?", r"\\g<\1>", rule.get("replacement", "$1")))
        elif action not in ("keep", "drop", "replace"):
            pytest.fail(f"relabel action {action!r}: this check cannot tell which targets it keeps")
    return out


def pod_targets(deployment: dict[str, Any], namespace: str, annotate: bool) -> list[dict[str, str]]:
    """What Kubernetes pod discovery finds for one pod of ``deployment``: one target per container port.
    ``annotate``: as if the pod also carried the usual prometheus.io/* annotations."""
    meta = deployment["spec"]["template"]["metadata"]
    annotations = dict(meta.get("annotations") or {})
    if annotate:
        annotations = {"prometheus.io/scrape": "true", "prometheus.io/port": "1", **annotations}

    def name(key: str) -> str:
        return re.sub(r"[^a-zA-Z0-9_]", "_", key)

    base = {
        "__meta_kubernetes_namespace": namespace,
        "__meta_kubernetes_pod_name": deployment["metadata"]["name"] + "-5d8f9-x2k4q",
        **{"__meta_kubernetes_pod_label_" + name(k): v for k, v in meta.get("labels", {}).items()},
        **{"__meta_kubernetes_pod_annotation_" + name(k): v for k, v in annotations.items()},
    }
    ports = [p for c in deployment["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])]
    return [{**base, "__address__": f"10.1.2.3:{p['containerPort']}"} for p in ports]


@pytest.mark.parametrize("annotate", [False, True], ids=["as-shipped", "every-pod-annotated"])
def test_each_target_is_scraped_by_one_job_only(annotate: bool) -> None:
    """A target two jobs scrape counts twice in every `sum by` of the dashboard. Static targets are told
    apart by address; on Kubernetes a Service target stands for the pods its selector picks, and pod
    discovery is replayed, relabelling and all, on every pod of deploy/k8s (also with prometheus.io/*
    annotations on every pod, as a cluster's conventions may add them): each pod is scraped by one job."""
    for which in ("compose", "k8s"):
        addresses = [t for job in prometheus(which)["scrape_configs"] for t in static_targets(job)]
        assert len(addresses) == len(set(addresses)), which
    namespace = docs(DEPLOY / "k8s" / "kustomization.yaml")[0]["namespace"]
    objs = k8s()
    deployments, services = kind(objs, "Deployment"), kind(objs, "Service")
    scraped_by: dict[str, list[str]] = {name: [] for name in deployments}
    for job in prometheus("k8s")["scrape_configs"]:
        for sd in job.get("kubernetes_sd_configs", []):
            assert sd["role"] == "pod"
            for name, d in deployments.items():
                if namespace not in sd.get("namespaces", {}).get("names", [namespace]):
                    continue
                kept = [t for t in (relabel(job.get("relabel_configs", []), t)
                                    for t in pod_targets(d, namespace, annotate)) if t is not None]  # fmt: skip
                if kept:
                    assert len({t["__address__"] for t in kept}) == 1, (job["job_name"], name)  # one per pod
                    scraped_by[name].append(job["job_name"])
        for target in static_targets(job):
            host = target.split(":")[0]
            assert host.endswith(f".{namespace}.svc"), target
            selector = services[host.removesuffix(f".{namespace}.svc")]["spec"]["selector"]
            for name, d in deployments.items():
                if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items():
                    scraped_by[name].append(job["job_name"])
    workers = {urlsplit(b.url).hostname or "" for b in configmap_config().backends}
    assert scraped_by == {
        name: ["chimera-gateway"] if name == "chimera-gateway" else ["vllm"] if name in workers else []
        for name in deployments
    }
    gateway_port = configmap_config().gateway.port
    (gw,) = pod_targets(deployments["chimera-gateway"], namespace, False)
    job = next(j for j in prometheus("k8s")["scrape_configs"] if j["job_name"] == "chimera-gateway")
    kept = relabel(job["relabel_configs"], gw)
    assert kept is not None and kept["__address__"] == f"10.1.2.3:{gateway_port}" and kept["pod"].startswith("chimera")


def test_dashboard_queries_only_metrics_that_exist() -> None:
    dash = json.loads((DEPLOY / "grafana" / "chimera-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    used = {m for e in exprs for m in re.findall(r"\b((?:chimera_|vllm:)[a-z0-9_:]+)", e)}
    gateway = set(re.findall(r'"(chimera_[a-z0-9_]+)"', (ROOT / "router" / "metrics.py").read_text()))
    assert {"chimera_requests_total", "chimera_ttft_seconds", "chimera_e2e_seconds"} <= gateway
    for m in used:
        known = gateway if m.startswith("chimera_") else VLLM_METRICS
        assert any(m == k + s or (m.endswith("_total") and m == k) for k in known for s in SUFFIXES), m
    assert any(m.startswith("chimera_") for m in used) and any(m.startswith("vllm:") for m in used)
    ds = docs(DEPLOY / "grafana" / "provisioning.yaml")[0]["datasources"][0]
    assert all(p.get("datasource", {}).get("uid", ds["uid"]) == ds["uid"] for p in dash["panels"])

"""The config loader: a good file loads into frozen objects; each mistake is one `file:line: key` error."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.core.config import load_config, parse_config
from router.core.errors import ConfigError

GOOD = """\
gateway:
  policy: least_kv
  max_body_bytes: 1000
backends:
  - name: small-0
    url: http://127.0.0.1:8001/
    model: qwen2.5-1.5b
    kv_budget_tokens: 400000
  - name: big-0
    url: http://127.0.0.1:8002
    model: qwen2.5-7b
    kv_budget_tokens: 200000
    tags: [long]
agents:
  - name: planner
    api_keys: [${PLANNER_KEY}]
    models: [qwen2.5-7b, qwen2.5-1.5b]
    sla: {ttft_ms: 800, tpot_ms: 60}
    priority: 0
  - name: coder
    api_keys: ["${CODER_KEY:-coder-default}"]
    models: [qwen2.5-1.5b]
"""


def _parse(text: str, env: dict[str, str] | None = None) -> object:
    return parse_config(text, file="fleet.yaml", env={"PLANNER_KEY": "pk-1", **(env or {})})


def test_good_config_loads_frozen_with_env_substituted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "fleet.yaml"
    f.write_text(GOOD)
    monkeypatch.setenv("PLANNER_KEY", "pk-secret")
    cfg = load_config(f)
    assert cfg.gateway.policy == "least_kv" and cfg.gateway.max_body_bytes == 1000
    assert cfg.backends[0].url == "http://127.0.0.1:8001"  # trailing slash dropped
    assert cfg.agent("planner") is not None and cfg.agent("planner").api_keys == ("pk-secret",)  # type: ignore[union-attr]
    assert cfg.agent("coder").api_keys == ("coder-default",)  # type: ignore[union-attr]
    assert cfg.served_models == ("qwen2.5-1.5b", "qwen2.5-7b") and cfg.uses_keys
    with pytest.raises(ValueError):
        cfg.gateway.port = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("old", "new", "where"),
    [
        ("  max_body_bytes: 1000", "  max_body_bytes: 1000\n  colour: red", "4: gateway.colour: unknown key"),
        ("    kv_budget_tokens: 200000\n", "    kv_budget_tokens: 200000\n    weight: 2\n",
         "13: backends[big-0].weight: unknown key"),
        ("  - name: big-0", "  - name: small-0", "9: backends[small-0].name: duplicate name 'small-0'"),
        ("  - name: coder", "  - name: planner", "20: agents[planner].name: duplicate name 'planner'"),
        ("models: [qwen2.5-1.5b]", "models: [gpt-9]", "22: agents[coder].models[0]: no backend serves model"),
        ("url: http://127.0.0.1:8002", "url: ftp://127.0.0.1:8002", "10: backends[big-0].url: not an http"),
        ("url: http://127.0.0.1:8002", "url: http://127.0.0.1:99999", "10: backends[big-0].url: bad port"),
        ("url: http://127.0.0.1:8002", "url: http://127.0.0.1:8001",
         "10: backends[big-0].url: URL 'http://127.0.0.1:8001' is used by two"),
        ("kv_budget_tokens: 200000", "kv_budget_tokens: -5",
         "12: backends[big-0].kv_budget_tokens: Input should be greater than 0"),
        ("max_body_bytes: 1000", "max_body_bytes: nope", "3: gateway.max_body_bytes"),
        ("    priority: 0\n", "    priority: 0\n    on_overload: panic\n", "20: agents[planner].on_overload"),
        # a boolean is not a number (pydantic's lax mode would read true as 1)
        ("kv_budget_tokens: 200000", "kv_budget_tokens: true",
         "12: backends[big-0].kv_budget_tokens: expected a number, not true"),
        ("sla: {ttft_ms: 800, tpot_ms: 60}", "sla: {ttft_ms: yes, tpot_ms: 60}",
         "18: agents[planner].sla.ttft_ms: expected a number, not true"),
        ("    priority: 0\n", "    priority: false\n", "19: agents[planner].priority: expected a number, not false"),
        # a key given twice (PyYAML would keep the last)
        ("  max_body_bytes: 1000", "  max_body_bytes: 1000\n  max_body_bytes: 2000",
         "4: invalid YAML: duplicate key 'max_body_bytes'"),
        ("    model: qwen2.5-7b\n", "    model: qwen2.5-7b\n    model: qwen2.5-7b\n",
         "12: invalid YAML: duplicate key 'model'"),
        # the state URL as redis-py reads it, at load rather than when the gateway starts
        ("  policy: least_kv\n", "  policy: least_kv\n  state: redis://127.0.0.1:notaport/0\n",
         "3: gateway.state: state URL: Port could not be cast"),
        ("  policy: least_kv\n", "  policy: least_kv\n  state: redis://127.0.0.1:6379/0?prefx=a\n",
         "3: gateway.state: unknown key 'prefx' in the state URL"),
        ("  policy: least_kv\n", "  policy: least_kv\n  state: redis://127.0.0.1:6379/0?lease_ttl_s=abc\n",
         "3: gateway.state: lease_ttl_s='abc' in the state URL is not a number"),
        # a simulated worker's profile is checked at load, not when `chimera serve` starts it
        ("    tags: [long]\n", "    tags: [long]\n    sim: {profile: h200-nope}\n",
         "14: backends[big-0].sim.profile: unknown profile 'h200-nope'"),
        # an engine the prober knows; `launch:` starts vLLM only
        ("    tags: [long]\n", "    tags: [long]\n    engine: ollama\n", "14: backends[big-0].engine: Input should be"),
        ("    tags: [long]\n", "    tags: [long]\n    engine: sglang\n    launch: {hf_model: m, kv_cache_gib: 4}\n",
         "14: backends[big-0].engine: launch: starts vLLM, not sglang"),
    ],
)  # fmt: skip
def test_each_mistake_names_file_line_and_key(old: str, new: str, where: str) -> None:
    assert old in GOOD
    with pytest.raises(ConfigError) as info:
        _parse(GOOD.replace(old, new, 1))
    assert str(info.value).startswith("fleet.yaml:" + where), str(info.value)
    assert "\n" not in str(info.value)


def test_numbers_from_env_vars_and_quoted_strings_are_still_numbers() -> None:
    text = GOOD.replace("max_body_bytes: 1000", "max_body_bytes: ${BODY}").replace("priority: 0", 'priority: "2"')
    cfg = _parse(text, {"BODY": "4096"})
    assert cfg.gateway.max_body_bytes == 4096 and cfg.agent("planner").priority == 2  # type: ignore[attr-defined]


def test_a_good_state_url_with_redis_py_options_loads() -> None:
    url = "redis://127.0.0.1:6379/0?prefix=p&lease_ttl_s=5&socket_timeout=0.5"
    cfg = _parse(GOOD.replace("  policy: least_kv\n", f"  policy: least_kv\n  state: {url}\n"))
    assert cfg.gateway.state == url  # type: ignore[attr-defined]


def test_sims_sharing_a_gpu_need_one_speedup() -> None:
    sims = GOOD.replace(
        "    kv_budget_tokens: 400000\n",
        "    kv_budget_tokens: 400000\n    gpu: 0\n    sim: {profile: h200-qwen2.5-1.5b, speedup: 2}\n",
    )
    sims = sims.replace("    tags: [long]\n", "    tags: [long]\n    gpu: 0\n    sim: {profile: h200-qwen2.5-7b}\n")
    with pytest.raises(ConfigError) as info:
        _parse(sims)
    assert str(info.value).startswith(
        "fleet.yaml:17: backends[big-0].sim.speedup: simulated workers small-0 and "
        "big-0 share gpu 0 but not their speedup (2 vs 1)"
    ), str(info.value)
    _parse(sims.replace("sim: {profile: h200-qwen2.5-7b}", "sim: {profile: h200-qwen2.5-7b, speedup: 2.0}"))
    other_gpu = "    gpu: 1\n    sim: {profile: h200-qwen2.5-7b}"
    _parse(sims.replace("    gpu: 0\n    sim: {profile: h200-qwen2.5-7b}", other_gpu))


def test_missing_env_var_names_its_line() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(GOOD, file="fleet.yaml", env={})
    assert str(info.value) == "fleet.yaml:16: ${PLANNER_KEY}: environment variable PLANNER_KEY is not set"


def test_env_value_cannot_change_the_yaml_shape() -> None:
    cfg = _parse(GOOD, env={"PLANNER_KEY": "a, b]: {x"})
    assert cfg.agents[0].api_keys == ("a, b]: {x",)  # type: ignore[attr-defined]


def test_env_vars_in_comments_are_left_alone_and_double_dollar_is_literal() -> None:
    text = GOOD.replace("  policy: least_kv\n", "  policy: least_kv   # or ${POLICY}\n  # admin_key: ${ADMIN_KEY}\n")
    text = text.replace("  - name: coder\n", "  - name: coder  # '${NOT_A_QUOTE} # ${ALSO_NOT}\n")
    text = text.replace("  max_body_bytes: 1000\n", "  max_body_bytes: 1000\n  request_log: it's.jsonl  # ${NOPE}\n")
    text = text.replace('["${CODER_KEY:-coder-default}"]', '["$${CODER_KEY}", "k#${CODER_KEY:-x}"]')
    cfg = _parse(text)  # POLICY, ADMIN_KEY, NOT_A_QUOTE, ALSO_NOT unset: only in comments
    assert cfg.agent("coder").api_keys == ("${CODER_KEY}", "k#x")  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="MISSING"):  # a quoted '#' starts no comment
        _parse(GOOD.replace("max_body_bytes: 1000", "max_body_bytes: 1000\n  request_log: '#${MISSING}'"))


def test_default_agent_rules() -> None:
    no_keys = "\n".join(line for line in GOOD.splitlines() if "api_keys" not in line)
    cfg = _parse(no_keys.replace("  policy: least_kv", "  policy: least_kv\n  default_agent: coder"))
    assert cfg.gateway.default_agent == "coder"  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"gateway\.default_agent: no agent named 'nobody'"):
        _parse(no_keys.replace("  policy: least_kv", "  policy: least_kv\n  default_agent: nobody"))
    with pytest.raises(ConfigError, match="only allowed when no agent has keys"):
        _parse(GOOD.replace("  policy: least_kv", "  policy: least_kv\n  default_agent: coder"))


def test_stage_cost_needs_the_expected_cost_rule() -> None:
    def with_options(opts: str) -> object:
        return _parse(GOOD.replace("  policy: least_kv", f"  policy: predictive\n  policy_options: {opts}"))

    cfg = with_options("{wrong_answer_s: 3, wrong_answer_stage_s: 1.5}")
    assert cfg.gateway.policy_options.wrong_answer_stage_s == 1.5  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"^fleet.yaml:3: gateway\.policy_options\.wrong_answer_stage_s: needs"):
        with_options("{wrong_answer_s: 0, wrong_answer_stage_s: 1.5}")
    assert with_options("{wrong_answer_s: 3, sla_miss_s: 20}").gateway.policy_options.sla_miss_s == 20  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"^fleet.yaml:3: gateway\.policy_options\.sla_miss_s: needs"):
        with_options("{wrong_answer_s: 0, sla_miss_s: 20}")


def test_shared_api_key_is_rejected() -> None:
    with pytest.raises(ConfigError, match=r"agents\[coder\].api_keys\[0\]: API key also belongs"):
        _parse(GOOD, env={"CODER_KEY": "pk-1"})


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match=r"^fleet.yaml:\d+: invalid YAML"):
        _parse("backends: [\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        _parse("- 1\n- 2\n")

"""Options that do nothing where they stand: `chimera check` and the gateway's start-up say so."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from router.checks import exposure, guessed_profiles, inert_options
from router.core.config import load_config
from router.serve import preflight

ROOT = Path(__file__).resolve().parents[2]

FLEET = """\
backends:
  - {name: w, url: "http://127.0.0.1:9", model: m, kv_budget_tokens: 1000}
"""


def _write(tmp_path: Path, gateway: str, agent: str = "") -> Path:
    path = tmp_path / "c.yaml"
    agents = f"agents:\n  - name: batch\n    models: [m]\n{agent}"
    policy = "" if "policy:" in gateway else "  policy: round_robin\n"
    path.write_text(f"gateway:\n{policy}{gateway}{FLEET}{agents}")
    return path


def test_on_overload_without_admission_is_named_with_its_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "", "    on_overload: reject\n")
    proc = subprocess.run([sys.executable, "-m", "router.cli", "check", str(path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        f"warning: {path}:8: agents[batch].on_overload: reject does nothing without gateway.admission "
        "(add `admission: {}` under gateway: to queue, reject or degrade when workers are full)"
    ]


def test_with_admission_on_overload_has_its_meaning(tmp_path: Path) -> None:
    assert inert_options(load_config(_write(tmp_path, "  admission: {}\n", "    on_overload: reject\n"))) == []


@pytest.mark.parametrize(
    ("gateway", "agent", "key"),
    [
        ("  policy_options: {latency_slack: 1.5}\n", "", "gateway.policy_options.latency_slack"),
        ("  policy_options: {long_tag: big}\n", "", "gateway.policy_options.long_tag"),
        ("  policy: predictive\n  policy_options: {latency_slack: 1.5}\n", "", "gateway.policy_options.latency_slack"),
        ("", "    min_quality: 0.6\n", "agents[batch].min_quality"),
        ("", "    priority: 0\n", "agents[batch].priority"),
        ("  engine_priority: {aging_s: 2}\n", "", "gateway.engine_priority"),
        ("  admission: {degrade_max_tokens: 64}\n", "", "gateway.admission.degrade_max_tokens"),
        ("  admission: {ttft_tolerance: 2}\n", "", "gateway.admission.ttft_tolerance"),
        ("  predictor: {save: m.pkl, refit_interval_s: 0}\n", "", "gateway.predictor.save"),
    ],
)
def test_each_inert_option_is_named(tmp_path: Path, gateway: str, agent: str, key: str) -> None:
    lines = inert_options(load_config(_write(tmp_path, gateway, agent)))
    assert len(lines) == 1 and f": {key}: does nothing" in lines[0], lines


def test_defaults_and_options_that_apply_are_not_named(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    options = "  policy_options: {latency_slack: 1.5, wrong_answer_s: 0}\n"
    path.write_text(f"gateway:\n  policy: predictive\n{options}{FLEET}"
                    "agents:\n  - {name: batch, models: [m], min_quality: 0.5}\n")  # fmt: skip
    assert inert_options(load_config(path)) == []
    assert inert_options(load_config(ROOT / "examples" / "quickstart.yaml")) == []


def test_the_gateway_logs_them_at_start_up(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _write(tmp_path, "", "    on_overload: degrade\n")
    with caplog.at_level(logging.WARNING):
        preflight(load_config(path), str(path), request_log=False)
    assert [r.getMessage() for r in caplog.records if "on_overload" in r.getMessage()] == [
        f"{path}:8: agents[batch].on_overload: degrade does nothing without gateway.admission "
        "(add `admission: {}` under gateway: to queue, reject or degrade when workers are full)"
    ]


def test_check_shows_each_backends_profile_and_warns_where_a_guess_or_a_learner_routes(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "gateway: {policy: predictive}\nbackends:\n"
        "  - {name: known, url: 'http://127.0.0.1:9', model: qwen2.5-7b, kv_budget_tokens: 1000}\n"
        "  - {name: mine, url: 'http://127.0.0.1:10', model: m, kv_budget_tokens: 1000}\n"
        "  - {name: set, url: 'http://127.0.0.1:11', model: m, kv_budget_tokens: 1000, profile: h200-qwen2.5-0.5b}\n"
        "  - {name: rated, url: 'http://127.0.0.1:12', model: m, kv_budget_tokens: 1000, quality: 0.7}\n"
        "agents:\n  - {name: a, models: [m]}\n"
    )
    proc = subprocess.run([sys.executable, "-m", "router.cli", "check", str(path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines() if line.startswith("  ")}
    assert "profile=guess(h200-qwen2.5-7b)" in rows["known"] and "profile=learned(from h200-qwen2.5-7b)" in rows["mine"]
    assert "profile=h200-qwen2.5-0.5b" in rows["set"]
    assert proc.stderr.splitlines() == [
        f"warning: {path}:3: backends[known]: no profile: its latency is predicted with h200-qwen2.5-7b, the profile "
        "shipped for its model name, measured on an H200; measure the worker with `chimera profile --url "
        "http://127.0.0.1:9 --model qwen2.5-7b --out known.json`, then set `profile: known.json`",
        f"warning: {path}:4: backends[mine]: no profile: none is shipped for model m, so its step times are learned "
        "from its own answers (until then: h200-qwen2.5-7b's); measure the worker with `chimera profile --url "
        "http://127.0.0.1:10 --model m --out mine.json`, then set `profile: mine.json` to predict it from the first "
        "request; and no `quality`: how good its answers are is learned from the verdicts posted to /v1/feedback "
        "(without them the policy cannot weigh its speed against its answers: set `quality`, 0..1)",
        f"warning: {path}:6: backends[rated]: no profile: none is shipped for model m, so its step times are learned "
        "from its own answers (until then: h200-qwen2.5-7b's); measure the worker with `chimera profile --url "
        "http://127.0.0.1:12 --model m --out rated.json`, then set `profile: rated.json` to predict it from the first "
        "request",
    ]
    path.write_text(path.read_text().replace("policy: predictive", "policy: round_robin"))  # predictions route nothing
    assert guessed_profiles(load_config(path)) == []


def test_a_gateway_open_beyond_loopback_is_said_at_check_and_start(tmp_path: Path) -> None:
    path = tmp_path / "open.yaml"
    path.write_text(
        "gateway:\n  host: 0.0.0.0\n  state: redis://redis:6379/0\n"
        f"{FLEET}agents:\n  - {{name: a, models: [m]}}\n"
    )
    proc = subprocess.run([sys.executable, "-m", "router.cli", "check", str(path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        f"warning: {path}:2: gateway.host: listens on 0.0.0.0, beyond loopback, and no agent has api_keys: any caller "
        "who reaches it is whichever agent it names",
        f"warning: {path}:2: gateway.host: listens on 0.0.0.0, beyond loopback, with no admin_key: /fleet and "
        "/metrics answer anyone",
        f"warning: {path}:3: gateway.state: listens on 0.0.0.0, beyond loopback, on a Redis state with no password",
    ]
    closed = load_config(path)
    closed = closed.model_copy(update={"gateway": closed.gateway.model_copy(
        update={"admin_key": "k", "state": "redis://:pw@redis:6379/0"})})  # fmt: skip
    closed = closed.model_copy(update={"agents": (closed.agents[0].model_copy(update={"api_keys": ("ka",)}),)})
    assert exposure(closed) == [] and exposure(load_config(path), host="127.0.0.1") == []
    assert exposure(load_config(path), host="::1") == [] and len(exposure(load_config(path), host="10.0.0.5")) == 3


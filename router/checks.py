"""Options that do nothing where they stand: ``chimera check`` prints them, the gateway logs them at start-up; and
the backends that route with a guessed profile, which ``chimera check`` names.

Each warning is one line, ``file:line: key: message``, and says what would give the option its
meaning. They are warnings, not errors and not silent defaults: a config that sets ``on_overload:
reject`` without ``gateway.admission`` is most likely a config whose author expects 429s, but
turning admission control on for them would hold every agent's requests at the gateway (a queue
with its own limits and waits) — a change of behaviour nobody asked for. So the gateway serves the
config as written and says which lines have no effect.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from urllib.parse import urlsplit

from router.core.config import Config
from router.policies import OPTIONS_READ, USES_PREDICTOR


def inert_options(config: Config) -> list[str]:
    """One line per option that has no effect in this config (only options the file sets)."""
    return [str(config.error(loc, message)) for loc, message in _inert(config)]


def exposure(config: Config, host: str | None = None) -> list[str]:
    """One line per way a gateway listening beyond loopback (``host``, else ``gateway.host``) is open to whoever
    reaches it: no agent has API keys (any caller picks its agent with ``X-Agent``, or gets ``default_agent``); no
    ``admin_key`` (``/fleet`` and ``/metrics`` name every worker and agent to anyone); a Redis state without a
    password. Nothing for a loopback address."""
    host = host or config.gateway.host
    if _loopback(host):
        return []
    where = f"listens on {host}, beyond loopback,"
    lines = []
    if not any(a.api_keys for a in config.agents):
        lines.append(config.error(("gateway", "host"), f"{where} and no agent has api_keys: any caller who reaches it "
                                  "is whichever agent it names"))  # fmt: skip
    if config.gateway.admin_key is None:
        lines.append(config.error(("gateway", "host"), f"{where} with no admin_key: /fleet and /metrics answer anyone"))
    state = config.gateway.state
    if state != "memory" and urlsplit(state).password is None and "password" not in state:
        lines.append(config.error(("gateway", "state"), f"{where} on a Redis state with no password"))
    return [str(line) for line in lines]


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost: it may resolve anywhere


def guessed_profiles(config: Config) -> list[str]:
    """One line per backend whose latency the gateway predicts from a guessed profile (it names none, and its
    ``sim:`` none), where predictions steer routing: the predictive policy or ``gateway.predictor``."""
    from predictor.prior import profile_choice

    g = config.gateway
    if g.policy not in USES_PREDICTOR and g.predictor is None:
        return []
    lines = []
    for i, b in enumerate(config.backends):
        name, why = profile_choice(b.profile_name, b.model)
        if why == "configured":
            continue
        fix = (f"measure the worker with `chimera profile --url {b.url} --model {b.model} --out {b.name}.json`, "
               f"then set `profile: {b.name}.json`")  # fmt: skip
        if why == "model":
            guess = f"no profile: its latency is predicted with {name}, the profile shipped for its model name"
            lines.append(str(config.error(("backends", i), f"{guess}, measured on an H200; {fix}")))
            continue
        quality = (
            ""
            if b.quality is not None
            else "; and no `quality`: how good its answers are is learned from the verdicts posted to /v1/feedback "
            "(without them the policy cannot weigh its speed against its answers: set `quality`, 0..1)"
        )
        lines.append(str(config.error(("backends", i), f"no profile: none is shipped for model {b.model}, so its step "
                                      f"times are learned from its own answers (until then: {name}'s); {fix} to "
                                      f"predict it from the first request" + quality)))  # fmt: skip
    return lines


def _inert(config: Config) -> Iterator[tuple[tuple[str | int, ...], str]]:
    g = config.gateway
    policy = g.policy
    predictive = policy in USES_PREDICTOR
    priority_workers = any(b.scheduling_policy == "priority" for b in config.backends)
    read = OPTIONS_READ.get(policy, frozenset())
    for key in sorted(g.policy_options.model_fields_set - read):
        users = sorted(p for p, opts in OPTIONS_READ.items() if key in opts)
        yield ("gateway", "policy_options", key), f"does nothing with policy {policy} (read by {', '.join(users)})"
    po = g.policy_options
    if predictive and "latency_slack" in po.model_fields_set and po.wrong_answer_s > 0:
        yield (
            ("gateway", "policy_options", "latency_slack"),
            ("does nothing with wrong_answer_s > 0: it belongs to Chimera's slack rule (wrong_answer_s: 0)"),
        )
    if g.engine_priority.model_fields_set and not priority_workers:
        yield ("gateway", "engine_priority"), "does nothing: no backend has scheduling_policy: priority"
    elif g.engine_priority.tokens_per_level is not None and not predictive:
        yield (
            ("gateway", "engine_priority", "tokens_per_level"),
            (f"does nothing with policy {policy}: the predicted tokens left come from the predictive policy"),
        )
    if g.admission is not None and "degrade_max_tokens" in g.admission.model_fields_set:
        if not any(a.on_overload == "degrade" for a in config.agents):
            yield ("gateway", "admission", "degrade_max_tokens"), "does nothing: no agent has on_overload: degrade"
    if g.admission is not None and not g.admission.adaptive:
        for key in sorted({"target_kv_usage", "ttft_tolerance"} & g.admission.model_fields_set):
            yield ("gateway", "admission", key), "does nothing without adaptive: true"
    pc = g.predictor
    if pc is not None and pc.save is not None and pc.refit_interval_s == 0:
        yield ("gateway", "predictor", "save"), "does nothing with refit_interval_s: 0 (no online refit to save)"
    for i, a in enumerate(config.agents):
        if g.admission is None and "on_overload" in a.model_fields_set:
            yield (
                ("agents", i, "on_overload"),
                (
                    f"{a.on_overload} does nothing without gateway.admission (add `admission: {{}}` under gateway: "
                    "to queue, reject or degrade when workers are full)"
                ),
            )
        if a.min_quality is not None and not predictive:
            yield ("agents", i, "min_quality"), f"does nothing with policy {policy}: only predictive predicts quality"
        if "priority" in a.model_fields_set and g.admission is None and not priority_workers:
            yield (
                ("agents", i, "priority"),
                ("does nothing without gateway.admission or a backend with scheduling_policy: priority"),
            )

"""The configuration reference (docs/configuration.md), generated from the pydantic models.

    python -m router.reference > docs/configuration.md

Every key, its type and bounds, its default and what it does come from ``router.core.config``
(the field docstrings), and the policy names from the registry (``router.policies``), so the page
cannot drift from the code: ``tests/test_reference.py`` fails when it does.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Iterator
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt, MinLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from router.core import config as c
from router.core.stateurl import STATE_KEYS, RedisOptions
from router.policies import available

#: The sections in the order a config file has them: (heading, YAML path, model).
SECTIONS: tuple[tuple[str, str, type[BaseModel]], ...] = (
    ("Top level", "", c.Config),
    ("gateway", "gateway", c.GatewayConfig),
    ("gateway.policy_options", "gateway.policy_options", c.PolicyOptions),
    ("gateway.timeouts", "gateway.timeouts", c.Timeouts),
    ("gateway.health", "gateway.health", c.HealthConfig),
    ("gateway.predictor", "gateway.predictor", c.PredictorConfig),
    ("gateway.admission", "gateway.admission", c.AdmissionConfig),
    ("gateway.engine_priority", "gateway.engine_priority", c.EnginePriorityConfig),
    ("backends[]", "backends[]", c.BackendConfig),
    ("backends[].sim", "backends[].sim", c.SimSpec),
    ("backends[].launch", "backends[].launch", c.LaunchSpec),
    ("agents[]", "agents[]", c.AgentConfig),
    ("agents[].sla", "agents[].sla", c.SLA),
)

INTRO = """\
# Configuration reference

Generated from the pydantic models (`router/core/config.py`) by `python -m router.reference`; a test fails
when this page and the models disagree. A config is one YAML file with three sections, `gateway`,
`backends` and `agents`; `chimera check FILE` validates it and prints the fleet it describes.

- Unknown keys, wrong types, duplicate names and an agent naming no served model are refused at load,
  as one line `file:line: key: message` (exit 2).
- `${VAR}` is read from the environment (`${VAR:-default}` where unset; `$${VAR}` is the text `${VAR}`),
  so secrets such as API keys never need to be in the file.
- An option that does nothing where it stands (`on_overload` without `gateway.admission`, a
  `policy_options` key the chosen policy does not read, ...) gets a warning from `chimera check` and at
  start-up.
"""


def render() -> str:
    out = [INTRO]
    for heading, path, model in SECTIONS:
        out.append(f"## `{heading}`\n" if path else f"## {heading}\n")
        doc = _first_paragraph(model.__doc__) if model is not c.Config else ""
        if doc:
            out.append(doc + "\n")
        out.append("| key | type | default | what it does |")
        out.append("| --- | --- | --- | --- |")
        out.extend(_rows(model))
        out.append("")
        if model is c.GatewayConfig:
            out += [STATE_URL, "| key | type | default | what it does |", "| --- | --- | --- | --- |"]
            out.extend(_state_rows())
            out.append("")
    return "\n".join(out)


STATE_URL = """\
## `gateway.state` URL keys

A Redis state URL (`redis://`, `rediss://`, `unix://`, `redis+sentinel://`, `rediss+sentinel://`) takes these
query keys of the gateway's own, e.g. `redis://redis:6379/0?prefix=prod&lease_ttl_s=5`. Every other query key goes
to redis-py's connection as it reads it (`socket_timeout`, `socket_connect_timeout`, `health_check_interval`,
`ssl_cert_reqs`, `ssl_ca_certs`, ...); a key neither knows is refused at load.
"""


def _state_rows() -> Iterator[str]:
    defaults = {f.name: f.default for f in dataclasses.fields(RedisOptions)}
    for key, (field, kind, text) in STATE_KEYS.items():
        default = defaults[field]
        shown = "none" if default is None else f"`{default}`"
        if key == "replica":
            shown = "host-pid-random"
        yield f"| `{key}` | {'number (> 0)' if kind is float else 'string'} | {shown} | {_cell(text)} |"


def _rows(model: type[BaseModel]) -> Iterator[str]:
    for name, info in model.model_fields.items():
        text = " ".join((info.description or "").split())
        if model is c.GatewayConfig and name == "policy":
            text += " One of " + ", ".join(f"`{p}`" for p in available()) + "."
        yield f"| `{name}` | {_type(info)} | {_default(info)} | {_cell(text)} |"


def _first_paragraph(doc: str | None) -> str:
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    value = info.default
    if value is None:
        return "none"
    if isinstance(value, BaseModel):
        return "see below"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple):
        return "`[]`" if not value else f"`{list(value)}`"
    return f"`{value}`"


def _type(info: FieldInfo) -> str:
    return _cell(_describe(info.annotation, list(info.metadata)))


def _describe(annotation: Any, metadata: list[Any]) -> str:
    origin = get_origin(annotation)
    if origin is Annotated:
        inner, *more = get_args(annotation)
        return _describe(inner, [*more, *metadata])
    if origin is Union or origin is types.UnionType:
        kinds = [a for a in get_args(annotation) if a is not type(None)]
        text = " or ".join(_describe(a, metadata) for a in kinds)
        return text + " or null" if len(kinds) < len(get_args(annotation)) else text
    if origin is Literal:
        return " \\| ".join(f"`{v}`" for v in get_args(annotation))
    if origin is tuple:
        item = get_args(annotation)[0]
        return f"list of {_describe(item, []).replace('string', 'strings').replace('integer', 'integers')}" + (
            _bounds([m for m in metadata if isinstance(m, MinLen)])
        )
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    names = {str: "string", int: "integer", float: "number", bool: "boolean"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation))) + _bounds(metadata)


def _bounds(metadata: list[Any]) -> str:
    parts = []
    for m in metadata:
        if isinstance(m, Gt):
            parts.append(f"> {m.gt}")
        elif isinstance(m, Ge):
            parts.append(f"≥ {m.ge}")
        elif isinstance(m, Lt):
            parts.append(f"< {m.lt}")
        elif isinstance(m, Le):
            parts.append(f"≤ {m.le}")
        elif isinstance(m, MinLen):
            parts.append(f"at least {m.min_length}")
        else:
            pattern = getattr(m, "pattern", None)
            if pattern:
                parts.append(f"matching `{pattern}`")
    return f" ({', '.join(parts)})" if parts else ""


if __name__ == "__main__":
    print(render(), end="")

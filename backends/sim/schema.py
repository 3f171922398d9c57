"""A JSON value drawn from a JSON schema, as a model under vLLM's guided decoding would write one.

Deterministic: every choice comes from the ``random.Random`` the caller seeds (on the prompt). Required
properties are always present, optional ones half the time; enums, consts, ``anyOf``/``oneOf``/``allOf``,
local ``$ref``s, numeric bounds, string lengths and the common string formats are respected. Strings
are words of the sim's vocabulary, so they read like the sim's other answers.
"""

from __future__ import annotations

import random
from typing import Any

from backends.sim.textgen import VOCAB, VOCAB_SIZE

MAX_DEPTH = 5  # below it: no optional properties, arrays at their least length


def draw_value(schema: object, rng: random.Random) -> Any:
    """A value valid for ``schema`` (a JSON schema as a dict; anything else: any value, here a string)."""
    root = schema if isinstance(schema, dict) else {}
    return _draw(root, rng, root, 0)


def _draw(schema: object, rng: random.Random, root: dict[str, Any], depth: int) -> Any:
    if not isinstance(schema, dict) or depth > 2 * MAX_DEPTH:
        return _words(rng)
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return _draw(_resolve(ref, root), rng, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return rng.choice(enum)
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            solid = [o for o in options if not (isinstance(o, dict) and o.get("type") == "null")]
            return _draw(rng.choice(solid or options), rng, root, depth + 1)
    parts = schema.get("allOf")
    if isinstance(parts, list) and parts:
        return _draw(_merge([schema, *parts]), rng, root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"] or kind
        kind = kinds[0] if kinds else None
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    draw = _KINDS.get(kind) if isinstance(kind, str) else None
    return draw(schema, rng, root, depth) if draw is not None else _words(rng)


def _resolve(ref: str, root: dict[str, Any]) -> object:
    """A local reference (``#/$defs/Name``, ``#/definitions/Name``, ``#``); anything else: no schema."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return {}
    node: object = root
    for part in ref[2:].split("/"):
        if not isinstance(node, dict) or part not in node:
            return {}
        node = node[part]
    return node


def _merge(schemas: list[Any]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    props: dict[str, Any] = {}
    required: list[str] = []
    for s in schemas:
        if not isinstance(s, dict):
            continue
        merged.update({k: v for k, v in s.items() if k not in ("allOf", "properties", "required")})
        props.update(s.get("properties") or {})
        required += [r for r in s.get("required") or [] if r not in required]
    if props:
        merged["properties"], merged["required"] = props, required
    return merged


def _object(schema: dict[str, Any], rng: random.Random, root: dict[str, Any], depth: int) -> dict[str, Any]:
    props = schema.get("properties")
    props = props if isinstance(props, dict) else {}
    required = schema.get("required")
    required = set(required) if isinstance(required, list) else set()
    out: dict[str, Any] = {}
    for name, sub in props.items():
        if name in required or (depth < MAX_DEPTH and rng.random() < 0.5):
            out[name] = _draw(sub, rng, root, depth + 1)
    for name in sorted(required - out.keys()):  # required but not described
        out[name] = _words(rng)
    return out


def _array(schema: dict[str, Any], rng: random.Random, root: dict[str, Any], depth: int) -> list[Any]:
    lo = _int(schema.get("minItems"), 1)
    hi = max(lo, _int(schema.get("maxItems"), lo + 2))
    n = lo if depth >= MAX_DEPTH else rng.randint(lo, hi)
    prefix = schema.get("prefixItems")
    prefix = prefix if isinstance(prefix, list) else []
    items = schema.get("items")
    return [_draw(prefix[i] if i < len(prefix) else items, rng, root, depth + 1) for i in range(n)]


def _string(schema: dict[str, Any], rng: random.Random, root: dict[str, Any], depth: int) -> str:
    fmt = schema.get("format")
    k = rng.randrange(VOCAB_SIZE)
    if fmt == "date":
        text = f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    elif fmt == "date-time":
        text = f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:00:00Z"
    elif fmt == "email":
        text = f"tok{k}@example.com"
    elif fmt in ("uri", "url"):
        text = f"https://example.com/tok{k}"
    elif fmt == "uuid":
        text = f"{rng.getrandbits(32):08x}-0000-4000-8000-{rng.getrandbits(48):012x}"
    else:
        text = _words(rng)
    lo, hi = _int(schema.get("minLength"), 0), schema.get("maxLength")
    if len(text) < lo:
        text += "x" * (lo - len(text))
    if isinstance(hi, int) and not isinstance(hi, bool) and len(text) > hi >= lo:
        text = text[:hi]
    return text


def _number(schema: dict[str, Any], rng: random.Random, root: dict[str, Any], depth: int) -> int | float:
    integer = schema.get("type") == "integer" or (isinstance(schema.get("type"), list) and "integer" in schema["type"])
    lo, hi = _bound(schema, "minimum", "exclusiveMinimum", 1), _bound(schema, "maximum", "exclusiveMaximum", -1)
    lo = 0 if lo is None else lo
    hi = lo + 100 if hi is None or hi < lo else hi
    if integer:
        return rng.randint(int(-(-lo // 1)), max(int(-(-lo // 1)), int(hi // 1)))
    return round(rng.uniform(lo, hi), 2) if hi - lo > 0.01 else lo


def _bound(schema: dict[str, Any], inclusive: str, exclusive: str, step: int) -> float | None:
    value, strict = schema.get(inclusive), schema.get(exclusive)
    if isinstance(strict, int | float) and not isinstance(strict, bool):
        return strict + step
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _boolean(schema: dict[str, Any], rng: random.Random, root: dict[str, Any], depth: int) -> bool:
    return rng.random() < 0.5


def _null(schema: dict[str, Any], rng: random.Random, root: dict[str, Any], depth: int) -> None:
    return None


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def _words(rng: random.Random) -> str:
    return " ".join(VOCAB[rng.randrange(VOCAB_SIZE)] for _ in range(rng.randint(1, 3)))


_KINDS = {
    "object": _object,
    "array": _array,
    "string": _string,
    "integer": _number,
    "number": _number,
    "boolean": _boolean,
    "null": _null,
}

"""Reading a YAML config: ``${VAR}`` substitution, duplicate keys refused, and the line of every key.

:mod:`router.core.config` validates what this reads; the line index lets any later check name the
``file:line`` of the key it is about (:meth:`router.core.config.Config.error`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

import yaml

from router.core.errors import ConfigError

Loc = tuple[str | int, ...]


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error (PyYAML keeps the last
    one, so `port: 8080` further up would silently lose to a later `port: 9090`)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: the base class reports it
                break
            if duplicate:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_ENV_RE = re.compile(r"(\$?)\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")  # $${VAR}: a literal ${VAR}
_PLACEHOLDER = "__chimera_env_{}__"
_PLACEHOLDER_RE = re.compile(r"__chimera_env_(\d+)__")


def read_yaml(text: str, *, file: str, env: Mapping[str, str]) -> tuple[Any, dict[Loc, int]]:
    """The document with ``${VAR}`` substituted, and the line of every key path. Raises ConfigError."""
    # ${VAR} is replaced by a YAML-safe placeholder before parsing (so `[${KEY}]` works in flow
    # style and a value with YAML syntax in it cannot change the document's shape), then the
    # placeholders inside string scalars are replaced by the values.
    values: list[str] = []

    def _sub(m: re.Match[str]) -> str:
        if m.group(1):  # $${VAR} stands for the text ${VAR}
            return m.group(0)[1:]
        if _in_comment(text, m.start()):  # `# admin_key: ${ADMIN_KEY}` needs no ADMIN_KEY
            return m.group(0)
        var, default = m.group(2), m.group(3)
        if var in env:
            values.append(env[var])
        elif default is not None:
            values.append(default)
        else:
            line = text.count("\n", 0, m.start()) + 1
            raise ConfigError(f"environment variable {var} is not set", file=file, line=line, key=f"${{{var}}}")
        return _PLACEHOLDER.format(len(values) - 1)

    masked = _ENV_RE.sub(_sub, text)
    try:
        node = yaml.compose(masked, Loader=yaml.SafeLoader)
        data = yaml.load(masked, Loader=_UniqueKeyLoader)  # a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"invalid YAML: {problem}", file=file, line=line) from exc
    if not isinstance(data, dict):
        raise ConfigError("the config must be a mapping with gateway, backends and agents", file=file, line=1)
    lines = dict(line_index(node)) if node is not None else {}
    return _unmask(data, values), lines


def _in_comment(text: str, pos: int) -> bool:
    """Whether ``pos`` is inside a YAML comment: after a ``#`` that starts its line or follows a blank,
    outside a quoted scalar (a good approximation of YAML's rule, for one line)."""
    quote = ""
    prev = " "
    for ch in text[text.rfind("\n", 0, pos) + 1 : pos]:
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"" and prev in " \t[{,:":  # a quoted scalar opens there (not the ' of "it's")
            quote = ch
        elif ch == "#" and prev in " \t":
            return True
        prev = ch
    return False


def _unmask(obj: Any, values: list[str]) -> Any:
    if isinstance(obj, str):
        return _PLACEHOLDER_RE.sub(lambda m: values[int(m.group(1))], obj)
    if isinstance(obj, list):
        return [_unmask(v, values) for v in obj]
    if isinstance(obj, dict):
        return {k: _unmask(v, values) for k, v in obj.items()}
    return obj


def line_index(node: yaml.Node, path: tuple[str | int, ...] = ()) -> Iterator[tuple[tuple[str | int, ...], int]]:
    yield path, node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = k.value
            yield (*path, key), k.start_mark.line + 1
            for sub, line in line_index(v, (*path, key)):
                if sub != (*path, key):
                    yield sub, line
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            yield from line_index(v, (*path, i))


def nearest_line(lines: Mapping[Loc, int], loc: tuple[Any, ...]) -> int | None:
    for n in range(len(loc), -1, -1):
        if loc[:n] in lines:
            return lines[loc[:n]]
    return None


def dotted(loc: tuple[Any, ...], data: Any) -> str:
    """`agents[1].models[0]` → `agents[planner].models[0]` where a list item has a name."""
    out = ""
    node = data
    for part in loc:
        if isinstance(part, int):
            name = (
                node[part].get("name")
                if isinstance(node, list) and part < len(node) and isinstance(node[part], dict)
                else None
            )
            out += f"[{name}]" if isinstance(name, str) else f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            node = None
    return out

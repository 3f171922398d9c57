"""`chimera top`: a live terminal view of a running gateway, read from its ``/fleet`` and ``/metrics``.

Every ``interval`` seconds it reads both and redraws:

- a title line: the gateway's URL, its policy, its fleet state (``memory``, ``redis`` or ``degraded``) and, with
  Redis, how many replicas share it;
- per worker: its model and health, what it reports running and waiting and its KV use (scraped from the worker),
  the reservations the gateway holds on it (requests and tokens in flight: every replica's, with Redis), the
  predicted TTFT and e2e of ``/fleet``'s reference request, and the answers it served per second;
- per agent: requests per second, the share of its answered requests that met its SLA, and its 429s per second.

Rates are taken over the readings of the last ``WINDOW_S`` seconds (the first frame has none yet: "-"). Under
``chimera serve --workers N`` every process's counters are summed by ``/metrics``, so the view is the gateway's.
Where ``gateway.admin_key`` is set, the key is read from ``$CHIMERA_ADMIN_KEY``.

A tool outside serving: ``rich`` comes with the ``[top]`` extra (and ``[bench]``), imported when the view draws.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from router.core.errors import ChimeraError

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

DEFAULT_URL = "http://127.0.0.1:8080"  # the quickstart's gateway
ADMIN_KEY_ENV = "CHIMERA_ADMIN_KEY"
WINDOW_S = 10.0  # rates are taken over the readings this far back
TOP_EXTRA = "pip install 'chimera-router[top]'"
NONE = "none"  # the metrics' label of a request that never got an agent or a worker


class GatewayUnreachable(ChimeraError):
    """No gateway answers at the URL, or it refuses this reader. ``str()`` is one line."""


@dataclass(frozen=True, slots=True)
class Reading:
    """One read of the gateway: ``/fleet`` as it answered, and the counters ``chimera top`` shows as rates."""

    at: float  # time.monotonic() of the read
    fleet: dict[str, Any]
    requests: dict[tuple[str, str, str], float] = field(default_factory=dict)  # (agent, backend, status) -> count
    sla_met: dict[str, float] = field(default_factory=dict)  # agent -> answers within every SLA objective


def parse_metrics(text: str) -> tuple[dict[tuple[str, str, str], float], dict[str, float]]:
    """``chimera_requests_total`` by (agent, backend, status) and ``chimera_sla_met_total`` by agent."""
    requests: dict[tuple[str, str, str], float] = {}
    met: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in ("chimera_requests", "chimera_sla_met"):
            continue
        for s in family.samples:
            if s.name == "chimera_requests_total":
                key = (s.labels.get("agent", NONE), s.labels.get("backend", NONE), s.labels.get("status", ""))
                requests[key] = s.value
            elif s.name == "chimera_sla_met_total":
                met[s.labels.get("agent", NONE)] = s.value
    return requests, met


def read(client: httpx.Client, url: str) -> Reading:
    """Read the gateway at ``url`` once. Raises GatewayUnreachable with one line saying why."""
    try:
        fleet = client.get(url + "/fleet")
        metrics = client.get(url + "/metrics") if fleet.status_code == 200 else fleet
    except httpx.HTTPError as exc:
        raise GatewayUnreachable(f"no gateway answers at {url} ({_why(exc)})") from None
    for r in (fleet, metrics):
        if r.status_code in (401, 403):
            key = (
                "the admin key in $" + ADMIN_KEY_ENV + " was refused"
                if os.environ.get(ADMIN_KEY_ENV)
                else ("set $" + ADMIN_KEY_ENV + " to the gateway's admin_key")
            )
            raise GatewayUnreachable(f"{url}{r.url.path} answered {r.status_code}: {key}")
        if r.status_code != 200:
            raise GatewayUnreachable(f"{url}{r.url.path} answered {r.status_code}: is it a chimera gateway?")
    try:
        body = fleet.json()
        requests, met = parse_metrics(metrics.text)
    except ValueError:
        raise GatewayUnreachable(
            f"{url} does not answer as a chimera gateway (/fleet or /metrics unreadable)"
        ) from None
    if not isinstance(body, dict) or not isinstance(body.get("backends"), list):
        raise GatewayUnreachable(f"{url}/fleet has no backends: is it a chimera gateway?")
    return Reading(time.monotonic(), body, requests, met)


def _why(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.ConnectError):
        return "connection refused" if "refused" in str(exc).lower() else f"cannot connect: {exc}"
    if isinstance(exc, httpx.TimeoutException):
        return "timed out"
    return str(exc) or type(exc).__name__


class Window:
    """The readings of the last ``span_s`` seconds; rates are the change between the oldest and the newest."""

    def __init__(self, span_s: float = WINDOW_S) -> None:
        self.span_s = span_s
        self.readings: deque[Reading] = deque()

    def add(self, reading: Reading) -> None:
        self.readings.append(reading)
        while len(self.readings) > 2 and reading.at - self.readings[0].at > self.span_s:
            self.readings.popleft()

    @property
    def latest(self) -> Reading:
        return self.readings[-1]

    def deltas(self) -> tuple[float, dict[tuple[str, str, str], float], dict[str, float]] | None:
        """(seconds, request counts, SLA-met counts) added between the oldest reading and the newest; None with
        fewer than two readings. A counter that went down (a restarted gateway) counts from zero."""
        if len(self.readings) < 2:
            return None
        old, new = self.readings[0], self.readings[-1]
        return (
            new.at - old.at,
            {k: _grown(v, old.requests.get(k, 0.0)) for k, v in new.requests.items()},
            {k: _grown(v, old.sla_met.get(k, 0.0)) for k, v in new.sla_met.items()},
        )


def _grown(new: float, old: float) -> float:
    return new - old if new >= old else new


@dataclass(slots=True)
class AgentRow:
    name: str
    rps: float | None = None
    sla: float | None = None  # share of answered requests that met the SLA, over the window
    rejected_ps: float | None = None
    total: float = 0.0  # requests since the gateway started


def agent_rows(window: Window) -> list[AgentRow]:
    """Per agent (every agent the gateway has counted a request of): rates over the window and its total."""
    latest = window.latest
    rows: dict[str, AgentRow] = {}
    for (agent, _backend, _status), n in latest.requests.items():
        if agent != NONE:
            rows.setdefault(agent, AgentRow(agent)).total += n
    d = window.deltas()
    if d is not None:
        span, requests, met = d
        for row in rows.values():
            mine = [(status, n) for (agent, _b, status), n in requests.items() if agent == row.name]
            row.rps = sum(n for _, n in mine) / span if span > 0 else 0.0
            row.rejected_ps = sum(n for s, n in mine if s == "429") / span if span > 0 else 0.0
            answered = sum(n for s, n in mine if s == "200" or s.startswith("5") or s == "499")
            row.sla = met.get(row.name, 0.0) / answered if answered else None
    return sorted(rows.values(), key=lambda r: r.name)


def served_rates(window: Window) -> dict[str, float]:
    """Requests per second answered 200 by each worker over the window (empty with one reading)."""
    d = window.deltas()
    if d is None or d[0] <= 0:
        return {}
    span, requests, _ = d
    out: dict[str, float] = {}
    for (_agent, backend, status), n in requests.items():
        if status == "200":
            out[backend] = out.get(backend, 0.0) + n / span
    return out


def _num(value: Any, fmt: str = "{:.0f}", none: str = "-") -> str:
    return none if value is None else fmt.format(value)


def _tokens(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value / 1e3:.1f}k" if value >= 1e4 else f"{value:.0f}"


def frame(url: str, window: Window, problem: str | None = None) -> RenderableType:
    """The view of the latest reading (and ``problem``: why the last read failed, shown in red)."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    fleet = window.latest.fleet
    title = Text.assemble(
        ("chimera ", "bold"), url, "  policy ", (str(fleet.get("policy", "?")), "bold"),
        "  state ", (str(fleet.get("state", "?")), "bold red" if fleet.get("state") == "degraded" else "bold"),
    )  # fmt: skip
    if replicas := fleet.get("replicas"):
        title.append(f"  replicas {len(replicas)}")
    ref = fleet.get("predicted_for") or {}
    if ref:
        title.append(f"\npredicted for {_num(ref.get('prompt_tokens'))} prompt + {_num(ref.get('output_tokens'))}"
                     f" output tokens, by the {ref.get('by', '?')}; rates over the last {window.span_s:g} s",
                     style="dim")  # fmt: skip
    if problem:
        title.append(f"\n{problem}", style="bold red")

    served = served_rates(window)
    def table(title: str) -> Table:
        return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)

    workers = table("workers")
    for col in ("worker", "model", "health", "run/wait", "KV", "held", "TTFT", "e2e", "req/s"):
        workers.add_column(col, justify="left" if col in ("worker", "model", "health") else "right", no_wrap=True)
    for b in fleet.get("backends", []):
        name = str(b.get("name"))
        workers.add_row(
            name, str(b.get("model")), Text("up", "green") if b.get("healthy") else Text("down", "bold red"),
            f"{_num(b.get('running'))}/{_num(b.get('waiting'))}", _num(b.get("kv_usage"), "{:.0%}"),
            f"{_num(b.get('inflight_requests'))}/{_tokens(b.get('inflight_tokens'))}",
            _num(b.get("predicted_ttft_ms")), _num(b.get("predicted_e2e_ms")),
            _num(served.get(name, 0.0) if served else None, "{:.1f}"),
        )  # fmt: skip
    workers.caption = (
        "run/wait: the worker's own count; KV: its cache in use; held: the requests/tokens the gateway "
        "reserves on it; TTFT, e2e: predicted, ms"
    )
    workers.caption_justify = "left"

    agents = table("agents")
    for col in ("agent", "req/s", "SLA met", "429/s", "requests"):
        agents.add_column(col, justify="left" if col == "agent" else "right")
    rows = agent_rows(window)
    for a in rows:
        sla = Text(_num(a.sla, "{:.1%}"), "red" if a.sla is not None and a.sla < 0.9 else "")
        rejected = Text(_num(a.rejected_ps, "{:.1f}"), "red" if a.rejected_ps else "")
        agents.add_row(a.name, _num(a.rps, "{:.1f}"), sla, rejected, _num(a.total))
    parts: list[RenderableType] = [title, workers, agents]
    if not rows:
        parts.append(Text("no requests yet", style="dim"))
    return Group(*parts)


def run(
    url: str = DEFAULT_URL,
    interval_s: float = 1.0,
    frames: int | None = None,
    console: Console | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Show the gateway at ``url`` until interrupted (or for ``frames`` frames, printed one below the other, for a
    script or a log). GatewayUnreachable when the first read fails; a later failure is shown on the view, which
    keeps trying."""
    from rich.console import Console
    from rich.live import Live

    url = url.rstrip("/")
    key = os.environ.get(ADMIN_KEY_ENV)
    headers = {"authorization": f"Bearer {key}"} if key else {}
    console = console or Console()
    window = Window(max(WINDOW_S, 2 * interval_s))
    with httpx.Client(headers=headers, timeout=max(2.0, interval_s)) as client:
        window.add(read(client, url))
        if frames is not None:
            for n in range(frames):
                if n:
                    sleep(interval_s)
                    window.add(read(client, url))
                console.print(frame(url, window))
            return 0
        with Live(frame(url, window), console=console, auto_refresh=False, screen=console.is_terminal) as live:
            for problem in _follow(client, url, window, interval_s, sleep):
                live.update(frame(url, window, problem), refresh=True)
    return 0


def _follow(
    client: httpx.Client, url: str, window: Window, interval_s: float, sleep: Callable[[float], None]
) -> Iterable[str | None]:
    """Read every ``interval_s`` for ever; yield after each read what went wrong with it (None: nothing)."""
    while True:
        sleep(interval_s)
        try:
            window.add(read(client, url))
            yield None
        except GatewayUnreachable as exc:
            yield f"{exc}; retrying every {interval_s:g} s"

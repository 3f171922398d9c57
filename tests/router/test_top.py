"""`chimera top` against a real gateway on loopback: simulated workers under load from the openai SDK, the view
rendered by rich to a string; the one-line errors of the command itself."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator

import openai
import pytest
from rich.console import Console

from backends.listen import free_port
from router import top
from tests.conftest import ServerThread, make_config

Start = Callable[..., ServerThread]


def rows(text: str, names: tuple[str, ...]) -> dict[str, list[str]]:
    """The cells of each table row that starts with one of ``names`` (the last frame's, where several)."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        cells = line.split()
        if cells and cells[0] in names:
            out[cells[0]] = cells
    return out


@pytest.fixture
def loaded(sim_server: Start, gateway_server: Start) -> Iterator[ServerThread]:
    """A gateway over two simulated workers, with three agents' requests kept flowing until the test ends."""
    small = sim_server(model="qwen2.5-0.5b", profile="h200-qwen2.5-0.5b", speedup=10.0)
    big = sim_server(model="qwen2.5-7b", profile="h200-qwen2.5-7b", speedup=10.0)
    models = ["qwen2.5-0.5b", "qwen2.5-7b"]
    cfg = make_config(
        [{"name": "small", "url": small.url, "model": models[0]}, {"name": "big", "url": big.url, "model": models[1]}],
        agents=[{"name": "planner", "models": models, "sla": {"e2e_ms": 60000}},
                {"name": "coder", "models": models, "sla": {"e2e_ms": 1}},  # an SLA nobody meets
                {"name": "tester", "models": models, "rpm": 1}],
        policy="least_outstanding",
    )  # fmt: skip
    gw = gateway_server(cfg, probe=True)  # (the workers' own running / waiting and KV use are scraped)
    stop = threading.Event()

    def agent(name: str) -> None:
        with openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0,
                           default_headers={"x-agent": name}) as client:  # fmt: skip
            while not stop.is_set():
                try:
                    client.chat.completions.create(
                        model="auto",
                        messages=[{"role": "user", "content": "hi"}],
                        max_tokens=32,
                        extra_body={"sim": {"output_tokens": 32}},
                    )
                except openai.RateLimitError:
                    stop.wait(0.05)

    threads = [threading.Thread(target=agent, args=(n,)) for n in ("planner", "planner", "coder", "tester")]
    for t in threads:
        t.start()
    yield gw
    stop.set()
    for t in threads:
        t.join(timeout=10)


def test_the_view_shows_workers_and_agents_moving(loaded: ServerThread) -> None:
    out = io.StringIO()
    console = Console(file=out, width=120, color_system=None)
    assert top.run(loaded.url, interval_s=0.4, frames=4, console=console) == 0
    text = out.getvalue()
    assert text.count("policy least_outstanding  state memory") == 4
    last = text[text.rindex("chimera http") :]
    workers = rows(last, ("small", "big"))
    for name, model in (("small", "qwen2.5-0.5b"), ("big", "qwen2.5-7b")):
        cells = workers[name]  # worker model health run/wait KV held TTFT e2e req/s
        assert cells[1:3] == [model, "up"]
        assert re.fullmatch(r"\d+/\d+", cells[3]) and re.fullmatch(r"\d+/\d+(\.\dk)?", cells[5])
        assert float(cells[6]) > 0 and float(cells[7]) > float(cells[6])  # predicted TTFT, e2e
        assert float(cells[8]) > 0, f"{name} served nothing in the window:\n{last}"
    agents = rows(last, ("planner", "coder", "tester"))
    planner, coder, tester = agents["planner"], agents["coder"], agents["tester"]
    assert float(planner[1]) > 0 and planner[2] == "100.0%" and planner[3] == "0.0"  # req/s, SLA met, 429/s
    assert coder[2] == "0.0%"  # every answer missed its SLA
    assert float(tester[3]) > 0  # its rate limit answers 429s
    assert int(planner[4]) > 0


def test_a_gateway_behind_an_admin_key(
    sim_server: Start, gateway_server: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = sim_server(model="m")
    gw = gateway_server(make_config([{"name": "w", "url": worker.url, "model": "m"}], admin_key="s3cret"))
    monkeypatch.delenv(top.ADMIN_KEY_ENV, raising=False)
    with pytest.raises(top.GatewayUnreachable, match=r"/fleet answered 401: set \$CHIMERA_ADMIN_KEY"):
        top.run(gw.url, frames=1, console=Console(file=io.StringIO()))
    monkeypatch.setenv(top.ADMIN_KEY_ENV, "wrong")
    with pytest.raises(top.GatewayUnreachable, match=r"the admin key in \$CHIMERA_ADMIN_KEY was refused"):
        top.run(gw.url, frames=1, console=Console(file=io.StringIO()))
    monkeypatch.setenv(top.ADMIN_KEY_ENV, "s3cret")
    out = io.StringIO()
    assert top.run(gw.url, frames=1, console=Console(file=out, width=120)) == 0
    assert "no requests yet" in out.getvalue() and rows(out.getvalue(), ("w",))["w"][1:3] == ["m", "up"]


def test_no_gateway_is_one_line_and_exit_1(sim_server: Start) -> None:
    port = free_port()
    worker = sim_server(model="m")  # answers HTTP, but is no gateway
    for url, said in ((f"http://127.0.0.1:{port}", f"no gateway answers at http://127.0.0.1:{port} "
                                                   "(connection refused)"),
                      (worker.url, f"{worker.url}/fleet answered 404: is it a chimera gateway?")):  # fmt: skip
        proc = subprocess.run([sys.executable, "-m", "router.cli", "top", "--url", url, "--frames", "1"],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert proc.returncode == 1 and proc.stdout == ""
        assert proc.stderr == f"chimera: error: {said}\n"
    bad = subprocess.run([sys.executable, "-m", "router.cli", "top", "--interval", "0"], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "--interval: must be above 0" in bad.stderr and bad.stderr.count("\n") == 1


def test_rates_come_from_the_window_and_survive_a_restarted_gateway() -> None:
    fleet = {"backends": []}
    w = top.Window(span_s=10.0)
    w.add(top.Reading(0.0, fleet, {("a", "w", "200"): 100.0, ("a", "w", "429"): 5.0}, {"a": 90.0}))
    assert top.agent_rows(w)[0].rps is None and top.agent_rows(w)[0].total == 105.0  # one reading: totals only
    w.add(top.Reading(5.0, fleet, {("a", "w", "200"): 120.0, ("a", "w", "429"): 10.0}, {"a": 100.0}))
    (a,) = top.agent_rows(w)
    assert (a.rps, a.rejected_ps, a.sla) == (5.0, 1.0, 0.5)
    assert top.served_rates(w) == {"w": 4.0}
    w.add(top.Reading(12.0, fleet, {("a", "w", "200"): 7.0}, {"a": 7.0}))  # restarted: counters from zero
    assert [r.at for r in w.readings] == [5.0, 12.0]  # the reading 12 s back has left the window
    (a,) = top.agent_rows(w)
    assert a.rps == pytest.approx(1.0) and a.sla == 1.0 and a.rejected_ps == 0.0

"""The gateway's small parts on their own: agent resolution, SSE observation, metrics, request log."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest

from router.app import YOUNG_GC_THRESHOLD, serving_gc
from router.auth import AgentResolver
from router.core.errors import Unauthorized
from router.core.types import BackendView, FleetSnapshot
from router.metrics import Metrics
from router.requestlog import RequestLog, RequestRecord
from router.sse import EventTooLarge, SSECutter
from tests.conftest import make_config

BACKENDS = [{"name": "w", "url": "http://127.0.0.1:9001", "model": "m"}]


def test_keys_pick_the_agent_and_x_agent_is_ignored() -> None:
    cfg = make_config(BACKENDS, agents=[{"name": "a", "api_keys": ["ka"], "models": ["m"]},
                                        {"name": "b", "api_keys": ["kb", "kb2"], "models": ["m"]}])  # fmt: skip
    r = AgentResolver(cfg)
    assert r.resolve({"authorization": "Bearer kb2", "x-agent": "a"}).name == "b"
    assert r.resolve({"authorization": "bearer ka"}).name == "a"
    for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": "Basic ka"}, {"x-agent": "a"}):
        with pytest.raises(Unauthorized):
            r.resolve(headers)


def test_without_keys_x_agent_then_default_agent() -> None:
    agents = [{"name": "a", "models": ["m"]}, {"name": "b", "models": ["m"]}]
    r = AgentResolver(make_config(BACKENDS, agents=agents, default_agent="b"))
    assert r.resolve({"x-agent": "a", "authorization": "Bearer anything"}).name == "a"
    assert r.resolve({}).name == "b"
    with pytest.raises(Unauthorized):
        r.resolve({"x-agent": "zz"})
    with pytest.raises(Unauthorized):  # no header, no default
        AgentResolver(make_config(BACKENDS, agents=agents)).resolve({})


def _event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def test_sse_cutter_forwards_whole_events_and_finds_usage() -> None:
    stream = (_event({"choices": [{"delta": {"role": "assistant"}}], "usage": None})
              + _event({"choices": [{"delta": {"content": "metadata: x\\n\\ndata: y"}}]})
              + _event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
              + b"data: [DONE]\n\n")  # fmt: skip
    c = SSECutter()
    out = b""
    for i in range(0, len(stream), 7):  # worst case: the worker's chunks split events anywhere
        piece = c.feed(stream[i : i + 7])
        assert piece == b"" or piece.endswith(b"\n\n")
        out += piece
    out += c.finish()
    assert out == stream
    assert c.events == 4 and c.done
    assert c.usage == {"prompt_tokens": 3, "completion_tokens": 2}
    assert c.content_events(opening_event=True) == 2


def test_sse_cutter_holds_back_a_partial_event_and_drops_it_at_the_end() -> None:
    c = SSECutter()
    assert c.feed(b'data: {"a": 1}\n\ndata: {"b"') == b'data: {"a": 1}\n\n'
    assert c.finish() == b"" and c.dropped == len(b'data: {"b"') and not c.done
    c = SSECutter()  # an unterminated [DONE] is completed: the answer is whole
    assert c.feed(b'data: {"a": 1}\n\ndata: [DONE]') == b'data: {"a": 1}\n\n'
    assert c.finish() == b"data: [DONE]\n\n" and c.done and c.dropped == 0


def test_metrics_names_labels_and_sla_violations() -> None:
    m = Metrics()
    rec = RequestRecord(request_id="r", endpoint="chat", agent="planner", backend="w", status=200, outcome="ok",
                        ttft_s=0.5, e2e_s=2.0, completion_tokens=11, slo_ttft_ms=100, slo_tpot_ms=1000,
                        slo_e2e_ms=5000, predicted={"ttft_ms": 250.0})  # fmt: skip
    m.observe(rec)
    m.observe(RequestRecord(request_id="r2", endpoint="chat", status=401, outcome="client_error"))
    m.observe(RequestRecord(request_id="r3", endpoint="chat", agent="planner", backend="w", status=200,
                            outcome="worker_error", error="WorkerTimeout"))  # fmt: skip
    m.refresh(FleetSnapshot((BackendView("w", "m", healthy=False, inflight_requests=3),)))
    text = m.render()[0].decode()
    assert 'chimera_requests_total{agent="planner",backend="w",status="200"} 1.0' in text
    assert 'chimera_requests_total{agent="none",backend="none",status="401"} 1.0' in text
    assert 'chimera_requests_total{agent="planner",backend="w",status="504"} 1.0' in text
    assert 'chimera_sla_violations_total{agent="planner",kind="ttft"} 1.0' in text
    assert 'kind="tpot"' not in text and 'kind="e2e"' not in text
    assert 'chimera_ttft_seconds_count{agent="planner",backend="w"} 1.0' in text
    assert 'chimera_e2e_seconds_count{agent="planner",backend="w"} 1.0' in text
    assert 'chimera_prediction_error_ratio_bucket{le="0.5",target="ttft"} 1.0' in text
    assert 'chimera_backend_healthy{backend="w"} 0.0' in text
    assert 'chimera_backend_inflight{backend="w"} 3.0' in text


async def test_request_log_appends_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "requests.jsonl"
    log = RequestLog(str(path))
    await log.start()
    for i in range(3):
        log.write(RequestRecord(request_id=f"r{i}", endpoint="chat", status=200, ttft_s=0.1, e2e_s=0.5,
                                completion_tokens=5))  # fmt: skip
    await log.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [x["request_id"] for x in lines] == ["r0", "r1", "r2"]
    assert lines[0]["tpot_s"] == pytest.approx(0.1)
    assert "started" not in lines[0]


async def test_request_log_off_is_a_no_op() -> None:
    log = RequestLog(None)
    await log.start()
    log.write(RequestRecord(request_id="r", endpoint="chat"))
    await log.close()


def test_metrics_label_children_are_resolved_once_and_count_alike() -> None:
    m = Metrics()
    for _ in range(3):
        m.observe(RequestRecord(request_id="r", endpoint="chat", agent="a", backend="w", status=200, outcome="ok",
                                e2e_s=0.2))  # fmt: skip
    m.worker_failed("w", "WorkerTimeout")
    m.worker_failed("w", "WorkerTimeout")
    text = m.render()[0].decode()
    assert 'chimera_requests_total{agent="a",backend="w",status="200"} 3.0' in text
    assert 'chimera_e2e_seconds_count{agent="a",backend="w"} 3.0' in text
    assert 'chimera_worker_failures_total{backend="w",kind="WorkerTimeout"} 2.0' in text
    assert m._requests("a", "w", "200") is m.requests.labels("a", "w", "200")


async def test_request_log_lines_are_utf8_and_survive_what_orjson_refuses(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    log = RequestLog(str(path))
    await log.start()
    rec = RequestRecord(request_id="r", endpoint="chat", requested_model="modèle", fleet={"running": 1},
                        predicted={"ttft_ms": 12.5}, sketch=[0.5])  # fmt: skip
    log.write(rec)
    log.write(RequestRecord(request_id="big", endpoint="chat", completion_tokens=2**70))  # a worker's odd usage
    log.write_event({"type": "feedback", "request_id": "r", "score": 1.0})
    await log.close()
    raw = path.read_bytes()
    assert "modèle".encode() in raw
    lines = [json.loads(line) for line in raw.decode().splitlines()]
    assert lines[0]["fleet"] == {"running": 1} and lines[0]["predicted"] == {"ttft_ms": 12.5}
    assert lines[1]["completion_tokens"] == 2**70 and lines[2]["type"] == "feedback"


def test_record_to_json_copies_its_containers() -> None:
    rec = RequestRecord(request_id="r", endpoint="chat", fleet={"running": 1}, sketch=[1.0])
    out = rec.to_json()
    assert out["fleet"] == rec.fleet and out["fleet"] is not rec.fleet and out["sketch"] is not rec.sketch
    assert set(out) == {f for f in RequestRecord.__dataclass_fields__ if f not in ("started", "prompt")} | {"tpot_s"}


def test_serving_gc_freezes_and_raises_the_young_threshold_then_restores() -> None:
    before = gc.get_threshold()
    with serving_gc():
        assert gc.get_threshold()[0] == max(before[0], YOUNG_GC_THRESHOLD)
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_sse_cutter_bounds_an_event_and_ends_only_at_a_done_line() -> None:
    events = b"".join(b'data: {"i": %d, "t": "%s"}\r\n\r\n' % (i, b"x" * (i % 37)) for i in range(200))
    events += b"data: [DONE]\n\n"
    for size in (1, 2, 3, 5, 64, 4096):  # any split, boundaries straddling two chunks included
        c = SSECutter()
        out = b"".join(c.feed(events[i : i + size]) for i in range(0, len(events), size)) + c.finish()
        assert out == events and c.done and c.events == 201
    c = SSECutter(max_event=4096)
    c.feed(b"data: " + b"x" * 4000)
    with pytest.raises(EventTooLarge) as too_large:
        c.feed(b"x" * 200)  # no blank line yet: past the bound
    assert too_large.value.limit == 4096
    said = SSECutter()
    said.feed(b'data: {"choices": [{"delta": {"content": "data: [DONE]"}}]}\n\n')
    assert not said.done  # [DONE] in the model's text is no end of the stream
    said.feed(b"data: [DONE]\r\n\r\n")
    assert said.done


def test_sse_cutter_reads_a_responses_stream() -> None:
    """Typed events that end with response.completed (no [DONE]); usage inside its response; deltas as content."""

    def typed(kind: str, data: dict[str, object]) -> bytes:
        return f"event: {kind}\n".encode() + _event({"type": kind, **data})

    stream = (
        typed("response.created", {"response": {"id": "r", "usage": None}})
        + typed("response.output_text.delta", {"delta": "a"})
        + typed("response.output_text.delta", {"delta": "response.completed"})  # text that looks like the end
        + typed("response.completed", {"response": {"usage": {"input_tokens": 5, "output_tokens": 2}}})
    )
    c = SSECutter(responses=True)
    out = c.feed(stream[:-30])
    assert not c.done and c.content_events(opening_event=False) == 2
    out += c.feed(stream[-30:]) + c.finish()
    assert out == stream and c.done
    assert c.usage == {"input_tokens": 5, "output_tokens": 2}
    cut = SSECutter(responses=True)  # a stream that breaks before its last event is not whole
    cut.feed(stream[: stream.index(b"event: response.completed")])
    assert cut.finish() == b"" and not cut.done

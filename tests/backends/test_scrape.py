"""parse_metrics against vLLM's exposition format, the simulator's, older vLLM names and junk."""

from __future__ import annotations

import pytest

from backends.scrape import parse_metrics
from router.core.errors import WorkerProtocolError
from router.state.base import ScrapedMetrics

# Shaped as vLLM's V1 engine exposes it through prometheus_client: counters declared under their
# `_total` name with `_created` companions, histograms, an info gauge, process/python metrics, and
# two engines (data parallel) as separate label sets.
VLLM_V1 = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12345.0
# HELP process_resident_memory_bytes Resident memory size in bytes.
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 1.2e+09
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen2.5-1.5B-Instruct"} 3.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen2.5-1.5B-Instruct"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen2.5-1.5B-Instruct"} 4.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen2.5-1.5B-Instruct"} 0.0
# HELP vllm:num_requests_waiting_by_reason Number of requests waiting, by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="Qwen/Qwen2.5-1.5B-Instruct",reason="capacity"} 4.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen2.5-1.5B-Instruct"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen2.5-1.5B-Instruct"} 0.25
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",enable_prefix_caching="True",engine="0",num_gpu_blocks="4681"} 1.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="Qwen/Qwen2.5-1.5B-Instruct"} 7.0
vllm:num_preemptions_total{engine="1",model_name="Qwen/Qwen2.5-1.5B-Instruct"} 1.0
# HELP vllm:num_preemptions_created Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_created gauge
vllm:num_preemptions_created{engine="0",model_name="Qwen/Qwen2.5-1.5B-Instruct"} 1.7643e+09
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen2.5-1.5B-Instruct"} 20480.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen2.5-1.5B-Instruct"} 8192.0
# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="Qwen/Qwen2.5-1.5B-Instruct"} 3.0
vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen2.5-1.5B-Instruct"} 90.0
vllm:iteration_tokens_total_count{engine="0",model_name="Qwen/Qwen2.5-1.5B-Instruct"} 90.0
vllm:iteration_tokens_total_sum{engine="0",model_name="Qwen/Qwen2.5-1.5B-Instruct"} 20480.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="Qwen/Qwen2.5-1.5B-Instruct"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen2.5-1.5B-Instruct"} 12.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="Qwen/Qwen2.5-1.5B-Instruct"} 12.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="Qwen/Qwen2.5-1.5B-Instruct"} 1.5
"""


def test_vllm_v1_format() -> None:
    m = parse_metrics(VLLM_V1)
    assert m == ScrapedMetrics(
        running=5,
        waiting=4,
        kv_usage=0.375,  # a fraction per engine: averaged, not summed
        preemptions_total=8.0,
        prefix_cache_queries_total=20480.0,
        prefix_cache_hits_total=8192.0,
        engine="vllm",
    )


def test_older_vllm_names() -> None:
    # vLLM's V0 engine: KV use as gpu_cache_usage_perc; no prefix-cache counters.
    text = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 0.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.125
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{model_name="m"} 2.0
"""
    m = parse_metrics(text)
    assert (m.running, m.waiting, m.kv_usage, m.preemptions_total) == (1, 0, 0.125, 2.0)
    assert m.prefix_cache_queries_total is None and m.prefix_cache_hits_total is None


def test_new_kv_name_wins_over_legacy() -> None:
    text = "vllm:kv_cache_usage_perc 0.5\nvllm:gpu_cache_usage_perc 0.9\n"
    assert parse_metrics(text).kv_usage == 0.5


def test_counter_typed_without_total_suffix_and_untyped_samples() -> None:
    # `# TYPE X counter` with `X_total` samples makes the parser put them in another family, and
    # untyped lines are each their own family: matching by sample name handles both.
    text = """\
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{model_name="a"} 3
vllm:prefix_cache_hits_total{model_name="b"} 4
vllm:num_requests_running{model_name="a"} 1
vllm:num_requests_running{model_name="b"} 2
vllm:num_preemptions 5
"""
    m = parse_metrics(text)
    assert (m.prefix_cache_hits_total, m.running, m.preemptions_total) == (7.0, 3, 5.0)
    assert m.waiting is None and m.kv_usage is None


def test_label_values_with_escapes() -> None:
    text = 'vllm:num_requests_waiting{model_name="a \\"quoted\\", b\\\\c",engine="0"} 6\n'
    assert parse_metrics(text).waiting == 6


def test_non_finite_and_negative_samples_are_ignored() -> None:
    text = "vllm:kv_cache_usage_perc NaN\nvllm:num_requests_running -1\nvllm:num_requests_waiting 2\n"
    m = parse_metrics(text)
    assert (m.kv_usage, m.running, m.waiting) == (None, None, 2)


def test_kv_usage_is_clamped() -> None:
    assert parse_metrics("vllm:kv_cache_usage_perc 1.0000001\n").kv_usage == 1.0


def test_simulator_exposition() -> None:
    from backends.sim.engine import Engine
    from backends.sim.metrics import exposition, make_registry
    from router.core.profile import available_profiles, load_profile

    engine = Engine(load_profile(available_profiles()[0]), kv_tokens=1600, max_num_seqs=8, max_num_batched_tokens=512)
    m = parse_metrics(exposition(make_registry(engine, "qwen2.5-1.5b")).decode())
    assert (m.running, m.waiting, m.kv_usage) == (0, 0, 0.0)
    assert (m.preemptions_total, m.prefix_cache_queries_total, m.prefix_cache_hits_total) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "garbage here\n",
        "<html><body>Not Found</body></html>",
        "vllm:num_requests_running abc\n",
        'vllm:num_requests_running{model_name="a} 1\n',
        "\x00\x01\x02",
        "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.5\n",  # not a vLLM
    ],
)
def test_junk_raises_worker_protocol_error(text: str) -> None:
    with pytest.raises(WorkerProtocolError):
        parse_metrics(text)

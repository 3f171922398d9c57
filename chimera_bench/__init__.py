"""`chimera bench`: multi-agent workloads replayed through the gateway, policies side by side.

Modules: ``workloads`` (seeded workflows and their hidden ``sim`` fields), ``client`` (the openai
SDK clients and the load loops), ``stats`` (results.json entries), ``report`` (table and plots),
``runner`` (one fresh fleet and gateway per run), ``gateway_proc`` (the gateway process),
``fastworker`` and ``overhead`` (the zero-latency worker and the gateway-overhead workload), ``overload``
(admission control's scenario), ``simfields`` (the proxy that gives real vLLM the bench's answer lengths and
verdicts), ``sweep`` (``--costs``: the predictive policy's wrong-answer cost), ``collect`` (``chimera predictor
collect``: training traffic), ``cli`` (arguments). See docs/benchmarks.md and docs/cli.md.
"""

"""`chimera bench`: multi-agent workloads replayed through the gateway, policies side by side.

Modules: ``workloads`` (seeded workflows and their hidden ``sim`` fields), ``client`` (the openai
SDK clients and the load loops), ``stats`` (results.json entries), ``report`` (table and plots),
``runner`` (one fresh fleet and gateway per run), ``gateway_proc`` (the gateway process),
``fastworker`` and ``overhead`` (the zero-latency worker and the gateway-overhead workload),
``cli`` (arguments). See docs/benchmarks.md.
"""

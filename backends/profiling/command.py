"""`chimera profile`: probe a live worker and fit its profile, or refit saved probes (argparse only at import time).

    chimera profile --url http://127.0.0.1:8000 --model qwen2.5-7b --out my-7b.json
    chimera profile --fit probe.json [probe-boot2.json ...] --model qwen2.5-7b --out my-7b.json

The profile written holds its provenance (date, the server's version and URL, the fit's errors) and, under ``raw``,
the probes themselves: ``--fit my-7b.json`` fits them again.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from router.core.errors import ConfigError, ProfileError

if TYPE_CHECKING:  # the parser is built on every `chimera` call: numpy, scipy and httpx only when it runs
    from backends.profiling.fit import Settings
    from backends.profiling.probe import Grid
    from router.core.profile import Profile

#: ``--quick``: the grid shrunk to about a third of its requests
QUICK: dict[str, Any] = {"ttft_prompts": (32, 128, 512, 2048, 8192), "ttft_reps": 2, "tpot_prompts": (256,),
                         "batches": (1, 8, 32, 256), "tpot_out": 48, "mix_out": 320, "burst": 64}  # fmt: skip


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {text!r}") from None


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--url", help="probe the live worker at this base URL (vLLM, or `chimera sim`)")
    src.add_argument("--fit", nargs="+", metavar="PROBE", help="fit saved probes instead (--probe-out files, or "
                     "profiles this command wrote): one per boot of the server")  # fmt: skip
    p.add_argument("--model", required=True, help="the served model name")
    p.add_argument("--out", help="the profile to write (default: <model>.json)")
    p.add_argument("--name", help="the profile's name (default: --out's stem)")
    p.add_argument("--quality", type=float, default=0.5, help="the model's answer quality in [0, 1] (default 0.5)")
    p.add_argument("--kv-tokens", type=int, help="KV capacity in tokens (default: the worker's metrics say it)")
    p.add_argument("--max-model-len", type=int, help="the server's (default: its /v1/models says it)")
    p.add_argument("--max-num-seqs", type=int, default=1024, help="the server's (vLLM's default 1024)")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192, help="the server's (vLLM's default 8192)")
    p.add_argument("--cudagraph-max-tokens", type=int, default=128,
                   help="the server's --max-cudagraph-capture-size (default 128)")  # fmt: skip
    p.add_argument("--no-async-scheduling", action="store_true", help="the server runs vLLM's synchronous scheduler")
    p.add_argument("--colocate", nargs="+", default=[], metavar="FILE",
                   help="co-location probes: the decode phases this model ran alone are fitted too")  # fmt: skip
    p.add_argument("--sim-http-ms", type=float, default=3.0,
                   help="the sim's own HTTP cost per first token, kept out of overhead_s.ttft (default 3)")  # fmt: skip
    p.add_argument("--note", default="", help="provenance: the GPU, the server's flags, ...")
    p.add_argument("--against", metavar="PROFILE", help="also print what this profile (a name or a JSON file) "
                   "predicts at every probed point, against the fitted one; a file holding probes (a profile this "
                   "command wrote, or a probe) of another boot of the server: also the fit against its "
                   "measurements, beside the two boots' spread")  # fmt: skip
    p.add_argument("--staged", action="store_true", help="fit without the joint stage (the fit of the shipped "
                   "profiles: see docs/profiling.md)")  # fmt: skip
    g = p.add_argument_group("the probe (with --url)")
    g.add_argument("--speedup", type=float, default=1.0, help="a simulated worker's speedup: times are scaled back")
    g.add_argument("--probe-out", help="also write the probe's results here, after every phase")
    quick = ", ".join(f"{k}={v}" for k, v in QUICK.items())
    g.add_argument("--quick", action="store_true", help=f"a smaller grid: {quick}")
    g.add_argument("--phases", type=lambda s: tuple(x for x in s.split(",") if x), help="of ttft,tpot,mix (all)")
    for flag, kind, what in (("--ttft-prompts", _ints, "prompt lengths of the TTFT phase"),
                             ("--ttft-reps", int, "measured requests per TTFT prompt length (their median)"),
                             ("--tpot-prompts", _ints, "prompt lengths of the decoding streams"),
                             ("--batches", _ints, "decoding batch sizes"), ("--tpot-out", int, "tokens each decodes"),
                             ("--mix-batch", int, "streams decoding while prompts are injected"),
                             ("--mix-out", int, "tokens each of them decodes"),
                             ("--mix-inject", _ints, "prompt lengths injected"),
                             ("--mix-at", _floats, "when each is sent, s after the batch starts (default: spread)"),
                             ("--burst", int, "requests of the warm-up burst (0: none)")):  # fmt: skip
        g.add_argument(flag, type=kind, help=what)
    g.add_argument("--procs", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)),
                   help="client processes the streams are spread over")  # fmt: skip
    g.add_argument("--seed", type=int, help="of the prompts' token ids (default: a fresh one, never cached)")
    g.add_argument("--request-timeout", type=float, default=300.0, help="seconds, per request")


def run(args: argparse.Namespace) -> int:
    from backends.profiling.fit import Settings, fit_profile

    out = Path(args.out or re.sub(r"[^A-Za-z0-9_.-]+", "-", args.model).strip("-") + ".json")
    if out.is_dir():
        raise ConfigError("must name a file to write the profile to", key="--out")
    if not 0.0 <= args.quality <= 1.0:
        raise ConfigError(f"must be in [0, 1], got {args.quality:g}", key="--quality")
    for key in ("kv_tokens", "max_model_len", "max_num_seqs", "max_num_batched_tokens", "cudagraph_max_tokens"):
        if (v := getattr(args, key)) is not None and v < 1:
            raise ConfigError(f"must be a positive integer, got {v}", key="--" + key.replace("_", "-"))
    settings = Settings(model=args.model, name=args.name or out.stem, quality=args.quality, kv_tokens=args.kv_tokens,
                        max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                        max_num_batched_tokens=args.max_num_batched_tokens, graph_max=args.cudagraph_max_tokens,
                        async_scheduling=not args.no_async_scheduling, sim_http_s=args.sim_http_ms / 1e3,
                        staged=args.staged)  # fmt: skip
    for flag, target in (("--out", out), ("--probe-out", args.probe_out)):
        if target is not None and Path(target).exists() and not Path(target).is_file():
            # it is replaced by a rename: a device or a folder there (/dev/null, run as root) would be lost
            raise ConfigError(f"{target} is not a regular file: give a file's path", key=flag)
    against, other_boot = _reference(args.against)
    colocate = [_read(f, "--colocate") for f in args.colocate]
    if args.fit and (given := _probe_flags(args)):
        raise ConfigError("is a flag of the probe: it does nothing with --fit", key=given[0])
    if args.fit:
        runs, sources = [], list(args.fit)
        for f in args.fit:
            runs += _probes_of(_read(f, "--fit"), f)
    else:
        runs, sources = [_probe(args)], []
    prof = fit_profile(runs, colocate, settings)
    prof["provenance"] = _provenance(prof["provenance"], runs, sources + list(args.colocate), args.note)
    prof["raw"] = {"probes": runs, **({"colocate": colocate} if colocate else {}), **prof["raw"]}
    _print_fit(prof)
    if against is not None:
        _print_against(prof, against, runs, colocate, settings)
    if other_boot:
        own = " ".join(Path(f).name for f in sources) or "this probe"
        _print_boots(prof, runs, other_boot, settings, own, Path(args.against).name)
    _write(out, prof)
    print(f"wrote {out} (profile {settings.name}: `profile: {out}` in a config, `chimera sim --profile {out}`)")
    return 0


def _probe_flags(args: argparse.Namespace) -> list[str]:
    """The probe's flags (``--speedup``, the grid's, ...) that ``args`` sets."""
    from backends.profiling.probe import Grid

    grid = [f.name for f in fields(Grid) if getattr(args, f.name, None) is not None]
    given = grid + [k for k in ("probe_out", "seed") if getattr(args, k) is not None]
    given += ["quick"] * args.quick + ["speedup"] * (args.speedup != 1.0)
    return ["--" + k.replace("_", "-") for k in given]


def _read(path: str, flag: str) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", file=path, key=flag) from exc
    except ValueError as exc:
        raise ConfigError(f"not JSON: {exc}", file=path, key=flag) from exc


def _probes_of(data: Any, path: str) -> list[dict[str, Any]]:
    """A probe's results, or the probes a profile written by this command holds (``raw.probes``)."""
    if isinstance(data, dict) and isinstance(data.get("raw"), dict) and isinstance(data["raw"].get("probes"), list):
        return list(data["raw"]["probes"])
    if isinstance(data, dict) and ("ttft" in data or "tpot" in data or "psweep" in data):
        return [data]
    raise ConfigError("neither a probe's results nor a profile holding them (raw.probes)", file=path, key="--fit")


def _reference(name: str | None) -> tuple[Profile | None, list[dict[str, Any]]]:
    """``--against``: the profile it names (None for a probe's results) and the probes its file holds."""
    if name is None:
        return None, []
    from backends.profiling.boots import probes_of
    from router.core.profile import load_profile

    probes = probes_of(_read(name, "--against")) if name.endswith(".json") and Path(name).is_file() else []
    try:
        return load_profile(name), probes
    except ProfileError as exc:
        if probes and "raw" not in json.loads(Path(name).read_text()):  # a probe's results, not a profile
            return None, probes
        raise ConfigError(str(exc), key="--against") from exc


def _probe(args: argparse.Namespace) -> dict[str, Any]:
    from backends.profiling.client import inspect_worker
    from backends.profiling.probe import Probe

    grid = _grid(args)
    if not args.speedup > 0:
        raise ConfigError(f"must be positive, got {args.speedup:g}", key="--speedup")
    if args.procs < 1:
        raise ConfigError(f"must be at least 1, got {args.procs}", key="--procs")
    worker = inspect_worker(args.url, args.model)
    if not (args.kv_tokens or worker.kv_tokens):  # before minutes of probing, not after
        raise ConfigError(f"the worker at {worker.url} does not say its KV capacity (vllm:cache_config_info in "
                          "/metrics): give it", key="--kv-tokens")  # fmt: skip
    print(f"chimera profile: probing {args.model} at {worker.url} (version {worker.version or 'unknown'}, "
          f"KV {args.kv_tokens or worker.kv_tokens} tokens)", file=sys.stderr, flush=True)  # fmt: skip
    probe = Probe(worker, grid, kv_tokens=args.kv_tokens, max_model_len=args.max_model_len, speedup=args.speedup,
                  procs=args.procs, seed=args.seed, request_timeout_s=args.request_timeout,
                  log=lambda line: print(f"chimera profile: {line}", file=sys.stderr, flush=True))  # fmt: skip
    return probe.run(save=(lambda res: _write(Path(args.probe_out), res)) if args.probe_out else None)


def _grid(args: argparse.Namespace) -> Grid:
    from backends.profiling.probe import Grid

    grid = replace(Grid(), **QUICK) if args.quick else Grid()
    given: dict[str, Any] = {f.name: v for f in fields(Grid) if (v := getattr(args, f.name, None)) is not None}
    grid = replace(grid, **given)
    grid.check()
    return grid


def _provenance(fit: dict[str, Any], runs: list[dict[str, Any]], sources: list[str], note: str) -> dict[str, Any]:
    servers = [{k: m.get(k) for k in ("url", "version", "started", "speedup") if m.get(k) is not None}
               for m in (r.get("meta", {}) for r in runs)]  # fmt: skip
    return {"status": fit["status"], "date": fit["date"], "tool": "chimera profile", "servers": servers,
            **({"sources": sources} if sources else {}), **({"notes": note} if note else {}),
            "fit": fit["fit"]}  # fmt: skip


def _print_fit(prof: dict[str, Any]) -> None:
    f = prof["provenance"]["fit"]
    print(f"== {prof['name']} ({prof['model']}): {f['points']} points, boots {', '.join(f['boots'])}")
    for sec in ("step_time_s", "cudagraph", "frontend_s", "overhead_s"):
        print(f"  {sec}: " + "  ".join(f"{k}={v:.4g}" for k, v in prof[sec].items() if not isinstance(v, bool)))
    for point, measured, fitted, err, _ in prof["raw"]["fit_rows"]["rows"]:
        print(f"  {point:32s} measured {measured:10.2f} ms  fit {fitted:10.2f} ms  {err:+7.1%}")
    kinds = "  ".join(f"{k} {v['mean_abs_rel_err']:.1%}/{v['max_abs_rel_err']:.1%}" for k, v in f["by_kind"].items())
    print(f"  fit against the measured points, mean/max |error|: {kinds}; all {f['mean_abs_rel_err']:.1%}"
          f"/{f['max_abs_rel_err']:.1%}")  # fmt: skip
    for line in f.get("warnings", ()):
        print(f"chimera profile: warning: {line}", file=sys.stderr)


def _print_against(prof: dict[str, Any], ref: Profile, runs: list[dict[str, Any]], colocate: list[dict[str, Any]],
                   s: Settings) -> None:  # fmt: skip
    from backends.profiling.fit import build_rows, colocate_rows, predict
    from router.core.profile import parse_profile

    rows = build_rows(runs, s.max_num_batched_tokens, s.graph_max)
    for i, c in enumerate(colocate, 1):
        rows += colocate_rows(c, s.model, f"c{i}", s.graph_max)
    fitted, theirs = predict(parse_profile(prof), rows), predict(ref, rows)
    print(f"== {prof['name']} against {ref.name}, at every probed point")
    by: dict[str, list[float]] = {}
    for r, a, b in zip(rows, fitted, theirs, strict=True):
        err = a / b - 1
        by.setdefault({"ttft": "TTFT", "mix": "mixed step"}.get(r["kind"], "TPOT"), []).append(abs(err))
        print(f"  {r['key']:32s} {ref.name} {b * 1e3:10.2f} ms  fitted {a * 1e3:10.2f} ms  {err:+7.1%}")
    print("  mean/max |error|: " + "  ".join(f"{k} {sum(v) / len(v):.1%}/{max(v):.1%} ({len(v)} points)"
                                              for k, v in by.items()))  # fmt: skip


def _print_boots(prof: dict[str, Any], runs: list[dict[str, Any]], other: list[dict[str, Any]], s: Settings,
                 own_name: str, other_name: str) -> None:  # fmt: skip
    from backends.profiling.boots import boot_figures, format_figures
    from backends.profiling.fit import build_rows
    from router.core.profile import parse_profile

    own, theirs = (build_rows(r, s.max_num_batched_tokens, s.graph_max) for r in (runs, other))
    print("\n".join(format_figures(boot_figures(parse_profile(prof), own, theirs), own_name, other_name)))


def _write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)

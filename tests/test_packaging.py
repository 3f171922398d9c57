"""What `pip install chimera-router` brings: the gateway's runtime, no plotting, console or SDK library."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH_ONLY = ("openai", "matplotlib", "rich")


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower()


def test_the_runtime_dependencies_hold_no_bench_library() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {_name(r) for r in project["dependencies"]}
    assert runtime.isdisjoint(BENCH_ONLY), runtime & set(BENCH_ONLY)
    assert {_name(r) for r in project["optional-dependencies"]["bench"]} >= set(BENCH_ONLY)


def test_serving_works_without_the_bench_libraries() -> None:
    """With openai, matplotlib and rich not installed (an import finder refuses them), the gateway, its CLI
    parser, the simulator and the predictor import, and `chimera bench` says which extra to install."""
    code = (
        "import importlib.abc, importlib.util, sys\n"
        "class Refuse(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {BENCH_ONLY!r}: raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Refuse())\n"
        "importlib.util.find_spec = lambda name, *a: None if name in "
        f"{BENCH_ONLY!r} else _find(name, *a)\n"
        "import router.app, router.serve, router.cli, backends.sim.server, predictor.model, router.learning\n"
        "sys.exit(router.cli.main(['bench', '--workload', 'chat', '--config', 'examples/quickstart.yaml']))\n"
    )
    code = "import importlib.util\n_find = importlib.util.find_spec\n" + code
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.strip().endswith("pip install 'chimera-router[bench]'"), proc.stderr[-2000:]


def test_an_image_without_the_bench_serves_and_names_the_extra() -> None:
    """The Docker image installs router, backends and predictor only: the CLI still parses, and the bench's
    commands say what to install, whatever arguments they are given."""
    code = (
        "import importlib.util, sys\n"
        "_find = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda name, *a: None if name == 'chimera_bench' else _find(name, *a)\n"
        "import router.cli\n"
        "assert router.cli.main(['check', 'examples/quickstart.yaml']) == 0\n"
        "sys.exit(router.cli.main(sys.argv[1:]))\n"
    )
    for argv in (["bench", "--workload", "chat", "--rate", "1"], ["predictor", "collect", "--config", "x.yaml"]):
        proc = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True, text=True,
                              timeout=60)  # fmt: skip
        assert proc.returncode == 1, proc.stderr[-2000:]
        needs = "chimera: this command needs the bench: pip install 'chimera-router[bench]'"
        assert proc.stderr.strip().splitlines()[-1] == needs

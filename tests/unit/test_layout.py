"""The house rules, checked: imports only run down the layers that docs/architecture.md draws,
and files, functions, benchmarks and the top docs stay within their sizes."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Low to high. A package may import its own layer and the layers below it, never one above.
LAYERS: list[set[str]] = [
    {"config", "utils", "models"},  # foundation: typed config, process helpers, model loading
    {"algos", "data", "rewards"},  # pure losses and advantages, rows and batches, scoring
    {"rl", "serve", "weights"},  # rollout records and control, Serve apps, the weight channel
    {"train", "eval", "agents"},  # Ray Train learners, held-out evaluation, multi-turn episodes
    {"phases"},  # the steps a pipeline runs
    {"pipelines"},  # one registered module per pipeline
    {"tune", "cli"},  # sweeps over pipelines, the raypost command
]
LAYER_OF = {name: i for i, layer in enumerate(LAYERS) for name in layer}
PRODUCT = ("raypost", "pipelines", "serve_apps", "benchmarks")
MAX_FILE_LINES, MAX_FUNCTION_LINES = 400, 60


def tracked(pattern: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", pattern], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / line for line in out.stdout.split()]


def package_of(path: Path) -> str:
    """The subpackage of ``raypost/<sub>/...`` or ``raypost/<sub>.py``."""
    parts = path.relative_to(ROOT / "raypost").parts
    return parts[0].removesuffix(".py")


def raypost_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, subpackage) of every ``raypost.<sub>`` import, at any depth (function-level too)."""
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "raypost" and len(parts) > 1:
                found.append((node.lineno, parts[1]))
    return found


def upward_imports(sources: dict[Path, str]) -> list[str]:
    """Each import in ``sources`` ({path: text}) that runs to a higher layer."""
    bad = []
    for path, text in sources.items():
        src = package_of(path)
        if src not in LAYER_OF:
            continue  # the package's __init__: the public API may name any layer
        for line, dst in raypost_imports(ast.parse(text)):
            if dst in LAYER_OF and LAYER_OF[dst] > LAYER_OF[src]:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports raypost.{dst} (layer {src} < {dst})")
    return bad


def test_every_subpackage_has_a_layer():
    subpackages = {p.name for p in (ROOT / "raypost").iterdir() if (p / "__init__.py").is_file()}
    modules = {p.stem for p in (ROOT / "raypost").glob("*.py") if p.stem != "__init__"}
    assert subpackages | modules <= set(LAYER_OF), "add the new package to LAYERS and docs/architecture.md"


def test_no_import_runs_from_a_lower_layer_to_a_higher_one():
    assert upward_imports({p: p.read_text() for p in tracked("raypost/*.py")}) == []


def test_the_layer_check_sees_an_upward_import():
    probe = {ROOT / "raypost" / "config" / "probe.py": "def f():\n    from raypost.train import loop\n"}
    assert upward_imports(probe) == ["raypost/config/probe.py:2 imports raypost.train (layer config < train)"]


def long_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]


@pytest.mark.parametrize("folder", [*PRODUCT, "tests"])
def test_no_file_over_400_lines(folder):
    long = [
        f"{p.relative_to(ROOT)} ({n})"
        for p in tracked(f"{folder}/*.py")
        if (n := len(p.read_text().splitlines())) > 400
    ]
    assert long == []


@pytest.mark.parametrize("folder", PRODUCT)
def test_no_function_over_60_lines(folder):
    assert [f for p in tracked(f"{folder}/*.py") for f in long_functions(p)] == []


def python_lines(pattern: str) -> int:
    return sum(len(p.read_text().splitlines()) for p in tracked(pattern))


def test_benchmarks_are_under_15_percent_of_the_python():
    share = python_lines("benchmarks/*.py") / python_lines("*.py")
    assert share < 0.15, f"benchmarks/ is {share:.1%} of the repository's Python lines"


@pytest.mark.parametrize(("doc", "limit"), [("README.md", 200), ("benchmarks/RESULTS.md", 400)])
def test_top_docs_stay_short(doc, limit):
    assert len((ROOT / doc).read_text().splitlines()) < limit

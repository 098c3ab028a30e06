"""The docs name only what exists: every repository path, test name, make target, module and
``raypost`` command (with its config keys) that a Markdown file of the repository mentions."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest

from raypost.config.base import ConfigError
from raypost.pipelines import registry
from raypost.tune.space import leaf_field

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted(p for p in ROOT.rglob("*.md") if not {".venv", ".git", "runs", "node_modules"} & set(p.parts))
TOP = "raypost|pipelines|examples|tests|benchmarks|docs|notes|serve_apps|tune_spaces|cluster_configs"
PATH = re.compile(rf"(?<![\w./-])((?:{TOP})/[\w./-]*[\w/])(?:::(\w+))?")
MAKE = re.compile(r"(?<![\w-])make ([a-z][\w-]*)")
MODULE = re.compile(r"python -m ([\w.]+)")
# a command line of a code span or block: at its start, or after `--` (ray job submit -- raypost ...)
COMMAND = re.compile(r"(?:^|-- )\s*(?:\S*/)?raypost ([a-z][\w-]*)((?: [^`\n|#]*)?)", re.M)
CODE = re.compile(r"```[^\n]*\n(.*?)```|`([^`\n]+)`", re.S)
PLACEHOLDER = re.compile(r"[<*{]|\.\.\.|\bNAME\b")
OTHER_COMMANDS = {"tune", "serve-reward", "serve-rollout"}
FLAGS_WITHOUT_KEYS = {"--config", "--help", "--verbose", "-h"}


def _text(md: Path) -> str:
    return md.read_text(encoding="utf-8")


def _code(text: str) -> str:
    """The fenced blocks and inline code spans of a Markdown text, one per line."""
    return "\n".join(a or b for a, b in CODE.findall(text))


def _check_key(model: type, key: str) -> None:
    """ConfigError unless ``key`` is a config key of ``model``, or a key inside one of its
    mapping fields (``resources.ray_resources.learner_node``)."""
    try:
        leaf_field(model, key)
    except ConfigError as err:
        head = key.rsplit(".", 1)[0]
        if "is a value, not a section" not in str(err) or "." not in key:
            raise
        leaf_field(model, head)


def _defines(path: Path, name: str) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name for n in ast.walk(tree))


@pytest.mark.parametrize("md", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_paths_and_tests_exist(md: Path) -> None:
    missing = []
    for match in PATH.finditer(_text(md)):
        rel, test = match.group(1).rstrip("."), match.group(2)
        if PLACEHOLDER.search(rel) or rel.startswith(("runs/", "notes/investigations/out/")):
            continue
        path = ROOT / rel
        if not path.exists():
            missing.append(rel)
        elif test is not None and not _defines(path, test):
            missing.append(f"{rel}::{test}")
    assert not missing, f"{md.relative_to(ROOT)} names what does not exist: {sorted(set(missing))}"


@pytest.mark.parametrize("md", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_make_targets_and_modules_exist(md: Path) -> None:
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, flags=re.M))
    text = _text(md)
    missing = [f"make {t}" for t in MAKE.findall(text) if t not in targets]
    for module in MODULE.findall(text):
        base = ROOT / module.replace(".", "/")
        if not (base.with_suffix(".py").exists() or (base / "__main__.py").exists()):
            missing.append(f"python -m {module}")
    assert not missing, f"{md.relative_to(ROOT)} names what does not exist: {missing}"


@pytest.mark.parametrize("md", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_raypost_commands_name_real_pipelines_and_config_keys(md: Path) -> None:
    bad = []
    for command, rest in COMMAND.findall(_code(_text(md))):
        name = command.replace("-", "_") if command not in OTHER_COMMANDS else command
        if name in OTHER_COMMANDS:
            continue
        if name not in registry.names():
            bad.append(f"raypost {command}")
            continue
        pipeline = registry.get(name)
        try:
            words = shlex.split(rest.replace("\\", " "))
        except ValueError:
            words = rest.split()
        for word in words:
            if not word.startswith("--") or word in FLAGS_WITHOUT_KEYS:
                continue
            key = pipeline.aliases.get(word[2:], word[2:])
            try:
                _check_key(pipeline.config, key)
            except ConfigError as err:
                bad.append(f"raypost {command} {word}: {err}")
    assert not bad, f"{md.relative_to(ROOT)}: {bad}"


def test_the_checks_see_a_wrong_name(tmp_path: Path) -> None:
    """The scans find what they look for: a missing path, test, target and config key."""
    text = (
        "see `raypost/nothing.py`, tests/unit/test_docs.py::test_nope, make nonesuch, "
        "`raypost grpo --algo.stesp 3`, `ray job submit -- .venv/bin/raypost sft --optim.lr 1e-4`"
    )
    assert [m.group(1) for m in PATH.finditer(text)] == ["raypost/nothing.py", "tests/unit/test_docs.py"]
    assert not _defines(ROOT / "tests" / "unit" / "test_docs.py", "test_nope")
    assert MAKE.findall(text) == ["nonesuch"]
    assert COMMAND.findall(_code("raypost runs here")) == []
    (command, rest), (command2, _) = COMMAND.findall(_code(text))
    assert (command, command2) == ("grpo", "sft")
    with pytest.raises(ConfigError, match="algo.steps"):
        leaf_field(registry.get("grpo").config, shlex.split(rest)[0][2:])

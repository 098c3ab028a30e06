"""A pipeline is one module plus one registry line: a toy pipeline written here and added to
``MODULES`` is run by the ``raypost`` command, listed by its help, loaded from a
``<pipeline>_*.yaml`` example, and swept by Tune (its space validated against its config, its
trial resources from its requests), with no other file touched. The product's dispatchers (the
command, Tune) never switch on a pipeline's name."""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest

from raypost import cli
from raypost.pipelines import registry
from tests.conftest import ROOT

TOY = '''
from pydantic import Field

from raypost.config.base import StrictModel
from raypost.pipelines.registry import Pipeline


class ToyConfig(StrictModel):
    """A pipeline with one knob."""

    steps: int = Field(3, ge=1, le=100, description="Steps to take.")


def run(cfg: ToyConfig, run_dir) -> dict:
    report = {"steps": cfg.steps}
    (run_dir / "ran.txt").write_text(str(cfg.steps))
    return report


PIPELINE = Pipeline(
    name="toy",
    summary="a pipeline written in one module",
    config=ToyConfig,
    run=run,
    requests=lambda cfg: {"learner": {"CPU": 1.0 + cfg.steps / 100}},
    trial=lambda cfg, trial_dir: None,
)
'''


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "toy_pipeline.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(registry.MODULES, "toy", "toy_pipeline")  # the one registry line
    return tmp_path


def test_a_registered_module_is_a_pipeline_of_the_command(toy: Path, monkeypatch, capsys) -> None:
    import raypost.phases.data as data_phase

    assert cli.main(["--help"]) == 0
    assert re.search(r"\n  toy +a pipeline written in one module\n", capsys.readouterr().out)
    assert cli.main(["toy", "--help"]) == 0 and "--steps (3): Steps to take." in capsys.readouterr().out
    assert cli.main(["toy", "--steps", "0"]) == 2 and "steps" in capsys.readouterr().err  # validated once
    run_dir = toy / "run"
    run_dir.mkdir()
    monkeypatch.setattr(data_phase, "start_run", lambda cfg, verbose=False: run_dir)  # no Ray here
    assert cli.main(["toy", "--steps", "7"]) == 0
    assert (run_dir / "ran.txt").read_text() == "7" and "steps: 7" in (run_dir / "config.yaml").read_text()


def test_a_registered_module_is_swept_by_tune_and_loads_its_examples(toy: Path) -> None:
    from raypost.tune.space import load_space, trial_config
    from raypost.tune.sweep import trial_resources

    (toy / "toy_small.yaml").write_text("steps: 5\n")
    assert registry.config_for_file(toy / "toy_small.yaml").steps == 5
    assert "toy" in registry.tunable()
    space_file = toy / "space.yaml"
    space_file.write_text(
        textwrap.dedent("""
        pipeline: toy
        metric: loss
        mode: min
        params: {steps: {choice: [10, 50]}}
        """)
    )
    space = load_space(space_file)
    assert trial_config(space, {"steps": 10}).steps == 10
    assert trial_resources(space)["CPU"] == pytest.approx(0.1 + 1.5)  # the driver + the largest request
    space_file.write_text(space_file.read_text().replace("[10, 50]", "[10, 500]"))
    with pytest.raises(Exception, match="params.steps = 500 is rejected by the toy config"):
        load_space(space_file)


def _string_constants(path: Path) -> set[str]:
    return {n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)}


@pytest.mark.parametrize("where", ["raypost/cli.py", "raypost/tune"])
def test_dispatchers_never_name_a_pipeline(where: str) -> None:
    files = [ROOT / where] if where.endswith(".py") else sorted((ROOT / where).rglob("*.py"))
    named = {f.name: _string_constants(f) & set(registry.names()) for f in files}
    assert not any(named.values()), f"name switches on pipelines: {named}"


def test_the_scan_sees_a_name_switch(tmp_path: Path) -> None:
    switch = tmp_path / "switch.py"
    switch.write_text("def f(name):\n    return 1 if name == 'grpo' else 2\n")
    assert _string_constants(switch) & set(registry.names()) == {"grpo"}


def test_help_shows_the_defaults_a_section_gets_from_its_parent(capsys) -> None:
    """GRPO's warm-up optimizer and PPO's critic optimizer are OptimConfigs built with their own
    defaults: the help shows those, not the class's."""
    assert cli.main(["ppo", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--warmup.optim.lr (0.002)" in out and "--critic.optim.lr (0.0001)" in out and "--optim.lr (0.0001)" in out
    assert "--critic.gamma (1.0)" in out and "--model.path (None)" in out

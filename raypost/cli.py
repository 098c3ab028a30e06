"""The ``raypost`` command.

    raypost <pipeline> [--config FILE.yaml] [--section.key VALUE ...]   run a registered pipeline
    raypost <pipeline> --help                                          its config keys
    raypost tune --pipeline NAME --space FILE.yaml                     a Ray Tune sweep
    raypost serve-reward [...] / raypost serve-rollout --model PATH    a Serve app on its own

The config is parsed and validated before any heavy import (Ray, torch), so a bad key or value
fails in about a second with the nearest valid key. ``pipelines/<name>.py`` runs the same code
(``ray job submit -- python pipelines/grpo.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from raypost.config.base import ConfigError, StrictModel, section_model
from raypost.pipelines import registry

SERVE_COMMANDS = {
    "serve-reward": "the reward service (verifiers + optional reward model) on Ray Serve",
    "serve-rollout": "vLLM rollout replicas on Ray Serve (/v1/completions)",
}


def usage() -> str:
    width = max(map(len, [*registry.names(), "tune", *SERVE_COMMANDS]))
    rows = [f"  {n:<{width}}  {registry.get(n).summary}" for n in registry.names()]
    rows += [f"  {'tune':<{width}}  a Ray Tune sweep of a pipeline (raypost tune --help)"]
    rows += [f"  {n:<{width}}  {what}" for n, what in SERVE_COMMANDS.items()]
    return (
        __doc__.split("\n\n")[1]
        + "\n\ncommands:\n"
        + "\n".join(rows)
        + "\n\nThe embedded default needs no download: `raypost grpo` trains a tiny model offline."
    )


def config_keys(model: type[StrictModel], prefix: str = "", defaults: StrictModel | None = None) -> list[str]:
    """One line per config key: ``--section.key (default): description``. ``defaults``: the
    section as its parent builds it (a section's own default may differ from its class's)."""
    lines = []
    for name, f in model.model_fields.items():
        sub = section_model(f.annotation)
        given = f.get_default(call_default_factory=True) if defaults is None else getattr(defaults, name)
        if sub is not None and f.annotation is sub:
            lines += config_keys(sub, f"{prefix}{name}.", given if isinstance(given, sub) else None)
        else:
            default = "required" if f.is_required() and defaults is None else repr(given)
            lines.append(f"  --{prefix}{name} ({default}): {f.description or ''}")
    return lines


def pipeline_help(pipeline: registry.Pipeline) -> str:
    aliases = ", ".join(f"--{a} = --{k}" for a, k in pipeline.aliases.items())
    return (
        f"raypost {pipeline.name}: {pipeline.summary}\n\nusage: raypost {pipeline.name} [--config FILE.yaml] "
        f"[--verbose] [--section.key VALUE ...]\nshort forms: {aliases}\n\nconfig keys:\n"
        + "\n".join(config_keys(pipeline.config))
    )


def run_pipeline(name: str, argv: list[str]) -> dict[str, Any]:
    """Parse and validate, start the run (Ray, run folder), check placement, run; -> report."""
    from raypost.config import load_config

    pipeline = registry.get(name)
    verbose = "--verbose" in argv
    cfg = load_config(pipeline.config, [a for a in argv if a != "--verbose"], aliases=dict(pipeline.aliases))

    import logging

    from raypost.config import dump_yaml
    from raypost.phases.data import start_run

    run_dir = start_run(cfg, verbose=verbose)
    pipeline.check(cfg)
    dump_yaml(cfg, run_dir / "config.yaml")  # with what the checks picked for the cluster
    report = pipeline.run(cfg, run_dir)
    logging.getLogger("raypost").info("report: %s", run_dir / "report.json")
    return report


def _serve(name: str) -> Callable[[list[str]], None]:
    from raypost.serve import entry

    return {"serve-reward": entry.reward_main, "serve-rollout": entry.rollout_main}[name]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    command, rest = argv[0].replace("-", "_") if argv[0] not in SERVE_COMMANDS else argv[0], argv[1:]
    try:
        if command == "tune":
            from raypost.tune.command import main as tune_main

            tune_main(rest)
        elif command in SERVE_COMMANDS:
            _serve(command)(rest)
        elif {"-h", "--help"} & set(rest):
            print(pipeline_help(registry.get(command)))
        else:
            run_pipeline(command, rest)
    except ConfigError as err:
        print(f"raypost: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Reward model: Bradley-Terry pairwise training of any sequence classifier on Ray Train.

The pipeline is ``raypost/pipelines/reward_model.py``, which reads top to bottom; this script runs it,
as ``raypost reward_model`` does: ``python pipelines/reward_model.py --help`` lists its config keys.

  ray job submit --working-dir . -- $PWD/.venv/bin/python pipelines/reward_model.py --run.name my-reward_model
"""

import sys

from raypost.cli import main

if __name__ == "__main__":
    sys.exit(main(["reward_model", *sys.argv[1:]]))

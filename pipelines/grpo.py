"""GRPO end to end in one Ray job: SFT warm-up, then GRPO with vLLM rollouts on Ray Serve.

The pipeline is ``raypost/pipelines/grpo.py``, which reads top to bottom; this script runs it,
as ``raypost grpo`` does: ``python pipelines/grpo.py --help`` lists its config keys.

  ray job submit --working-dir . -- $PWD/.venv/bin/python pipelines/grpo.py --run.name my-grpo
"""

import sys

from raypost.cli import main

if __name__ == "__main__":
    sys.exit(main(["grpo", *sys.argv[1:]]))

"""Supervised fine-tuning on Ray: Ray Data preprocessing, Ray Train + DeepSpeed learner.

The pipeline is ``raypost/pipelines/sft.py``, which reads top to bottom; this script runs it,
as ``raypost sft`` does: ``python pipelines/sft.py --help`` lists its config keys.

  ray job submit --working-dir . -- $PWD/.venv/bin/python pipelines/sft.py --run.name my-sft
"""

import sys

from raypost.cli import main

if __name__ == "__main__":
    sys.exit(main(["sft", *sys.argv[1:]]))

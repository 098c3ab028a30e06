"""Distillation on Ray: a teacher's knowledge into a smaller student that shares its tokenizer.

The pipeline is ``raypost/pipelines/distill.py``, which reads top to bottom; this script runs it,
as ``raypost distill`` does: ``python pipelines/distill.py --help`` lists its config keys.

  ray job submit --working-dir . -- $PWD/.venv/bin/python pipelines/distill.py --run.name my-distill
"""

import sys

from raypost.cli import main

if __name__ == "__main__":
    sys.exit(main(["distill", *sys.argv[1:]]))

"""Hyperparameter sweep of a pipeline with Ray Tune; each trial is that pipeline's Ray Train run.

The sweep driver is ``raypost/tune/command.py``; this script runs it, as ``raypost tune`` does:
``python pipelines/tune.py --pipeline sft --space tune_spaces/sft_quick.yaml``.
"""

import sys

from raypost.cli import main

if __name__ == "__main__":
    sys.exit(main(["tune", *sys.argv[1:]]))

"""DPO: offline preference optimization (DPO, IPO, SimPO) of a causal LM on Ray Train.

The pipeline is ``raypost/pipelines/dpo.py``, which reads top to bottom; this script runs it,
as ``raypost dpo`` does: ``python pipelines/dpo.py --help`` lists its config keys.

  ray job submit --working-dir . -- $PWD/.venv/bin/python pipelines/dpo.py --run.name my-dpo
"""

import sys

from raypost.cli import main

if __name__ == "__main__":
    sys.exit(main(["dpo", *sys.argv[1:]]))

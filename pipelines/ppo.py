"""PPO with a learned critic and GAE: the GRPO job with a value model beside the policy.

The pipeline is ``raypost/pipelines/ppo.py``, which reads top to bottom; this script runs it,
as ``raypost ppo`` does: ``python pipelines/ppo.py --help`` lists its config keys.

  ray job submit --working-dir . -- $PWD/.venv/bin/python pipelines/ppo.py --run.name my-ppo
"""

import sys

from raypost.cli import main

if __name__ == "__main__":
    sys.exit(main(["ppo", *sys.argv[1:]]))

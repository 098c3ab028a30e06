"""The weight channel: versioned pushes of the policy's weights from learner rank 0 to the rollout
replicas. One module per transport, registered by name (``rollout.weights.transport``):

* ``shm`` (``shm.py``): safetensors files in node-local shared memory;
* ``object_store`` (``object_store.py``): Ray's object store, then a memfd per replica;
* ``collective`` (``collective.py``): a process group from rank 0 to the engine workers.

``fallback.py`` sends each version through a second transport too (``rollout.weights.fallback``),
which a replica loads from when the first fails. ``buckets.py`` reads a learner's weights bucket by
bucket under any ZeRO stage; ``vllm_ext.py`` is the engine workers' end, dispatching on the
transport through the registry.
"""

from raypost.weights import collective, object_store, shm  # noqa: F401 - each registers its transport
from raypost.weights.channel import NAMESPACE, TRANSPORTS, WeightBoard, WeightChannel, open_channel
from raypost.weights.fallback import FallbackChannel
from raypost.weights.shm import check_weight_path, default_transport
from raypost.weights.specs import Spec, WeightsNotReachedError, check_served, specs_of

__all__ = [
    "NAMESPACE",
    "FallbackChannel",
    "TRANSPORTS",
    "Spec",
    "WeightBoard",
    "WeightChannel",
    "WeightsNotReachedError",
    "check_served",
    "check_weight_path",
    "default_transport",
    "open_channel",
    "specs_of",
]

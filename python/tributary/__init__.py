"""tributary: collective communication for data-parallel training, from Python.

Collectives (the CrossDeviceOps layer), zero-copy on NumPy arrays and on any object with the buffer
protocol, ``__array_interface__`` or ``__cuda_array_interface__``::

    import numpy as np, tributary
    ops = tributary.backend("ring:timeout=30s")   # None: TRIBUTARY_CROSS_DEVICE_OPS, else "auto"
    x = np.full(4, ops.rank + 1, np.float32)
    ops.all_reduce(x, op="sum")                   # in place; returns x
    work = ops.all_reduce(x, async_op=True)       # a Work: wait(timeout), done(), error()

A backend takes one buffer per local replica (a list), or one buffer when it has one replica.
Failures raise ``tributary.Error`` subclasses carrying ``.code`` (a StatusCode) and ``.message``
(see tributary.errors).

The strategy layer, with tf.distribute's vocabulary: ``MirroredStrategy``,
``MultiWorkerMirroredStrategy`` (plus ``OneDeviceStrategy``, ``CentralStorageStrategy``,
``make_strategy``), ``scope()``, ``run(fn, args=...)`` (fn runs on the replica threads),
``reduce``, ``gather``, ``Variable`` / ``create_variable`` (``read``, ``assign``, ``assign_add``,
``assign_sub``), ``get_replica_context()`` (``all_reduce``, ``all_gather``, ``merge_call``),
``compute_average_loss``, ``scale_regularization_loss``, ``Dataset`` and
``experimental_distribute_dataset``. Values come back as read-only NumPy arrays.
"""

from .errors import *  # noqa: F401,F403
from .errors import __all__ as _errors_all
from ._tributary import (  # noqa: F401
    __version__,
    AutoShardPolicy,
    Backend,
    CentralStorageStrategy,
    Context,
    Dataset,
    DatasetIterator,
    DistributedDataset,
    DistributedIterator,
    IndexedSlices,
    InputContext,
    InputOptions,
    InputReplicationMode,
    MirroredStrategy,
    MultiWorkerMirroredStrategy,
    OneDeviceStrategy,
    Optional,
    PerReplica,
    ReduceOp,
    Registration,
    ReplicaContext,
    Strategy,
    StrategyScope,
    ValueContext,
    Variable,
    VariableAggregation,
    VariableSynchronization,
    Work,
    backend,
    backends,
    compute_average_loss,
    cuda_available,
    get_replica_context,
    get_strategy,
    has_strategy,
    in_cross_replica_context,
    make_context,
    make_strategy,
    restore_checkpoint,
    save_checkpoint,
    scale_regularization_loss,
    shareable_array,
    to_dense,
)

import enum as _enum


class CommunicationImplementation(_enum.Enum):
    """TF's tf.distribute.experimental.CommunicationImplementation."""

    AUTO = "AUTO"
    RING = "RING"
    NCCL = "NCCL"


class CommunicationOptions:
    """TF's tf.distribute.experimental.CommunicationOptions, for
    ``MultiWorkerMirroredStrategy(communication_options=...)``. ``implementation`` is a
    CommunicationImplementation, or a string ('auto', 'ring', 'nccl' or any backend spec)."""

    def __init__(self, bytes_per_pack=0, timeout_seconds=None,
                 implementation=CommunicationImplementation.AUTO):
        if bytes_per_pack < 0:
            raise ValueError("bytes_per_pack must be non-negative, got {}".format(bytes_per_pack))
        if isinstance(implementation, str):
            implementation = CommunicationImplementation.__members__.get(
                implementation.upper(), implementation)
        self.bytes_per_pack = bytes_per_pack
        self.timeout_seconds = timeout_seconds
        self.implementation = implementation

    def __repr__(self):
        return ("CommunicationOptions(bytes_per_pack={!r}, timeout_seconds={!r}, "
                "implementation={!r})".format(self.bytes_per_pack, self.timeout_seconds,
                                              self.implementation))


__all__ = _errors_all + [
    "CommunicationImplementation", "CommunicationOptions", "Backend", "CentralStorageStrategy",
    "Context", "Dataset", "DistributedDataset", "IndexedSlices", "InputContext", "InputOptions",
    "InputReplicationMode", "AutoShardPolicy", "ValueContext", "MirroredStrategy",
    "MultiWorkerMirroredStrategy", "OneDeviceStrategy", "Optional", "PerReplica", "ReduceOp",
    "Registration", "ReplicaContext", "Strategy", "Variable", "VariableAggregation",
    "VariableSynchronization",
    "Work", "backend", "backends", "compute_average_loss", "cuda_available", "get_replica_context",
    "get_strategy", "has_strategy", "in_cross_replica_context", "make_context", "make_strategy",
    "restore_checkpoint", "save_checkpoint", "scale_regularization_loss", "shareable_array",
    "to_dense",
]

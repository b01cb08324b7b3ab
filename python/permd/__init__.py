"""permd: stateless, resumable epoch permutations for distributed training.

    permd.Permutation(seed, epoch, size)      one epoch's order, computed on demand
    permd.Sampler(dataset, num_replicas, rank, seed=..., mode="exact")   a DistributedSampler, checkpointed
                                              as (seed, epoch, offset) (docs/python.md)
    permd.Mixture(seed, epoch, sizes, weights, stages=...)   a weighted mixture of datasets (docs/mixtures.md);
                                              permd.Sampler(mixture=...) reads it, permd.reweight_stage
                                              re-weights it from a checkpoint
    permd.Client(socket=...)                  the permd daemon: datasets, fetch, stream, inverse, stats
    permd.ShardPlan(seed, epoch, shards, window, lanes)   a sharded dataset's epoch, computed here
    permd.digest(ids)                         an order-independent digest, to verify exactly-once delivery
"""
from .errors import (Conflict, ConnectionFailed, InvalidArgument, NoProcessGroup, NotFound, OutOfMemory, OutOfRange,
                     Overloaded, PermdError, ProtocolError, ServerError, Timeout, Unauthenticated, Unavailable,
                     Unsupported)
from .permutation import Permutation
from .client import Client, TokenFileWarning
from .sampler import Sampler
from .shards import ShardPlan, digest
from .layout import LayoutError, ShardLayout
from .mixture import Mixture, Sharded, reweight_stage  # noqa: F401 (docs/mixtures.md)

__version__ = "0.1.0"
__all__ = ["Permutation", "Sampler", "Client", "ShardPlan", "digest", "Mixture", "reweight_stage", "PermdError",
           "NotFound", "Conflict", "InvalidArgument", "OutOfRange", "Unauthenticated", "Overloaded", "ConnectionFailed",
           "Timeout", "OutOfMemory", "ProtocolError", "Unsupported", "ServerError", "Unavailable", "NoProcessGroup",
           "TokenFileWarning"]

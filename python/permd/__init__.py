"""permd: stateless, resumable epoch permutations for distributed training.

    permd.Permutation(seed, epoch, size)      one epoch's order, computed on demand
    permd.Sampler(dataset, num_replicas, rank, seed=..., mode="exact")   a DistributedSampler drop-in
    permd.Client(socket=...)                  the permd daemon: datasets, fetch, stream, inverse, stats
"""
from .errors import (Conflict, ConnectionFailed, InvalidArgument, NotFound, OutOfRange, Overloaded, PermdError,
                     Timeout, Unauthenticated)
from .permutation import Permutation
from .client import Client
from .sampler import Sampler

__version__ = "0.1.0"
__all__ = ["Permutation", "Sampler", "Client", "PermdError", "NotFound", "Conflict", "InvalidArgument",
           "OutOfRange", "Unauthenticated", "Overloaded", "ConnectionFailed", "Timeout"]

"""pstrain's Python client: a worker of your own on a pstrain cluster.

pstrain.Session (pstrain/session.py) is the worker side over libpstrain.so
(registration, pulls, pushes, embedding rows, progress); pstrain.torch puts
a PyTorch nn.Module on it. Guide: docs/pytorch.md.
"""
from .session import (AbortedError, CancelledError, DeadlineExceededError, Error,
                      FailedPreconditionError, InvalidArgumentError, NotFoundError,
                      PermissionDeniedError, ResourceExhaustedError, Session,
                      UnauthenticatedError, UnavailableError, Variable)
from .safetensors import write_safetensors

__all__ = ["Session", "Variable", "Error", "InvalidArgumentError", "UnauthenticatedError",
           "PermissionDeniedError", "UnavailableError", "DeadlineExceededError",
           "FailedPreconditionError", "NotFoundError", "ResourceExhaustedError",
           "CancelledError", "AbortedError", "write_safetensors"]

"""The layers of common/, lowest first, and who may depend on each.

A package of common/ is visible to its own layer, the layers above it and
the roles, the CLI and the tests; never to a layer below it, so a dependency
that runs back up fails Bazel's visibility check at analysis time.
"""

LAYERS = [
    "base",  # status, logging, tensors, bytes, CRC32C, histograms, stop signals
    "storage",  # Env (files), the fault-injecting Env, checkpoints, tensor files
    "cluster",  # cluster spec, config, placement, sizing, Slurm
    "security",  # tokens, roles and TLS credentials
    "rpc",  # channels, servers, deadlines, frames, call windows, call stats
    "client",  # the PS and chief clients
    "observability",  # /metrics and health, TensorBoard events
    "runtime",  # a daemon's start-up: flags to config, credentials, allocator
]

_USERS = [
    "//chief:__subpackages__",
    "//common/testing:__pkg__",  # test support, used by tests only
    "//ps_server:__subpackages__",
    "//tests:__subpackages__",
    "//tools:__subpackages__",
    "//worker:__subpackages__",
]

def visible_from_above(layer):
    """The visibility list of `layer`'s package: itself, the layers above, the users."""
    above = LAYERS[LAYERS.index(layer):]
    return ["//common/%s:__pkg__" % name for name in above] + _USERS

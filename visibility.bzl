"""Who may depend on each layer (docs/architecture.md, "Layers"), in one place for the BUILD files.

The dependency order is launcher/ -> ipc/ -> runtime/ and cli/ -> train/ -> nn/ -> runtime/, with
train/ -> collectives/ -> ipc/: nn/ and cli/ never use shared memory or communicators directly.
tests/layering checks the same order on the sources' includes.
"""

# Shared memory: the launcher (segment cleanup), the collectives and train/.
IPC_USERS = [
    "//bench:__subpackages__",
    "//collectives:__subpackages__",
    "//ipc:__subpackages__",
    "//launcher:__subpackages__",
    "//tests:__subpackages__",
    "//train:__subpackages__",
]

# Communicators: train/ (and the benchmarks that measure them).
COLLECTIVES_USERS = [
    "//bench:__subpackages__",
    "//collectives:__subpackages__",
    "//tests:__subpackages__",
    "//train:__subpackages__",
]

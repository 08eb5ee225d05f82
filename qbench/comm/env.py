"""The environment variables a launcher sets for a rank's communicator. Below the package's
``__init__`` so that a backend (``torchdist``) reads them without importing the package that
selects it. No torch.
"""

import os

from qbench.errors import UserError

# A torch.distributed init_method (``file:///tmp/...``) for ranks a launcher started itself;
# unset, a rank joins by env:// (MASTER_ADDR / MASTER_PORT, as torchrun and srun set them).
INIT_METHOD_ENV = "QBENCH_INIT_METHOD"

# Where mpirun (Open MPI 5: OMPI_*, PRRTE's PMIx) tells a process its rank before MPI starts.
MPI_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK")

# Ranks per node, as torchrun sets it (qbench's own launchers set it from the topology).
LOCAL_WORLD_SIZE_ENV = "LOCAL_WORLD_SIZE"


def ranks_per_node(world_size: int) -> int:
    """Ranks per node G: node n holds ranks n G .. n G + G - 1 (hierarchical schemes split
    their communicators by it); unset: all ranks on one node."""
    text = os.environ.get(LOCAL_WORLD_SIZE_ENV, "")
    if not text:
        return world_size
    if not text.isdigit() or int(text) < 1 or world_size % int(text):
        raise UserError(
            f"{LOCAL_WORLD_SIZE_ENV}={text} must be a ranks-per-node count that divides the "
            f"world size {world_size}; e.g. {LOCAL_WORLD_SIZE_ENV}={world_size}"
        )
    return int(text)

"""The environment variables a launcher sets for a rank's communicator. Below the package's
``__init__`` so that a backend (``torchdist``) reads them without importing the package that
selects it. No torch.
"""

# A torch.distributed init_method (``file:///tmp/...``) for ranks a launcher started itself;
# unset, a rank joins by env:// (MASTER_ADDR / MASTER_PORT, as torchrun and srun set them).
INIT_METHOD_ENV = "QBENCH_INIT_METHOD"

# Where mpirun (Open MPI 5: OMPI_*, PRRTE's PMIx) tells a process its rank before MPI starts.
MPI_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK")

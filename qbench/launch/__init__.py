"""From the run matrix to processes: the sweep driver, torchrun / mpirun, Slurm, links."""

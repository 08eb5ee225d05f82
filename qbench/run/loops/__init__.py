"""The training loops a rank runs (``qbench.spec.loop`` chooses which): the flat loop (one flat
gradient, a scheme's exchange after backward), DDP's and FSDP's, epoch mode's evaluation, and
what every loop shares (``training``). Replayed runs' loops are in ``qbench.run.replay``."""

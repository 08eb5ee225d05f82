"""Asynchronous parameter server with double quantization (seed 003, Yu, Wu and Huang):
AsyLPG, Sparse-AsyLPG and accelerated AsyLPG. Scheme ``async-ps``; its parameters are
validated by the catalog (``qbench.catalog.schemes.ASYNC_PS``) into :class:`AsyncParams`.

Rank 0 is a dedicated server holding the fp32 master model; ranks 1..K-1 are workers over K-1
partitions of the training set. There is no barrier: each worker repeatedly pulls the model
(quantized by ``down``: the model half of double quantization), computes a gradient on its next
batch, encodes it with the run's compressor (the gradient half) and pushes it. The server
applies each gradient when it arrives, one version per update, and holds a worker's next model
back while handing it out could let some update exceed the staleness bound tau
(:func:`qbench.run.async_ps.protocol.may_hand_out`). Variants:

* ``asylpg``: the server steps x <- x - lr (g + wd x) (plain SGD, as AsyLPG; no momentum);
* ``sparse``: the same, with each gradient top-k sparsified then quantized (``ratio``);
* ``accelerated``: Nesterov momentum with beta = the scenario's ``momentum``: workers get the
  look-ahead point y = x + beta v, and the server steps v <- beta v - lr (g + wd x), x <- x + v.

Seed 003 builds the three on SVRG (a snapshot and its full gradient per epoch); qbench's
workers send plain stochastic gradients, as every other scheme here does.

Rows: a worker writes one per push; the server one per update it applied, with the update's
staleness, the version it produced, the pushing worker's batch loss and ``cum_bits``, all bits
through the server so far (up and down, headers included): seed 003's "bits transmitted until
the training loss first falls below a threshold" (:mod:`qbench.run.async_ps.metrics`).

The package reads a rank's set-up through :class:`AsyncParts` only, which
``qbench.run.loops.flat.async_parts`` builds; it never imports the training loops. Modules:
``protocol`` (messages, the staleness rule, the gradient codec), ``server`` (rank 0),
``client`` (a worker rank: the others), ``parts`` (what they read of a rank), ``metrics`` (pure
pandas over the rows). Importing the package or ``metrics`` loads no torch: reports read the
metric.
"""

from __future__ import annotations

from qbench.run.async_ps.parts import SERVER, AsyncParams, AsyncParts, Batches, shard

__all__ = ["SERVER", "AsyncParams", "AsyncParts", "Batches", "run", "shard"]


def run(parts: AsyncParts) -> None:
    """Serve (rank 0) or work (the others) until the server has spent its budget of updates."""
    # torch: loaded when a rank runs; importing the package loads none (reports read metrics)
    from qbench.run.async_ps import client, server

    if parts.comm.rank == SERVER:
        server.serve(parts)
    else:
        client.work(parts)

"""Micro-benchmarks of single pieces (kernels, collectives), apart from sweeps.

Each benchmark is a pure measuring module returning rows, a renderer that prints them for
people and a versioned JSON document written atomically; a benchmark of several modules is a
sub-package named after it:

* ``kernels.py``, printed by ``render.py`` (which also holds the consoles and number formats
  the other benchmarks print with);
* ``comm/``: the sweep and its launches (``comm/__init__.py``), the per-rank entry
  (``worker``), the pure numbers (``results``) and the tables with the command (``render``);
* ``numerics/``: the simulation (``numerics/__init__.py``), the reduction orders (``orders``)
  and where the ranks' gradients come from (``gradients``); ``qbench.report.numerics``
  summarises and prints its document.
"""

from __future__ import annotations

"""Micro-benchmarks of single pieces (kernels, collectives), apart from sweeps.

Each benchmark is a pure measuring module returning rows (``kernels.py``), a renderer that
prints them for people (``render.py``) and a versioned JSON document written atomically.
"""

from __future__ import annotations

"""``python -m qbench.cli ...``: the same as the ``qbench`` command."""

from qbench.cli import main

main()

"""From a scenario to the run matrix (no torch, no processes).

The scenario's keys (``scenario``, ``checks``), the layer policy (``layers``), emulated links
(``network``) and the expansion into run specs (``matrix``)."""

"""Declared clusters: methods projected from the facts a user knows (no torch).

A machine is described by its devices, compute, codec speed, links and collective (issue 46);
qbench projects every method's iteration on it, and checks that projection against a real
machine's published numbers.

Modules, in the order data flows: :mod:`units` (rates and durations as written), :mod:`declared`
(the cluster file), :mod:`study` (the workloads, methods and GPU counts projected),
:mod:`collectives` (the collectives' times on declared links), :mod:`calibrate` (host or link
values fitted on named measured cells), :mod:`project` (iteration breakdown, speedup,
scalability), :mod:`validate` (predicted against published, the error band). No torch here.
"""

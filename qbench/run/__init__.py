"""One rank's side of a run (torch): the worker and its training loops.

Flat aggregation after backward, DDP buckets during it, the asynchronous parameter server;
compute precision, accuracy-mode epochs and telemetry."""

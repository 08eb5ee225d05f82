"""Result files, the hand-over between stages: schema, paths, the lock.

The versioned record schema (``schema``), the only module that knows result paths
(``store``), a run's compressor and scheme as typed catalog specs (``view``), and the
one-sweep-per-directory lock."""

"""Result files, the hand-over between stages: schema, paths, the lock.

The versioned record schema (``schema``), the only module that knows result paths
(``store``), and the one-sweep-per-directory lock."""

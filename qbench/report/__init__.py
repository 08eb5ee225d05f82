"""From result files to answers: summaries, tables, the page, figures.

Summaries (``stats``, pure pandas), tables (``tables``), the report page (``page``),
A/B comparisons (``ab``) and figures (``plots``). Reads files only: never torch, the worker
or a launcher."""

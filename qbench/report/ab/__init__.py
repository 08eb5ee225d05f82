"""A/B comparison of two results directories (``qbench report A B``): the numbers
(``stats``: matched configurations, ratios with bootstrap intervals, the CI gate) and the
comparison as people read it (``report``: the files, the table, the warnings).

Reads files only; never imports torch.
"""

"""Run on 2+ ranks (gloo): the evaluated model is the mean over ranks, traffic is not counted."""

from __future__ import annotations

import torch
from torch import nn

from qbench import comm
from qbench.run.loops import epochs


def main() -> None:
    cm = comm.connect("gloo", timeout_s=60)
    k, r = cm.world_size, cm.rank
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    with torch.no_grad():  # rank-dependent weights, as gossip ranks have
        for p in model.parameters():
            p.add_(float(r))
        model[1].running_mean.add_(float(r))
    sent = cm.bytes_sent
    avg = epochs.averaged(model, cm)
    assert cm.bytes_sent == sent, "evaluation traffic counted as training bytes"
    shift = (k - 1) / 2  # mean of 0..k-1
    for p, q in zip(model.parameters(), avg.parameters(), strict=True):
        torch.testing.assert_close(q, p - r + shift, atol=1e-6, rtol=0)
    torch.testing.assert_close(avg[1].running_mean, model[1].running_mean - r + shift)
    data = epochs.EpochData(
        train_x=torch.zeros(2, 4), train_y=torch.zeros(2, dtype=torch.long),
        test_x=torch.randn(5, 4), test_y=torch.full((5,), r % 3), num_classes=3,
    )  # fmt: skip
    scores = epochs.evaluate(avg, data, cm)
    assert 0.0 <= scores["top1"] <= 1.0 and scores["test_loss"] > 0, scores
    cm.close()


if __name__ == "__main__":
    main()

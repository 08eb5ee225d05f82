"""``qbench init [FILE] [--workload]``: a commented starter scenario (and model / data factory
module) that runs as written, so a new user starts from something that works."""

from __future__ import annotations

from pathlib import Path

import click

from qbench.errors import UserError

WORKLOAD_MODULE = "workload"

_HEADER = """\
# A starter scenario from `qbench init`. Edit it, then see the runs it makes (and what it
# excludes, and why), run them, and report (the summary table, figures, report page):
#   qbench sweep {file} --dry-run
#   qbench sweep {file}
#   qbench report results/{name}
# Every key: docs/scenarios.md. Your own model, data, optimizer and loss: docs/workloads.md.
name: {name}
"""
_ZOO = """\
model: mlp                  # `qbench models` lists the zoo; yours: {factory: "mypkg.nets:build"}
dataset: synthetic          # random inputs of the model's shape; real: digits, fashion-mnist, ...
"""
_OWN = """\
model:                      # your model: {module}.py's build(**params), run from its directory
  factory: "{module}:build"
  name: mynet               # its label in run ids and reports
  params: {{hidden: 128}}
  input_shape: [3, 32, 32]  # one sample, without the batch
  num_classes: 10
dataset: {{factory: "{module}:data"}}   # or `synthetic`: random inputs of input_shape
"""
_REST = """\
world_size: 2               # ranks (processes), one CPU thread each
backend: gloo               # gloo (CPU), mpi, or nccl (one GPU per rank)
scheme: ddp                 # PyTorch DDP; a qbench compressor under ddp is sent per DDP bucket
# scheme: fsdp              # sharded (FSDP2): the compressor is what the reduce-scatter sends
compressor:
  - none                    # fp32: DDP's own allreduce, the baseline
  - {name: qsgd, bits: 4, bucket_size: 512}
# optimizer: {name: adam, lr: 0.001}   # sgd, momentum (the default), nesterov, adam, adamw
# loss: cross-entropy                  # nll, mse, l1, smooth-l1, bce-logits, or a factory
batch_size: 32              # per rank
warmup: 5                   # iterations kept on disk, dropped from summaries
iterations: 20              # measured iterations; `epochs: 3` trains and evaluates instead
# network: {bandwidth: 1gbit}   # emulate a slow link (needs root; docs/network.md)
"""
_MODULE = '''\
"""Your workload for qbench: a model factory and a dataset factory (docs/workloads.md).

The scenario names them by import path ("{module}:build", "{module}:data"); run qbench from this
directory so that the ranks import this module too.
"""

import torch
from torch import nn
from torch.utils.data import TensorDataset


def build(hidden: int = 128, classes: int = 10) -> nn.Module:
    """The model, called on every rank with the scenario's `params` (torch is seeded first, so
    every rank starts from the same weights). Return any nn.Module, e.g.
    torchvision.models.resnet18(weights=None, num_classes=classes)."""
    return nn.Sequential(
        nn.Flatten(), nn.Linear(3 * 32 * 32, hidden), nn.ReLU(), nn.Linear(hidden, classes)
    )


def data(samples: int = 2048, classes: int = 10) -> tuple[TensorDataset, TensorDataset]:
    """The data: (train, test) datasets of (input, target) pairs; each rank trains on its
    share of train, and accuracy mode (`epochs:`) evaluates on test. Replace with your own,
    e.g. torchvision.datasets.CIFAR10(root, download=False, transform=ToTensor())."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(samples, 3, 32, 32, generator=g)
    y = (x.flatten(1) @ torch.randn(3 * 32 * 32, classes, generator=g)).argmax(1)
    cut = samples * 4 // 5
    return TensorDataset(x[:cut], y[:cut]), TensorDataset(x[cut:], y[cut:])
'''


def starter(file: Path, workload: bool) -> dict[Path, str]:
    """The files ``qbench init`` writes: the scenario, and with ``workload`` the module."""
    name = file.stem if _plain(file.stem) else "my-sweep"
    text = _HEADER.format(file=file, name=name)
    text += _OWN.format(module=WORKLOAD_MODULE) if workload else _ZOO
    files = {file: text + _REST}
    if workload:
        files[file.parent / f"{WORKLOAD_MODULE}.py"] = _MODULE.format(module=WORKLOAD_MODULE)
    return files


def _plain(name: str) -> bool:
    return bool(name) and not name.startswith(".") and all(c.isalnum() or c in "-_." for c in name)


@click.command()
@click.argument("file", default="scenario.yaml", required=False)
@click.option(
    "--workload", is_flag=True,
    help=f"Also write {WORKLOAD_MODULE}.py beside FILE: a model and a dataset factory the "
    "scenario runs, to replace with your own.",
)  # fmt: skip
def init(file: str, workload: bool) -> None:
    """Write a commented starter scenario to FILE [scenario.yaml]; never overwrites a file."""
    files = starter(Path(file), workload)
    taken = [str(p) for p in files if p.exists()]
    if taken:
        raise UserError(
            f"{taken[0]} exists and qbench init never overwrites; name another file, e.g. "
            "`qbench init my-sweep.yaml`"
        )
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    where = Path(file).parent
    cd = f"cd {where} && " if workload and str(where) not in ("", ".") else ""
    written = " and ".join(str(p) for p in files)
    click.echo(
        f"wrote {written}; next: {cd}qbench sweep {Path(file).name if cd else file} --dry-run"
    )

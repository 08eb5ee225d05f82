"""``qbench cost predict`` and ``crossover`` options -> the configurations to predict.

Scheme and compressor specs are read here, once, by the catalog (no torch): the model gets
typed values, never option text.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import replace

from qbench import catalog
from qbench.catalog import model_params, specs
from qbench.costmodel.config import Config
from qbench.costmodel.model import CostModel, compute_fits
from qbench.costmodel.schemes import (
    ALLREDUCE,
    BACKWARD,
    BACKWARD_SCHEMES,
    DDP,
    NONE,
    PROJECTED,
    Scheme,
    full_precision,
    incompatibility,
    is_torch_hook,
    nominal_bits_per_value,
)
from qbench.errors import UserError
from qbench.spec import network
from qbench.spec.network import Link, Topology

DEFAULT_SCHEMES = ("allreduce", "reduce-broadcast", "integer-allreduce", PROJECTED)


DEFAULT_COMPRESSORS = ("qsgd:bits=4,bucket_size=512",)


DEFAULT_NUMEL = 2**24
"""A 64 MiB fp32 gradient (bench comm's default largest size) when no size or workload is given."""


def build_configs(
    m: CostModel, *, schemes: Sequence[str] = (), compressors: Sequence[str] = (),
    backends: Sequence[str] = (), world_sizes: Sequence[int] = (),
    bandwidths: Sequence[str] = (), numels: Sequence[str] = (), workload: str | None = None,
    batch_size: int | None = None, compute_s: float | None = None, step_s: float | None = None,
    fp32_numel: str = "0", host_cores: int | None = None, tbf_burst: bool = True,
    overlap: str | None = None, nodes: int | None = None, ranks_per_node: int | None = None,
    intra_bandwidth: str | None = None,
) -> tuple[list[Config], list[str]]:  # fmt: skip
    """Every combination of the options (fp32 allreduce first); notes say what was skipped.
    ``overlap``: ``backward`` runs every scheme that can per DDP bucket, ``none`` none."""
    for k in world_sizes:
        if k < 1:
            raise UserError(f"--world-size must be >= 1, got {k}; e.g. `--world-size 2 4 8`")
    if host_cores is not None and host_cores < 1:
        raise UserError(f"--host-cores must be >= 1, got {host_cores}")
    for name, v in (("--compute-s", compute_s), ("--step-s", step_s)):
        if v is not None and not (math.isfinite(v) and v >= 0):
            raise UserError(f"{name} must be seconds >= 0, got {v}")
    scheme_list = [scheme_option(s) for s in schemes or DEFAULT_SCHEMES]
    comps = [compressor_info(c, m) for c in (compressors or DEFAULT_COMPRESSORS)]
    nets = [_network(b) for b in bandwidths] or m.links
    backs = list(backends) or m.backends
    if not nets or not backs:
        raise UserError("the model has no fitted collectives; fit it with `--comm FILE.json`")
    unknown = [b for b in backs if b not in m.backends]
    if unknown:
        raise UserError(
            f"backend {unknown[0]!r} not in the model; fitted: {', '.join(m.backends) or 'none'}"
        )
    sizes: list[int | None] = [count(n, "--model-numel") for n in numels]
    if not sizes:
        sizes = [None] if workload and compute_fits(m, workload) else [DEFAULT_NUMEL]
    f32 = count(fp32_numel, "--fp32-numel", minimum=0)
    Comp = tuple[catalog.CompressorSpec, float | None]
    combos: list[tuple[Scheme, Comp]] = [(ALLREDUCE, (NONE, 32.0))]
    notes: list[str] = []
    for s, c in itertools.product(scheme_list, comps):
        got = _scheme_for(s, c[0], overlap, notes)
        if got is None or (got == ALLREDUCE and full_precision(c[0])):
            continue
        why = incompatibility(got, c[0])
        if why:
            notes.append(f"skipped {got.label} {c[0].label}: {why}")
        elif (got, c) not in combos:
            combos.append((got, c))
    cluster = _cluster(nodes, ranks_per_node, intra_bandwidth, world_sizes)
    configs = []
    for back, net, k, n, (s, (comp, bits)) in itertools.product(
        backs, nets, world_sizes or (2,), sizes, combos
    ):
        topo = None if cluster is None else replace(cluster, inter=net)
        configs.append(Config(
            scheme=s, compressor=comp, bits_per_value=bits, backend=back, network=net,
            world_size=k if topo is None else topo.world_size, topology=topo, numel=n,
            fp32_numel=0 if full_precision(comp) else f32, workload=workload,
            batch_size=batch_size, compute_s=compute_s, step_s=step_s, host_cores=host_cores,
            tbf_burst=tbf_burst,
        ))  # fmt: skip
    return configs, list(dict.fromkeys(notes))


def _scheme_for(
    s: Scheme, compressor: catalog.CompressorSpec, overlap: str | None, notes: list[str]
) -> Scheme | None:
    """The scheme under ``--overlap`` (None, with a note, where it cannot run per bucket); ``ddp``
    with a qbench compressor is reduce-broadcast per bucket, as in scenarios."""
    if overlap == BACKWARD and not s.backward and s.name not in BACKWARD_SCHEMES:
        notes.append(f"skipped {s.label}: only {', '.join(BACKWARD_SCHEMES)} run per bucket")
        return None
    s = s.per_bucket(overlap)
    if s.name == DDP and not is_torch_hook(compressor):
        rb = Scheme("reduce-broadcast", backward=True, bucket_cap_mb=s.bucket_cap_mb)
        notes.append(f"ddp runs {compressor.label} as {rb.label} (qbench's hook), as scenarios do")
        return rb
    return s


def scheme_option(text: str) -> Scheme:
    """A ``--scheme`` spec (``reduce-broadcast:overlap=16``), validated by the catalog;
    ``lowprec-allreduce`` is the model's own projection. The cost model's old spellings
    (``+overlap16``, ``+backward``) are refused with the catalog spec that says the same."""
    spec = specs.mapping(text, "scheme")
    if spec["name"] == PROJECTED:
        if len(spec) > 1:
            raise UserError(f"scheme {text!r}: {PROJECTED} takes no parameters")
        return Scheme(PROJECTED)
    if "+" in spec["name"]:
        raise UserError(f"scheme {text!r}: write it as a spec, e.g. `--scheme {_as_spec(text)}`")
    return Scheme.of(catalog.scheme(spec))


def _as_spec(label: str) -> str:
    """The catalog spec of an old ``name+key<value>`` spelling, for the refusal's fix."""
    try:
        return specs.to_cli(catalog.scheme_from_label(label).given)
    except UserError:
        return "reduce-broadcast:overlap=16"


def compressor_info(spec: str, m: CostModel) -> tuple[catalog.CompressorSpec, float | None]:
    """(catalog spec, wire bits per value) of a ``--compressor`` spec; None bits for PowerSGD,
    whose DDP payloads the model measured per bucket."""
    c = catalog.compressor(specs.parse_cli(spec))  # UserError naming a bad name or value
    bits = nominal_bits_per_value(c)
    if bits is not None:
        return c, bits
    if c.label in m.compressors:
        return c, m.compressors[c.label]
    if c.entry.hook_only:
        return c, None
    raise UserError(
        f"{c.label}: payload size depends on the data and the model has no measurement of it; "
        "fit with bench data that includes it"
    )


def _cluster(
    nodes: int | None, per_node: int | None, intra: str | None, world_sizes: Sequence[int]
) -> Topology | None:
    """The topology of ``--nodes N --ranks-per-node G [--intra-bandwidth RATE]`` (its inter
    link set per ``--bandwidth``); None without them: one level."""
    if nodes is None and per_node is None:
        if intra is not None:
            raise UserError("--intra-bandwidth needs --nodes and --ranks-per-node")
        return None
    if nodes is None or per_node is None:
        raise UserError("give --nodes and --ranks-per-node together, e.g. `--nodes 16 "
                        "--ranks-per-node 8`")  # fmt: skip
    for name, v in (("--nodes", nodes), ("--ranks-per-node", per_node)):
        if v < 1:
            raise UserError(f"{name} must be >= 1, got {v}; e.g. `--nodes 16 --ranks-per-node 8`")
    if world_sizes:
        raise UserError(
            f"--world-size is --nodes x --ranks-per-node ({nodes * per_node}) here; drop it"
        )
    return Topology(
        nodes, per_node, intra=Link() if intra is None else _network(intra, "--intra-bandwidth")
    )


def _network(text: str, option: str = "--bandwidth") -> Link:
    """The link of a ``--bandwidth`` option, labelled in lower case as fits name theirs
    (``1gbit``, ``unshaped``)."""
    t = text.strip().lower().replace(" ", "")
    try:
        return network.option(t)
    except UserError:
        raise UserError(
            f"{option} must be a rate in kbit/mbit/gbit or `unshaped`, got {text!r}; "
            f"e.g. `{option} 1gbit 10gbit`"
        ) from None


def count(text: str, option: str, minimum: int = 1) -> int:
    """``61M``, ``2.5e6``, ``500k``, ``25_000_000`` -> int (UserError otherwise)."""
    try:
        return model_params.count(minimum)(str(text))
    except ValueError as e:
        raise UserError(f"{option} must be {e}, got {text!r}") from None

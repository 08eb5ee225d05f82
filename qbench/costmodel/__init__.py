"""Calibrated cost model: fit on measurements, predict iteration times.

Fits alpha-beta, codec and compute parameters and DDP bucket profiles.

Pure numpy / pandas over the files qbench writes (``qbench bench comm --json``, ``qbench bench
kernels --json``, sweep results directories); never torch, a launcher or a process. The
command line is ``qbench cost fit | predict | crossover | validate`` (``qbench.cli.cost``);
docs/costmodel.md gives the overview. Each module's docstring carries its formulas:

* ``schemes``: the schemes and compressor labels the model knows;
* ``formulas``: alpha-beta times per collective, emulated links' tbf credit, other link rates,
  and each scheme's traffic as the catalog declares it (``qbench.catalog.schemes.traffic``:
  ``comm_plan``, codec units);
* ``lsq``: the weighted non-negative least squares of the fits;
* ``model``: the fitted parameters (``CostModel``, saved as JSON);
* ``inputs``: reading bench JSON and results directories (``run_table``);
* ``points``: measurements as fit points; compute and imbalance from runs;
* ``phases``: encode / decode phase times from the codec fits, the collective fit for a link;
* ``fit``: ``fit`` (``qbench cost fit``);
* ``config`` and ``predict``: ``Config``, ``predict``, ``predict_frame`` (``qbench cost predict``);
* ``profiles`` and ``overlap``: DDP runs (buckets during backward), fitted and predicted;
* ``crossover``: the link rate where a configuration beats DDP fp32 (``qbench cost crossover``);
* ``validate``: predicted against measured (``qbench cost validate``).
"""

from __future__ import annotations

from qbench.catalog.schemes.traffic import int_sum_bytes
from qbench.costmodel.config import Config, Prediction
from qbench.costmodel.crossover import Crossover, crossover
from qbench.costmodel.fit import fit, fit_collectives
from qbench.costmodel.fit.lsq import WEIGHT_POWER, Quality, fit_collective, fit_linear, nnls
from qbench.costmodel.formulas import (
    FALLBACK,
    CommItem,
    allreduce_wire,
    burst_s,
    codec_units,
    collective_msgs,
    collective_time,
    collective_wire,
    comm_plan,
    comm_time,
    payload_bits,
    scale_beta,
)
from qbench.costmodel.inputs import (
    COMM_SCHEMA,
    KERNELS_SCHEMA,
    RUN_PARTS,
    bench_key,
    comm_rows,
    held_out,
    kernel_rows,
    load_input,
    run_key,
    run_table,
)
from qbench.costmodel.model import (
    SCHEMA,
    BucketProfile,
    CodecFit,
    CollectiveFit,
    ComputeFit,
    CostModel,
    compute_fits,
    imbalance_key,
    solo_key,
)
from qbench.costmodel.overlap import exposed, predict_backward, timeline
from qbench.costmodel.phases import codec_time, collective_fit, wire_bits
from qbench.costmodel.predict import PREDICTION_COLUMNS, predict, predict_frame
from qbench.costmodel.profiles import fit_bucket_profiles
from qbench.costmodel.schemes import (
    DDP,
    FP32,
    PROJECTED,
    SCHEMES,
    Scheme,
    incompatibility,
    nominal_bits_per_value,
)
from qbench.costmodel.validate import (
    TARGET_ERROR,
    VALIDATION_COLUMNS,
    ValidationSummary,
    summarize_validation,
    validate,
    validate_comm,
    validate_runs,
)

# fmt: off
__all__ = [
    "COMM_SCHEMA",
    "DDP",
    "FALLBACK",
    "FP32",
    "KERNELS_SCHEMA",
    "PREDICTION_COLUMNS",
    "PROJECTED",
    "RUN_PARTS",
    "SCHEMA",
    "SCHEMES",
    "TARGET_ERROR",
    "VALIDATION_COLUMNS",
    "WEIGHT_POWER",
    "BucketProfile",
    "CodecFit",
    "CollectiveFit",
    "CommItem",
    "ComputeFit",
    "Config",
    "CostModel",
    "Crossover",
    "Prediction",
    "Quality",
    "Scheme",
    "ValidationSummary",
    "allreduce_wire",
    "bench_key",
    "burst_s",
    "codec_time",
    "codec_units",
    "collective_fit",
    "collective_msgs",
    "collective_time",
    "collective_wire",
    "comm_plan",
    "comm_rows",
    "comm_time",
    "compute_fits",
    "crossover",
    "exposed",
    "fit",
    "fit_bucket_profiles",
    "fit_collective",
    "fit_collectives",
    "fit_linear",
    "held_out",
    "imbalance_key",
    "incompatibility",
    "int_sum_bytes",
    "kernel_rows",
    "load_input",
    "nnls",
    "nominal_bits_per_value",
    "payload_bits",
    "predict",
    "predict_backward",
    "predict_frame",
    "run_key",
    "run_table",
    "scale_beta",
    "solo_key",
    "summarize_validation",
    "timeline",
    "validate",
    "validate_comm",
    "validate_runs",
    "wire_bits",
]
# fmt: on

"""Property-based fuzzing of scenario files: every input gives a runnable matrix or the one-line
error, never a traceback.

Inputs are mostly valid keys (the Scenario dataclass's fields, so keys added later are fuzzed
too) with values of every type YAML can produce: ints (negative, huge), floats (nan, inf),
strings, bools, null, lists, nested mappings, compressor / scheme / model mappings whose names
and parameters mix the real ones with junk. Plus YAML text mutated or made up, valid or not.

Deterministic for CI: derandomized, no example database.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from qbench import catalog, compress, data, models
from qbench.catalog import models as zoo
from qbench.catalog import workloads
from qbench.catalog.params import Param
from qbench.errors import UserError
from qbench.spec import layers, scenario
from qbench.spec.matrix import Matrix, expand
from qbench.spec.runspec import RunSpec
from tests.invoke import qbench

CHECKED_RUNS = 8  # of each matrix: run ids and labels are computed for these
LIMIT_S = 10  # per input; a hang is a bug too
FIELDS = [f.name for f in dataclasses.fields(scenario.Scenario) if f.name != "source"]

SETTINGS = settings(
    max_examples=1000,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# ---- what the code knows, looked up so that new names are fuzzed too ------------------------


def _model_names() -> list[str]:
    names = getattr(models, "names", None)
    return list(names()) if callable(names) else list(getattr(models, "MODELS", {}))


def _model_params() -> dict[str, list[str]]:
    """Parameter names of the models that take some (from the catalog)."""
    return {n: list(e.params) for n, e in zoo.MODELS.items() if e.params}


def _literal_choices() -> list[str]:
    """Every listed choice of a compressor or scheme parameter (the catalog's)."""
    entries = [*catalog.COMPRESSORS.values(), *catalog.SCHEMES.values()]
    return sorted({str(c) for e in entries for p in e.params for c in p.choices})


COMPRESSORS = sorted(catalog.COMPRESSORS)
COMPRESSOR_PARAMS = sorted({p.name for e in catalog.COMPRESSORS.values() for p in e.params})
SCHEMES = ["auto", *sorted(catalog.SCHEMES)]
SCHEME_PARAMS = ["overlap", "topology", "algorithm", "gamma", "down"]
MODELS = _model_names()
MODEL_PARAMS_BY_NAME = _model_params()
MODEL_PARAMS = sorted({p for ps in MODEL_PARAMS_BY_NAME.values() for p in ps})
CHOICES = [
    *scenario.BACKENDS, *getattr(scenario, "DEVICES", ()), *getattr(scenario, "LAUNCHERS", ()),
    *data.DATASETS, *_literal_choices(), "ring", "torus", "dpsgd", "choco", "deepsqueeze",
    "unshaped", "auto",
]  # fmt: skip
JUNK = ["", " ", "x", "qsgd ", "QSGD", "none\n", "1gbit", "-1", "nan", "é", "a/b", ".hidden", "~"]
NAMES = st.sampled_from(sorted({*COMPRESSORS, *SCHEMES, *MODELS, *CHOICES, *JUNK}))

# ---- values ---------------------------------------------------------------------------------

INTS = st.one_of(
    st.integers(-3, 70),
    st.sampled_from([0, 1, 2, 4, 8, 16, 512, 2**31, 2**63, -(2**63), 10**20]),
    st.integers(),
)
FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 0.5, 1.0, 1e-300, 1e300, float("nan"), float("inf")]),
)
RATES = st.one_of(
    st.sampled_from(["1gbit", "100mbit", "10 kbit", "0gbit", "1.5gbit", "1Gbit", "fast"]),
    st.builds(lambda n, u: f"{n}{u}", INTS, st.sampled_from(["kbit", "mbit", "gbit", "", "bit"])),
)
SCALARS = st.one_of(
    st.none(), st.booleans(), INTS, FLOATS, NAMES, RATES, st.text(max_size=10),
)  # fmt: skip
KEYS = st.one_of(
    st.sampled_from([*FIELDS, *COMPRESSOR_PARAMS, *SCHEME_PARAMS, *MODEL_PARAMS, "name"]),
    st.text(max_size=8), INTS, st.booleans(), st.none(),
)  # fmt: skip
ANY = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(KEYS, inner, max_size=4)),
    max_leaves=12,
)


@st.composite
def named(draw: st.DrawFn, names: list[str], params: list[str]) -> Any:
    """A registry entry of any shape: names and parameters mix the real ones with junk."""
    name = draw(st.one_of(st.sampled_from(names), NAMES, SCALARS))
    if draw(st.integers(0, 3)) == 0:
        return name
    keys = draw(st.lists(st.one_of(st.sampled_from(params), KEYS), max_size=4, unique_by=repr))
    out = {k: draw(_param_value()) for k in keys}
    if draw(st.integers(0, 9)):
        out["name"] = name
    return out


def _param_value() -> st.SearchStrategy[Any]:
    return st.one_of(INTS, FLOATS, st.booleans(), st.none(), NAMES, RATES, ANY)


def axis(element: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """One value or a list (a sweep), sometimes empty."""
    return st.one_of(element, st.lists(element, max_size=3))


def valid_axis(element: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """One value or a short list (matrices stay small: a dozen axes multiply)."""
    return st.one_of(element, st.lists(element, min_size=1, max_size=2))


# ---- mostly valid values: what a user would write, typed from the code ------------------------


def _typed_value(param: Param) -> st.SearchStrategy[Any]:
    """A plausible value for a catalog parameter (its choices, small numbers of its type)."""
    if param.choices:
        return st.sampled_from(param.choices)
    kinds = param.kind if isinstance(param.kind, tuple) else (param.kind,)
    options: list[st.SearchStrategy[Any]] = [st.just(param.default)]
    if bool in kinds:
        options.append(st.booleans())
    if int in kinds:
        options.append(st.one_of(st.integers(0, 64), st.sampled_from([128, 512, 4096])))
    if float in kinds:
        options.append(st.one_of(st.floats(0, 1), st.sampled_from([0.01, 0.5, 1.0, 2.0])))
    return st.one_of(*options)


@st.composite
def good_compressor(draw: st.DrawFn) -> Any:
    name = draw(st.sampled_from(COMPRESSORS))
    entry = catalog.COMPRESSORS[name]
    params = (
        draw(st.lists(st.sampled_from(entry.params), max_size=3, unique=True))
        if (entry.params)
        else []
    )
    if not params and draw(st.booleans()):
        return name
    return {"name": name, **{p.name: draw(_typed_value(p)) for p in params}}


GOOD_SCHEME = st.one_of(
    st.sampled_from(SCHEMES),
    st.builds(lambda n, o: {"name": n, "overlap": o},
              st.sampled_from(["reduce-broadcast", "integer-allreduce"]), st.integers(1, 8)),
    st.fixed_dictionaries(
        {"name": st.just("gossip")},
        optional={"topology": st.sampled_from(["ring", "torus"]),
                  "algorithm": st.sampled_from(["dpsgd", "choco", "deepsqueeze"]),
                  "gamma": st.floats(0.01, 1)},
    ),
    st.builds(lambda c: {"name": "parameter-server", "down": c}, good_compressor()),
)  # fmt: skip
GOOD_MODEL = st.one_of(
    st.sampled_from(MODELS),
    *(
        st.fixed_dictionaries(
            {"name": st.just(name)},
            optional={p: st.one_of(st.integers(1, 10**6), st.sampled_from(["25M", "1k", "0.5"]))
                      for p in params},
        )
        for name, params in MODEL_PARAMS_BY_NAME.items()
    ),
    st.fixed_dictionaries(  # the user's own model: checked by spelling, never imported here
        {"factory": st.sampled_from(["mypkg.nets:build", "torchvision.models:resnet18"])},
        optional={"params": st.dictionaries(st.sampled_from(["width", "depth"]),
                                            st.integers(1, 64), max_size=2),
                  "input_shape": st.sampled_from([[784], [3, 32, 32]]),
                  "num_classes": st.integers(1, 100), "name": st.sampled_from(["net", "mine"])},
    ),
)  # fmt: skip
GOOD_NETWORK = st.one_of(st.just("unshaped"), st.builds(lambda r: {"bandwidth": r}, RATES))
GOOD_LAYERS = st.fixed_dictionaries(
    {},
    optional={
        "full_precision_below": st.one_of(st.just("auto"), st.integers(0, 10**5)),
        "quantized_fraction": st.floats(0.01, 1),
        "overrides": st.dictionaries(
            st.sampled_from(["*.bias", "fc.*", "*", "layer1.*"]),
            st.one_of(st.just("none"), good_compressor()),
            max_size=2,
        ),
    },
)
GOOD_FILTER = st.dictionaries(
    st.sampled_from(list(getattr(scenario, "FILTER_KEYS", ("backend",)))),
    st.one_of(NAMES, st.integers(1, 4), st.lists(NAMES, max_size=2), good_compressor()),
    min_size=1,
    max_size=2,
)
VALID: dict[str, st.SearchStrategy[Any]] = {
    "name": st.sampled_from(["smoke", "fuzz", "a-b_c.1"]),
    "model": valid_axis(GOOD_MODEL),
    "dataset": valid_axis(st.sampled_from(data.DATASETS)),
    "world_size": valid_axis(st.integers(1, 8)),
    "nodes": valid_axis(st.sampled_from([1, 1, 2])),
    "gpus_per_node": st.integers(1, 8),
    "backend": valid_axis(st.sampled_from(scenario.BACKENDS)),
    "device": valid_axis(st.sampled_from(getattr(scenario, "DEVICES", ("auto",)))),
    "scheme": valid_axis(GOOD_SCHEME),
    "compressor": valid_axis(good_compressor()),
    "network": valid_axis(GOOD_NETWORK),
    "batch_size": st.one_of(st.integers(1, 64), st.dictionaries(st.integers(1, 8),
                                                                st.integers(1, 64), min_size=1)),
    "warmup": st.integers(0, 5),
    "iterations": st.integers(1, 50),
    "lr": st.floats(0, 1),
    "momentum": st.floats(0, 1),
    "seed": valid_axis(st.integers(0, 3)),
    "repeats": st.integers(1, 3),
    "include": valid_axis(GOOD_FILTER),
    "exclude": valid_axis(GOOD_FILTER),
    "price_per_hour": st.floats(0, 100),
    "launcher": st.sampled_from(getattr(scenario, "LAUNCHERS", ("local",))),
    "slurm": st.dictionaries(st.sampled_from(["partition", "time", "account"]), NAMES,
                             max_size=2),
    "timeout": st.floats(1, 1000),
    "telemetry": st.booleans(),
    "layers": GOOD_LAYERS,
    "epochs": st.integers(1, 3),  # an explicit null is refused: leave the key out instead
    "lr_schedule": st.one_of(
        st.just({}),
        st.fixed_dictionaries({"milestones": st.lists(st.integers(1, 5), min_size=1, max_size=2)},
                              optional={"gamma": st.floats(0.01, 1)}),
        st.fixed_dictionaries({"every": st.integers(1, 5)}, optional={"gamma": st.floats(0.01, 1)}),
    ),
    "weight_decay": st.sampled_from([0.0, 1e-4, 0.001]),
    "skew": valid_axis(st.floats(0, 1)),
    "target_accuracy": st.floats(0, 1),
    "compute": valid_axis(st.sampled_from(getattr(scenario, "COMPUTE", ("fp32",)))),
    "norm": st.sampled_from(getattr(scenario, "NORMS", ("batchnorm",))),
    "rounding": st.sampled_from(getattr(scenario, "ROUNDING", ("per-rank",))),
    "weights": valid_axis(st.one_of(st.just("none"), st.builds(lambda b: {"bits": b},
                                                               st.integers(2, 32)))),
    "optimizer": st.one_of(
        st.sampled_from(["sgd", "momentum", "nesterov"]),
        st.builds(lambda n, lr: {"name": n, "lr": lr}, st.sampled_from(list(workloads.OPTIMIZERS)),
                  st.sampled_from([0.001, 0.1])),
    ),
    "loss": st.one_of(st.sampled_from(list(workloads.LOSSES)),
                      st.just({"factory": "mypkg.losses:focal", "params": {"gamma": 2}})),
    # files the scenario names (replay): their valid value without a file is the default ""
    "timeline": st.just(""),
    "codec_time": st.just(""),
}  # fmt: skip

# ---- junk: any type, edge values, and registry entries of any shape --------------------------

COMPRESSOR = named(COMPRESSORS, COMPRESSOR_PARAMS)
SCHEME = st.one_of(
    named(SCHEMES, SCHEME_PARAMS),
    st.builds(lambda c: {"name": "parameter-server", "down": c}, COMPRESSOR),
)
LAYERS = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "full_precision_below": st.one_of(st.just("auto"), INTS, FLOATS, NAMES),
            "quantized_fraction": st.one_of(FLOATS, INTS, NAMES, st.none()),
            "overrides": st.one_of(
                st.dictionaries(
                    st.one_of(st.sampled_from(["*.bias", "fc.*", "*"]), KEYS),
                    st.one_of(COMPRESSOR, ANY),
                    max_size=3,
                ),
                ANY,
            ),
        },
    ),
    ANY,
)
FILTER = st.dictionaries(
    st.one_of(st.sampled_from(list(getattr(scenario, "FILTER_KEYS", ()))), KEYS),
    st.one_of(axis(NAMES), axis(INTS), COMPRESSOR, ANY),
    max_size=3,
)
JUNKY: dict[str, st.SearchStrategy[Any]] = {
    "name": st.one_of(NAMES, st.text(max_size=12)),
    "model": axis(named(MODELS, MODEL_PARAMS)),
    "scheme": axis(SCHEME),
    "compressor": axis(COMPRESSOR),
    "network": axis(st.one_of(st.just("unshaped"), st.none(), st.just({}),
                              st.dictionaries(st.one_of(st.just("bandwidth"), KEYS),
                                              st.one_of(RATES, SCALARS), max_size=2))),
    "batch_size": st.one_of(INTS, st.dictionaries(INTS, st.one_of(INTS, SCALARS), max_size=3)),
    "layers": LAYERS,
    "include": axis(FILTER),
    "exclude": axis(FILTER),
    "optimizer": named(list(workloads.OPTIMIZERS), ["lr", "momentum", "betas", "eps"]),
    "loss": st.one_of(named(list(workloads.LOSSES), ["label_smoothing", "beta"]),
                      st.fixed_dictionaries({"factory": NAMES}, optional={"params": ANY})),
}  # fmt: skip


def junk_for(key: str) -> st.SearchStrategy[Any]:
    """A value that is probably wrong for ``key``: of the wrong type, out of range, another
    key's valid value, or (structured keys) a plausible shape with bad insides."""
    generic = st.one_of(axis(INTS), axis(FLOATS), st.booleans(), st.none(), axis(NAMES), ANY)
    other = st.sampled_from(sorted(VALID)).flatmap(lambda k: VALID[k])
    specific = JUNKY.get(key)
    return st.one_of(generic, other) if specific is None else st.one_of(specific, generic, other)


@st.composite
def scenario_mapping(draw: st.DrawFn, mistakes: bool = True) -> dict[Any, Any]:
    """A valid scenario (name, model and some other keys) with 0 to 3 mistakes in it (none
    with ``mistakes=False``)."""
    out: dict[Any, Any] = {"name": draw(VALID["name"]), "model": draw(VALID["model"])}
    for key in draw(st.lists(st.sampled_from(FIELDS), max_size=8, unique=True)):
        out[key] = draw(VALID.get(key, SCALARS))
    for _ in range(draw(st.sampled_from([0, 1, 1, 1, 2, 3])) if mistakes else 0):
        what = draw(st.integers(0, 19))
        if what == 0:  # a key that does not exist
            out[draw(KEYS)] = draw(ANY)
        elif what == 1:  # a required key missing
            out.pop(draw(st.sampled_from(["name", "model"])), None)
        else:
            key = draw(st.sampled_from(FIELDS))
            out[key] = draw(junk_for(key))
    return out


def dump(mapping: Any, flow: bool | None = None) -> str:
    return yaml.safe_dump(mapping, default_flow_style=flow, allow_unicode=True, sort_keys=False)


@st.composite
def mutated(draw: st.DrawFn) -> str:
    """Valid YAML with a few characters deleted, replaced or inserted."""
    text = dump(draw(scenario_mapping()), draw(st.sampled_from([None, True, False])))
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(text)))
        what = draw(st.sampled_from(["delete", "replace", "insert"]))
        ch = draw(st.sampled_from(list(":[]{}-,'\"#&*!|>%@`\t\n ?")) | st.characters())
        if what == "delete":
            text = text[:i] + text[i + 1 :]
        elif what == "replace":
            text = text[:i] + ch + text[i + 1 :]
        else:
            text = text[:i] + ch + text[i:]
    return text


TEXTS = st.one_of(
    st.builds(dump, scenario_mapping(), st.sampled_from([None, True, False])),
    st.builds(dump, scenario_mapping(), st.sampled_from([None, True, False])),
    mutated(),
    st.text(max_size=60),
    st.builds(dump, ANY),
)

# Inputs YAML itself makes tricky: tags, aliases, dates, sets, several documents, tabs, depth.
TRICKY = [
    "",
    "---",
    "name: s\nmodel: mlp\n---\nname: t\n",
    "name: s\nmodel: mlp\nseed: 2024-01-01\n",
    "name: 2024-01-01\nmodel: mlp\n",
    "name: s\nmodel: !!binary aGVsbG8=\n",
    "name: s\nmodel: mlp\ncompressor: !!set {qsgd, none}\n",
    "name: s\nmodel: mlp\ncompressor: !!omap [{name: qsgd}]\n",
    "name: s\nmodel: !!python/object:os.system ls\n",
    "a: &x [*x]\n",
    "name: &n s\nmodel: mlp\nscheme: {name: *n}\n",
    "name: s\nmodel: mlp\n\tworld_size: 2\n",
    "name: s\nmodel: mlp\nname: t\n",
    "name: s\nmodel: mlp\nworld_size: " + "[" * 2000 + "]" * 2000 + "\n",
    "name: s\nmodel: mlp\nlayers: {overrides: {'*': {name: qsgd, bits: 4}}}\n",
    "name: s\nmodel: mlp\ncompressor: {name: qsgd, bits: .nan}\n",
    "name: s\nmodel: mlp\nlr: .inf\n",
    "name: s\nmodel: mlp\nbatch_size: {1: 64, 2: 32}\n",
    "name: s\nmodel: mlp\n? [a, b]\n: 1\n",
    "\x00",
    "\ufeffname: s\nmodel: mlp\n",
    # Integers past Python's 4300-digit str() limit (decimal fails in YAML, hex when printed).
    "name: s\nmodel: mlp\nseed: " + "1" * 5000 + "\n",
    "name: s\nmodel: mlp\nseed: 0x" + "f" * 5000 + "\n",
    "name: s\nmodel: mlp\nworld_size: -0x" + "f" * 5000 + "\n",
    # Mapping keys YAML does not make strings, and names that are not strings.
    "name: s\nmodel: mlp\ncompressor: {name: qsgd, 1: 2}\n",
    "name: s\nmodel: mlp\ncompressor: {name: [qsgd]}\n",
    "name: s\nmodel: mlp\nscheme: {name: [a]}\n",
    "name: s\nmodel: mlp\nscheme: {name: reduce-broadcast, 1: 2, a: 3}\n",
    "name: s\nmodel: mlp\nscheme: {name: allreduce, 1: 2}\n",
    "name: s\nmodel: mlp\nscheme: {name: gossip, 1: 2, b: 3}\n",
    "name: s\nmodel: mlp\nscheme: {name: parameter-server, down: {name: qsgd, true: 1}}\n",
    "name: s\nmodel: mlp\nscheme: {name: parameter-server, down: {name: [a]}}\n",
    "name: s\nmodel: mlp\nscheme: {name: auto, 0: 0}\n",
    "name: s\nmodel: mlp\nscheme: {name: auto, bogus: 1}\n",
    "name: s\nmodel: mlp\ncompressor: [none, qsgd]\nscheme: {name: auto, overlap: 4}\n",
    "name: s\nmodel: mlp\nscheme: {name: auto, overlap: null}\n",
    "name: s\nmodel: mlp\nlayers: {overrides: {'*': [qsgd]}}\n",
    "name: s\nmodel: mlp\nlayers: {overrides: {'*': 5}}\n",
    "name: s\nmodel: mlp\nlayers: {overrides: {'*': null}}\n",
    "name: s\nmodel: mlp\nlayers: {overrides: {'*': {bits: 4}}}\n",
    "name: s\nmodel: mlp\nlayers: {overrides: {'*': {name: qsgd, 1: 2}}}\n",
    # Keys and values with line breaks: the error must stay on one line.
    'name: s\nmodel: mlp\nlayers: {"a\\nb": 1}\n',
    'name: s\nmodel: mlp\nnetwork: {"a\\nb": 1}\n',
    'name: s\nmodel: mlp\n"a\\nb": 1\n',
    'name: s\nmodel: mlp\ncompressor: {name: qsgd, "a\\nb": 1}\n',
    # Rates beyond float range or below one bit per second.
    "name: s\nmodel: mlp\nnetwork: {bandwidth: " + "9" * 400 + "gbit}\n",
    "name: s\nmodel: mlp\nnetwork: {bandwidth: 0.0001kbit}\n",
    # A large but legal matrix: 8,000 runs expand in about a second.
    "name: s\nmodel: mlp\nrepeats: 100\nseed: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]\n"
    "world_size: [1, 2, 3, 4, 5, 6, 7, 8]\n",
]

# Model parameters whose parameter count takes minutes: a synthetic model of millions of layers.
TRICKY_MODELS = [
    "name: s\nmodel: {name: synthetic, width: 1}\n",
    "name: s\nmodel: {name: synthetic, params: 1e12, gflops: 3000}\n",
]


@contextlib.contextmanager
def time_limit(seconds: int, what: str) -> Iterator[None]:
    """Turn a hang into a failure (SIGALRM; main thread on Unix, else no limit)."""

    def expired(signum: int, frame: object) -> None:
        raise AssertionError(f"{what} took more than {seconds} s (hangs?)")

    if not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def check(text: str, labels: bool = False) -> Matrix | None:
    """The property: a matrix of runnable runs, or a one-line UserError.

    Runnable: what the sweep and the worker do with each run before training works (run id,
    labels, spec.json round trip, scheme parameters, compressors, layer policy); a UserError
    there is a bug too, since expand accepted the run. ``labels``: also for models with
    parameters, whose parameter count is not cached (see TRICKY_MODELS)."""
    try:
        with time_limit(LIMIT_S, f"loads + expand of {text[:200]!r}"):
            m = expand(scenario.loads(text, source="fuzz.yaml"))
    except UserError as e:
        msg = str(e)
        assert msg.strip(), "empty error message"
        assert "\n" not in msg and "\r" not in msg, f"error spans several lines: {msg!r}"
        return None
    assert m.runs, "expand returned a matrix without runs instead of a UserError"
    with time_limit(LIMIT_S, f"the runs of {text[:200]!r}"):
        for run in m.runs[:CHECKED_RUNS]:
            runnable(run, labels or not run.workload.model_params)
    return m


def runnable(run: RunSpec, labels: bool) -> None:
    """What happens to a run after expand: the driver computes its id and labels and writes
    spec.json; the worker reads it back and builds the scheme, compressors and layer policy."""
    assert run.run_id
    if labels:
        run.labels()
    back = RunSpec.from_dict(json.loads(json.dumps(run.to_dict())))  # spec.json, strict JSON
    assert back.run_id == run.run_id, "spec.json changes the run"
    catalog.scheme({"name": run.method.scheme.name, **run.method.scheme_params})
    compress.from_spec(run.method.compressor.given)
    policy = run.method.layers or layers.LayerPolicy()
    for spec in policy.overrides.values():
        compress.from_spec(spec)


# ---- properties -----------------------------------------------------------------------------


@SETTINGS
@given(TEXTS)
@example("name: s\nmodel: mlp\n")
@example("name: s\nmodel: [mlp, resnet20]\ncompressor: [none, {name: qsgd, bits: 4}]\n")
def test_any_scenario_text_gives_a_matrix_or_one_line_error(text: str) -> None:
    check(text)


@SETTINGS
@given(scenario_mapping())
def test_any_scenario_mapping_gives_a_matrix_or_one_line_error(mapping: dict[Any, Any]) -> None:
    check(dump(mapping))


@pytest.mark.parametrize("text", TRICKY, ids=range(len(TRICKY)))
def test_tricky_yaml_gives_a_matrix_or_one_line_error(text: str) -> None:
    check(text)


@pytest.mark.parametrize("text", TRICKY_MODELS, ids=range(len(TRICKY_MODELS)))
def test_model_parameters_give_labels_or_one_line_error(text: str) -> None:
    check(text, labels=True)


def test_the_generator_is_not_all_junk() -> None:
    """The mappings the properties above draw reach matrices, not only errors: of 200
    drawn without deliberate mistakes at least a quarter expand (79 when written), of 200
    drawn with them at least a tenth (63). Otherwise the properties would only ever test the
    error path and ``runnable`` would see almost nothing."""
    expanded = {False: 0, True: 0}

    def count(mistakes: bool) -> None:
        @settings(SETTINGS, max_examples=200)
        @given(scenario_mapping(mistakes=mistakes))
        def draw(mapping: dict[Any, Any]) -> None:
            expanded[mistakes] += check(dump(mapping)) is not None

        draw()

    count(mistakes=False)
    count(mistakes=True)
    assert expanded[False] >= 50, expanded
    assert expanded[True] >= 20, expanded
    m = check("name: s\nmodel: [mlp]\nworld_size: [1, 2]\ncompressor: [none, qsgd]\n")
    assert m is not None and len(m.runs) == 4  # a hand-written valid case: 2 x 2 runs


def _cli(path: Path) -> tuple[int, str]:
    """``qbench sweep PATH --dry-run`` (tests/invoke.py): exit code and all output."""
    proc = qbench("sweep", str(path), "--dry-run")
    return proc.returncode, proc.stdout + proc.stderr


@settings(SETTINGS, max_examples=60)
@given(st.one_of(TEXTS, st.sampled_from(TRICKY)))
def test_cli_dry_run_exits_0_or_2_without_traceback(text: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "s.yaml"
        path.write_text(text, encoding="utf-8")
        code, output = _cli(path)
    assert code in (0, 2), f"exit {code}: {output[-2000:]}"
    assert "Traceback" not in output, output[-2000:]
    if code == 2:
        errors = [ln for ln in output.splitlines() if ln.startswith("qbench: error: ")]
        assert len(errors) == 1, output[-2000:]

"""Scenario validation word for word, and every range at both of its ends (issue 24).

Each expected message is written out here from the schema's rules (docs/scenarios.md): the key,
the bad value, the valid range or choices and the example fix; test_bad_inputs.py checks the same
mistakes reach the terminal as one line with exit 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from qbench.errors import UserError
from qbench.spec import scenario

BASE = "name: t\nmodel: mlp\n"
VALID_KEYS = (
    "name, model, dataset, world_size, nodes, gpus_per_node, backend, device, scheme, "
    "compressor, network, batch_size, warmup, iterations, epochs, steps_per_epoch, cover, "
    "lr_schedule, weight_decay, skew, target_accuracy, compute, norm, weights, rounding, lr, "
    "momentum, "
    "optimizer, loss, seed, repeats, include, exclude, price_per_hour, launcher, isolation, "
    "slurm, timeout, telemetry, profile, layers, nonfinite, dilation, timeline, codec_time"
)
ACCURACY = "epochs: 2\ndataset: digits\n"


def error(text: str, source: str = "t.yaml") -> str:
    with pytest.raises(UserError) as e:
        scenario.loads(text, source)
    return str(e.value)


# (line added to BASE, message): the value just outside each range, on both sides
OUT_OF_RANGE = [
    ("gpus_per_node: 0", "gpus_per_node must be in [1, 1024], got 0; e.g. `gpus_per_node: 8`"),
    ("gpus_per_node: 1025",
     "gpus_per_node must be in [1, 1024], got 1025; e.g. `gpus_per_node: 8`"),
    ("repeats: 0", "repeats must be in [1, 1000], got 0; e.g. `repeats: 3`"),
    ("repeats: 1001", "repeats must be in [1, 1000], got 1001; e.g. `repeats: 3`"),
    ("price_per_hour: -0.01",
     "price_per_hour must be in [0, 1e+06], got -0.01; e.g. `price_per_hour: 32.77`"),
    ("price_per_hour: 1000001",
     "price_per_hour must be in [0, 1e+06], got 1000001.0; e.g. `price_per_hour: 32.77`"),
    ("seed: -1", "seed must be in [0, 4.29497e+09], got -1; e.g. `seed: [0, 1, 2]`"),
    ("seed: [0, 4294967296]",
     "seed must be in [0, 4.29497e+09], got 4294967296; e.g. `seed: [0, 1, 2]`"),
    ("warmup: -1", "warmup must be in [0, 1e+06], got -1"),
    ("warmup: 1000001", "warmup must be in [0, 1e+06], got 1000001"),
    ("iterations: 0", "iterations must be in [1, 1e+07], got 0"),
    ("iterations: 10000001", "iterations must be in [1, 1e+07], got 10000001"),
    (ACCURACY + "steps_per_epoch: 0", "steps_per_epoch must be in [1, 1e+07], got 0"),
    (ACCURACY + "steps_per_epoch: 10000001",
     "steps_per_epoch must be in [1, 1e+07], got 10000001"),
    ("lr: -0.5", "lr must be in [0, 1000], got -0.5; e.g. `lr: 0.05`"),
    ("lr: 1001", "lr must be in [0, 1000], got 1001.0; e.g. `lr: 0.05`"),
    ("momentum: -0.1", "momentum must be in [0, 1], got -0.1; e.g. `momentum: 0.9`"),
    ("momentum: 1.5", "momentum must be in [0, 1], got 1.5; e.g. `momentum: 0.9`"),
    ("timeout: 0.5", "timeout must be in [1, 1e+07], got 0.5; e.g. `timeout: 600`"),
    ("timeout: 10000001", "timeout must be in [1, 1e+07], got 10000001.0; e.g. `timeout: 600`"),
    ("world_size: [2, 0]", "world_size must be >= 1, got 0; e.g. `world_size: [1, 2, 4]`"),
    ("world_size: 1048577",
     "world_size must be at most 1048576, got 1048577; e.g. `world_size: [1, 2, 4]`"),
    ("nodes: 0", "nodes must be >= 1, got 0; e.g. `nodes: [1, 2]`"),
    ("nodes: 1048577", "nodes must be at most 1048576, got 1048577; e.g. `nodes: [1, 2]`"),
]  # fmt: skip


@pytest.mark.parametrize(("line", "message"), OUT_OF_RANGE)
def test_values_out_of_range_word_for_word(line: str, message: str) -> None:
    assert error(f"{BASE}{line}\n") == message


# every range's own ends are valid: (line, attribute, value read back)
AT_THE_ENDS = [
    ("gpus_per_node: 1", "gpus_per_node", 1), ("gpus_per_node: 1024", "gpus_per_node", 1024),
    ("repeats: 1", "repeats", 1), ("repeats: 1000", "repeats", 1000),
    ("price_per_hour: 0", "price_per_hour", 0.0),
    ("price_per_hour: 1000000", "price_per_hour", 1e6),
    ("seed: [0, 4294967295]", "seed", (0, 4294967295)),
    ("warmup: 0", "warmup", 0), ("warmup: 1000000", "warmup", 10**6),
    ("iterations: 1", "iterations", 1), ("iterations: 10000000", "iterations", 10**7),
    (ACCURACY + "steps_per_epoch: 1", "steps_per_epoch", 1),
    (ACCURACY + "steps_per_epoch: 10000000", "steps_per_epoch", 10**7),
    ("lr: 0", "lr", 0.0), ("lr: 1000", "lr", 1e3),
    ("momentum: 0", "momentum", 0.0), ("momentum: 1", "momentum", 1.0),
    ("timeout: 1", "timeout", 1.0), ("timeout: 10000000", "timeout", 1e7),
    ("world_size: [1, 1048576]", "world_size", (1, 1 << 20)),
    ("nodes: [1, 1048576]", "nodes", (1, 1 << 20)),
]  # fmt: skip


@pytest.mark.parametrize(("line", "attribute", "value"), AT_THE_ENDS)
def test_values_at_the_ends_of_their_ranges_are_kept(line: str, attribute: str, value: Any) -> None:
    got = getattr(scenario.loads(f"{BASE}{line}\n", "t.yaml"), attribute)
    assert got == value
    assert type(got) is type(value)  # ints stay ints; floats written as ints become floats


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("backend: [gloo, tcp]",
         "backend 'tcp' is not one of gloo, mpi, nccl; e.g. `backend: gloo`"),
        ("device: tpu", "device 'tpu' is not one of auto, cpu, cuda; e.g. `device: auto`"),
        ("launcher: pbs", "launcher 'pbs' is not one of local, slurm; e.g. `launcher: local`"),
        ("isolation: x",
         "isolation 'x' is not one of auto, group, process; e.g. `isolation: auto`"),
        ("compute: int4",
         "compute 'int4' is not one of fp32, bf16, fp16, int8, int8-asym, replay; e.g. "
         "`compute: fp32`"),
        ("norm: ln",
         "norm 'ln' is not one of batchnorm, range-evonorm, range-evonorm-gs2; e.g. "
         "`norm: batchnorm`"),
        ("rounding: same",
         "rounding 'same' is not one of per-rank, shared; e.g. `rounding: per-rank`"),
        ("rounding: shared",
         "rounding: shared applies to stochastic rounding, which only compute int8 or "
         "int8-asym and `weights: {bits: N}` do; add one of them or drop `rounding:`"),
        ("steps_per_epoch: 3",
         "steps_per_epoch applies to accuracy mode only; set `epochs:` too, or use "
         "`iterations:` in iteration mode"),
        ("iterations: true", "iterations must be int, got True (bool)"),
        ("lr: true", "lr must be float, got True (bool)"),
        ("telemetry: 1", "telemetry must be bool, got 1 (int)"),
        ("dataset: 3", "dataset must be str, got 3 (int)"),
        ("world_size: []", "world_size is an empty list; give at least one value"),
        ("include: [3]", "include entry 3 must be a mapping; e.g. `include: [{backend: mpi}]`"),
        ("exclude: x", "exclude entry 'x' must be a mapping; e.g. `exclude: [{backend: mpi}]`"),
        ("slurm: 3", "slurm must be a mapping, got 3; e.g. `slurm: {partition: gpu}`"),
        ("lr_schedule: [1]",
         "lr_schedule must be a mapping, got [1]; e.g. `lr_schedule: {milestones: [30, 45], "
         "gamma: 0.1}`"),
        ("weights: 3", "weights must be a mapping, got 3; e.g. `weights: [none, {bits: 8}]`"),
        ("batch_size: {1: 8, two: 8}", "batch_size key must be int, got 'two' (str)"),
        ("batch_size: {1: 8, 2: x}", "batch_size must be int, got 'x' (str)"),
        ("batch_size: 0", "batch_size must be >= 1, got 0; e.g. `batch_size: 32`"),
        ("batch_size: x", "batch_size must be int, got 'x' (str)"),
        ("bogus: 1\nzzz: 2", f"t.yaml: unknown key 'bogus'; valid keys: {VALID_KEYS}"),
        ("iteration: 1",
         f"t.yaml: unknown key 'iteration' (did you mean 'iterations'?); valid keys: {VALID_KEYS}"),
        ("compressor: [none, {name: qsgd, bits: 12}]",
         "t.yaml: compressor entry 2 `{name: qsgd, bits: 12}`: qsgd: bits must be 1..8 or 16, "
         "got 12; e.g. `bits: 4`"),
        ("compressor: ['qsgd:bits=12']",
         "t.yaml: compressor entry 1 `qsgd:bits=12`: qsgd: bits must be 1..8 or 16, got 12; "
         "e.g. `bits: 4`"),
        ("scheme: [auto, {name: reduce-broadcast, overlap: 0}]",
         "t.yaml: scheme entry 2 `{name: reduce-broadcast, overlap: 0}`: "),
        ("model: [mlp, 3]",
         "t.yaml: model entry 2 `3`: model entry 3 must be a name or a mapping like {name: ...}"),
    ],
)  # fmt: skip
def test_bad_values_word_for_word(line: str, message: str) -> None:
    text = f"name: t\n{line}\n" if line.startswith("model:") else f"{BASE}{line}\n"
    got = error(text)
    assert got.startswith(message) if message.endswith(": ") else got == message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("model: mlp\n", "t.yaml: missing required key 'name'; e.g. `name: smoke`"),
        ("name: t\n", "t.yaml: missing required key 'model'; e.g. `name: smoke`"),
        ("", "t.yaml: a scenario must be a YAML mapping of keys, got null"),
        ("3\n", "t.yaml: a scenario must be a YAML mapping of keys, got int"),
        ("name: t\nmodel: {params: 1}\n",
         "model {'params': 1} has no name; e.g. `model: mlp` or "
         "`- {name: synthetic, params: 25M}`"),
        ("name: a/b\nmodel: mlp\n",
         "name 'a/b' must be a plain directory name; e.g. `name: smoke`"),
        ("name: t\nmodel: mlp\nworld_size: [1, 2\n",
         "t.yaml: line 4 is not valid YAML (expected ',' or ']', but got '<stream end>'); fix the "
         "syntax"),
        ("name: t\nmodel: mlp\nx: *a\n",
         "t.yaml: line 3 is not valid YAML (found undefined alias 'a'); fix the syntax"),
        # a reader error has no line and no `problem`: the first line of its text
        ("name: x\0\nmodel: mlp\n",
         "t.yaml: is not valid YAML (unacceptable character #x0000: special characters are not "
         "allowed); fix the syntax"),
        (f"{BASE}seed: {'9' * 5000}\n",
         "t.yaml: a YAML value cannot be read (Exceeds the limit (4300 digits) for integer string "
         "conversion: value has 5000...); use an ordinary number or string"),
        (f"{BASE}seed: {'[' * 5000}{']' * 5000}\n",
         "t.yaml: YAML nested too deeply to read; a scenario needs at most a few levels (e.g. "
         "`compressor: [{name: qsgd, bits: 4}]`)"),
    ],
)  # fmt: skip
def test_whole_file_mistakes_word_for_word(text: str, message: str) -> None:
    assert error(text) == message


def test_a_value_nested_deeper_than_the_parser_goes(monkeypatch: pytest.MonkeyPatch) -> None:
    # YAML gives up first on any text tried (about 500 levels), so the parser's own limit is
    # reached by standing in for it
    def too_deep(raw: Any, source: str = "") -> scenario.Scenario:
        raise RecursionError

    monkeypatch.setattr(scenario, "parse", too_deep)
    assert error(BASE) == (
        "t.yaml: a value is nested too deeply; a scenario needs at most a few levels (e.g. "
        "`world_size: [1, 2]`)"
    )


def test_a_deep_value_is_shown_short() -> None:
    got = error(f"{BASE}world_size: {'[' * 400}1{']' * 400}\n")
    assert got == f"world_size must be int, got {'[' * 37}... (list)"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"name": "t", "model": ({"name": "mlp"},), "scheme": ({"overlap": 2},)},
         "scheme {'overlap': 2} has no name; e.g. `- {name: reduce-broadcast}`"),
        ({"name": "t", "model": ({"name": "mlp"},), "compressor": ({"bits": 2},)},
         "compressor {'bits': 2} has no name; e.g. `- {name: qsgd, bits: 4}`"),
        ({"name": "t", "model": ({"factory": "m:f"},)}, None),
    ],
)  # fmt: skip
def test_scenario_built_in_code_is_checked_too(entry: dict[str, Any], message: str | None) -> None:
    if message is None:
        assert scenario.Scenario(**entry).model == ({"factory": "m:f"},)
        return
    with pytest.raises(UserError) as e:
        scenario.Scenario(**entry)
    assert str(e.value) == message


def test_written_entries_are_one_line_of_at_most_60_characters() -> None:
    long = (
        "{name: qsgd, bits: 12, bucket_size: 1024, norm: max, layout: interleaved, align: tensor}"
    )
    got = error(f"{BASE}compressor: {long}\n")
    assert got.startswith("t.yaml: compressor entry 1 `{name: qsgd, bits: 12, bucket_size: "
                          "1024, norm: max, layo...`: ")  # fmt: skip
    assert scenario._written("x" * 60) == "x" * 60
    assert scenario._written("x" * 61) == "x" * 57 + "..."
    assert scenario._written({"name": "qsgd", "bits": 4}) == "{name: qsgd, bits: 4}"
    assert scenario._written(["a", 1]) == "[a, 1]"
    assert scenario._written(3) == "3"
    assert scenario._written("a\nb") == "'a\\nb'"  # repr: one line whatever YAML held
    assert scenario._written("a\rb") == "'a\\rb'"
    assert scenario._written(None) == "null"  # YAML's document end marker taken off
    assert scenario._written({"a": {"b": 1}}) == "{a: {b: 1}}"  # flow style all the way down
    # however long, YAML never wraps the line (a wrapped one would be shown by repr, quoted)
    assert scenario._written(["abc"] * 30) == "[abc, " + "abc, " * 10 + "a..."
    text = "word " * 39 + "word"  # 199 characters, 39 places YAML could break the line
    assert scenario._written({"k": text}) == f"{{k: {text[:53]}..."
    many = "x\n" * 40  # a multi-line value: its repr, cut at 60 characters
    assert scenario._written(many) == repr(many)[:57] + "..."
    assert scenario._written({"k": "a\nb"}) == "{'k': 'a\\nb'}"
    assert scenario._written(object()).startswith("<object object at ")


def test_short_exception_text() -> None:
    assert scenario._short(ValueError()) == "ValueError"  # no message: the type's name
    assert scenario._short(ValueError("first\nsecond")) == "first"
    assert scenario._short(ValueError("x" * 80)) == "x" * 80
    assert scenario._short(ValueError("x" * 81)) == "x" * 77 + "..."


def test_a_dataset_factory_is_kept_as_written() -> None:
    sc = scenario.loads(f'{BASE}dataset: [digits, {{factory: "mypkg.data:splits"}}]\n', "t.yaml")
    assert sc.dataset == ("digits", {"factory": "mypkg.data:splits"})


# -- reading the file ----------------------------------------------------------------------------
def test_a_file_is_read_with_its_path_as_source(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(BASE)
    assert scenario.load(path).source == str(path)
    path.write_text("name: t\nmodel: [mlp\n")
    with pytest.raises(UserError) as e:
        scenario.load(path)
    assert str(e.value).startswith(f"{path}: line 3 is not valid YAML (")


def test_file_mistakes_word_for_word(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def message(path: Path) -> str:
        with pytest.raises(UserError) as e:
            scenario.read_text(path)
        return str(e.value)

    assert message(tmp_path) == (
        f"scenario file '{tmp_path}' is a directory; give its YAML file, e.g. scenarios/tour.yaml"
    )
    missing = tmp_path / "nope.yaml"
    assert message(missing) == (
        f"scenario file '{missing}' not found; check the path (e.g. scenarios/)"
    )
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("name: caf\xe9\n".encode("latin-1"))
    assert message(latin) == (
        f"scenario file '{latin}' is not UTF-8 text (byte 9: 0xe9); save it as UTF-8 YAML"
    )

    # root reads any file whatever its mode, so the refusal is stood in for
    def refuse(self: Path) -> bytes:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_bytes", refuse)
    good = tmp_path / "good.yaml"
    good.write_text(BASE)
    assert message(good) == (
        f"scenario file '{good}' cannot be read (Permission denied); check its permissions"
    )


def test_floats_ints_and_bools_are_typed() -> None:
    sc = scenario.loads(f"{BASE}lr: 1\nskew: [0, 1]\ntelemetry: true\ncover: false\n", "t.yaml")
    assert (sc.lr, sc.skew, sc.telemetry, sc.cover) == (1.0, (0.0, 1.0), True, False)
    assert [type(v) for v in (sc.lr, *sc.skew)] == [float, float, float]
    assert scenario._typed("x", 2, int) == 2
    assert scenario._typed("x", False, bool) is False


# -- --set ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "sets", "message"),
    [
        (BASE, ["world_size=two"],
         "--set 'world_size=two': world_size must be int, got 'two' (str)"),
        (BASE, ["iterations=0"], "--set 'iterations=0': iterations must be in [1, 1e+07], got 0"),
        (BASE, ["seeds=1"],
         f"--set 'seeds=1': unknown key 'seeds' (did you mean 'seed'?); valid keys: {VALID_KEYS}"),
        (BASE, ["seed"], "--set 'seed': expected KEY=VALUE, e.g. --set seed=0"),
        (BASE, [" =3"], "--set ' =3': expected KEY=VALUE, e.g. --set seed=0"),
        (BASE, ["seed=[0"],
         "--set 'seed=[0': the value is not valid YAML; quote it, e.g. --set 'seed=[0, 1]'"),
        ("", ["seed=3"], "s.yaml: a scenario must be a YAML mapping of keys, got null"),
        ("- 1\n", ["seed=3"], "s.yaml: a scenario must be a YAML mapping of keys, got list"),
        ("name: t\nmodel: [mlp\n", ["seed=3"],
         "s.yaml: line 3 is not valid YAML (expected ',' or ']', but got '<stream end>'); fix "
         "the syntax"),
        # the file's own mistake stays the file's; only what --set gave is blamed on it
        (f"{BASE}seed: x\n", ["lr=1"], "seed must be int, got 'x' (str)"),
        (f"{BASE}seed: x\n", ["seed=1", "lr=x"], "--set 'lr=x': lr must be float, got 'x' (str)"),
        # the key is what comes before the first "="; the file's name is not part of the blame
        (BASE, ["lr=x=1"], "--set 'lr=x=1': lr must be float, got 'x=1' (str)"),
        (BASE, ["compressor={name: qsgd, bits: 12}"],
         "--set 'compressor={name: qsgd, bits: 12}': compressor entry 1 `{name: qsgd, bits: "
         "12}`: qsgd: bits must be 1..8 or 16, got 12; e.g. `bits: 4`"),
        # "lr" is not blamed for an error about "lr_schedule" (a word, not a prefix)
        (BASE, ["lr=1", "lr_schedule=3"],
         "--set 'lr_schedule=3': lr_schedule must be a mapping, got 3; e.g. `lr_schedule: "
         "{milestones: [30, 45], gamma: 0.1}`"),
    ],
)  # fmt: skip
def test_set_mistakes_word_for_word(text: str, sets: list[str], message: str) -> None:
    with pytest.raises(UserError) as e:
        scenario.loads(scenario.with_overrides(text, "s.yaml", sets), "s.yaml")
    assert str(e.value) == message


def test_set_writes_a_note_and_the_new_yaml() -> None:
    out = scenario.with_overrides(BASE, "s.yaml", [" lr = 0.1", "world_size=[2, 4]"])
    assert out == ("# s.yaml with --set  lr = 0.1 world_size=[2, 4]\nname: t\nmodel: mlp\n"
                   "lr: 0.1\nworld_size:\n- 2\n- 4\n")  # fmt: skip
    assert scenario.with_overrides("not: [valid", "s.yaml", []) == "not: [valid"
    assert scenario.loads(scenario.with_overrides(BASE, "s.yaml", ["name=a=b"])).name == "a=b"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("exclude: [{}]",
         "exclude has an empty entry; give axes to match, e.g. `exclude: [{backend: mpi}]`"),
        ("include: [{}]",
         "include has an empty entry; give axes to match, e.g. `include: [{backend: mpi}]`"),
        ("exclude: [{bogus: 1}]",
         "exclude entry matches on unknown axis 'bogus'; valid: model, dataset, world_size, "
         "nodes, backend, device, scheme, compressor, network, seed, repeat, skew, compute"),
        # the command line's spelling of a scheme, and its mistakes named as a scheme's
        ("scheme: ['reduce-broadcast:overlap']",
         "<embedded>: scheme entry 1 `reduce-broadcast:overlap`: scheme spec "
         "'reduce-broadcast:overlap': 'overlap' is not KEY=VALUE; e.g. "
         "`--scheme reduce-broadcast:overlap=4`"),
    ],
)  # fmt: skip
def test_filter_and_spec_mistakes_word_for_word(line: str, message: str) -> None:
    with pytest.raises(UserError) as e:
        scenario.loads(f"{BASE}{line}\n")
    assert str(e.value) == message


@pytest.mark.parametrize(
    "key", ["model", "compressor", "scheme", "network", "include", "exclude", "dataset", "weights"]
)
def test_an_empty_list_names_its_key(key: str) -> None:
    text = f"name: t\n{key}: []\n" + ("" if key == "model" else "model: mlp\n")
    assert error(text) == f"{key} is an empty list; give at least one value"


def test_embedded_is_the_default_source() -> None:
    assert scenario.loads(BASE).source == "<embedded>"
    assert scenario.parse({"name": "t", "model": "mlp"}).source == "<embedded>"
    with pytest.raises(UserError) as e:
        scenario.parse({"name": "t", "model": "mlp", "x": 1})
    assert str(e.value) == f"<embedded>: unknown key 'x'; valid keys: {VALID_KEYS}"


def test_a_model_name_with_a_colon_is_a_name() -> None:
    # compressors and schemes read `name:key=value`; a model name is taken as written
    sc = scenario.loads('name: t\nmodel: "mypkg:net"\nscheme: "reduce-broadcast:overlap=2"\n')
    assert sc.model == ({"name": "mypkg:net"},)
    assert sc.scheme == ({"name": "reduce-broadcast", "overlap": 2},)

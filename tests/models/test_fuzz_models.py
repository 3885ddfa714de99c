"""Bad models never break anything: configs and paths through the API and every CLI subcommand
(a LessonkitError, exit 2 with one message, no traceback), and ModelSpecs with random fields."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lessonkit import LessonkitError, ModelSpec, estimate, resolve_model
from lessonkit.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 100,
}
SUBCOMMANDS = (["vram"], ["check"], ["recommend"])


def write(path: Path, content: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def llama(**change: object) -> dict:
    return {k: v for k, v in (LLAMA | change).items() if v is not ...}


# name -> (build the model argument under tmp_path, a phrase the message must hold)
BAD_CONFIGS = {
    "config.json is a folder": (
        lambda t: str((t / "m" / "config.json").mkdir(parents=True) or t / "m"),
        "folder",
    ),
    "JSON root is a list": (lambda t: str(write(t / "list.json", [LLAMA])), "JSON list"),
    "JSON root is a string": (lambda t: str(write(t / "str.json", '"llama"')), "JSON string"),
    "JSON root is null": (lambda t: str(write(t / "null.json", "null")), "JSON null"),
    "empty file": (lambda t: str(write(t / "empty.json", "")), "not valid JSON"),
    "zero heads": (
        lambda t: str(write(t / "z.json", llama(num_attention_heads=0))),
        "num_attention_heads",
    ),
    "heads as a string": (
        lambda t: str(write(t / "s.json", llama(num_attention_heads="32"))),
        "num_attention_heads",
    ),
    "heads as a fraction": (
        lambda t: str(write(t / "f.json", llama(num_attention_heads=4.5))),
        "num_attention_heads",
    ),
    "negative head_dim": (lambda t: str(write(t / "hd.json", llama(head_dim=-8))), "head_dim"),
    "tie_word_embeddings 'no'": (
        lambda t: str(write(t / "tie.json", llama(tie_word_embeddings="no"))),
        "true or false",
    ),
    "attention_bias as text": (
        lambda t: str(write(t / "ab.json", llama(attention_bias="yes"))),
        "attention_bias",
    ),
    "hidden_act a number": (
        lambda t: str(write(t / "act.json", llama(hidden_act=3))),
        "hidden_act",
    ),
    "missing field": (lambda t: str(write(t / "miss.json", llama(vocab_size=...))), "vocab_size"),
    "fewer units than heads": (
        lambda t: str(write(t / "few.json", llama(hidden_size=2))),
        "smaller than",
    ),
    "huge dimension": (
        lambda t: str(write(t / "big.json", llama(vocab_size=10**30))),
        "vocab_size",
    ),
    "unknown model_type": (
        lambda t: str(write(t / "vit.json", llama(model_type="vit"))),
        "Unsupported model_type",
    ),
    "model_type a list": (
        lambda t: str(write(t / "mt.json", llama(model_type=["llama"]))),
        "Unsupported model_type",
    ),
    "gpt2 with zero layers": (
        lambda t: str(write(t / "g.json", {"model_type": "gpt2", "n_layer": 0})),
        "n_layer",
    ),
    "not UTF-8": (lambda t: str(write(t / "latin.json", b"\xff\xfe{\x00}")), "UTF-8"),
    "integer too long for JSON": (
        lambda t: str(
            write(t / "long.json", '{"model_type": "llama", "vocab_size": ' + "9" * 5000 + "}")
        ),
        "not a readable config",
    ),
    "nested too deeply": (
        lambda t: str(write(t / "deep.json", '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")),
        "not a readable config",
    ),
    "a loop of links": (
        lambda t: (os.symlink(t / "loop.json", t / "loop.json"), str(t / "loop.json"))[1],
        "Cannot read",
    ),
    "a loop of links, no .json": (
        lambda t: (os.symlink(t / "loop", t / "loop"), str(t / "loop"))[1],
        "Cannot read",
    ),
    "a name over 255 characters": (lambda t: str(t / ("x" * 300 + ".json")), "Cannot read"),
    "a missing file": (lambda t: str(t / "nowhere" / "config.json"), "No config.json"),
    "a link to an endless file": (
        lambda t: (os.symlink("/dev/zero", t / "zero.json"), str(t / "zero.json"))[1],
        "not a regular file",
    ),
    "a file over 10 MiB": (
        lambda t: str(write(t / "big.json", b" " * (10 * 2**20 + 1))),
        "MiB: not a config.json",
    ),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_bad_configs_are_clear_errors_in_the_api(case, tmp_path):
    build, phrase = BAD_CONFIGS[case]
    model = build(tmp_path)
    with pytest.raises(LessonkitError, match=phrase.replace(".", r"\.")):
        resolve_model(model)
    with pytest.raises(LessonkitError):
        ModelSpec.from_hf_config(model)


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_bad_configs_exit_2_with_one_message_in_every_subcommand(case, tmp_path, capsys):
    build, phrase = BAD_CONFIGS[case]
    model = build(tmp_path)
    for sub in SUBCOMMANDS:
        assert main([*sub, "--model", model]) == 2, sub
        err = capsys.readouterr().err
        assert err.startswith(f"lessonkit {sub[0]}: error: ") and phrase in err, err
        assert err.count("\n") == 1 and len(err) < 1000, err


def test_an_unreadable_config_is_a_clear_error(tmp_path, monkeypatch):
    path = write(tmp_path / "secret.json", LLAMA)

    def denied(file, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(file))

    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(LessonkitError, match="permission denied"):
        resolve_model(str(path))


@pytest.mark.skipif(
    os.name != "posix" or os.geteuid() == 0,
    reason="file permissions do not stop root (or this is not POSIX)",
)
def test_an_unreadable_config_file_exits_2(tmp_path, capsys):
    path = write(tmp_path / "secret.json", LLAMA)
    path.chmod(0)
    assert main(["vram", "--model", str(path)]) == 2
    assert "permission denied" in capsys.readouterr().err


def test_a_nul_byte_in_a_path_is_a_clear_error():
    with pytest.raises(LessonkitError, match="Cannot read"):
        ModelSpec.from_hf_config("bad\x00name.json")


def test_bad_configs_through_the_real_command_leave_no_traceback(tmp_path):
    """The installed entry point, in a process of its own: one line on stderr, exit 2."""
    for case in ("JSON root is a list", "zero heads", "not UTF-8", "a loop of links"):
        model = BAD_CONFIGS[case][0](tmp_path)
        run = subprocess.run(
            [sys.executable, "-m", "lessonkit", "vram", "--model", model],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        assert run.returncode == 2 and "Traceback" not in run.stderr, (case, run.stderr)
        assert run.stderr.startswith("lessonkit vram: error:") and run.stdout == ""


# ----- names and sizes --------------------------------------------------------------------------
def test_an_empty_name_is_refused_and_never_reads_the_current_folder(tmp_path, monkeypatch, capsys):
    write(tmp_path / "config.json", LLAMA)
    monkeypatch.chdir(tmp_path)
    for empty in ("", "   "):
        with pytest.raises(LessonkitError, match="model name is empty"):
            resolve_model(empty)
        for sub in SUBCOMMANDS:
            assert main([*sub, "--model", empty]) == 2
            assert "model name is empty" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("size", "reason"),
    [
        ("1e30", "at most 2T parameters, got 1e+30"),
        ("0", "at least 1M parameters, got 0"),
        ("1k", "at least 1M parameters, got 1000"),
        ("3T", "at most 2T parameters"),
        (10**5000, "at most 2T parameters"),
        (math.nan, "got nan"),
        (math.inf, "at most 2T"),
    ],
    ids=["1e30", "0", "1k", "3T", "10**5000", "nan", "inf"],
)
def test_a_size_out_of_range_says_why(size, reason, capsys):
    with pytest.raises(LessonkitError, match=reason.replace("+", r"\+")) as info:
        resolve_model(size)
    assert "Unknown model" not in str(info.value)
    if isinstance(size, str):
        for sub in SUBCOMMANDS:
            assert main([*sub, "--model", size]) == 2
            err = capsys.readouterr().err
            assert reason in err and "Unknown model" not in err, err


def test_a_path_that_is_not_there_says_so():
    with pytest.raises(LessonkitError, match="Unknown model.*Nor is it a file or folder here"):
        resolve_model("/nowhere/at/all/")


def test_overlong_names_are_refused_quickly(capsys):
    for name in ("x" * 300, "x" * 5000, "/" + "a/" * 3000 + "config.json"):
        with pytest.raises(LessonkitError):
            resolve_model(name)
        assert main(["vram", "--model", name]) == 2
        assert len(capsys.readouterr().err) < 1000


def test_numbers_and_names_too_long_to_print_are_described_not_echoed():
    from lessonkit import get_gpu

    for setting in ("batch_size", "lora_rank", "seq_len"):
        with pytest.raises(LessonkitError, match="an integer of about 5,001 digits"):
            estimate("7B", method="lora", **{setting: 10**5000})
    with pytest.raises(LessonkitError, match="negative integer"):
        estimate("7B", batch_size=-(10**5000))
    with pytest.raises(LessonkitError) as info:
        get_gpu("x" * 1_000_000)
    assert len(str(info.value)) < 1000


@pytest.mark.parametrize(
    ("budget", "dollars"),
    [("1e1", 10), ("1E1", 10), ("$1e1/h", 10), ("2.5", 2.5), (".5", 0.5), ("1.5e+1 per hour", 15)],
)
def test_budget_takes_the_numbers_tokens_takes(budget, dollars):
    from lessonkit.planning.recommender import parse_budget, parse_tokens

    assert parse_budget(budget) == pytest.approx(dollars)
    number = budget.strip("$").split("/")[0].split()[0]
    assert parse_tokens(number) == pytest.approx(dollars)


def test_recommend_accepts_a_budget_in_exponent_notation(capsys):
    assert main(["recommend", "--model", "1B", "--budget", "1e1", "--json"]) in (0, 1)
    assert json.loads(capsys.readouterr().out)["budget_per_hour"] == 10


# ----- writing the output -----------------------------------------------------------------------
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize(
    "argv",
    [
        ["vram", "--model", "7B"],
        ["vram", "--model", "7B", "--json"],
        ["recommend", "--model", "7B"],
        ["check"],
        ["--help"],
    ],
)
@pytest.mark.parametrize("unbuffered", ["", "1"])
def test_a_full_disk_ends_with_one_line_and_a_non_zero_exit(argv, unbuffered):
    env = dict(os.environ, PYTHONUNBUFFERED=unbuffered)
    with open("/dev/full", "w") as full:
        run = subprocess.run(
            [sys.executable, "-m", "lessonkit", *argv],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env,
        )
    assert run.returncode == 3, run.stderr
    assert run.stderr.count("\n") == 1 and "No space left on device" in run.stderr, run.stderr
    assert run.stderr.startswith("lessonkit") and "Traceback" not in run.stderr


# ----- ModelSpec with random fields ---------------------------------------------------------------
FIELD_VALUES = st.one_of(
    st.integers(min_value=-5, max_value=300),
    st.integers(),
    st.floats(),
    st.booleans(),
    st.none(),
    st.text(max_size=12),
    st.sampled_from(
        ["llama", "gpt2", "gemma2", "qwen2", "rmsnorm", "layernorm", "none", "qkv", "all", "no"]
    ),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
NAMES = [f.name for f in fields(ModelSpec)]


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(values=st.fixed_dictionaries({}, optional=dict.fromkeys(NAMES, FIELD_VALUES)))
def test_random_modelspec_fields_give_a_spec_that_counts_or_a_clear_error(values):
    base = dict(
        name="fuzz",
        family="llama",
        n_layers=2,
        hidden_size=64,
        n_heads=4,
        n_kv_heads=4,
        intermediate_size=128,
        vocab_size=100,
    )
    try:
        spec = ModelSpec(**(base | values))
    except LessonkitError as err:
        assert str(err) and len(str(err)) < 500
        return
    assert isinstance(spec.tie_embeddings, bool) and spec.norm in ("rmsnorm", "layernorm")
    assert spec.attention_bias in ("none", "qkv", "all") and spec.head_dim >= 1
    tensors = spec.parameter_tensors()
    assert all(dim >= 0 for t in tensors.layer + tensors.outer for dim in t.shape)
    assert isinstance(spec.n_params, int) and spec.n_params > 0
    report = estimate(spec)
    assert math.isfinite(report.total_bytes) and report.total_bytes > 0


@pytest.mark.parametrize(
    ("change", "phrase"),
    [
        ({"head_dim": -8}, "head_dim"),
        ({"head_dim": 0}, "head_dim"),
        ({"tie_embeddings": "no"}, "tie_embeddings must be True or False"),
        ({"gated_mlp": 1}, "gated_mlp"),
        ({"norm": "batchnorm"}, "norm must be one of rmsnorm"),
        ({"attention_bias": True}, "attention_bias must be one of none, qkv, all"),
        ({"max_positions": -1}, "max_positions"),
        ({"vocab_size": 10**12}, "vocab_size"),
        ({"name": None}, "name must be a string"),
        ({"family": ["llama"]}, "family"),
        ({"extra": 3}, "extra"),
    ],
)
def test_modelspec_checks_every_field(change, phrase):
    base = dict(
        name="x",
        family="llama",
        n_layers=2,
        hidden_size=64,
        n_heads=4,
        n_kv_heads=4,
        intermediate_size=128,
        vocab_size=100,
    )
    with pytest.raises(LessonkitError, match=phrase):
        ModelSpec(**(base | change))

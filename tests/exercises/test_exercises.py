"""lessonkit.exercises: answers in many forms, wrong answers rejected, odd input never raises."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import types

import pytest

from lessonkit import LessonkitError
from lessonkit.exercises.check_result import STATUSES, CheckResult
from lessonkit.exercises.checking import (
    answer_key,
    check,
    hint,
    key_points_found,
    options,
    question_ids,
)
from lessonkit.exercises.expected import bandwidth_ladder
from lessonkit.units import GB, GiB

SECTIONS = (
    "01_vram_equation",
    "02_gpu_selection_matrix",
    "03_choosing_your_environment",
    "04_hardware_decision_flow",
    "05_checking_your_environment",
    "06_summary_and_reflection",
)


def bank() -> dict:
    from lessonkit.exercises.expected import bank as _bank

    return _bank()


def ids_of(*kinds: str) -> list[str]:
    return [qid for qid in question_ids() if bank()[qid]["kind"] in kinds]


def status(qid: str, answer: object) -> str:
    return check(qid, answer, show=False).status


# ----- the bank -----------------------------------------------------------------------------
def test_every_section_has_at_least_four_questions_with_matching_ids():
    for number, section in enumerate(SECTIONS, start=1):
        ids = question_ids(section)
        assert len(ids) >= 4, section
        for qid in ids:
            assert qid.startswith(f"{number:02d}.") and bank()[qid]["section"] == section
    assert sorted({q["section"] for q in bank().values()}) == list(SECTIONS)


def test_every_question_is_well_formed():
    from lessonkit.exercises.checking import _CHECKERS
    from lessonkit.exercises.expected import EXPECTED as _EXPECTED

    for qid, question in bank().items():
        assert question["kind"] in _CHECKERS, qid
        assert (question["title"] and question.get("hints")) or question["kind"] == "text", qid
        if question["kind"] == "text":
            for point in question["key_points"]:
                assert point["point"] and all(re.compile(p) for p in point["patterns"])
        else:
            assert qid in _EXPECTED, f"{qid} has no expected answer"
    assert set(_EXPECTED) <= set(bank())


def test_numeric_hints_do_not_give_the_answer_away():
    from lessonkit.exercises.answer_feedback import _format

    for qid in ids_of("number"):
        question = bank()[qid]
        shown = _format(float(answer_key(qid)), question.get("unit", ""))
        # the answer as a number of its own ("2" is not given away by "seq_len=512")
        for step in question["hints"]:
            assert not re.search(rf"(?<![\d.,]){re.escape(shown)}(?![\d.,]*\d)", step), qid


def test_the_guide_reflections_are_made_concrete():
    times = answer_key("06.1")
    links = {link["name"]: link["bandwidth_gbs"] for link in bandwidth_ladder()}
    assert set(times) == set(links)
    for name, seconds in times.items():
        assert seconds == pytest.approx(14e9 / (links[name] * GB))
    assert times["PCIe 4.0 x16"] > times["DDR5 system RAM"] > times["HBM3 (H100 SXM)"]
    parts = answer_key("06.4")
    assert set(parts) == {"gradients", "optimizer", "activations", "cuda_context"}
    assert parts["optimizer"] == pytest.approx(2 * parts["gradients"])
    assert sum(parts.values()) * GiB > 16 * GB  # why the 14 GB model crashes a 16 GB GPU


def test_bandwidth_ladder_reads_gpu_memory_from_the_catalog():
    from lessonkit.hardware.gpus import get_gpu

    rows = bandwidth_ladder()
    assert [r["bandwidth_gbs"] for r in rows] == sorted(r["bandwidth_gbs"] for r in rows)
    for row in rows:
        assert row["source"] and re.fullmatch(r"\d{4}-\d\d-\d\d", row["as_of"])
        if "gpu" in row:
            assert row["bandwidth_gbs"] == get_gpu(row["gpu"]).bandwidth_gbs


def test_expected_answers_follow_the_calculator():
    """Answers are computed when checked: change the calculator and they change with it."""
    import lessonkit.memory.estimating as vram

    before = answer_key("02.1")
    real = vram.estimate

    def doubled(*args, **kwargs):
        report = real(*args, **kwargs)
        report.breakdown = {k: 2 * v for k, v in report.breakdown.items()}
        return report

    vram.estimate = doubled
    try:
        assert answer_key("02.1") == 2 * before
        assert status("02.1", before) == "not yet"
    finally:
        vram.estimate = real
    assert status("02.1", before) == "correct"


# ----- numbers ------------------------------------------------------------------------------
def number_forms(qid: str) -> list[object]:
    value, unit = float(answer_key(qid)), bank()[qid].get("unit", "")
    if unit == "GB":
        return [
            value,
            f"{value / GB:.3f} GB",
            f"{value / GB:.3f}GB",
            value / GB,
            f"{value / GiB:.3f} GiB",
            f"{value / 1e6:,.0f} MB",
        ]
    if unit == "params":
        return [value, int(value), f"{value / 1e6:.3f}M", f"{value:,.0f}"]
    if unit in ("$", "$/h"):
        return [value, f"${value:.3f}", f"{value:.3f} USD"]
    if unit == "x":
        return [value, f"{value:.3f}x", f"{value:.3f} times"]
    if unit == "GiB":
        return [value, f"{value:.3f} GiB", f"{value * GiB / GB:.3f} GB"]
    return [value, str(value), f"{value} {unit}".strip()]


@pytest.mark.parametrize("qid", ids_of("number"))
def test_numbers_are_accepted_in_reasonable_forms(qid):
    for form in number_forms(qid):
        result = check(qid, form, show=False)
        assert result.status == "correct", (form, result.message)
        assert result.correct is True
        assert "Accepted within" in result.tolerance


@pytest.mark.parametrize("qid", ids_of("number"))
def test_wrong_numbers_are_rejected(qid):
    value = float(answer_key(qid))
    for factor in (2, 0.5, 1.3, 0.7, 10):
        result = check(qid, value * factor, show=False)
        assert result.status == "not yet" and result.correct is False, factor
        assert result.hint and ("too high" in result.message or "too low" in result.message)


def test_common_mistakes_get_their_own_hint():
    weights = answer_key("01.1")
    assert "fp32" in check("01.1", 2 * weights, show=False).message
    reserved = answer_key("05.2")
    # Divided by 10**9 where GiB were asked: the GiB/GB remark.
    assert "GiB" in check("05.2", reserved * GiB / GB, show=False).message
    only_weights = check("01.2", 2, show=False)
    assert only_weights.status == "not yet" and "gradients" in only_weights.message


@pytest.mark.parametrize(
    ("text", "unit", "expected"),
    [
        ("16 GB", "GB", 16e9),
        ("16GB", "GB", 16e9),
        (16e9, "GB", 16e9),
        (16, "GB", 16e9),
        ("16 GiB", "GB", 16 * GiB),
        ("15,000 MB", "GB", 15e9),
        ("0.44 s", "s", 0.44),
        ("440 ms", "s", 0.44),
        ("$17.90", "$", 17.9),
        ("1.79 $/h", "$/h", 1.79),
        ("8.4M", "params", 8.4e6),
        ("8,388,608", "params", 8388608),
        ("4x", "x", 4),
        ("16 bytes/param", "B/param", 16),
        ("14.9 GiB", "GiB", 14.9),
        ("3 GPUs", "GPUs", 3),
        ("6,0", "", 6.0),
    ],
)
def test_reading_numbers_with_units(text, unit, expected):
    from lessonkit.exercises.answer_parsing import _read_number

    assert _read_number(text, unit) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("text", "unit"),
    [("16 parsecs", "GB"), ("sixteen", "GB"), ("", "s"), ("1.2.3", "x"), ("5 kg", "$")],
)
def test_unreadable_numbers_say_what_is_expected(text, unit):
    from lessonkit.exercises.answer_parsing import _read_number, _Unreadable

    with pytest.raises(_Unreadable, match="number|unit"):
        _read_number(text, unit)


# ----- choices ------------------------------------------------------------------------------
@pytest.mark.parametrize("qid", ids_of("choice"))
def test_choices_forgive_case_and_spelling(qid):
    expected = answer_key(qid)
    name = expected if isinstance(expected, str) else sorted(expected)[0]
    for form in (name, name.upper(), f"  {name.lower()} ", name.replace(" ", "-")):
        assert status(qid, form) == "correct", form


@pytest.mark.parametrize("qid", ids_of("choice"))
def test_wrong_choices_are_rejected(qid):
    expected = answer_key(qid)
    accepted = {expected} if isinstance(expected, str) else set(expected)
    source = bank()[qid].get("options_from")
    if source == "gpus":
        from lessonkit.hardware.gpus import gpu_names

        others = gpu_names()
    elif source == "environments":
        from lessonkit.hardware.environments import list_environments

        others = [env.name for env in list_environments()]
    elif source == "categories":
        from lessonkit.memory.report import CATEGORIES

        others = list(CATEGORIES)
    elif source == "models":
        from lessonkit.models.presets import preset_names

        others = preset_names()
    else:
        others = options(qid)
    wrong = [name for name in others if name not in accepted]
    assert wrong, qid
    for name in wrong:
        assert status(qid, name) == "not yet", name
    assert status(qid, [sorted(accepted)[0]]) == "not yet"  # one option, not a list


def test_records_stand_for_their_names_and_reports_get_a_pointer():
    import lessonkit

    assert status("02.4", lessonkit.get_gpu(sorted(answer_key("02.4"))[0])) == "correct"
    assert status("06.6", lessonkit.get_preset(sorted(answer_key("06.6"))[0])) == "correct"
    report = lessonkit.estimate("7B", method="full", precision="bf16-mixed")
    result = check("02.1", report, show=False)
    assert result.status == "not yet" and "report.total_bytes" in result.message


def test_unknown_option_names_get_close_matches():
    result = check("02.3", ["8bit adamw", "checkpointng"], show=False)
    assert result.status == "not yet" and "Did you mean 'gradient checkpointing'" in result.message
    gpu = check("02.4", "rtx a600", show=False)
    assert gpu.status == "not yet" and "RTX A6000" in gpu.message


@pytest.mark.parametrize("qid", ids_of("multi"))
def test_multiple_choice_needs_exactly_the_right_set(qid):
    expected = sorted(answer_key(qid))
    assert status(qid, expected) == "correct"
    assert status(qid, [name.upper() for name in reversed(expected)]) == "correct"
    assert status(qid, tuple(expected)) == "correct"
    if len(expected) > 1:
        missing = check(qid, expected[1:], show=False)
        assert missing.status == "not yet" and "missing" in missing.message
    if bank()[qid].get("options"):
        names = list(options(qid))
    elif bank()[qid].get("options_from") == "gpus":
        from lessonkit.hardware.gpus import gpu_names

        names = gpu_names()
    else:
        names = ["full", "lora", "qlora"]
    extra = [n for n in names if n not in expected]
    assert extra, qid
    too_many = check(qid, expected + extra[:1], show=False)
    assert too_many.status == "not yet" and "not right" in too_many.message


def test_options_with_settings_are_runs_the_student_can_estimate():
    changes = options("02.3")
    assert isinstance(changes, dict) and all(isinstance(v, dict) for v in changes.values())
    assert set(answer_key("02.3")) < set(changes)  # some changes fit, some do not


# ----- tables -------------------------------------------------------------------------------
@pytest.mark.parametrize("qid", ids_of("table"))
def test_tables_accept_right_rows_under_other_spellings(qid):
    expected = answer_key(qid)
    assert status(qid, dict(expected)) == "correct"
    unit = bank()[qid]["unit"]
    written = {
        "GB": lambda v: f"{v / GB:.4f} GB",
        "GiB": lambda v: f"{v:.4f} GiB",
        "s": lambda v: f"{v * 1000:.4f} ms",
    }[unit]
    as_text = {name.upper(): written(v) for name, v in expected.items()}
    assert status(qid, as_text) == "correct"


@pytest.mark.parametrize("qid", ids_of("table"))
def test_tables_reject_a_wrong_or_missing_row(qid):
    expected = answer_key(qid)
    first = next(iter(expected))
    wrong = dict(expected, **{first: expected[first] * 3})
    result = check(qid, wrong, show=False)
    assert result.status == "not yet" and any("✘" in d for d in result.details)
    partial = {k: v for k, v in expected.items() if k != first}
    result = check(qid, partial, show=False)
    assert result.status == "not yet" and f"{first}: missing" in result.details
    result = check(qid, dict(expected, nonsense=1), show=False)
    assert result.status == "not yet" and any("nonsense" in d for d in result.details)


def test_the_bandwidth_table_knows_short_names():
    times = {
        "ddr5": 14 / 89.6,
        "pcie4": 14 / 31.5,
        "pcie5": 14 / 63,
        "gddr6x": 14 / 1008,
        "hbm3": 14 / 3350,
    }
    assert status("06.1", times) == "correct"


# ----- the health-check debugging task ------------------------------------------------------
def guide_version():
    import torch

    def check_gpu_health():
        if not torch.cuda.is_available():
            print("[ERROR] No GPU detected. Training will be 100x slower on CPU.")
            return
        vram_total = torch.cuda.get_total_memory(0) / (1024**3)
        print(f"Total VRAM: {vram_total:.2f} GB")

    return check_gpu_health


def test_the_guide_snippet_is_rejected_with_the_reason():
    result = check("05.1", guide_version(), show=False)
    assert result.status == "not yet"
    assert any("get_total_memory" in d for d in result.details)


def test_gib_labelled_as_gb_is_rejected():
    def check_gpu_health():
        import torch

        if not torch.cuda.is_available():
            print("no GPU")
            return
        print(f"Total VRAM: {torch.cuda.get_device_properties(0).total_memory / 1024**3:.2f} GB")

    result = check("05.1", check_gpu_health, show=False)
    assert result.status == "not yet" and any("label it GiB" in d for d in result.details)


def test_fixed_health_checks_pass_in_gb_or_gib():
    import torch

    def in_gb():
        if not torch.cuda.is_available():
            print("[ERROR] No GPU detected.")
            return
        total = torch.cuda.get_device_properties(0).total_memory
        print(f"Total VRAM: {total / 1e9:.2f} GB")

    def in_gib():
        import torch as t

        if not t.cuda.is_available():
            print("[ERROR] No GPU detected.")
            return
        _free, total = t.cuda.mem_get_info(0)
        print(f"Total VRAM: {total / 2**30:.2f} GiB")

    for fn in (in_gb, in_gib):
        assert check("05.1", fn, show=False).status == "correct", fn.__name__
    assert sys.modules["torch"] is torch and torch.cuda.is_available is not None


def test_a_function_that_crashes_without_a_gpu_is_rejected():
    def crashes():
        import torch

        print(f"{torch.cuda.get_device_properties(0).total_memory / 1e9:.2f} GB")

    result = check("05.1", crashes, show=False)
    assert result.status == "not yet"
    assert any("without a GPU" in d and "RuntimeError" in d for d in result.details)


def test_an_untouched_function_is_not_answered():
    def check_gpu_health():
        raise NotImplementedError("your code here")

    assert status("05.1", check_gpu_health) == "not answered"
    assert status("05.1", "check_gpu_health") == "not yet"  # the name, not the function


# ----- free text ----------------------------------------------------------------------------
def test_reflections_get_a_self_check_not_a_grade():
    answer = (
        "GPU memory bandwidth is about 3350 GB/s on HBM3 against 90 GB/s for DDR5; every step "
        "reads all the weights, over PCIe if they live in system RAM, and the CPU lacks the "
        "parallel compute of the GPU."
    )
    result = check("06.3", answer, show=False)
    assert result.status == "self-check" and result.correct is None
    assert "not a grade" in result.message
    assert key_points_found("06.3", answer) == (4, 4)
    partial = (
        "It is slower because the bandwidth in GB/s is lower, that is really all there is to say."
    )
    found, total = key_points_found("06.3", partial)
    assert 0 < found < total


@pytest.mark.parametrize("answer", ["too short", 42, ["a", "b"]])
def test_reflections_need_some_text(answer):
    assert status("06.5", answer) == "not yet"


# ----- placeholders and odd input -----------------------------------------------------------
PLACEHOLDERS = [..., None, "", "   ", "Your answer here.", "your answer here"]
ODD = [
    float("nan"),
    float("inf"),
    -5,
    0,
    1e300,
    True,
    "abc",
    "16 parsecs",
    [1, 2],
    (),
    {},
    {"x": 1},
    {1, 2},
    object(),
    b"16 GB",
    3 + 4j,
    lambda: 0,
    print,
    types,
    "-",
]


@pytest.mark.parametrize("qid", question_ids())
def test_placeholders_report_not_answered(qid):
    for answer in PLACEHOLDERS:
        result = check(qid, answer, show=False)
        assert result.status == "not answered" and result.correct is None, answer
        assert "Not answered yet" in result.message


@pytest.mark.parametrize("qid", question_ids())
def test_odd_input_never_raises(qid):
    for answer in ODD:
        result = check(qid, answer, show=False)
        assert result.status in STATUSES, answer
        assert result.correct is not True or bank()[qid]["kind"] == "number", answer
        assert result.message


def test_unknown_question_ids_list_the_ids():
    with pytest.raises(LessonkitError, match="Did you mean '01.1'.*Question ids: 01.1, .*06.6"):
        check("O1.1", 1)
    with pytest.raises(LessonkitError, match="Section 01 has 01.1"):
        check("01.99", 1)
    assert check("1.1", ..., show=False).question_id == "01.1"
    assert hint("1.1") == bank()["01.1"]["hints"][0]


# ----- showing the result -------------------------------------------------------------------
def test_plain_python_prints_text_and_returns_the_result(capsys):
    result = check("01.5", "optimizer")
    printed = capsys.readouterr().out
    assert isinstance(result, CheckResult) and result.correct is True
    assert printed.startswith("01.5 ") and "CORRECT" in printed
    assert repr(result) == "<CheckResult 01.5: correct>"
    check("01.5", "weights", show=False)
    assert capsys.readouterr().out == ""


def test_html_carries_the_status_and_escapes_the_answer():
    result = check("01.5", "<script>", show=False)
    html = result._repr_html_()
    assert "data-question='01.5'" in html and "data-status='not yet'" in html
    assert "<script>" not in html


def test_importing_exercises_does_not_import_torch():
    code = (
        "import sys, lessonkit.exercises as e; e.check('01.5', 'weights', show=False); "
        "assert not {'torch', 'transformers', 'matplotlib'} & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_tolerance_is_stated_and_used():
    value = float(answer_key("02.1"))
    inside, outside = value * 1.04, value * 1.06
    assert status("02.1", inside) == "correct" and status("02.1", outside) == "not yet"
    assert "±5%" in check("02.1", inside, show=False).tolerance
    assert math.isclose(answer_key("04.1"), round(answer_key("04.1")))
    assert status("04.1", answer_key("04.1") + 1) == "not yet"


def test_t4_question_teaches_binary_card_sizes_and_what_pytorch_keeps():
    from lessonkit import get_gpu

    t4 = get_gpu("T4")
    assert answer_key("05.2") == pytest.approx((16 * GiB - t4.usable_bytes) / GiB)
    assert 1 < answer_key("05.2") < 2  # ECC's sixteenth of the chips, and the driver's reserve
    question = bank()["05.2"]
    assert question["unit"] == "GiB" and "ECC" in question["explanation"]
    assert status("05.2", f"{(16 * GiB - t4.usable_bytes) / 2**20:.0f} MiB") == "correct"
    assert status("05.2", 16 - 16e9 / GiB) == "not yet"  # the decimal reading of "16 GB"


def test_reflection_key_points_quote_no_figures():
    figure = re.compile(r"~?\d[\d.,]*\s*(?:GB|GiB|x\b|times\b|%)")
    for qid in ("06.3", "06.5"):
        for point in bank()[qid]["key_points"]:
            assert not figure.search(point["point"]), (qid, point["point"])


# ----- the guide's own figures and ranges ---------------------------------------------------
def test_weights_question_wants_the_exact_count_not_the_guides_14_gb():
    weights = answer_key("01.1")
    assert status("01.1", f"{weights / GB:.1f} GB") == "correct"  # to one decimal, as asked
    assert status("01.1", f"{weights / GB - 0.1:.1f}") == "not yet"
    guide = check("01.1", "14 GB", show=False)
    assert abs(14 * GB - weights) > 0.05 * GB  # the guide's rounding is outside the tolerance
    assert guide.status == "not yet" and "what the guide says" in guide.message
    assert "n_params" in guide.message and "too high" in guide.message
    assert "±0.05 GB" in guide.tolerance


@pytest.mark.parametrize(
    ("text", "unit", "expected"),
    [
        ("2-3x", "x", (2, 3)),
        ("2x - 3x", "x", (2, 3)),
        ("2 to 3 times", "x", (2, 3)),
        ("120–160 GB", "GB", (120e9, 160e9)),
        ("3-2x", "x", (2, 3)),
        ("4x", "x", None),
        ("2-3 parsecs", "x", None),
        ("-", "x", None),
        (23, "x", None),
    ],
)
def test_reading_ranges(text, unit, expected):
    from lessonkit.exercises.answer_parsing import _read_range

    found = _read_range(text, unit)
    assert found == (pytest.approx(expected) if expected else None)


def test_a_range_is_read_as_a_range_and_the_guides_range_is_named():
    expected = answer_key("01.3")
    guide = check("01.3", "2-3x", show=False)
    assert guide.status == "not yet" and "Could not read" not in guide.message
    assert "the guide's range" in guide.message and "above" in guide.message
    assert expected > 3  # why the guide's range is wrong for mixed-precision AdamW
    inside_guide = check("01.3", "2.5", show=False)
    assert inside_guide.status == "not yet" and "what the guide says" in inside_guide.message
    wide = check("01.3", f"{expected - 1:g}-{expected + 1:g}x", show=False)
    assert wide.status == "not yet" and "inside" in wide.message and "one number" in wide.message
    narrow = f"{expected * 0.99:.3f}-{expected * 1.01:.3f}x"
    assert status("01.3", narrow) == "correct"
    other = check("02.1", "1-2 GB", show=False)  # no guide figure: just where lessonkit's lies
    assert other.status == "not yet" and "above" in other.message and "guide" not in other.message


# ----- questions that make students think ---------------------------------------------------
def _numbers_in(text: str) -> list[float]:
    return [float(n.replace(",", "")) for n in re.findall(r"\d[\d,]*\.?\d*(?:e[-+]?\d+)?", text)]


def _gives_away(message: str, qid: str) -> bool:
    """Whether any number in ``message``, read in the question's unit, is the expected answer."""
    from lessonkit.exercises.answer_feedback import _compare
    from lessonkit.exercises.answer_parsing import _read_number

    question = bank()[qid]
    expected = float(answer_key(qid))
    for number in _numbers_in(message):
        try:
            value = _read_number(number, question.get("unit", ""))
        except Exception:  # a number too large to read is no answer
            continue
        if _compare(value, expected, question)[0] or math.isclose(value, expected, rel_tol=0.02):
            return True
    return False


@pytest.mark.parametrize("qid", ids_of("number"))
@pytest.mark.parametrize("junk", ["abc", "0.0123 parsecs", [1, 2], {"a": 1}, True, "1e999"])
def test_junk_input_never_gives_the_answer_away(qid, junk):
    result = check(qid, junk, show=False)
    assert result.status == "not yet"
    # the student's own input echoed back ("got [1, 2]") is not the answer given away
    message = result.message.replace(repr(junk), "<input>").replace(str(junk), "<input>")
    assert not _gives_away(message, qid), result.message
    assert not _gives_away(result.hint, qid), result.hint


@pytest.mark.parametrize("qid", ["01.1", "01.2", "01.3", "01.4"])
def test_the_issues_junk_examples_no_longer_show_the_answer(qid):
    message = check(qid, "abc", show=False).message
    assert "such as" in message  # still an example of the form wanted
    assert not _gives_away(message.replace("abc", ""), qid), message


@pytest.mark.parametrize(
    "qid", [q for q in ids_of("number") if bank()[q].get("unit", "") not in ("GB", "GiB", "s", "h")]
)
def test_ratio_and_count_questions_get_no_unit_diagnosis(qid):
    expected = float(answer_key(qid))
    for factor in (GiB / GB, GB / GiB, 1000, 1e-3, 1e6):
        result = check(qid, expected * factor, show=False)
        assert result.status == "not yet"
        text = str(result)
        assert "GiB/GB" not in text and "10^" not in text and "check your units" not in text, text


def test_the_gib_gb_diagnosis_stays_for_memory_questions():
    result = check("05.2", float(answer_key("05.2")) * GiB / GB, show=False)
    assert "GiB/GB factor" in result.message


@pytest.mark.parametrize(
    ("qid", "answer", "point"),
    [
        (
            "06.5",
            "It does not crash because gradients are not stored and nothing else is needed.",
            0,
        ),
        (
            "01.6",
            "No gradients are kept, and there is no optimizer state either, only weights here.",
            0,
        ),
        (
            "06.3",
            "System RAM is not slower and the bandwidth does not matter for training at all.",
            0,
        ),
    ],
)
def test_negated_mentions_are_not_key_points(qid, answer, point):
    result = check(qid, answer, show=False)
    assert result.verdict == "wrong claim" and result.status == "not yet"  # a denial is a claim
    assert "your answer mentions this" not in result.details[point], result.details
    assert key_points_found(qid, answer)[0] == 0


def test_not_only_is_not_a_negation():
    answer = (
        "Not only the weights: the gradients need as much memory again, so the model alone "
        "says little about the peak."
    )
    details = check("06.5", answer, show=False).details
    assert details[0].endswith("(your answer mentions this)"), details


def test_reflections_are_a_checklist_that_asks_for_no_ticks():
    answer = (
        "Gradients need as much memory as the weights, AdamW keeps two states per parameter, "
        "activations grow with batch size, the CUDA context takes memory; use QLoRA."
    )
    result = check("06.5", answer, show=False)
    assert key_points_found("06.5", answer) == (5, 5)
    assert all(d.startswith("✓ ") for d in result.details)  # what the answer touches
    assert "tick" not in str(result) and "correct" not in result.message.lower()
    assert "not a grade" in result.message and result.verdict == "complete"


def test_no_question_is_a_yes_or_no_guess():
    for qid, question in bank().items():
        names = {o if isinstance(o, str) else o["name"] for o in question.get("options", [])}
        assert not names or len(names) > 2, qid


def test_every_section_has_an_apply_or_analyse_question_beyond_a_pick():
    for section in SECTIONS:
        thinking = [
            q
            for q in question_ids(section)
            if bank()[q]["level"] in ("apply", "analyse") and bank()[q]["kind"] != "choice"
        ]
        assert thinking, section
    assert {q["level"] for q in bank().values()} <= {
        "remember",
        "understand",
        "apply",
        "analyse",
        "evaluate",
    }


def test_the_cheapest_place_question_says_that_free_tiers_count():
    import json as _json
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    cells = _json.loads((root / "solutions" / "03_choosing_your_environment.ipynb").read_text())[
        "cells"
    ]
    text = "".join(next(c for c in cells if c["id"] == "q03-1")["source"])
    assert "that you rent" not in text and "free tiers count" in text
    from lessonkit import get_environment

    assert all(get_environment(name).tier == 1 for name in answer_key("03.1"))  # a free tier wins


def test_the_exercise_placeholder_in_a_function_is_not_answered():
    namespace: dict = {}
    exec(
        "import torch\ndef f():\n    answer = ...  # your answer here\n    print(f'{vram_total} GB')\n",
        namespace,
    )
    result = check("05.1", namespace["f"], show=False)
    assert result.status == "not answered" and "answer = ..." in result.message


def test_autograde_is_silent_for_students_and_strict_under_nbgrader(monkeypatch, capsys):
    from lessonkit.exercises.grading import autograde

    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    assert autograde("01.5", "weights") is None and autograde("01.5", ...) is None
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    autograde("01.5", "optimizer")
    for answer in ("weights", ..., "abc", None):
        with pytest.raises(AssertionError, match="01.5 is (not yet|not answered)"):
            autograde("01.5", answer)

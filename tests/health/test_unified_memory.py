"""The health check judges a unified-memory machine (the DGX Spark) against the memory a run
can have, what torch.cuda.mem_get_info() reports free, or the catalog's usable figure, never
against total_memory, which counts the whole pool the OS and the CPU side share."""

from __future__ import annotations

from lessonkit.hardware.gpus import get_gpu
from lessonkit.health.report import Device
from lessonkit.health.verdict import device_lines
from lessonkit.models.presets import resolve_model
from lessonkit.planning.verdicts import fit_sentence
from lessonkit.units import GiB

TOTAL = round(121.69 * GiB)  # what get_device_properties(0).total_memory says on a DGX Spark


def spark(free: int | None) -> Device:
    return Device(
        index=0,
        name="NVIDIA GB10",
        backend="cuda",
        total_memory_bytes=TOTAL,
        free_memory_bytes=free,
        native_bf16=True,
        smoke_test="passed",
        catalog_name="DGX Spark",
    )


def test_without_a_free_reading_the_catalogs_usable_figure_is_the_budget():
    gpu, spec = get_gpu("DGX Spark"), resolve_model("7B")
    lines = device_lines(spec, [spark(None)])
    assert len(lines) == 1
    label = (
        f"{gpu.usable_bytes / GiB:.1f} GiB DGX Spark "
        "(usable on an idle machine of 121.7 GiB total_memory)"
    )
    assert lines[0] == fit_sentence(spec, label, gpu.usable_bytes, 1, True, gpu=gpu)
    assert not lines[0].startswith("121.7 GiB")
    assert gpu.unified_memory_note in lines[0]


def test_what_is_free_now_is_the_budget_when_it_was_read():
    spec = resolve_model("llama-3.1-8b")
    free = round(90.0 * GiB)
    (line,) = device_lines(spec, [spark(free)])
    assert line.startswith("90.0 GiB DGX Spark (free now of 121.7 GiB total_memory):")


def test_a_run_between_the_usable_figure_and_total_memory_does_not_fit():
    # a 5.5B model's full fine-tuning peaks at about 109 GiB: judged against total_memory it
    # would fit, against the 101.3 GiB a run can have it does not
    gpu = get_gpu("DGX Spark")
    for size in ("5B", "5.5B", "6B"):
        spec = resolve_model(size)
        on_total = fit_sentence(spec, "121.7 GiB GPU", TOTAL, 1, True)
        on_usable = fit_sentence(spec, "101.3 GiB GPU", gpu.usable_bytes, 1, True)
        if "full fine-tuning fits" in on_total and "full fine-tuning fits" not in on_usable:
            (line,) = device_lines(spec, [spark(None)])
            assert "full fine-tuning fits" not in line
            return
    raise AssertionError("no size between the two figures among those tried")

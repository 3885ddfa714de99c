"""A core path a newcomer can follow: each notebook states its minutes, keeps its core path
under the word limit with the optional parts under "Going deeper" headings, links the
glossary, and defines each glossary term where it first uses it (or links it)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import course_words  # noqa: E402
import glossary_links  # noqa: E402

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.fixture(scope="module")
def terms() -> list[glossary_links.Term]:
    return glossary_links.glossary_terms()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_core_path_within_the_limit_and_minutes_stated(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    assert course_words.core_words(nb) <= course_words.LIMIT
    minutes = course_words.stated_minutes(nb)
    assert minutes is not None and 10 <= minutes <= 30, minutes


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_going_deeper_comes_after_the_takeaways(path: Path) -> None:
    """Optional sections are headings JupyterLab and Colab fold, after the core's takeaways."""
    nb = nbformat.read(path, as_version=4)
    sources = [c.source for c in nb.cells if c.cell_type == "markdown"]
    deeper = [i for i, s in enumerate(sources) if course_words.OPTIONAL.match(s)]
    takeaways = [i for i, s in enumerate(sources) if re.search(r"^## (Key )?[Tt]akeaways", s, re.M)]
    if deeper:
        assert takeaways and min(deeper) > max(takeaways)


def test_notebook_1_keeps_its_detail_in_going_deeper() -> None:
    """The library-version recipes, the recipe table and the measured step are optional."""
    nb = nbformat.read(NOTEBOOKS[0], as_version=4)
    core = " ".join(" ".join(c.source.split()) for c in course_words.core_cells(nb))
    deeper = " ".join(" ".join(c.source.split()) for c in course_words.optional_cells(nb))
    for detail in ("adamw_torch_fused", "foreach", "dtype=torch.float32", "Llama 2's"):
        assert detail not in core and detail in deeper, detail
    for term in ("allocator margin", "autocast", "LoRA dropout", "ZeRO", "FSDP", "bf16-master"):
        assert term.lower() in (core + deeper).lower(), term


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_every_notebook_links_the_glossary(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    assert f"]({glossary_links.GLOSSARY_URL})" in nb.cells[0].source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_glossary_terms_defined_on_first_use_or_linked(path: Path, terms) -> None:
    nb = nbformat.read(path, as_version=4)
    assert glossary_links.bare(nb, terms) == []


def test_the_glossary_holds_the_jargon_the_course_uses(terms) -> None:
    names = {t.text for t in terms}
    for jargon in (
        "Allocator margin",
        "LoRA dropout",
        "bf16-master",
        "Autocast",
        "ZeRO",
        "FSDP",
        "NVML",
        "ECC",
        "MFU",
        "Mixture of experts",
        "Expert",
        "Active parameters",
    ):
        assert jargon in names, jargon
    anchors = [t.anchor for t in terms]
    text = glossary_links.GLOSSARY.read_text(encoding="utf-8")
    assert all(f'<a id="{a}"></a>' in text for a in anchors)
    assert len(text.split()) < 900  # one page


def test_the_glossary_check_finds_a_bare_first_use(terms) -> None:
    cells = [
        nbformat.v4.new_markdown_cell("The **CUDA context** is fixed. NVML reads the driver."),
        nbformat.v4.new_markdown_cell("The [ECC](x/docs/glossary.md#ecc) bits; MFU is a share."),
        nbformat.v4.new_markdown_cell("## NVML in a heading\n\nand `MFU` in code"),
    ]
    nb = nbformat.v4.new_notebook(cells=cells)
    found = glossary_links.bare(nb, terms)
    assert [line.split(": ", 1)[1].split(" ")[0] for line in found] == ["'NVML'", "'MFU'"]
    assert glossary_links.link(nb, terms) == 2
    assert glossary_links.bare(nb, terms) == []
    assert "[NVML](" in nb.cells[0].source and "#nvml)" in nb.cells[0].source


def test_the_word_count_leaves_out_going_deeper_and_addresses() -> None:
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_markdown_cell("# Title\n\nfour words of [prose](https://a.b/c/d)"),
            nbformat.v4.new_markdown_cell("## Going deeper: more\n\nnot counted at all"),
            nbformat.v4.new_markdown_cell("### still deeper\n\nnot counted"),
            nbformat.v4.new_markdown_cell("## Check your understanding\n\ncounted"),
        ]
    )
    # "Title four words of prose" and "Check your understanding counted"; marks are no words
    assert course_words.core_words(nb) == 5 + 4


@pytest.mark.parametrize(
    "path", sorted((ROOT / "exercises").glob("*.ipynb")), ids=lambda p: f"exercises-{p.name[:2]}"
)
def test_every_practice_notebook_links_the_glossary(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    assert f"]({glossary_links.GLOSSARY_URL})" in nb.cells[0].source

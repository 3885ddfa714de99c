"""One answer per question the course asks in more than one notebook: whether one A100 80GB
holds a full fine-tune, what fits a free T4, where the guide's "~120 to 160 GB" comes from and
which environment runs a run for the least money.

Each function returns a ``CourseAnswer``: the deciding figure, a sentence with the figures and a
takeaway without them (the words the notebooks' takeaways use). The figures come from the
calculator, the catalog and the sentences of ``guide_claims`` and ``verdicts``; nothing here is
typed by hand.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..hardware.gpus import get_gpu
from ..models.presets import resolve_model
from ..models.recipes import usual_recipe
from ..models.spec import ModelSpec
from ..units import GB, GiB
from .fitting import method_label
from .guide_claims import method_fits
from .recommender import recommend
from .verdicts import full_on_one_a100_figures

GUIDE_RANGE_GB = (120, 160)  # the guide's "~120 to 160 GB" for a full fine-tune of a 7B model
DEFAULT_TOKENS = 10_000_000  # the course's run for comparing environments


@dataclass(frozen=True)
class CourseAnswer:
    """The course's one answer to a question: its figure, a sentence with the figures, a
    takeaway in words only, and ``topic``, a pattern that finds the question in a text."""

    key: str
    question: str
    figure: float
    unit: str  # "bytes" or "USD"
    sentence: str
    takeaway: str
    topic: str
    names: tuple[str, ...] = ()  # the GPUs or environments that answer, where it names any
    # each environment's cheapest run that fits, in USD, for a reveal's reason: (name, cost)
    costs: tuple[tuple[str, float], ...] = ()

    def mentioned_in(self, text: str) -> bool:
        """True when ``text`` speaks of this answer's question."""
        return re.search(self.topic, " ".join(text.split()), re.IGNORECASE | re.DOTALL) is not None


def _size(model: Any, spec: ModelSpec) -> str:
    """'a 7B model' for a size such as '7B', else the model's name: how the takeaways name
    a model, without its exact shape."""
    if isinstance(model, str) and re.fullmatch(r"\d+(\.\d+)?[BM]", model.strip(), re.I):
        return f"a {model.strip().upper()} model"
    return spec.name


def _trainer_peak(spec: ModelSpec) -> float:
    """Full fine-tuning of ``spec`` with Hugging Face's Trainer today (pure bf16, fused AdamW)
    at batch 1 x 512, in bytes."""
    from ..memory.estimating import estimate

    recipe: dict[str, Any] = {**usual_recipe("trainer"), "batch_size": 1, "seq_len": 512}
    return estimate(spec, method="full", **recipe).total_bytes


def a100_full_answer(model: Any = "7B") -> CourseAnswer:
    """Does one A100 80GB hold a full fine-tune of ``model`` (batch 1 x 512)? Pure bf16 against
    mixed-precision AdamW, and the other ways that fit."""
    spec = resolve_model(model)
    gpu = get_gpu("A100 80GB")
    plain, ways = full_on_one_a100_figures(spec)
    pure = next((value for name, value in ways if name.startswith("pure bf16")), None)
    others = [(name, value) for name, value in ways if not name.startswith("pure bf16")]
    mixed_fits = plain <= gpu.usable_bytes
    run = f"a full fine-tune of {_size(model, spec)}"
    if mixed_fits:
        words = f"holds {run} even with mixed-precision AdamW"
    elif pure is not None:
        words = f"holds {run} in pure bf16, not with mixed-precision AdamW"
    else:
        words = f"does not hold {run}, in pure bf16 or with mixed-precision AdamW"
    short = {  # the single changes (a combination of two is left to the sentence)
        "8-bit AdamW": "8-bit AdamW states",
        "optimizer states offloaded to the CPU (ZeRO-Offload)": "optimizer states on the CPU",
        "ZeRO-3 over 2 GPUs": "sharding over two GPUs",
    }
    singles = [short[name] for name, _ in others if name in short]
    takeaway = f"One A100 80GB {words}"
    if singles and not mixed_fits:
        listed = ", ".join(singles[:-1]) + " or " + singles[-1] if len(singles) > 1 else singles[0]
        takeaway += f"; {listed} {'fit' if len(singles) > 1 else 'fits'} too"
    takeaway += "."
    sentence = (
        f"Full fine-tuning of {spec.name} on one {gpu.name} ({gpu.usable_text} usable), batch "
        f"1 x 512: mixed-precision AdamW peaks at {plain / GiB:.1f} GiB "
        f"({'fits' if mixed_fits else 'does not fit'})"
        + (
            f", pure bf16 at {pure / GiB:.1f} GiB with PyTorch's AdamW and "
            f"{_trainer_peak(spec) / GiB:.1f} GiB with the Trainer's fused AdamW (both fit)"
            if pure is not None
            else ""
        )
        + "".join(f"; {name}: {value / GiB:.1f} GiB" for name, value in others)
        + "."
    )
    return CourseAnswer(
        key="a100",
        question=f"Does one A100 80GB hold a full fine-tune of {spec.name}?",
        figure=pure if pure is not None and not mixed_fits else plain,
        unit="bytes",
        sentence=sentence,
        takeaway=takeaway,
        topic=r"(A100|80 GB)[^.]*full (fine-tun|SFT)|full (fine-tun|SFT)[^.]*(A100|80 GB)",
        names=(gpu.name,),
    )


def t4_answer(model: Any = "7B") -> CourseAnswer:
    """What fits the free tier's 16 GB T4 for ``model``: each method's best fit."""
    spec = resolve_model(model)
    gpu = get_gpu("T4")
    fits = method_fits(spec, gpu)
    words, parts = [], []
    for method, fit in fits.items():
        label = method_label(method, gpu.native_bf16)
        if not fit.fits:
            how = "does not fit"
        elif fit.tight:
            how = "fits only tightly"
        else:
            how = "fits with room to spare"
        words.append((method, how))
        parts.append(f"{label} {how} ({fit.peak_bytes / GiB:.1f} GiB at {fit.settings_text()})")
    names = {"qlora": "QLoRA", "lora": "LoRA", "full": "a full fine-tune"}
    said = "; ".join(f"{names[m]} {how}" for m, how in words)
    lightest = next((fit for fit in fits.values() if fit.fits), fits["qlora"])
    return CourseAnswer(
        key="t4",
        question=f"What fits a free 16 GB T4 for {spec.name}?",
        figure=lightest.peak_bytes,
        unit="bytes",
        sentence=f"On a 16 GB {gpu.name} ({gpu.usable_text} usable), for {spec.name}: "
        + "; ".join(parts)
        + ".",
        takeaway=f"On a free 16 GB T4, for {_size(model, spec)}: {said}.",
        topic=r"\bT4\b|free tier[^.;]*(LoRA|fine-tun)",
        names=(gpu.name,),
    )


def guide_range_answer(model: Any = "7B") -> CourseAnswer:
    """Where the guide's '~120 to 160 GB' for a full fine-tune comes from: mixed precision in a
    plain PyTorch loop (batch 1 x 512), against pure bf16 with today's Trainer recipe."""
    spec = resolve_model(model)
    low, high = (value * GB for value in GUIDE_RANGE_GB)
    step: dict[str, Any] = dict(method="full", batch_size=1, seq_len=512)
    from ..memory.estimating import estimate

    mixed = estimate(spec, precision="bf16-mixed", optimizer="adamw", **step).total_bytes
    pure = _trainer_peak(spec)
    place = "inside" if low <= mixed <= high else "below" if mixed < low else "above"
    share = pure / mixed
    less = "less than half" if share < 0.5 else "less" if share < 1 else "more"
    pure_words = f"in pure bf16, the default of today's Trainer, it needs {less}"
    if place == "inside":
        takeaway = (
            f'The guide\'s "~120 to 160 GB" is what a full fine-tune of {_size(model, spec)} '
            f"needs in mixed precision with AdamW; {pure_words}."
        )
    else:
        takeaway = (
            f"A full fine-tune of {_size(model, spec)} in mixed precision with AdamW is {place} "
            f'the guide\'s "~120 to 160 GB"; {pure_words}.'
        )
    sentence = (
        f"The guide's '~120 to 160 GB' ({low / GiB:.1f}-{high / GiB:.1f} GiB): full fine-tuning "
        f"of {spec.name} in mixed precision with AdamW in a plain PyTorch loop peaks at "
        f"{mixed / GiB:.1f} GiB at batch 1 x 512, {place} the range; pure bf16 with fused AdamW "
        f"(the Trainer's default) at {pure / GiB:.1f} GiB."
    )
    return CourseAnswer(
        key="guide_range",
        question=f"Where does the guide's '~120 to 160 GB' for {spec.name} come from?",
        figure=mixed,
        unit="bytes",
        sentence=sentence,
        takeaway=takeaway,
        topic=r"120 to 160|120-160",
    )


def cheapest_environment_answer(
    model: Any = "7B", method: str = "lora", tokens: float = DEFAULT_TOKENS
) -> CourseAnswer:
    """Which environment runs ``tokens`` of ``method`` for the least money: free where a free
    tier holds it, and the cheapest paid one (the whole run's cost, ties kept)."""
    spec = resolve_model(model)
    rec = recommend(spec, method=method, tokens=tokens)
    first: dict[str, Any] = {}  # each environment's first fit in the ranking, as its row shows
    for option in rec.options:
        if option.fits:
            first.setdefault(option.environment, option)
    free = [o for o in first.values() if o.price_per_hour == 0 and o.purchase_usd is None]
    paid = [o for o in first.values() if o.price_per_hour > 0 and o.cost_usd is not None]
    names: tuple[str, ...] = ()
    cost = 0.0
    if not paid:
        paid_words = "no paid environment fits it"
    else:
        cost = min(o.cost_usd for o in paid)
        # costs that read the same to the cent are a tie: a student cannot tell them apart
        best = sorted((o for o in paid if round(o.cost_usd, 2) == round(cost, 2)), key=_by_cost)
        names = tuple(sorted(o.name for o in best))
        runs = " or ".join(
            f"{o.name} ({o.setup}, {o.run_hours:.1f} h for ${o.cost_usd:,.2f})" for o in best
        )
        paid_words = f"the cheapest paid one is {runs}" + (", a tie" if len(best) > 1 else "")
    free_words = (
        f"{free[0].name} runs it free ({free[0].setup}, {free[0].run_hours:.1f} h)"
        if free
        else "no free tier holds it"
    )
    label = method_label(method)
    takeaway = (
        f"For {label} of {_size(model, spec)}, "
        + ("a free tier is the cheapest start" if free else "no free tier holds the run")
        + "; among paid environments, a pay-as-you-go GPU cloud costs least for the whole run, "
        "not the lowest price per hour."
        if names and all(o.tier == "engineer" for o in paid if o.name in names)
        else f"For {label} of {_size(model, spec)}, compare the whole run's cost, not the price per hour."
    )
    return CourseAnswer(
        key="cheapest",
        question=f"Which environment runs {tokens:,.0f} tokens of {label} of {spec.name} for "
        "the least money?",
        figure=cost,
        unit="USD",
        sentence=f"{label} of {spec.name}, {tokens:,.0f} training tokens: {free_words}; "
        f"{paid_words}.",
        takeaway=takeaway,
        topic=r"cheapest (start|environment|paid)|least money|costs? least",
        names=names,
        costs=tuple(sorted((o.name, float(o.cost_usd or 0.0)) for o in first.values())),
    )


def _by_cost(option: Any) -> float:
    return float(option.cost_usd)


def course_answers(model: Any = "7B") -> dict[str, CourseAnswer]:
    """Every answer of this module by key: 'a100', 't4', 'guide_range', 'cheapest'."""
    answers = (
        a100_full_answer(model),
        t4_answer(model),
        guide_range_answer(model),
        cheapest_environment_answer(model),
    )
    return {answer.key: answer for answer in answers}


def disagreements(texts: dict[str, str], answers: dict[str, CourseAnswer]) -> list[str]:
    """Where a takeaway speaks of a question without the course's answer: one line per text
    (by its name) and question; empty when every takeaway agrees."""
    found = []
    for where, text in texts.items():
        flat = " ".join(re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text).split())  # links: text
        for answer in answers.values():
            if answer.mentioned_in(flat) and answer.takeaway not in flat:
                found.append(
                    f"{where} speaks of '{answer.question}' without the course's answer: "
                    f"{answer.takeaway!r}"
                )
    return found

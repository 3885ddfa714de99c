"""The guide's claims about prices, free tiers and its GPU table, each checked against the
catalog and ending in a one-sentence verdict computed here (never typed by hand).

Every function returns one sentence that starts with the guide's words in quotes and says
whether they hold ('right', 'mostly right', 'half right', 'too modest', 'wrong' and the like),
with the figures that decide it. ``guide_claim_verdicts()`` collects them for a notebook.
"""

from __future__ import annotations

from typing import Any

from ..errors import LessonkitError
from ..hardware.environments import Environment, Offer, get_environment, list_environments
from ..hardware.gpus import GPU, get_gpu, list_gpus
from ..models.presets import resolve_model
from ..models.spec import ModelSpec
from ..units import GiB
from .fitting import (
    DEFAULT_MFU,
    DEFAULT_SEQ,
    compute_hours,
    find_fit,
    method_label,
    overhead_hours,
)
from .verdicts import full_on_one_a100_figures

GUIDE_A100_PRICE = 1.50  # "You can rent an A100 for ~$1.50/hour"
GUIDE_MARKUP = (2.0, 3.0)  # "often 2-3x the price of Lambda Labs"
GUIDE_FREE_MEMORY_GB = (12, 16)  # "limited VRAM (12-16GB)"
# "~" read as within a fifth either way.
ABOUT = 0.2


def _possessive(name: str) -> str:
    return f"{name}'" if name.endswith("s") else f"{name}'s"


def _money(value: float) -> str:
    return f"${value:,.2f}"


def _span(values: list[float]) -> str:
    low, high = min(values), max(values)
    return _money(low) if low == high else f"{_money(low)}-{high:,.2f}"


def _offers(gpu_names: tuple[str, ...], tier: int) -> list[tuple[Environment, Offer]]:
    return [
        (env, offer)
        for env in list_environments(tier=tier)
        for offer in env.offers
        if offer.gpu.name in gpu_names and not offer.free
    ]


def a100_price_verdict() -> str:
    """The guide's tier 2: 'You can rent an A100 for ~$1.50/hour', against the GPU clouds'
    A100 offers (per GPU-hour, typical and range)."""
    offers = _offers(("A100 80GB", "A100 40GB"), tier=2)
    if not offers:
        return "'Rent an A100 for ~$1.50/hour': no GPU cloud of the catalog rents an A100."
    typical = [o.price_per_hour.typical for _, o in offers]
    lows = [o.price_per_hour.low for _, o in offers]
    highs = [o.price_per_hour.high for _, o in offers]
    near = [t for t in typical if abs(t - GUIDE_A100_PRICE) <= ABOUT * GUIDE_A100_PRICE]
    inside = min(lows) <= GUIDE_A100_PRICE <= max(highs)
    verdict = "right" if near else ("roughly right" if inside else "wrong")
    listed = ", ".join(
        f"{_money(o.price_per_hour.typical)} ({env.name}, {o.gpu.name})"
        for env, o in sorted(offers, key=lambda eo: eo[1].price_per_hour.typical)
    )
    return (
        f"The guide's 'rent an A100 for ~$1.50/hour' is {verdict}: the GPU clouds' typical "
        f"prices per A100-hour are {listed}, and their offers span "
        f"{_span(lows + highs)} (as of {max(o.as_of for _, o in offers)})."
    )


def enterprise_markup_verdict() -> str:
    """The guide's tier 3: 'often 2-3x the price of Lambda Labs', for every GPU that Lambda
    and an enterprise platform both rent (typical price per GPU-hour, instance included)."""
    lam = get_environment("lambda")
    ratios: list[tuple[str, str, float]] = []
    for env in list_environments(tier=3):
        for offer in env.offers:
            try:
                theirs = lam.offer(offer.gpu)
            except LessonkitError:
                continue
            ratio = env.hourly_cost(offer) / lam.hourly_cost(theirs)
            ratios.append((env.name, offer.gpu.name, ratio))
    if not ratios:
        return "'2-3x the price of Lambda Labs': no GPU is rented by both in the catalog."
    low, high = GUIDE_MARKUP
    within = [r for r in ratios if low <= r[2] <= high]
    above = [r for r in ratios if r[2] > high]
    below = [r for r in ratios if r[2] < low]
    share = len(within) / len(ratios)
    verdict = "right" if share == 1 else "mostly right" if share >= 0.5 else "mostly wrong"

    def words(rows: list[tuple[str, str, float]]) -> str:
        return ", ".join(f"{gpu} on {name} {ratio:.1f}x" for name, gpu, ratio in rows)

    parts = [f"{len(within)} of the {len(ratios)} prices compared are 2-3x ({words(within)})"]
    if above:
        parts.append(f"{len(above)} cost more ({words(above)})")
    if below:
        parts.append(f"{len(below)} cost less ({words(below)})")
    return (
        f"The guide's 'often 2-3x the price of Lambda Labs' is {verdict}: for the GPUs Lambda "
        f"and the enterprise platforms both rent, per GPU-hour, " + "; ".join(parts) + "."
    )


def _free_offers() -> list[tuple[Environment, Offer]]:
    return [(env, o) for env in list_environments(tier=1) for o in env.offers if o.free]


def free_tier_memory_verdict() -> str:
    """The guide's tier 1: 'limited VRAM (12-16GB)', against the free GPUs of Colab and Kaggle
    and what PyTorch can allocate on them."""
    free = _free_offers()
    usable = [(env, o) for env, o in free if not o.broken and o.gpu.current_wheels]
    if not usable:
        return "'Limited VRAM (12-16GB)': the catalog lists no usable free GPU."
    sizes = sorted({o.gpu.memory_gb for _, o in usable})
    low, high = GUIDE_FREE_MEMORY_GB
    inside = all(low <= s <= high for s in sizes)
    reaches_low = min(sizes) <= low
    verdict = "right" if inside and reaches_low else "half right" if inside else "wrong"
    gpus = {o.gpu.name: o.gpu for _, o in usable}
    cards = "; ".join(
        f"{g.name}: {g.memory_gb:g} GB card, {g.usable_text} usable by PyTorch"
        for g in gpus.values()
    )
    most = max(max(o.counts) for _, o in usable)
    where = [env.name for env, o in usable if max(o.counts) == most]
    broken = [
        f"{_possessive(env.name)} {o.gpu.name}"
        for env, o in free
        if o.broken or not o.gpu.current_wheels
    ]
    text = (
        f"The guide's 'limited VRAM (12-16GB)' of the free tier is {verdict}: the free GPUs are "
        f"{' and '.join(f'{s:g} GB' for s in sizes)} cards ({cards})"
    )
    if not reaches_low:
        text += f", none has {low} GB"
    if most > 1:
        name = next(o.gpu.name for _, o in usable if max(o.counts) == most)
        text += f", and {' and '.join(where)} gives {most} x {name} in one session"
    if broken:
        text += f" ({', '.join(broken)} has no kernels in current PyTorch wheels)"
    return text + "."


def _tokens_in(spec: ModelSpec, fit: Any, hours: float, gpu: GPU, sessions: int = 1) -> float:
    """Training tokens a run of ``fit`` gets through in ``hours`` of wall time on
    ``fit.count`` x ``gpu``, after starting up and loading the model once per session."""
    per_million = compute_hours(
        spec,
        fit.method,
        1e6,
        gpu.bf16_tflops,
        fit.count,
        DEFAULT_MFU,
        fit.gradient_checkpointing,
        fit.seq_len,
    )
    train = max(0.0, hours - overhead_hours(spec, fit.method, hours, sessions))
    return train / per_million * 1e6


def free_tier_experiments_verdict(model: Any = "7B", seq_len: int = DEFAULT_SEQ) -> str:
    """The guide's tier 1: 'Only suitable for very small 7B model experiments', against what
    fits a free GPU and how many tokens a free session (Colab) or a week's quota (Kaggle)
    trains with the lightest method that fits with room to spare."""
    spec = resolve_model(model)
    free = [(env, o) for env, o in _free_offers() if not o.broken and o.gpu.current_wheels]
    if not free:
        return "'Only suitable for very small 7B model experiments': no usable free GPU."
    gpu = free[0][1].gpu
    fits = method_fits(spec, gpu, seq_len=seq_len)
    words = []
    for method, fit in fits.items():
        label = method_label(method, gpu.native_bf16)
        if fit.fits:
            how = "tightly" if fit.tight else "with room to spare"
            words.append(
                f"{label} fits {how} ({fit.peak_bytes / GiB:.1f} of {gpu.usable_text} at "
                f"{fit.settings_text()})"
            )
        else:
            words.append(
                f"{label} does not ({fit.peak_bytes / GiB:,.1f} GiB even at batch 1 with "
                "checkpointing)"
            )
    best = next((m for m in ("qlora", "lora") if fits[m].fits and not fits[m].tight), None)
    runs = []
    if best is not None:
        for env, offer in free:
            if env.session_hours and not env.weekly_gpu_hours:
                tokens = _tokens_in(spec, fits[best], env.session_hours, gpu)
                runs.append(
                    f"one {env.session_hours:g} h session on {env.name} trains about "
                    f"{tokens / 1e6:,.0f}M tokens"
                )
            if env.weekly_gpu_hours:
                count = max(offer.counts)
                fit = _one_fit(spec, best, gpu, count, seq_len)
                sessions = env.sessions_needed(env.weekly_gpu_hours)
                tokens = _tokens_in(spec, fit, env.weekly_gpu_hours, gpu, sessions)
                runs.append(
                    f"{_possessive(env.name)} {env.weekly_gpu_hours:g} hours a week on "
                    f"{count} x {gpu.name} about {tokens / 1e6:,.0f}M"
                )
    verdict = (
        f"too modest for {method_label(best, gpu.native_bf16)}, right for full fine-tuning"
        if best is not None and not fits["full"].fits
        else "too modest"
        if best is not None
        else "right"
    )
    tail = ""
    if best is not None and runs:
        tail = (
            f"; with {method_label(best, gpu.native_bf16)}, {', and '.join(runs)} "
            f"({seq_len}-token examples, {DEFAULT_MFU:.0%} of the GPU's dense compute)"
        )
    return (
        f"The guide's 'only suitable for very small 7B model experiments' is {verdict} "
        f"for {spec.name} on a free {gpu.name}: {'; '.join(words)}{tail}."
    )


def _one_fit(spec: ModelSpec, method: str, gpu: GPU, count: int, seq_len: int) -> Any:
    fit = find_fit(
        spec, method, gpu.usable_bytes, count, native_bf16=gpu.native_bf16, seq_len=seq_len
    )
    assert fit is not None  # every method runs on one GPU and on several
    return fit


def method_fits(
    spec: ModelSpec, gpu: GPU, count: int = 1, seq_len: int = DEFAULT_SEQ
) -> dict[str, Any]:
    """Each method's best fit of ``spec`` on ``count`` x ``gpu`` (lightest method first):
    'qlora', 'lora', 'full' -> ``Fit``."""
    return {
        method: _one_fit(spec, method, gpu, count, seq_len) for method in ("qlora", "lora", "full")
    }


def colab_a100_verdict(model: Any = "7B") -> str:
    """The guide's flow: '7B/8B, low budget -> Google Colab (A100)', against what Colab's free
    and paid tiers offer and what fits on them."""
    spec = resolve_model(model)
    colab = [e for e in list_environments() if e.detect.get("platform") == "colab"]
    free = [o for e in colab for o in e.offers if o.free]
    a100 = [(e, o) for e in colab for o in e.offers if o.gpu.name.startswith("A100")]
    if not a100:
        return "'Google Colab (A100)': Colab offers no A100 in the catalog."
    env, offer = a100[0]
    gpu = offer.gpu
    lora = _one_fit(spec, "lora", gpu, 1, DEFAULT_SEQ)
    free_a100 = [o for o in free if o.gpu.name.startswith("A100")]
    if free_a100:
        return f"The guide's 'Google Colab (A100)' is right: the free tier offers an {gpu.name}."
    text = (
        f"The guide's 'Low budget -> Google Colab (A100)' needs Colab's paid tier: the A100 is "
        f"the {gpu.name} of {env.name} at "
        f"{_span([offer.price_per_hour.low, offer.price_per_hour.high])} an hour "
        f"({offer.note.split(';')[0]}), where {method_label('lora', gpu.native_bf16)} of "
        f"{spec.name} {'fits' if lora.fits else 'does not fit'} ({lora.peak_bytes / GiB:.1f} of "
        f"{gpu.usable_text})"
    )
    if free:
        t4 = free[0].gpu
        qlora = _one_fit(spec, "qlora", t4, 1, DEFAULT_SEQ)
        text += f", while free Colab offers only a {t4.name}"
        if qlora.fits:
            text += (
                f", on which {method_label('qlora', t4.native_bf16)} of {spec.name} fits "
                f"({qlora.peak_bytes / GiB:.1f} of {t4.usable_text}) at no cost"
            )
    return text + "."


# The guide's GPU Selection Matrix: tier, its name for the GPU, the catalog's, its VRAM and
# 'Best for'.
GUIDE_MATRIX = (
    ("Consumer High-End", "NVIDIA RTX 4090", "RTX 4090", 24, "SFT of 7B/8B models using LoRA"),
    (
        "Prosumer/Workstation",
        "NVIDIA A6000",
        "RTX A6000",
        48,
        "SFT of 13B models or 7B with larger batches",
    ),
    (
        "Enterprise Cloud",
        "NVIDIA A100",
        "A100 80GB",
        80,
        "Fine-tuning 70B models or full SFT of 7B models",
    ),
    ("State-of-the-Art", "NVIDIA H100", "H100 SXM", 80, "The fastest training available today"),
)


def _guide_name(guide: str, gpu: GPU) -> str:
    """How the guide's name for a GPU relates to the catalog's: the other catalog cards its
    model number could be read as ('A6000': the RTX 6000 Ada and RTX PRO 6000 too)."""
    number = guide.split()[-1]
    key = number.lstrip("A") if len(number) > 4 else number  # 'A6000' reads as '6000'
    others = [g.name for g in list_gpus() if g is not gpu and key in g.name.replace(" ", "")]
    text = f"the guide's '{guide}' is the catalog's {gpu.name}"
    if others:
        text += f" (not the {' or '.join(others)})"
    return text


def guide_gpu_table() -> list[str]:
    """One verdict sentence per row of the guide's GPU Selection Matrix: its VRAM against the
    catalog and its 'Best for' against the estimates (or, for the H100, the catalog's
    compute)."""
    seven, thirteen, seventy = (resolve_model(size) for size in ("7B", "13B", "70B"))
    rows = []
    for tier, guide, name, vram, best_for in GUIDE_MATRIX:
        gpu = get_gpu(name)
        memory = _guide_name(guide, gpu) + (
            f"; its {vram}GB is the card's size ({gpu.memory_gb:g} GB, {gpu.usable_text} usable)"
            if gpu.memory_gb == vram
            else f"; its {vram}GB is wrong: the {gpu.name} has {gpu.memory_gb:g} GB"
        )
        if name == "RTX 4090":
            lora = _one_fit(seven, "lora", gpu, 1, DEFAULT_SEQ)
            full = _one_fit(seven, "full", gpu, 1, DEFAULT_SEQ)
            claim = (
                f"'{best_for}' {'holds' if lora.fits else 'does not hold'}: LoRA of "
                f"{seven.name} peaks at {lora.peak_bytes / GiB:.1f} GiB "
                f"({lora.settings_text()}), full fine-tuning "
                f"{'fits' if full.fits else 'does not'} ({full.peak_bytes / GiB:.1f} GiB)"
            )
        elif name == "RTX A6000":
            lora = _one_fit(thirteen, "lora", gpu, 1, DEFAULT_SEQ)
            full = _one_fit(thirteen, "full", gpu, 1, DEFAULT_SEQ)
            small = _largest_batch(seven, get_gpu("RTX 4090"))
            large = _largest_batch(seven, gpu)
            claim = (
                f"'SFT of 13B models' holds for LoRA only (LoRA of {thirteen.name} "
                f"{'fits' if lora.fits else 'does not fit'} at {lora.peak_bytes / GiB:.1f} GiB, "
                f"full fine-tuning needs {full.peak_bytes / GiB:.1f} GiB), and '7B with larger "
                f"batches' {'holds' if large > small else 'does not hold'}: LoRA of "
                f"{seven.name} runs at batch {large} x {DEFAULT_SEQ} with checkpointing here "
                f"against {small} on an RTX 4090"
                if lora.fits and not full.fits
                else f"'{best_for}': LoRA of {thirteen.name} peaks at "
                f"{lora.peak_bytes / GiB:.1f} GiB, full fine-tuning at {full.peak_bytes / GiB:.1f}"
            )
        elif name == "A100 80GB":
            qlora = _one_fit(seventy, "qlora", gpu, 1, DEFAULT_SEQ)
            lora = _one_fit(seventy, "lora", gpu, 1, DEFAULT_SEQ)
            plain, ways = full_on_one_a100_figures(seven)
            claim = (
                f"'Fine-tuning 70B models' holds for QLoRA only (QLoRA of {seventy.name} peaks "
                f"at {qlora.peak_bytes / GiB:.1f} GiB, LoRA at {lora.peak_bytes / GiB:.1f}); "
                f"'full SFT of 7B models' "
                + (
                    "holds"
                    if plain <= gpu.usable_bytes
                    else f"needs more than plain bf16-mixed AdamW ({plain / GiB:.1f} GiB): "
                    + ", ".join(f"{way} ({value / GiB:.1f} GiB)" for way, value in ways)
                    + (" fit instead" if ways else " and nothing else fits one")
                )
            )
        else:
            faster = sorted(
                (g for g in list_gpus() if g.bf16_tflops > gpu.bf16_tflops),
                key=lambda g: -g.bf16_tflops,
            )
            claim = (
                f"'{best_for}' is no longer so: "
                + ", ".join(f"{g.name} ({g.bf16_tflops:g})" for g in faster)
                + f" have more dense bf16 TFLOPS than its {gpu.bf16_tflops:g}"
                if faster
                else f"'{best_for}' holds: no catalog GPU has more dense bf16 compute"
            )
        rows.append(f"{tier}, {guide} {vram}GB: {memory}; {claim}.")
    return rows


def _largest_batch(spec: ModelSpec, gpu: GPU, most: int = 256) -> int:
    """The largest power-of-two LoRA batch at the default sequence, with checkpointing, that
    fits ``gpu`` (0 when batch 1 does not)."""
    batch = most
    while batch >= 1:
        fit = find_fit(
            spec, "lora", gpu.usable_bytes, 1, native_bf16=gpu.native_bf16, batch_size=batch
        )
        if fit is not None and fit.fits and fit.batch_size == batch:
            return batch
        batch //= 2
    return 0


def guide_claim_verdicts(model: Any = "7B") -> dict[str, str]:
    """Every verdict of this module by claim: 'a100_price', 'enterprise_markup',
    'free_tier_memory', 'free_tier_experiments', 'colab_a100'."""
    return {
        "a100_price": a100_price_verdict(),
        "enterprise_markup": enterprise_markup_verdict(),
        "free_tier_memory": free_tier_memory_verdict(),
        "free_tier_experiments": free_tier_experiments_verdict(model),
        "colab_a100": colab_a100_verdict(model),
    }

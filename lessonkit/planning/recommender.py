"""The guide's decision flow (model size -> budget -> where to train), computed.

``recommend(model, method=None, budget=None, platform=None, tokens=None)`` ranks every
environment x GPU x count x method that the catalog offers: the setups that fit first, then the
cheapest (the whole run's cost when ``tokens`` is given, else the price per hour), each with its
peak memory from ``estimate``, headroom, price, time and cost, and why.

``budget``: dollars per hour for the whole setup (a number, or '$2/h'), or a word: 'free'
(free tiers only), 'low' (at most $2 per hour, the guide's '~$1.50/hour A100'), 'high' (no
limit). Buying a workstation is considered with no budget or 'high' (its price spread over its
working hours, plus power), not under a cap per hour. ``platform``: an environment ('colab',
'lambda', 'local', ...) or a tier ('hobbyist', 'engineer', 'enterprise', 'own hardware', or 1-3).
Each environment without an option says why in ``Recommendation.left_out``: memory (with the
setup that comes closest and what it would need), session or weekly limits, budget, buying
hardware, availability or platform (planning/left_out.py). QLoRA on several GPUs runs data
parallel, each GPU holding the whole 4-bit model (planning/fitting.py). ``cheapest()`` and
``fastest()`` look over every offer of every environment, not over each environment's first row.
"""

from __future__ import annotations

import html
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import (
    LessonkitError,
    choose,
    normalise_name,
    positive_int,
    positive_number,
    real_number,
)
from ..hardware.environments import TIERS, Environment, get_environment, list_environments
from ..hardware.gpu_records import is_tight, used_text
from ..memory.settings import MAX_BATCH, MAX_SEQ
from ..models.presets import alias_note, resolve_model
from ..models.spec import ModelSpec
from ..options import METHODS
from ..safe_repr import short_repr
from ..units import GiB, format_hours, parse_count
from .fitting import (
    DEFAULT_BATCH,
    DEFAULT_MFU,
    DEFAULT_SEQ,
    METHOD_WORDS,
    assumptions,
    compute_hours,
    find_fit,
    method_label,
    needs_text,
    run_hours,
)
from .left_out import NO_MEMORY, NOT_ON_PLATFORM, left_out_reason, memory_reason
from .verdicts import guide_notes

BUDGET_WORDS = {"free": 0.0, "low": 2.0, "high": math.inf}
MAX_TOKENS = 1e14


@dataclass
class Option:
    """One way to run the job: where, on what, how, what it needs and costs."""

    environment: str  # key in environments.json
    name: str  # the environment's name
    tier: str  # tier name ("hobbyist", "engineer", "enterprise", "own hardware")
    gpu: str
    count: int
    method: str
    fits: bool
    peak_bytes: int
    usable_bytes: int
    settings: dict[str, Any]
    price_per_hour: float  # the whole setup, typical
    price_range: tuple[float, float]
    hours: float | None = None
    cost_usd: float | None = None
    usd_per_million_tokens: float = 0.0
    note: str = ""
    purchase_usd: tuple[float, float] | None = None
    sessions: int = 1  # sessions of the environment's length, resuming from checkpoints
    limit: str = ""  # why the run breaks the environment's session or weekly limits
    hours_per_million_tokens: float = 0.0  # time of a million training tokens, steps alone

    @property
    def headroom_bytes(self) -> int:
        return self.usable_bytes - self.peak_bytes

    @property
    def tight(self) -> bool:
        """Less than 5% of the GPU left (the kit's one rule, hardware.gpu_records.is_tight):
        fragmentation or a longer batch can tip it into OOM."""
        return is_tight(self.peak_bytes, self.usable_bytes)

    @property
    def run_hours(self) -> float:
        """The run's hours when tokens were given, else the hours of a million tokens."""
        return self.hours if self.hours is not None else self.hours_per_million_tokens

    @property
    def setup(self) -> str:
        return f"{self.count} x {self.gpu}"

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["headroom_bytes"] = self.headroom_bytes
        return d


@dataclass
class Recommendation:
    """Ranked options for fine-tuning a model, with the assumptions and the guide's view."""

    model: ModelSpec
    method: str | None
    budget: float | None
    platform: str | None
    tokens: float | None
    mfu: float
    options: list[Option] = field(default_factory=list)
    rejected: dict[str, int] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)  # environment key -> why
    needs: list[str] = field(default_factory=list)
    guide: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)

    @property
    def best(self) -> Option | None:
        return self.options[0] if self.options else None

    def best_per_method(self) -> dict[str, Option]:
        out: dict[str, Option] = {}
        for option in self.options:
            out.setdefault(option.method, option)
        return out

    def cheapest(self, method: str | None = None, *, paid: bool = False) -> Option | None:
        """The option with the least money for the run (its cost when tokens were given,
        else dollars per million tokens) over every offer, optionally one method or paid
        offers only; None when nothing fits."""
        options = self._among(method, paid)
        if not options:
            return None
        return min(
            options,
            key=lambda o: (
                o.cost_usd if o.cost_usd is not None else o.usd_per_million_tokens,
                o.run_hours,
            ),
        )

    def fastest(self, method: str | None = None, *, paid: bool = False) -> Option | None:
        """The quickest option over every offer of every environment (each offer at the
        fewest GPUs that fit it), not the quickest of each environment's cheapest; ties go
        to the cheaper. None when nothing fits."""
        options = self._among(method, paid)
        if not options:
            return None
        return min(
            options,
            key=lambda o: (
                o.run_hours,
                o.cost_usd if o.cost_usd is not None else o.usd_per_million_tokens,
            ),
        )

    def _among(self, method: str | None, paid: bool) -> list[Option]:
        return [
            o
            for o in self.options
            if (method is None or o.method == method) and (not paid or o.price_per_hour > 0)
        ]

    def cheapest_and_fastest(self, method: str | None = None) -> str:
        """One sentence naming the cheapest and the fastest setup over every offer."""
        cheapest, fastest = self.cheapest(method), self.fastest(method)
        if cheapest is None or fastest is None:
            return f"Nothing in the catalog fits {self.model.name} with these settings."
        return (
            f"Cheapest: {_option_words(cheapest)}; fastest of every offer (each at the fewest "
            f"GPUs that fit): {_option_words(fastest)}."
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.name,
            "n_params": self.model.n_params,
            "active_params": self.model.active_params,
            "method": self.method,
            "budget_per_hour": None if self.budget in (None, math.inf) else self.budget,
            "platform": self.platform,
            "tokens": self.tokens,
            "mfu": self.mfu,
            "options": [o.to_dict() for o in self.options],
            "rejected": dict(self.rejected),
            "left_out": dict(self.left_out),
            "needs": list(self.needs),
            "guide": list(self.guide),
            "assumptions": list(self.assumptions),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def _title(self) -> str:
        parts = [
            f"{self.model.name} ({self.model.params_text})",
            METHOD_WORDS[self.method] if self.method else "any method",
        ]
        if self.budget is not None:
            parts.append(
                "no budget limit" if self.budget == math.inf else f"budget ${self.budget:.2f}/h"
            )
        if self.platform:
            parts.append(f"platform {self.platform}")
        if self.tokens:
            parts.append(f"{self.tokens:,.0f} tokens at {self.mfu:.0%} MFU")
        return "Recommendation for " + ", ".join(parts)

    def lines(self, limit: int = 10) -> list[str]:
        out = []
        for i, o in enumerate(self.options[:limit], 1):
            out.append(f"{i}. {o.name}: {o.setup}, {o.note}")
        return out

    def __str__(self) -> str:
        return self.text()

    def text(self, limit: int = 10) -> str:
        """Readable text with the first ``limit`` options."""
        text = [self._title()]
        if self.options:
            text += self.lines(limit)
            if len(self.options) > limit:
                text.append(
                    f"   ... and {len(self.options) - limit} more options (to_dict() lists all)"
                )
        else:
            text.append("Nothing in the catalog fits these constraints.")
        if self.rejected:
            text.append("Left out: " + ", ".join(f"{n} {why}" for why, n in self.rejected.items()))
        names = {e.key: e.name for e in list_environments()}
        text += [
            f"Not here: {names[key]}: {why}"
            for key, why in self.left_out.items()
            if why != NOT_ON_PLATFORM
        ]
        text += [f"Needs: {n}" for n in self.needs]
        text += [f"The guide: {g}" for g in self.guide]
        text += [f"Assumption: {a}" for a in self.assumptions]
        return "\n".join(text)

    def _repr_html_(self) -> str:
        esc = html.escape
        rows = "".join(
            f"<tr><td>{i}</td><td>{esc(o.name)}</td><td>{esc(o.setup)}</td><td>{esc(o.method)}</td>"
            f"<td>{o.peak_bytes / GiB:.1f} / {o.usable_bytes / GiB:.1f} GiB</td>"
            f"<td>${o.price_per_hour:.2f}/h</td>"
            f"<td>{'' if o.hours is None else format_hours(o.hours)}</td>"
            f"<td>{'' if o.cost_usd is None else f'${o.cost_usd:,.2f}'}</td></tr>"
            for i, o in enumerate(self.options[:15], 1)
        )
        extra = "".join(f"<li>{esc(x)}</li>" for x in self.needs + self.guide + self.assumptions)
        return (
            f"<div class='lessonkit-recommend'><b>{esc(self._title())}</b><table>"
            "<tr><th>#</th><th>where</th><th>GPUs</th><th>method</th><th>peak / usable</th>"
            f"<th>price</th><th>time</th><th>cost</th></tr>{rows}</table>"
            + ("" if rows else "<p>Nothing in the catalog fits these constraints.</p>")
            + f"<ul>{extra}</ul></div>"
        )


# ----- input ---------------------------------------------------------------------------------
def parse_budget(budget: Any) -> float | None:
    """Dollars per hour for the whole setup (inf: no limit), from a number or 'low'/'$2/h'."""
    if budget is None:
        return None
    if isinstance(budget, str):
        word = budget.strip().lower()
        if word in BUDGET_WORDS:
            return BUDGET_WORDS[word]
        # the number as --tokens writes it (1e1, 2.5, 1k), with an optional $ and /h
        match = re.fullmatch(
            r"\$?\s*(-?)([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?\s*[kmbt]?)\s*"
            r"(?:\$|usd)?\s*(?:/\s*h(?:our)?|per hour)?",
            word,
        )
        if not match:
            raise LessonkitError(
                f"budget must be dollars per hour (e.g. 2.5 or '$2/h') or one of "
                f"{', '.join(BUDGET_WORDS)}; got {short_repr(budget)}."
            )
        budget = parse_count(match.group(2)) * (-1 if match.group(1) else 1)
    return positive_number(budget, "budget (dollars per hour)", allow_zero=True)


def parse_tokens(tokens: Any) -> float | None:
    """A token count: 5e7, '50M', '1B'."""
    if tokens is None:
        return None
    try:
        value = parse_count(tokens)
    except LessonkitError:
        raise LessonkitError(
            f"tokens must be a number of training tokens such as 5e7 or '50M', got "
            f"{short_repr(tokens)}."
        ) from None
    return positive_number(value, "tokens", maximum=MAX_TOKENS)


def platform_environments(platform: Any) -> tuple[list[Environment], bool]:
    """The environments a platform (name, tier or None) stands for, and whether one was named."""
    envs = list_environments()
    if platform is None:
        chosen = envs
    elif isinstance(real_number(platform), int) and real_number(platform) in TIERS:
        chosen = [e for e in envs if e.tier == real_number(platform)]
    elif isinstance(platform, str) and normalise_name(platform).removeprefix("tier") in {
        normalise_name(n) for n in TIERS.values()
    } | {str(t) for t in TIERS}:
        key = normalise_name(platform).removeprefix("tier")
        chosen = [e for e in envs if normalise_name(e.tier_name) == key or str(e.tier) == key]
    else:
        env = get_environment(platform)
        group = env.detect.get("platform")
        same = group and normalise_name(platform) in {
            normalise_name(group),
            normalise_name(env.detect.get("platform_name", "")),
        }
        chosen = [e for e in envs if e.detect.get("platform") == group] if same else [env]
        return chosen, True
    return chosen, False


def buying_considered(budget: float | None, named: bool = False) -> bool:
    """Bought hardware is compared with no budget, budget 'high', or when asked for by name;
    a cap per hour is a renting budget (a purchase is paid up front)."""
    return named or budget is None or budget == math.inf


def select_environments(platform: Any, budget: float | None) -> list[Environment]:
    """The environments a platform (name, tier or None) and budget allow."""
    chosen, named = platform_environments(platform)
    buying = buying_considered(budget, named)
    return [e for e in chosen if e.tier != 0 or buying]


# ----- the recommender -----------------------------------------------------------------------
def recommend(
    model: Any,
    method: str | None = None,
    budget: Any = None,
    platform: Any = None,
    tokens: Any = None,
    *,
    mfu: float = DEFAULT_MFU,
    batch_size: int = DEFAULT_BATCH,
    seq_len: int = DEFAULT_SEQ,
) -> Recommendation:
    """Rank where and how to fine-tune ``model``: setups that fit first, then the cheapest.

    See the module docstring for ``budget`` and ``platform``; ``tokens`` (e.g. '50M') adds the
    time and cost of a run at model-FLOPs utilisation ``mfu``.
    """
    spec = resolve_model(model)
    methods = list(METHODS) if method is None else [choose(method, METHODS, "method")]
    cap = parse_budget(budget)
    n_tokens = parse_tokens(tokens)
    mfu = positive_number(mfu, "mfu (model-FLOPs utilisation)", maximum=1.0)
    batch_size = positive_int(batch_size, "batch_size", maximum=MAX_BATCH)
    seq_len = positive_int(seq_len, "seq_len", maximum=MAX_SEQ)
    envs, named = platform_environments(platform)
    buying = buying_considered(cap, named)
    rec = Recommendation(
        spec,
        None if method is None else methods[0],
        cap,
        None if platform is None else str(platform),
        n_tokens,
        mfu,
        assumptions=[note for note in (alias_note(spec),) if note] + assumptions(),
    )

    def count(why: str) -> None:
        rec.rejected[why] = rec.rejected.get(why, 0) + 1

    allowed = {e.key for e in envs}
    for env in list_environments():
        if env.key not in allowed:
            rec.left_out[env.key] = NOT_ON_PLATFORM
            continue
        fitting, broken = [], []
        for offer in env.offers:
            if offer.broken or not offer.gpu.current_wheels:
                count(f"not usable ({offer.gpu.name} on {env.name}: {offer.note or 'unsupported'})")
                broken.append(offer)
                continue
            for m in methods:
                option = _option(spec, env, offer, m, batch_size, seq_len, n_tokens, mfu)
                if option is None:
                    count("do not fit")
                else:
                    fitting.append(option)
        kept, too_long = [], []
        for option in fitting:
            if option.limit:
                count("break a session or weekly limit")
                too_long.append(option)
            elif env.tier == 0 and not buying:
                count("need buying hardware")
            elif cap is not None and option.price_per_hour > cap + 1e-9:
                count("over budget")
            else:
                kept.append(option)
        rec.options += kept
        if not kept:
            rec.left_out[env.key] = left_out_reason(
                env, [o for o in fitting if not o.limit], broken, cap, buying, too_long
            )
            if rec.left_out[env.key].startswith(NO_MEMORY):
                rec.left_out[env.key] = memory_reason(
                    spec, env, methods, batch_size, seq_len, broken
                )
    # Comfortable fits first, then cheapest = least money for the same work: the run's cost, or
    # dollars per million tokens.
    rec.options.sort(
        key=lambda o: (
            o.tight,
            o.cost_usd if o.cost_usd is not None else o.usd_per_million_tokens,
            o.price_per_hour,
            -o.headroom_bytes,
        )
    )
    found = {o.method for o in rec.options}
    rec.needs = [
        needs_text(spec, m, seq_len) for m in methods if m not in found or spec.n_params > 3e10
    ]
    rec.guide = guide_notes(spec, rec)
    return rec


def _option_words(option: Option) -> str:
    """E.g. 'RunPod, 1 x B200, QLoRA, 2.1 h for $12.58' (or per million tokens)."""
    what = f"{option.name}, {option.setup}, {METHOD_WORDS[option.method]}"
    if option.hours is not None and option.cost_usd is not None:
        return f"{what}, {format_hours(option.hours)} for ${option.cost_usd:,.2f}"
    return (
        f"{what}, {format_hours(option.hours_per_million_tokens)} and "
        f"${option.usd_per_million_tokens:,.2f} per million tokens"
    )


def _option(
    spec: ModelSpec,
    env: Environment,
    offer: Any,
    method: str,
    batch: int,
    seq: int,
    tokens: float | None,
    mfu: float,
) -> Option | None:
    gpu = offer.gpu
    for count in offer.counts:
        fit = find_fit(
            spec,
            method,
            gpu.usable_bytes,
            count,
            native_bf16=gpu.native_bf16,
            batch_size=batch,
            seq_len=seq,
        )
        if fit is None or not fit.fits:
            continue
        price = offer.price_per_hour
        hourly = env.hourly_cost(offer) * count
        per_gpu_low, per_gpu_high = env.hourly_range(offer)
        hours = cost = None
        sessions = 1
        hours_per_million = compute_hours(
            spec, method, 1e6, gpu.bf16_tflops, count, mfu, fit.gradient_checkpointing, seq
        )
        per_million = hours_per_million * hourly
        if tokens:
            timing = (spec, method, tokens, gpu.bf16_tflops, count, mfu)
            hours = run_hours(*timing, fit.gradient_checkpointing, seq, sessions=1)
            # Each session starts and loads the model again, which can need one more session.
            while env.sessions_needed(hours) > sessions:
                sessions = env.sessions_needed(hours)
                hours = run_hours(*timing, fit.gradient_checkpointing, seq, sessions=sessions)
            cost = hours * hourly
        note = (
            f"{method_label(method, gpu.native_bf16)} at {fit.settings_text()}: peak "
            f"{fit.peak_bytes / GiB:.1f} of {gpu.usable_text} per GPU "
            f"({fit.headroom_bytes / GiB:.1f} GiB headroom, "
            f"{used_text(fit.peak_bytes, fit.usable_bytes)}); "
            + (
                "free"
                if price.high == 0
                else f"${hourly:.2f}/h, ${per_million:.2f} per million tokens"
            )
            + (
                f"; {format_hours(hours)} and ${cost:,.2f} for the run, start-up and checkpoint "
                "saves included"
                if hours is not None
                else ""
            )
        )
        if count > 8:
            note += f"; {count // 8} nodes of 8 GPUs in one job"
        if gpu.unified_memory:
            note += (
                f"; unified memory: {gpu.memory_text}, what torch.cuda.mem_get_info() "
                "reports free on an idle machine, not total_memory"
            )
        if sessions > 1:
            note += (
                f"; {sessions} sessions of up to {env.session_hours:g} h, each resuming from "
                f"the last checkpoint"
            )
            if env.weekly_gpu_hours:
                note += f", within one week's {env.weekly_gpu_hours:g} GPU-hours of quota"
        if not gpu.native_bf16:
            note += "; no native bf16 on this GPU: fp16 instead (same memory)"
        if offer.purchase_usd:
            low, high = offer.purchase_usd
            note += (
                f"; buy for ${low * count:,.0f}-{high * count:,.0f}, counted here spread over "
                f"{env.amortize_hours:,.0f} h plus electricity"
            )
        if offer.note:
            note += f" ({offer.note})"
        if gpu.caveat:
            note += f". Note: {gpu.caveat}"
        settings = {
            k: v
            for k, v in fit.shared_report.settings.items()
            if k
            in (
                "method",
                "precision",
                "optimizer",
                "batch_size",
                "seq_len",
                "gradient_checkpointing",
                "n_gpus",
                "zero_stage",
            )
        }
        return Option(
            env.key,
            env.name,
            env.tier_name,
            gpu.name,
            count,
            method,
            True,
            fit.peak_bytes,
            gpu.usable_bytes,
            settings,
            hourly,
            (per_gpu_low * count, per_gpu_high * count),
            hours,
            cost,
            per_million,
            note,
            offer.purchase_usd,
            sessions,
            env.too_long(hours) if hours else "",
            hours_per_million,
        )
    return None

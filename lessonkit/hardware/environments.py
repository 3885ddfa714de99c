"""Where to fine-tune: the guide's three tiers of environments, plus your own workstation.

Data in ``data/environments.json``: GPUs offered with per-GPU-hour prices, quotas, session
limits, pros and cons, each environment with its source and as-of date.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

from ..errors import LessonkitError, normalise_name, unknown_name_message
from .gpus import GPU, Price, get_gpu

TIERS = {0: "own hardware", 1: "hobbyist", 2: "engineer", 3: "enterprise"}


@dataclass(frozen=True)
class Offer:
    """One GPU an environment rents out, in which counts, at what price per GPU-hour."""

    gpu: GPU
    counts: tuple[int, ...]
    price_per_hour: Price
    note: str = ""
    broken: bool = False
    purchase_usd: tuple[float, float] | None = None

    @property
    def free(self) -> bool:
        return self.price_per_hour.high == 0

    @property
    def source(self) -> str:
        """Where the price was read: the offer's own page, else the environment's."""
        return self.price_per_hour.source

    @property
    def as_of(self) -> str:
        """The day the price was read (the offer's own date, else the environment's)."""
        return self.price_per_hour.as_of

    def to_dict(self) -> dict[str, Any]:
        p = self.price_per_hour
        return {
            "gpu": self.gpu.name,
            "counts": list(self.counts),
            "price_per_hour": {"low": p.low, "high": p.high, "typical": p.typical},
            "note": self.note,
            "broken": self.broken,
            "purchase_usd": list(self.purchase_usd) if self.purchase_usd else None,
            "source": self.source,
            "as_of": self.as_of,
        }


@dataclass(frozen=True)
class Environment:
    """A place to run a fine-tuning job: a hosted notebook, a GPU cloud or an ML platform."""

    key: str
    name: str
    tier: int
    tier_name: str
    kind: str
    offers: tuple[Offer, ...]
    quotas: str
    session_limits: str
    pros: tuple[str, ...]
    cons: tuple[str, ...]
    url: str
    source: str
    as_of: str
    unconfirmed: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    detect: dict[str, Any] = field(default_factory=dict, compare=False)
    hints: dict[str, str] = field(default_factory=dict, compare=False)
    amortize_hours: float | None = None  # bought hardware: hours its price is spread over
    session_hours: float | None = None  # longest session; a longer run resumes from a checkpoint
    weekly_gpu_hours: float | None = None  # a free quota of GPU session hours per week
    resume_across_sessions: bool = True  # False: a run must end within one session
    resume_note: str = ""  # why a run is not planned across sessions here

    def sessions_needed(self, hours: float) -> int:
        """Sessions of at most ``session_hours`` a run of ``hours`` takes (1 without a limit)."""
        if not self.session_hours or hours <= self.session_hours:
            return 1
        return math.ceil(hours / self.session_hours)

    def too_long(self, hours: float) -> str:
        """Why a run of ``hours`` breaks this environment's session or weekly limits ('' if not)."""
        sessions = self.sessions_needed(hours)
        if sessions > 1 and not self.resume_across_sessions:
            return (
                f"the run takes {hours:,.1f} h, longer than one {self.session_hours:g} h "
                f"session ({sessions} sessions); {self.resume_note}"
            )
        if self.weekly_gpu_hours and hours > self.weekly_gpu_hours:
            weeks = math.ceil(hours / self.weekly_gpu_hours)
            return (
                f"the run takes {hours:,.1f} h, more than the {self.weekly_gpu_hours:g} GPU-hours "
                f"a week this free tier allows ({weeks} weeks of quota)"
            )
        return ""

    def hourly_cost(self, offer: Offer) -> float:
        """Typical dollars per GPU-hour, with bought hardware's price spread over its hours."""
        cost = offer.price_per_hour.typical
        if offer.purchase_usd and self.amortize_hours:
            cost += sum(offer.purchase_usd) / 2 / self.amortize_hours
        return cost

    def hourly_range(self, offer: Offer) -> tuple[float, float]:
        """Lowest and highest dollars per GPU-hour, counted like ``hourly_cost``: bought hardware
        adds its cheapest and dearest purchase price spread over its hours."""
        low, high = offer.price_per_hour.low, offer.price_per_hour.high
        if offer.purchase_usd and self.amortize_hours:
            low += offer.purchase_usd[0] / self.amortize_hours
            high += offer.purchase_usd[1] / self.amortize_hours
        return low, high

    @property
    def free(self) -> bool:
        """True when every GPU it offers costs nothing."""
        return all(o.free for o in self.offers)

    @property
    def gpus(self) -> list[GPU]:
        return [o.gpu for o in self.offers]

    @property
    def price_range(self) -> tuple[float, float]:
        """Cheapest and dearest $/GPU-hour over the GPUs offered (bought hardware included at
        its price spread over its hours, as ``hourly_range``)."""
        ranges = [self.hourly_range(o) for o in self.offers]
        return min(low for low, _ in ranges), max(high for _, high in ranges)

    def offer(self, gpu: str | GPU) -> Offer:
        """The offer for one GPU; LessonkitError naming the GPUs offered otherwise."""
        wanted = get_gpu(gpu)
        for o in self.offers:
            if o.gpu == wanted:
                return o
        raise LessonkitError(
            f"{self.name} does not offer {wanted.name}; it offers "
            f"{', '.join(g.name for g in self.gpus)}."
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "name": self.name,
            "tier": self.tier,
            "tier_name": self.tier_name,
            "kind": self.kind,
            "offers": [o.to_dict() for o in self.offers],
            "quotas": self.quotas,
            "session_limits": self.session_limits,
            "pros": list(self.pros),
            "cons": list(self.cons),
            "url": self.url,
            "source": self.source,
            "as_of": self.as_of,
            "unconfirmed": list(self.unconfirmed),
        }

    def __str__(self) -> str:
        low, high = self.price_range
        price = "free" if high == 0 else f"${low:.2f}-{high:.2f} per GPU-hour"
        if self.amortize_hours and any(o.purchase_usd for o in self.offers):
            price += f" (the card's price spread over {self.amortize_hours:,.0f} h, plus power)"
        return (
            f"{self.name} (tier {self.tier}, {self.tier_name}): "
            f"{', '.join(g.name for g in self.gpus)}; {price}"
        )


def _environment_from_dict(entry: dict[str, Any]) -> Environment:
    offers = []
    for item in entry["offers"]:
        purchase = item.get("purchase_usd")
        price = Price.from_dict(
            item["price_per_hour"],
            item.get("source", entry["source"]),
            item.get("as_of", entry["as_of"]),
        )
        if price is None:
            raise LessonkitError(
                f"environments.json: {entry['key']} offers {item['gpu']} without a price."
            )
        offers.append(
            Offer(
                gpu=get_gpu(item["gpu"]),
                counts=tuple(item["counts"]),
                price_per_hour=price,
                note=item.get("note", ""),
                broken=bool(item.get("broken", False)),
                purchase_usd=(purchase["low"], purchase["high"]) if purchase else None,
            )
        )
    return Environment(
        key=entry["key"],
        name=entry["name"],
        tier=entry["tier"],
        tier_name=entry["tier_name"],
        kind=entry["kind"],
        offers=tuple(offers),
        quotas=entry["quotas"],
        session_limits=entry["session_limits"],
        pros=tuple(entry["pros"]),
        cons=tuple(entry["cons"]),
        url=entry.get("url", ""),
        source=entry["source"],
        as_of=entry["as_of"],
        unconfirmed=tuple(entry.get("unconfirmed", ())),
        aliases=tuple(entry.get("aliases", ())),
        detect=dict(entry.get("detect", {})),
        hints=dict(entry.get("hints", {})),
        amortize_hours=entry.get("amortize_hours"),
        session_hours=entry.get("session_hours"),
        weekly_gpu_hours=entry.get("weekly_gpu_hours"),
        resume_across_sessions=bool(entry.get("resume_across_sessions", True)),
        resume_note=entry.get("resume_note", ""),
    )


@lru_cache(maxsize=1)
def _catalog() -> dict[str, Environment]:
    text = resources.files("lessonkit").joinpath("data/environments.json").read_text()
    return {e["key"]: _environment_from_dict(e) for e in json.loads(text)["environments"]}


def list_environments(*, tier: int | None = None) -> list[Environment]:
    """All environments, in the guide's tier order (optionally one tier)."""
    envs = sorted(_catalog().values(), key=lambda e: e.tier if e.tier else 9)
    return [e for e in envs if tier is None or e.tier == tier]


def environment_keys() -> list[str]:
    return list(_catalog())


def get_environment(name: str | Environment) -> Environment:
    """An environment by key or name, forgiving spelling ('Lambda Labs', 'colab', 'vast.ai')."""
    if isinstance(name, Environment):
        return name
    if not isinstance(name, str):
        raise LessonkitError(f"An environment is a name such as 'colab' or 'lambda', got {name!r}.")
    key = normalise_name(name)
    for env in _catalog().values():
        if key in {normalise_name(a) for a in (env.key, env.name, *env.aliases)}:
            return env
    raise LessonkitError(unknown_name_message(name, environment_keys(), "environment"))


def offered_price(gpu: str | GPU) -> dict[str, Any] | None:
    """The price range per GPU-hour that the catalog's rentals give one GPU, as gpus.json must
    state it: the span of the GPU clouds' offers (tier 2) where there are any, else of the other
    paid rentals (tiers 1 and 3, whose prices include the instance); typical is the median of
    those offers' typical prices. None when nobody rents it out."""
    wanted = get_gpu(gpu)
    paid = [
        (e, o)
        for e in list_environments()
        if e.tier != 0
        for o in e.offers
        if o.gpu == wanted and not o.free
    ]
    chosen = [(e, o) for e, o in paid if e.tier == 2] or paid
    if not chosen:
        return None
    typicals = sorted(o.price_per_hour.typical for _, o in chosen)
    middle = len(typicals) // 2
    typical = (
        typicals[middle] if len(typicals) % 2 else (typicals[middle - 1] + typicals[middle]) / 2
    )
    names = [e.name for e, _ in chosen]
    return {
        "low": min(o.price_per_hour.low for _, o in chosen),
        "high": max(o.price_per_hour.high for _, o in chosen),
        "typical": round(typical, 3),
        "source": "the offers of " + ", ".join(names) + " in environments.json (each with its "
        "own price page)",
        "as_of": max(o.as_of for _, o in chosen),
    }

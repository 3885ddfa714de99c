"""Why an environment offers no setup for a run: the first true reason of memory, session or
weekly limits, buying hardware, budget and availability, each one computed (the test over
every environment, model size and method recomputes each reason)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..hardware.environments import Environment
from ..models.spec import ModelSpec
from ..units import GiB
from .fitting import Fit, find_fit, method_label

if TYPE_CHECKING:
    from .recommender import Option

NOT_ON_PLATFORM = "not on the platform asked for"
NO_MEMORY = "no GPU setup it offers has enough memory for this run"


def closest_setup(
    spec: ModelSpec, env: Environment, methods: list[str], batch: int, seq: int
) -> tuple[Any, Fit] | None:
    """Of the setups an environment offers (usable offers, every count, each method), the
    one whose smallest configuration comes nearest to fitting: (offer, Fit), or None."""
    best: tuple[Any, Fit] | None = None
    for offer in env.offers:
        if offer.broken or not offer.gpu.current_wheels:
            continue
        for method in methods:
            for count in offer.counts:
                fit = find_fit(
                    spec,
                    method,
                    offer.gpu.usable_bytes,
                    count,
                    native_bf16=offer.gpu.native_bf16,
                    batch_size=batch,
                    seq_len=seq,
                )
                if fit is None:
                    continue
                if best is None or fit.peak_bytes / fit.usable_bytes < (
                    best[1].peak_bytes / best[1].usable_bytes
                ):
                    best = (offer, fit)
    return best


def memory_reason(
    spec: ModelSpec, env: Environment, methods: list[str], batch: int, seq: int, broken: list[Any]
) -> str:
    """Why nothing fits an environment's memory, with the setup that comes closest and what it
    would need per GPU."""
    why = NO_MEMORY
    closest = closest_setup(spec, env, methods, batch, seq)
    if closest is not None:
        offer, fit = closest
        gpu = offer.gpu
        why += (
            f": the closest, {method_label(fit.method, gpu.native_bf16)} on {fit.count} x "
            f"{gpu.name}, needs {fit.peak_bytes / GiB:,.1f} GiB per GPU at "
            f"{fit.settings_text()}, against {gpu.memory_text}"
        )
        if fit.method == "qlora" and fit.count > 1:
            why += " (QLoRA runs data parallel: more GPUs do not lower the memory per GPU)"
    return why + (f" ({', '.join(o.gpu.name for o in broken)} not usable)" if broken else "")


def left_out_reason(
    env: Environment,
    fitting: list[Option],
    broken: list[Any],
    cap: float | None,
    buying: bool,
    too_long: list[Option] | None = None,
) -> str:
    """Why an environment offers nothing for the run: the first true reason of memory, session
    or weekly limits, buying hardware, budget and availability (a setup that does not fit is
    never a budget question)."""
    if not fitting and too_long:
        quickest = min(too_long, key=lambda o: o.hours or 0.0)
        return f"{quickest.setup} would fit, but {quickest.limit}"
    if not fitting:
        if broken and len(broken) == len(env.offers):
            return "none of the GPUs it offers is usable: " + "; ".join(
                f"{o.gpu.name}: {o.note}" if o.note else o.gpu.name for o in broken
            )
        return NO_MEMORY + (
            f" ({', '.join(o.gpu.name for o in broken)} not usable)" if broken else ""
        )
    cheapest = min(fitting, key=lambda o: o.price_per_hour)
    if env.tier == 0 and not buying:
        low = cheapest.purchase_usd[0] * cheapest.count if cheapest.purchase_usd else 0.0
        return (
            f"buying a card is not compared under a budget per hour (${cap:.2f}/h): "
            f"{cheapest.setup} would fit, from ${low:,.0f}; budget='high' or no budget "
            f"compares it"
        )
    return (
        f"over budget: the cheapest setup that fits ({cheapest.setup}) costs "
        f"${cheapest.price_per_hour:.2f}/h, the budget is ${cap:.2f}/h"
    )

"""Time of the recommender and the health check, in milliseconds (median of N runs).

recommend() calls estimate() for every environment x GPU x count x method it tries; the health
check adds the probes (the first call imports torch) and its verdict. Target: a recommend() call
well under a second, so the CLI and the notebook explorers answer at once.

    python benchmarks/recommend_speed.py [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import time


def median_ms(action, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import lessonkit
    from lessonkit.planning.fitting import clear_estimate_cache

    cases = {
        "7B, low budget": dict(model="7B", budget="low"),
        "70B, 20M tokens": dict(model="70B", tokens="20M"),
        "2T full (nothing fits)": dict(model="2T", method="full"),
    }
    for name, kwargs in cases.items():

        def cold(kwargs: dict = kwargs) -> None:
            clear_estimate_cache()
            lessonkit.recommend(**kwargs)

        print(
            f"recommend {name:<24} cold {median_ms(cold, args.repeats):8.1f} ms   "
            f"cached {median_ms(lambda kwargs=kwargs: lessonkit.recommend(**kwargs), args.repeats):8.1f} ms"
        )
    start = time.perf_counter()
    lessonkit.check_gpu_health()
    print(
        f"check_gpu_health first call (imports torch)   {(time.perf_counter() - start) * 1e3:8.1f} ms"
    )
    print(
        f"check_gpu_health again                        "
        f"{median_ms(lessonkit.check_gpu_health, args.repeats):8.1f} ms"
    )


if __name__ == "__main__":
    main()

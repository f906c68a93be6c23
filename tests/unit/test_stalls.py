"""Times that are the scheduler's, not the variants': the rule on synthetic figures, the thread choice on given loads,
and the words the measurement writes and the report reads."""

from __future__ import annotations

import pytest

from attnbench.measure.noise import UNUSABLE, noise_reason
from attnbench.measure.stalls import Timed, floor_seconds, scheduler_bound
from attnbench.measure.threads import choose_threads
from attnbench.report import unusable

MS = 1e-3
PEAK = {"read_bytes_per_s": 22e9, "copy_bytes_per_s": 35e9, "matmul_flops_per_s": 68e9}


def decode_step(median_ms: float, read_bytes: float, fastest_ms: float | None = None, samples: int = 9) -> Timed:
    fastest = (fastest_ms if fastest_ms is not None else 0.9 * median_ms) * MS
    return Timed(median_ms * MS, fastest, samples, floor_seconds("decode", None, read_bytes, PEAK))


# what a busy 2-core machine gave at N=2048 with 2 threads: one figure for reads 60x apart
COLLAPSED = {
    "full": decode_step(36.0, 8.4e6),
    "band(window=256)": decode_step(35.9, 1.06e6),
    "linear": decode_step(35.9, 0.14e6),
}
LOADED = dict(threads=2, competing=1.3, cores=2)


def test_medians_collapsing_onto_one_figure_while_the_work_differs_are_the_scheduler_s() -> None:
    reason = scheduler_bound(COLLAPSED, **LOADED)
    assert "full, band(window=256), linear all took 35.9–36 ms" in reason and "differs 60x" in reason
    assert ";" not in reason  # one clause of a row's `noisy`


def test_a_collapse_is_not_a_sign_where_the_threads_fit_the_idle_cores() -> None:
    assert scheduler_bound(COLLAPSED, threads=2, competing=0.2, cores=2) == ""
    assert scheduler_bound(COLLAPSED, threads=1, competing=1.3, cores=2) == ""  # no sibling thread to wait for
    assert scheduler_bound(COLLAPSED, threads=2, competing=None, cores=2) == ""  # load unknown: no claim


def test_a_common_overhead_under_a_millisecond_or_alike_work_is_no_collapse() -> None:
    overhead = {"full": decode_step(0.031, 64e3), "band": decode_step(0.030, 60e3), "linear": decode_step(0.030, 6e3)}
    assert scheduler_bound(overhead, **LOADED) == ""  # dispatch-bound small steps: one figure, microseconds
    alike = {"full": decode_step(36.0, 8.4e6), "sinks": decode_step(35.0, 8.0e6)}
    assert scheduler_bound(alike, **LOADED) == ""  # the same work, the same time: as it should be


def test_times_that_follow_the_work_are_not_flagged_even_under_load() -> None:
    honest = {"full": decode_step(0.25, 8.4e6), "band": decode_step(0.056, 1.06e6),
              "linear": decode_step(0.067, 0.14e6)}  # fmt: skip
    assert scheduler_bound(honest, **LOADED) == ""


def test_the_collapse_is_found_among_variants_that_do_not_collapse() -> None:
    group = {**COLLAPSED, "full(kv_cache=False)": decode_step(97.0, 12.6e6)}  # recomputing: slower than the wait
    assert "full, band(window=256), linear all took" in scheduler_bound(group, **LOADED)


def test_a_variant_whose_rounds_mostly_waited_makes_its_group_the_scheduler_s() -> None:
    # 2 threads under load: full's step 10 ms by the median, 0.27 ms at best; band untouched
    group = {"full": decode_step(10.2, 8.4e6, fastest_ms=0.27), "band": decode_step(0.164, 1.06e6, fastest_ms=0.13)}
    reason = scheduler_bound(group, threads=1, competing=None, cores=2)
    assert reason.startswith("full: fastest sample under 1/5 of the median")
    too_few = {"full": decode_step(10.2, 8.4e6, fastest_ms=0.27, samples=2), "band": group["band"]}
    assert scheduler_bound(too_few, threads=1, competing=None, cores=2) == ""


def test_a_full_sequence_call_s_floor_is_its_flops_or_its_bytes_whichever_takes_longer() -> None:
    assert floor_seconds("fwd", 68e9, 35e3, PEAK) == pytest.approx(1.0)
    assert floor_seconds("fwd+bwd", 68e9, 35e3, PEAK) == pytest.approx(3.0)  # the backward counted (mode_work)
    assert floor_seconds("fwd", 68.0, 35e9, PEAK) == pytest.approx(1.0)
    assert floor_seconds("decode", None, 22e9, {"copy_bytes_per_s": 11e9}) == pytest.approx(2.0)  # no read stream
    assert floor_seconds("fwd", None, 1.0, PEAK) != floor_seconds("fwd", None, 1.0, PEAK)  # NaN: unknown


@pytest.mark.parametrize(
    "requested, competing, cores, ceiling, threads",
    [
        (0, 1.3, 2, 2, 1),  # the observed load: one core left
        (0, 2.0, 2, 2, 1),  # none left: still one
        (0, 0.3, 2, 2, 2),  # a light load leaves both
        (0, 0.5, 2, 2, 2),  # half a core busy: the noise flag's limit, the thread keeps its core
        (0, 0.6, 2, 2, 1),
        (0, 1.0, 16, 8, 8),  # never above torch's default
        (0, 9.0, 16, 8, 7),
        (3, 2.0, 2, 2, 3),  # the user's count always wins
    ],
)
def test_the_threads_fit_the_idle_cores_unless_the_user_set_them(requested, competing, cores, ceiling, threads) -> None:
    choice = choose_threads(requested, competing, cores, ceiling)
    assert choice.threads == threads
    assert choice.chosen is (requested == 0)
    assert ("set by the user" in choice.why) is (requested > 0)


def test_an_unreadable_load_keeps_torch_s_default() -> None:
    choice = choose_threads(0, None, 2, 2)
    assert choice.threads == 2 and "cannot be read" in choice.why


def test_the_measurement_and_the_report_read_unusable_alike() -> None:
    assert unusable.UNUSABLE == UNUSABLE
    marked = noise_reason(36e-3, 1e-3, 1.3, bound="full, band all took 36 ms")
    assert unusable.is_unusable(marked) and marked.startswith(f"{UNUSABLE}: full, band all took 36 ms; ")
    assert not unusable.is_unusable(noise_reason(36e-3, 1e-2, 1.3))  # noisy, but usable

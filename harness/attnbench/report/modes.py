"""What a run mode means in a report, declared once: its words, what one timed sample is, which memory figure the
verdict weighs, and what its roofline counts. Every heading, table, sentence and plot that names a mode or picks a
mode's column reads it here.

`fwd` and `fwd+bwd` time one full-sequence call and weigh its peak memory. `decode` (attnbench.measure.decode) times
one generated token's step against what a variant keeps from a prompt of N, and weighs that cache: a user choosing a
KV-cache method pays for it on every sequence served, while one step's scratch is small and brief.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

MIB = 2**20


@dataclass(frozen=True)
class Mode:
    name: str  # as in results.csv: "fwd", "fwd+bwd", "decode"
    words: str  # in a setting's heading and plot subtitles
    per: str  # what one timed sample is: "per call", "per generated token"
    memory: str  # the memory column the verdict, its plots and the slopes weigh
    memory_words: str  # that column in words, for captions and headers
    n_axis: str = "sequence length N (tokens)"  # the x label of every plot against N

    @property
    def decode(self) -> bool:
        return self.name == "decode"

    def against(self, baseline: str) -> str:
        """The baseline as a speedup names it: `full`, or "full's KV cache" in decode (its `kv_cache=False` twin
        recomputes the prefix every step and is the other label)."""
        return f"{baseline}'s KV cache" if self.decode and baseline == "full" else baseline

    @property
    def roofline_words(self) -> str:
        """What its roofline counts (attnbench.report.analysis.of_roofline)."""
        if self.decode:
            return ("bytes one step must read / read bandwidth + bytes it writes / write bandwidth (the bandwidth "
                    "roofline; no FLOP term)")
        return "max(FLOPs / matmul peak, bytes moved / copy peak)"


PEAK_WORDS = "peak memory of one call beyond the inputs"
FORWARD = Mode("fwd", "forward", "per call", "peak_mem_bytes", PEAK_WORDS)
TRAINING = Mode("fwd+bwd", "forward + backward", "per call", "peak_mem_bytes", PEAK_WORDS)
DECODE = Mode(
    "decode",
    "decode (per generated token, after a prompt of N)",
    "per generated token",
    "cache_bytes",
    "cache kept at context N (KV cache, window, RNN state or compressed cache)",
    n_axis="context N (prompt tokens)",
)
MODES = {mode.name: mode for mode in (FORWARD, TRAINING, DECODE)}

DECODE_NOTE = (
    "Decode rows (mode decode): each variant's prefill takes a prompt of N, then single-token steps follow; time and "
    "speedup are per generated token (one step at a context of N to N + decode_steps, the variants in turns), memory "
    "is the cache kept at N (× the baseline's), prefill is the prompt's one call (timed once, so noisier), error is "
    "the steps' outputs against exact causal softmax over everything visible to each step (float64), and the "
    "roofline is the bytes one step must read over the run's measured read bandwidth (one stream, STREAM-like) plus "
    "what it writes over the write bandwidth; read GB/s is what a step reads over its median time, with its share of "
    "that measured read bandwidth."
)


def mode_of(name: object) -> Mode:
    """The mode a results.csv value names; an unknown one (a newer run read by an older report) reads as itself,
    timed per call."""
    return MODES.get(str(name)) or Mode(str(name), str(name), "per call", "peak_mem_bytes", PEAK_WORDS)


def mode_of_rows(rows: pd.DataFrame) -> Mode:
    """The mode of one setting's rows (a setting has one); forward for none."""
    return mode_of(rows["mode"].iloc[0]) if len(rows) and "mode" in rows else FORWARD


def has_decode(rows: pd.DataFrame) -> bool:
    return len(rows) > 0 and "mode" in rows and bool((rows["mode"] == DECODE.name).any())


def mib_text(value: float) -> str:
    """Bytes as MiB with three digits ("16.0", "0.508", "0.0156"), whole from 100 ("1024"); a dash when missing."""
    if value is None or value != value:
        return "–"
    mib = value / MIB
    return f"{mib:.0f}" if mib >= 99.95 else f"{mib:#.3g}"


def ms_text(seconds: float) -> str:
    """Seconds as milliseconds with three digits ("0.394", "60.9"), whole from 100 ("2990"); a dash when missing."""
    if seconds is None or seconds != seconds:
        return "–"
    ms = seconds * 1e3
    return f"{ms:.0f}" if ms >= 99.95 else f"{ms:.3g}"


def read_rate_text(rate: float, share: float) -> str:
    """A step's achieved read bandwidth in GB/s with three digits, and its share of the measured read bandwidth:
    "4.21 (19%)"; a dash when missing."""
    if rate is None or rate != rate:
        return "–"
    gb = rate / 1e9
    percent = "–" if share is None or share != share else (
        f"{100 * share:.0f}%" if share >= 0.095 else f"{100 * share:.2g}%")  # fmt: skip
    return f"{gb:.0f} ({percent})" if gb >= 99.95 else f"{gb:#.3g} ({percent})"

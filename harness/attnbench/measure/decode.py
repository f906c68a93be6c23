"""Measure one comparison group in mode `decode`: generation one token at a time against what each variant keeps.

For a context of N (the cell's seq_len) the inputs hold N + T positions (T = `decode_steps`). Each variant's
`prefill` takes the first N (timed once: `prefill_s`; what it keeps: `cache_bytes`), then T `step`s take the
rest one position at a time; their outputs are compared with exact causal softmax over everything visible to each
step, in float64 (the error columns). Inputs captured from a grouped-query model hold each key/value head repeated
for its query heads: a variant that decodes grouped-query attention is handed one copy per key/value head, so its
cache is the model's own (`cache_bytes`, `bytes_moved`); another keeps one per query head. Then the group's variants are timed **one step per sample, in turns**
(`attnbench.measure.timing.time_in_turns`): every sample is a step at a context between N and N + T, and a
variant's sequence restarts from a copy of its prefilled state, untimed, when it has no room left. The step's peak
memory beyond its state is measured last. `bytes_moved` is what a step must read and write (the part of the state
it reads, its q, k, v and output): over the machine's measured read (and write) bandwidth it is the step's roofline.
A `compiled` decode cell times the step's fused form (`attnbench.kernels`: one C call where the uncompiled cell runs
its eager PyTorch operations), in turns with the eager cell of the same setting; a step with no fused form (no kernel
call in its first step) is `unsupported` there, never timed eager under the fused label.

b - batch, h - heads, n - positions, d - head dim, e - value dim
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from attnbench.inputs.catalogue import Inputs
from attnbench.interface import AttentionVariant, DecodeState
from attnbench.kernels import eager_steps, fused_calls, unavailable_reason
from attnbench.measure.group import GROUP_STEP, GroupMeasurement, failure, timing_fields
from attnbench.measure.machine import warm_allocator
from attnbench.measure.memory import peak_memory
from attnbench.measure.metrics import needle_fields
from attnbench.measure.reference import exact_reference
from attnbench.measure.timing import time_in_turns, timed_call
from attnbench.ops import DECODE_CHECK, TOLERANCE, decode_exactness_error
from attnbench.plan.cells import Cell
from attnbench.stats import Spread


def kv_group(k: torch.Tensor, v: torch.Tensor) -> int:
    """How many adjacent heads of k and v (b, h, n, d) are copies of one key/value head: a captured grouped-query
    model's heads arrive repeated (SmolLM2: 3 for 9 query heads, each 3 times); 1 when no heads repeat."""
    heads = k.shape[1]
    for group in range(heads, 1, -1):
        if heads % group == 0 and all(
            bool((x.unflatten(1, (heads // group, group)) == x[:, ::group, None]).all()) for x in (k, v)
        ):
            return group
    return 1


def kv_heads(variant: AttentionVariant, k: torch.Tensor, v: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What a variant's prefill and step take: one head per key/value head when it decodes grouped-query attention
    (its cache then counts the model's own heads), else every query head's copy."""
    if group > 1 and variant.supports.grouped_kv:
        return k[:, ::group], v[:, ::group]
    return k, v


class Generation:
    """One variant's generation: the prefilled state, the live state, and the next step to take (0..T-1)."""

    def __init__(self, variant: AttentionVariant, prefilled: DecodeState, inputs: Inputs, prompt: int, steps: int,
                 group: int = 1, fused: bool = False):  # fmt: skip
        self.variant, self.prefilled, self.inputs, self.prompt, self.steps = variant, prefilled, inputs, prompt, steps
        self.group = group  # key/value heads shared by this many query heads (kv_group)
        self.fused = fused  # the step's fused form (attnbench.kernels), else its eager one
        self.state = prefilled.clone()
        self.done = 0

    def restart_unless_room(self, number: int) -> None:
        """Untimed: back to the prefilled state when fewer than `number` steps are left."""
        if self.done + number > self.steps:
            self.state, self.done = self.prefilled.clone(), 0

    def step(self) -> torch.Tensor:
        """The next token's output (b, h, 1, e)."""
        t = self.prompt + self.done
        q, k, v = (x[:, :, t : t + 1] for x in (self.inputs.q, self.inputs.k, self.inputs.v))
        k, v = kv_heads(self.variant, k, v, self.group)
        with torch.no_grad(), eager_steps(not self.fused):
            out, self.state = self.variant.step(self.state, q, k, v)
        self.done += 1
        return out

    def checked_step(self) -> torch.Tensor:
        """`step`, its output and state checked: (b, h, 1, Dv) in the inputs' dtype, and a DecodeState."""
        out = self.step()
        b, h, _, _ = self.inputs.q.shape
        expected = (b, h, 1, self.inputs.v.shape[-1])
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected or out.dtype != self.inputs.q.dtype:
            what = f"{tuple(out.shape)} {str(out.dtype).removeprefix('torch.')}" if isinstance(out, torch.Tensor) else repr(out)
            wanted = f"{expected} {str(self.inputs.q.dtype).removeprefix('torch.')}"
            raise DecodeContractError(f"step gave {what}; expected (b, h, 1, Dv) = {wanted}, the inputs' dtype")
        if not isinstance(self.state, DecodeState):
            raise DecodeContractError(f"step must return (output, DecodeState); its state is a {type(self.state).__name__}")
        return out


def no_fused_step(cell: Cell) -> str:
    """Why a `compiled` decode cell (the fused step) cannot run: it would time the eager form under another name."""
    label = cell.variant.label()
    why = unavailable_reason() or (
        f"{cell.dtype} on {cell.device}: the kernels take float32 on the CPU"
        if (cell.dtype, cell.device) != ("float32", "cpu")
        else f"{label}'s step took no fused form at these settings (attnbench.kernels); its eager step is the "
        "uncompiled cell"
    )
    remedy = "; install a C compiler (gcc), or time the eager steps (compile = false)" if unavailable_reason() else ""
    return f"no fused decode step: {why}{remedy}"


class DecodeContractError(ValueError):
    """A variant's prefill or step broke the decode protocol (shapes, dtype, state)."""


class DecodeMeasurement(GroupMeasurement):
    """`GroupMeasurement` for decode cells: prefill, steps checked against float64, steps timed in turns."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.steps = self.settings.decode_steps
        self.generations: dict[str, Generation] = {}
        self.read_bytes: dict[str, int] = {}  # per cell: what its first step (at a context of N) read
        self.heads_per_kv = 1  # query heads per key/value head of the inputs (a captured grouped-query model's)

    def _measure(self) -> list[tuple[str, int, float]]:
        samples: list[tuple[str, int, float]] = []
        if not self.variants:
            return samples
        n = self.setting.seq_len
        try:
            self.progress("building the inputs", GROUP_STEP)
            self.inputs = self._make_inputs(positions=n + self.steps, queries_from=n)
            self.heads_per_kv = kv_group(self.inputs.k, self.inputs.v)
            if self.settings.error:
                self.progress("computing the exact reference", GROUP_STEP)
                i = self.inputs
                self.reference = exact_reference(
                    i.q[:, :, n:], i.k, i.v, causal=True, key_padding_mask=None, query_offset=n
                )  # the steps' rows, each against every position up to it
        except Exception as error:  # inputs the machine cannot build fail every cell of the group
            for key in list(self.variants):
                self._fail(key, failure(error))
        for cell in self.group.cells:
            if cell.key() in self.variants:
                self._prefill_and_check(cell)
        if self.group.timed and self.generations:
            with warm_allocator():
                samples = self._time_steps()
            for cell in self.group.cells:
                if cell.key() in self.generations:
                    self._step_memory(cell)
        return samples

    def _prefill_and_check(self, cell: Cell) -> None:
        """Prefill (timed once), then the T steps from a copy of its state: shapes, finite, error vs float64."""
        key, variant, inputs, n = cell.key(), self.variants[cell.key()], self.inputs, self.setting.seq_len
        assert inputs is not None
        try:
            self.progress("prefill", key)

            k, v = kv_heads(variant, inputs.k[:, :, :n], inputs.v[:, :, :n], self.heads_per_kv)

            def prefill() -> tuple[torch.Tensor, DecodeState]:
                with torch.no_grad():
                    return variant.prefill(inputs.q[:, :, :n], k, v, room=self.steps)

            (prompt_out, state), prefill_s = timed_call(prefill, self.device)
            expected = (cell.batch, cell.heads, n, cell.v_dim)
            if tuple(prompt_out.shape) != expected or not isinstance(state, DecodeState):
                what = f"prefill gave {tuple(prompt_out.shape)} and a {type(state).__name__}"
                return self._fail(key, {"status": "error", "reason": f"{what}; expected {expected} and a DecodeState"})
            del prompt_out
            self.fields[key].update(decode_steps=self.steps, prefill_s=prefill_s, cache_bytes=state.nbytes)
            if variant.exact:
                self.progress("self-check", key)
                passed, self.fields[key]["self_check"] = self._decode_self_check(cell, variant)
                if not passed:
                    reason = f"decode self-check against its own support failed: {self.fields[key]['self_check']}"
                    return self._fail(key, {"status": "error", "reason": reason})
            generation = Generation(variant, state, inputs, n, self.steps, self.heads_per_kv, fused=cell.compiled)
            self.progress("steps", key)
            calls = fused_calls()
            outputs = [generation.checked_step()]
            if cell.compiled and fused_calls() == calls:
                return self._fail(key, {"status": "unsupported", "reason": no_fused_step(cell)})
            self.read_bytes[key] = generation.state.read_bytes  # what a step at a context of N reads
            outputs += [generation.checked_step() for _ in range(self.steps - 1)]
            outputs = torch.cat(outputs, dim=-2)  # (b, h, T, e)
            if not torch.isfinite(outputs).all():
                return self._fail(key, {"status": "error", "reason": "a step output has NaN or Inf"})
            self.fields[key].update(needle_fields(outputs, inputs, causal=True, first_position=n))
            if self.reference is not None:
                self._error_fields(key, outputs)
            generation.restart_unless_room(self.steps)
            self.generations[key] = generation
        except (Exception, SystemExit) as error:
            self._failed(key, error)

    def _decode_self_check(self, cell: Cell, variant: AttentionVariant) -> tuple[bool, str]:
        """An exact variant's decoding against the dense reference of its own pattern at small N, once per run
        (as the full-sequence modes check its forward): a variant that claims exactness must earn it."""
        check_key = (cell.variant, cell.device, cell.dtype, "decode")
        if check_key not in self.self_checks:
            dtype = getattr(torch, cell.dtype)
            prompt, steps = DECODE_CHECK
            error = decode_exactness_error(variant, device=self.device, dtype=dtype)
            if error is None:
                self.self_checks[check_key] = (True, "no static pattern to check its steps against")
            else:
                passed = error <= TOLERANCE[dtype]
                verdict = "pass" if passed else "FAIL"
                self.self_checks[check_key] = (passed, f"{verdict} (max err {error:.1e}, prompt {prompt}, {steps} steps)")
        return self.self_checks[check_key]

    def _fail(self, key: str, outcome: dict[str, str]) -> None:
        super()._fail(key, outcome)
        self.generations.pop(key, None)

    def _time_steps(self) -> list[tuple[str, int, float]]:
        """One step per sample, the group's variants in turns; a sequence restarts (untimed) when out of room."""
        calls: dict[str, Callable[[], Any]] = {key: g.step for key, g in self.generations.items()}
        before = {key: g.restart_unless_room for key, g in self.generations.items()}
        samples = time_in_turns(
            calls,
            self.device,
            min_rounds=self.settings.min_rounds,
            min_run_time=self.settings.min_run_time,
            order_seed=self.group.key(),
            slow_after_s=self.settings.time_budget_s,
            on_step=self.progress,
            on_failure=self._failed,
            before=before,
            max_block=self.steps,
        )
        for key, values in samples.items():
            self.fields[key].update(**timing_fields(Spread.of(values)))
            token = self.inputs.q[:, :, :1] if self.inputs is not None else None
            io = 0 if token is None else 3 * token.numel() * token.element_size()  # q, k, v in; out is about v's
            self.fields[key]["bytes_moved"] = self.read_bytes[key] + io + io // 3
        self._speedups(samples, set(samples))
        self._compiled_speedups(samples)  # each fused step against its eager twin, round by round
        return [(key, index, seconds) for key, values in samples.items() for index, seconds in enumerate(values)]

    def _step_memory(self, cell: Cell) -> None:
        """The most one step holds beyond its state (the state's own buffers, written in place, are not new)."""
        key, generation = cell.key(), self.generations[cell.key()]
        try:
            self.progress("memory", key)
            generation.restart_unless_room(1)
            held = tuple(generation.state.tensors()) + self._held()
            peak, method, tensors = peak_memory(generation.step, self.device, inputs=held)
            self.fields[key].update(peak_mem_bytes=peak, mem_method=method, tensor_mem_bytes=tensors)
        except (Exception, SystemExit) as error:
            self._failed(key, error)

"""CPU kernels for decode steps (a small C library built once per machine: `build`), and their calls on tensors
(`steps`). Each call has an eager PyTorch form beside it that it is tested against."""

from attnbench.kernels.build import eager_steps, fused_calls, unavailable_reason, usable

__all__ = ["eager_steps", "fused_calls", "unavailable_reason", "usable"]

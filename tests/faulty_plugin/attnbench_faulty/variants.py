"""Faulty plugins for attnbench's tests: each misbehaves in one way a real plugin might."""

import atexit
import sys

import torch
from attnbench import AttentionVariant, Hyperparameter

print("chatty plugin: imported")  # noise on stdout at import
atexit.register(lambda: print("chatty plugin: bye"))  # and at exit


class Chatty(AttentionVariant):
    """Exact attention that prints on every call, to stdout and (a lot) to stderr."""

    name = "chatty"
    family = "test"
    exact = False

    def forward(self, q, k, v, *, causal, key_padding_mask):
        print("chatty plugin: forward", tuple(q.shape))
        print("chatty plugin: a warning " + "x" * 4000, file=sys.stderr)  # fills a pipe nobody reads in ~16 calls
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


class FailsToBuild(AttentionVariant):
    """A constructor that raises."""

    name = "fails-to-build"
    family = "test"
    exact = False

    def __init__(self, seed=0, **hyperparams):
        super().__init__(seed=seed, **hyperparams)
        raise RuntimeError("needs a GPU library that is not here")

    def forward(self, q, k, v, *, causal, key_padding_mask):
        return v


class ExactWithoutMask(AttentionVariant):
    """Declares exact = True but has no support_mask for its self-check."""

    name = "exact-without-mask"
    family = "test"
    exact = True

    def forward(self, q, k, v, *, causal, key_padding_mask):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


class ReservedName(AttentionVariant):
    """A hyperparameter named like the variant's own attribute."""

    name = "reserved-name"
    family = "test"
    exact = False
    hyperparameters = {
        "seed": Hyperparameter(1, "clashes with the variant's seed"),
        "family": Hyperparameter("x", "clashes with the variant's family", kind=str),
    }

    def forward(self, q, k, v, *, causal, key_padding_mask):
        return v


class DenseScores(AttentionVariant):
    """Holds the whole score matrix and does not override cost(): the default must count it."""

    name = "dense-scores"
    family = "test"
    exact = False

    def forward(self, q, k, v, *, causal, key_padding_mask):
        return torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1) @ v


class OddReason(AttentionVariant):
    """Fails with a message that has a pipe, a newline and more than 90 characters."""

    name = "odd-reason"
    family = "test"
    exact = False

    def forward(self, q, k, v, *, causal, key_padding_mask):
        raise RuntimeError("head_dim | must be 32 for this kernel\nsecond line of the message " + "x" * 80 + " END")


class LongCall(AttentionVariant):
    """From N=64 on, one call is a single torch operation of tens of seconds (fused attention over 100k keys, on
    torch's own thread pool): a signal can reach Python only when it returns. Writes the file named by
    ATTNBENCH_TEST_LONG_CALL as it starts it."""

    name = "long-call"
    family = "test"
    exact = False

    def forward(self, q, k, v, *, causal, key_padding_mask):
        if q.shape[-2] >= 64:
            import os

            marker = os.environ.get("ATTNBENCH_TEST_LONG_CALL")
            if marker:
                open(marker, "w").close()
            big = torch.randn(1, 1, 100_000, 64)
            torch.nn.functional.scaled_dot_product_attention(big, big, big)  # one call, ~40 s on 2 cores
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


class NeverLetsGo(AttentionVariant):
    """Starts a non-daemon thread that never ends, as a library's worker pool may: an ordinary interpreter exit
    waits for it forever."""

    name = "never-lets-go"
    family = "test"
    exact = False

    def forward(self, q, k, v, *, causal, key_padding_mask):
        import threading

        if not any(t.name == "never-lets-go" for t in threading.enumerate()):
            threading.Thread(target=threading.Event().wait, name="never-lets-go", daemon=False).start()
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


class ExitsTheProcess(AttentionVariant):
    """Calls sys.exit(3) from N=32 on, as a plugin ending on an internal check might."""

    name = "exits"
    family = "test"
    exact = False

    def forward(self, q, k, v, *, causal, key_padding_mask):
        if q.shape[-2] >= 32:
            sys.exit(3)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

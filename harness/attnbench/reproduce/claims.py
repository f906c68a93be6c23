"""The catalogue of published claims, kept as data: one `Claim` per paper figure or table.

Each entry says what the paper reports (its figures, its baseline and setting), what of it can transfer to another
machine (a trend, or a figure in size), the sweep that measures it here (the keys of a run config), and which check
in `attnbench.reproduce.checks` judges the results, with the published figures the check compares. Adding a claim is
adding an entry here (and, where none of the checks fits, a check function), with a test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# 2020-era "standard attention" materializes the N x N matrix: that is `full-math` here, not the fused `full`
STANDARD = "full-math"
CPU_SHAPE = {"batch": 1, "heads": 8, "head_dim": 64, "dtype": "float32", "device": "cpu", "mode": "fwd"}
SPEED_ONLY = {"error": False, "min_run_time": 0.2, "time_budget_s": 20.0, "baseline": STANDARD}
ERROR_ONLY = {"min_run_time": 0.05, "min_rounds": 2, "time_budget_s": 20.0}
# generation one token at a time after a prompt of N (mode decode): time is per generated token
DECODE = {"mode": "decode", "causal": True, "decode_steps": 16, "inputs": [{"name": "realistic"}]}
# the Performer paper's comparisons: head dim 16 and small Q and K (random features depend on |q| and |k|)
PERFORMER_REGIME = {
    "head_dim": 16, "seq_lens": [1024], "seeds": [0, 1, 2, 3], "inputs": [{"name": "gaussian", "scale": 0.5}]
}  # fmt: skip


@dataclass(frozen=True)
class Claim:
    """One published claim and how it is checked here."""

    id: str  # the name `attnbench reproduce <id>` takes
    paper: str
    where: str  # the table or figure
    statement: str  # what the paper reports, in one sentence
    published: str  # its figures, as the report prints them
    baseline: str  # what the paper compares against, and which variant stands for it here
    transfers: str  # what can carry over to this machine: trends, or figures in size
    sweep: dict[str, Any]  # the run config (the keys of a TOML config); empty: nothing here can check it
    check: str  # the check's name in `attnbench.reproduce.checks.CHECKS`
    params: dict[str, Any] = field(default_factory=dict)  # what the check compares (published figures included)
    quick: dict[str, Any] = field(default_factory=dict)  # overrides of `sweep` (or of `grid`) for --quick
    grid: dict[str, Any] = field(default_factory=dict)  # an MQAR grid (`attnbench recall`'s keys) in place of a sweep
    # a generation grid (`attnbench generate`'s keys): the real model answering with each method (`make model`)
    generation: dict[str, Any] = field(default_factory=dict)
    # why `reproduce --quick` leaves it out of the whole catalogue (it runs when named); empty: --quick runs it
    quick_left_out: str = ""

    def grid_config(self, quick: bool = False) -> dict[str, Any]:
        """The MQAR or generation grid of this claim (a new dict), with the --quick overrides when asked."""
        raw = {"name": f"reproduce-{self.id}", **(self.grid or self.generation)}
        return {**raw, **self.quick} if quick else raw

    def config(self, quick: bool = False) -> dict[str, Any]:
        """The run config of this claim (a new dict), with the --quick overrides when asked."""
        raw = {"name": f"reproduce-{self.id}", **CPU_SHAPE, **self.sweep}
        return {**raw, **self.quick} if quick else raw

    @property
    def variants(self) -> list[str]:
        """The variant names its sweep needs."""
        from attnbench.generation.grid import ALIASES  # a paper's name (quest, streamingllm): a variant's setting

        items = self.generation.get("methods", []) or (self.grid or self.sweep).get("variants", [])
        names = [item if isinstance(item, str) else item["name"] for item in items if item != "blind"]
        return [ALIASES.get(name, {}).get("name", name) for name in names]


CLAIMS: list[Claim] = [
    Claim(
        id="linformer-table3",
        paper="Wang et al. 2020, Linformer",
        where="Table 3 (inference, V100)",
        statement="Linformer's time and memory savings over standard attention rise with n, and shrink as k grows",
        published="k=128: time about 1.5× at n=512, 3.4× at 4K, 8.6× at 16K, 20× at 65K; memory 1.7×, 14×, 56×, 60×; "
        "both smaller for larger k",
        baseline=f"standard attention (N×N materialized): `{STANDARD}`",
        transfers="trends (rise with n, fall with k); memory ratios in size (within 2×); time ratios are hardware's",
        sweep={
            **SPEED_ONLY,
            "seq_lens": [512, 1024, 2048, 4096, 8192],
            "inputs": [{"name": "gaussian"}],
            "variants": [{"name": STANDARD}, {"name": "linformer", "k": [128, 256]}],
        },
        check="gains_rise_with_n",
        params={
            "baseline": STANDARD,
            "published": {  # label -> N -> (time ratio, memory ratio); k=256 has no figure checked in size
                "linformer(k=128)": {512: (1.5, 1.7), 4096: (3.4, 14.0)},
                "linformer(k=256)": {},
            },
            "falls_with_k": ["linformer(k=128)", "linformer(k=256)"],
        },
        quick={"seq_lens": [512, 2048], "min_rounds": 3},
    ),
    Claim(
        id="nystromformer-table1",
        paper="Xiong et al. 2021, Nyströmformer",
        where="Table 1 (one instance, memory and time vs standard attention)",
        statement="Nyström-64, Linformer-256 and Longformer-257 save memory and time at n=8192 far more than at 512",
        published="n=512 / 8192, memory× and time×: Linformer-256 1.3/1.1 and 16.1/13.8; Longformer-257 1.7/0.3 and "
        "22.5/4.3; Nyström-64 1.5/1.1 and 22.8/12.7",
        baseline=f"standard attention: `{STANDARD}`; Longformer-257 is `band(window=128)` (257 keys)",
        transfers="trends (gains rise with n); memory ratios in size (within 2×)",
        sweep={
            **SPEED_ONLY,
            "heads": 2,
            "seq_lens": [512, 8192],
            "inputs": [{"name": "gaussian"}],
            "variants": [
                {"name": STANDARD},
                {"name": "linformer", "k": 256},
                {"name": "band", "window": 128},
                {"name": "nystromformer", "landmarks": 64},
            ],
        },
        check="gains_rise_with_n",
        params={
            "baseline": STANDARD,
            "published": {
                "linformer(k=256)": {512: (1.1, 1.3), 8192: (13.8, 16.1)},
                "band(window=128)": {512: (0.3, 1.7), 8192: (4.3, 22.5)},
                "nystromformer(landmarks=64)": {512: (1.1, 1.5), 8192: (12.7, 22.8)},
            },
        },
        quick={"seq_lens": [512, 4096], "min_rounds": 3},
    ),
    Claim(
        id="performer-features",
        paper="Choromanski et al. 2021, Performer",
        where="§4.2 and Fig. 4 (approximation error)",
        statement="FAVOR+'s error falls as the number of random features m grows",
        published="the approximation's MSE falls with m (head dim 16, small inputs)",
        baseline="exact softmax attention (here float64 exact attention)",
        transfers="the trend, in the paper's regime: head dim 16, Q and K both N(0, 0.5²) (gaussian, scale 0.5); "
        "error of the output relative to its norm",
        sweep={
            **ERROR_ONLY,
            **PERFORMER_REGIME,
            "variants": [{"name": "full"}, {"name": "performer", "features": [16, 64, 256, 1024]}],
        },
        check="error_falls_along",
        params={"variant": "performer", "axis": "features", "metric": "err_rel_fro"},
        quick={"seq_lens": [512], "seeds": [0, 1]},
    ),
    Claim(
        id="performer-orthogonal",
        paper="Choromanski et al. 2021, Performer",
        where="§4.2 and Fig. 4 (orthogonal vs iid features)",
        statement="orthogonal random features approximate better than iid ones at equal m",
        published="orthogonal features give a lower MSE than iid ones at every m shown",
        baseline="exact softmax attention",
        transfers="the comparison, in the paper's regime (head dim 16, gaussian scale 0.5), paired by seed",
        sweep={
            **ERROR_ONLY,
            **PERFORMER_REGIME,
            "variants": [
                {"name": "full"}, {"name": "performer", "features": [16, 64, 256], "orthogonal": [True, False]}
            ],  # fmt: skip
        },
        check="more_accurate",
        params={"variant": "performer", "better": {"orthogonal": True}, "worse": {"orthogonal": False},
                "metric": "err_rel_fro"},  # fmt: skip
        quick={"seq_lens": [512], "seeds": [0, 1]},
    ),
    Claim(
        id="performer-positive",
        paper="Choromanski et al. 2021, Performer",
        where="§2.3 and Fig. 4 (positive vs trigonometric features)",
        statement="positive random features beat trigonometric ones where logits are large (the trigonometric "
        "estimates of small kernel values go negative and blow up the normalization)",
        published="trigonometric features' error blows up as logits grow; positive ones stay bounded",
        baseline="exact softmax attention",
        transfers="the comparison at large logits (gaussian, scale 1.5: logit std 2.25); at small logits (scale "
        "0.5) the trigonometric features are the more accurate here, as the paper's analysis allows",
        sweep={
            **ERROR_ONLY,
            **PERFORMER_REGIME,
            "inputs": [{"name": "gaussian", "scale": 1.5}],
            "variants": [
                {"name": "full"}, {"name": "performer", "features": [64, 256], "kernel": ["positive", "trig"]}
            ],  # fmt: skip
        },
        check="more_accurate",
        params={"variant": "performer", "better": {"kernel": "positive"}, "worse": {"kernel": "trig"},
                "metric": "err_rel_fro"},  # fmt: skip
        quick={"seq_lens": [512], "seeds": [0, 1]},
    ),
    Claim(
        id="reformer-hashes",
        paper="Kitaev et al. 2020, Reformer",
        where="Fig. 4 and §5 (LSH attention with more hash rounds)",
        statement="LSH attention's error falls as n_hashes grows (1, 2, 4, 8)",
        published="accuracy rises with n_hashes; 8 rounds nearly match full attention",
        baseline="full attention",
        transfers="the trend",
        sweep={
            **ERROR_ONLY,
            "seq_lens": [1024],
            "seeds": [0, 1],
            "inputs": [{"name": "realistic"}],
            "variants": [{"name": "full"}, {"name": "lsh", "n_hashes": [1, 2, 4, 8]}],
        },
        check="error_falls_along",
        params={"variant": "lsh", "axis": "n_hashes"},
        quick={"seq_lens": [512], "seeds": [0, 1, 2]},
    ),
    Claim(
        id="reformer-shared-qk",
        paper="Kitaev et al. 2020, Reformer",
        where="§2 and Fig. 3 (shared-QK attention)",
        statement="tying keys to queries (shared-QK) does not hurt: models trained with it match separate Q and K",
        published="shared-QK trains as well as separate Q, K on enwik8 and imagenet64 (slightly faster)",
        baseline="a Transformer trained with separate Q and K",
        transfers="nothing here: the claim is about training under the tie; attnbench approximates given Q, K, V, "
        "where imposing K = Q is a different function and must differ (lsh(shared_qk=true) measures that cost)",
        sweep={},  # nothing to run
        check="not_transferable",
        params={"why": "a claim about training with tied Q and K; here Q and K are given, so nothing of it can be "
                "checked (lsh(shared_qk=true)'s error against given Q, K is measured by every run instead)"},
    ),
    Claim(
        id="linear-scaling",
        paper="Katharopoulos et al. 2020, Transformers are RNNs",
        where="Fig. 1 and §4.1 (time against sequence length)",
        statement="linear attention's time grows linearly in N where softmax attention's grows quadratically",
        published="log-log slopes about 1 (linear) and 2 (softmax)",
        baseline=f"softmax attention: `{STANDARD}` (materialized, as theirs)",
        transfers="the slopes, fitted over N = 1024..8192 (smaller N are dominated by fixed costs)",
        sweep={
            **SPEED_ONLY,
            "heads": 2,
            "seq_lens": [1024, 2048, 4096, 8192],
            "inputs": [{"name": "gaussian"}],
            "variants": [{"name": STANDARD}, {"name": "linear"}],
        },
        check="time_slopes",
        params={"slopes": {"linear": [0.7, 1.3], STANDARD: [1.6, 2.4]}},
        quick={"min_rounds": 3},
    ),
    Claim(
        id="streamingllm-sinks",
        paper="Xiao et al. 2023, StreamingLLM",
        where="§3 and Fig. 2 (attention sinks)",
        statement="a sliding window alone loses the mass on the first tokens; keeping a few sink tokens restores it",
        published="window attention collapses once the first tokens leave it; 4 sinks recover dense-like quality",
        baseline="full attention",
        transfers="the mechanism: band(window) against band(window, sinks=4) on an input with a first-token sink",
        sweep={
            **ERROR_ONLY,
            "seq_lens": [1024, 4096],
            "inputs": [{"name": "realistic"}],
            "variants": [{"name": "full"}, {"name": "band", "window": 256, "sinks": [0, 4]}],
        },
        check="sinks_restore",
        params={"window": "band(sinks=0, window=256)", "sinks": "band(sinks=4, window=256)"},
        quick={"seq_lens": [1024]},
    ),
    Claim(
        id="streamingllm-speedup",
        paper="Xiao et al. 2023, StreamingLLM",
        where="§4.5 and Fig. 10 (per-token decoding latency)",
        statement="with a cache of sinks and a window, each token costs about the same whatever the window; the "
        "sliding window with re-computation grows quadratically with it, so StreamingLLM's speedup grows with the "
        "cache size",
        published="up to 22.2× per token at a cache of 4096 (Llama-2-13B, A6000); the gap grows from cache 256 up",
        baseline="the sliding window with re-computation: band(window=W, sinks=4, kv_cache=false), which recomputes "
        "the window's attention from its tokens every step",
        transfers="the trend: the ratio rises with the window. Not its size: the paper recomputes every layer's keys "
        "and values through the whole model, here only attention is recomputed",
        sweep={
            **DECODE,
            "error": False,
            "min_run_time": 0.2,
            "time_budget_s": 20.0,
            "seq_lens": [4096],
            "variants": [{"name": "band", "window": [256, 512, 1024, 2048], "sinks": 4, "kv_cache": [True, False]}],
        },
        check="ratio_rises_along",
        params={"variant": "band", "axis": "window", "slow": {"kv_cache": False}, "fast": {"kv_cache": True},
                "published_top": 22.2},  # fmt: skip
        quick={
            "seq_lens": [2048], "min_rounds": 3,
            "variants": [{"name": "band", "window": [256, 1024], "sinks": 4, "kv_cache": [True, False]}],
        },  # fmt: skip
    ),
    Claim(
        id="linear-rnn",
        paper="Katharopoulos et al. 2020, Transformers are RNNs",
        where="§3.4 and Tables 2–3 (autoregressive generation)",
        statement="linear attention generates as an RNN at a constant cost per token: its speedup over softmax "
        "without a cache grows with the sequence length",
        published="up to ~4,000× faster image generation than softmax attention without a cache (CIFAR-10, 3,072 "
        "positions per image; whole model, GPU); faster than softmax with a cache ('stateful softmax') too",
        baseline="softmax without a cache, full(kv_cache=false): the prefix's attention recomputed each token; and "
        "full with a KV cache",
        transfers="the trend: the per-token gain over both softmax baselines rises with N. Its size is the paper's "
        "whole model and GPU",
        sweep={
            **DECODE,
            "error": False,
            "min_run_time": 0.2,
            "time_budget_s": 20.0,
            "seq_lens": [1024, 2048, 4096, 8192],
            "baseline": "full(kv_cache=False)",
            "variants": [{"name": "full"}, {"name": "full", "kv_cache": False}, {"name": "linear"}],
        },
        check="gains_rise_with_n",
        params={"baseline": "full(kv_cache=False)", "published": {"linear": {}, "full": {}}, "measures": ["time"]},
        quick={"seq_lens": [1024, 2048, 4096], "min_rounds": 3},
    ),
    Claim(
        id="fla-crossover",
        paper="Yang, Zhang et al., flash-linear-attention (fla)",
        where="README, benchmarks of the chunkwise kernels against FlashAttention-2 by sequence length",
        statement="the gated and delta-rule linear attention kernels overtake exact (flash) attention only at long "
        "sequences",
        published="FlashAttention-2 faster at T <= 2048, the linear kernels faster at T = 8192 (GPU)",
        baseline="FlashAttention-2: `full`, PyTorch's fused exact attention (causal)",
        transfers="the trend (exact faster at short N, the linear kernels at long N) and the crossover N, on this "
        "machine's kernels: ours in PyTorch against its fused CPU kernel, not Triton against FlashAttention-2",
        sweep={
            "error": False, "min_run_time": 0.2, "time_budget_s": 30.0, "causal": True, "baseline": "full",
            "seq_lens": [256, 512, 1024, 2048, 4096, 8192, 16384], "inputs": [{"name": "gaussian"}],
            "variants": [{"name": "full"}, {"name": "retnet"}, {"name": "gla"}, {"name": "deltanet"},
                         {"name": "gated-deltanet"}],
        },  # fmt: skip
        check="overtakes_at_long_n",
        params={"baseline": "full", "labels": ["retnet", "gla", "deltanet", "gated-deltanet"],
                "published_range": (2048, 8192)},  # fmt: skip
        quick={"seq_lens": [256, 2048, 8192], "min_rounds": 6, "min_run_time": 0.1},  # 6 rounds: 95% intervals
    ),
    Claim(
        id="h2o-budget",
        paper="Zhang et al. 2023, H2O: Heavy-Hitter Oracle",
        where="§5 and Fig. 4 (quality against the KV cache budget)",
        statement="keeping 20% of the KV cache, half heavy hitters (most accumulated attention) and half recent "
        "tokens, matches the full cache's quality, where a local window of the same size does not",
        published="at a 20% budget H2O's accuracy is close to the full cache's on OPT and LLaMA tasks; the local "
        "window's falls off",
        baseline="a local window of the same number of tokens, band(window=0.2 N - 1), and exact attention",
        transfers="the comparison at 20% of N: h2o's per-step error below the window's, and within the verdict's "
        "accuracy budget (0.5 vs uniform, the reading here of 'matches the full cache'); the paper's task accuracy "
        "is a model's, over many layers",
        sweep={
            **DECODE,
            **ERROR_ONLY,
            "seq_lens": [4096],
            "variants": [{"name": "full"}, {"name": "h2o", "budget": 819}, {"name": "band", "window": 818}],
        },
        check="beats_at_equal_budget",
        params={"method": "h2o(budget=819)", "against": "band(window=818)", "max_error": 0.5},
    ),
    Claim(
        id="zoology-mqar",
        paper="Arora et al. 2023, Zoology: Measuring and Improving Recall in Efficient Language Models",
        where="Fig. 2 and §3 (multi-query associative recall by model dimension, sequence length and pairs)",
        statement="attention solves MQAR at every size tried; efficient mixers with a fixed state fall behind as the "
        "key-value pairs to remember grow at a fixed model dimension",
        published="attention near 100% at every sequence length and model dimension; gated convolutions and linear "
        "attention fall off as pairs grow unless the model dimension grows with them",
        baseline="attention (`full`) as the sequence mixer of the same 2-layer model",
        transfers="the comparison, on CPU-sized models (d_model 64, N 64-128, 4 and 16 pairs, 600 steps): full's mean "
        "accuracy over 3 seeds at least 99% everywhere, and each fixed-state mixer at least 10 points lower at 16 pairs "
        "than at 4 (at the largest N) and below full there",
        sweep={},
        grid={
            "variants": ["full", "linear", "deltanet"], "seq_lens": [64, 128], "pairs": [4, 16],
            "seeds": [0, 1, 2], "max_steps": 600,
        },  # fmt: skip
        check="attention_recalls_others_fall_behind",
        params={"baseline": "full", "labels": ["linear", "deltanet"], "solved": 0.99},
        quick={"seq_lens": [64], "seeds": [0]},
    ),
    Claim(
        id="streamingllm-window",
        paper="Xiao et al. 2024, StreamingLLM: Efficient Streaming Language Models with Attention Sinks",
        where="§3 and Table 6 / kvpress's RULER figure (what a window of recent tokens with sinks keeps)",
        statement="a cache of the first tokens (attention sinks) and a window of the recent ones keeps the model "
        "fluent, but it retrieves only what lies inside its window",
        published="StreamingLLM keeps perplexity flat but cannot answer about evicted text; kvpress's RULER-4K at "
        "ratio 0.5 (Llama-3.1-8B): StreamingLLM ~59 against ~96 exact",
        baseline="the exact model (`full`, its own answers) on the same prompts",
        transfers="the mechanism, on SmolLM2-135M: passkey at N=2048, needles at depths spread over 0-100%, "
        "4 sinks and a window keeping 1/2, 1/4, 1/8 of the prompt. A needle is inside when its tokens lie among "
        "the positions the window keeps when the answer starts: the needles outside lie clearly below those inside "
        "that the exact model answers (Wilson 95% intervals apart), and at each share the accuracy's interval "
        "reaches the share of needles inside the window that the exact model answers",
        sweep={},
        generation={
            "tasks": ["passkey"], "seq_lens": [2048], "samples": 10, "keep": [0.5, 0.25, 0.125],
            "methods": [{"name": "band", "sinks": 4, "label": "streamingllm"}],
        },  # fmt: skip
        check="window_retrieves_what_it_keeps",
        params={"method": "streamingllm"},
        quick={"samples": 5, "keep": [0.5, 0.125]},
    ),
    Claim(
        id="snapkv-question-aware",
        paper="Li et al. 2024, SnapKV / kvpress (NVIDIA), its FAQ and RULER figure",
        where="kvpress's RULER-4K figure and FAQ (question-aware vs question-agnostic compression)",
        statement="SnapKV with the question in its observation window keeps retrieval at compression ratios "
        "0.5-0.75 where compressing before the question loses part of it",
        published="kvpress RULER-4K at ratio 0.5 (Llama-3.1-8B): SnapKV with the question ~89, without ~70, "
        "exact ~96",
        baseline="the exact model (`full`) on the same prompts, each protocol",
        transfers="the comparison, on SmolLM2-135M: single needles at N=2048, keeping 1/2 and 1/4 of the cache: "
        "question-aware not clearly below the exact model at either share, question-agnostic clearly below "
        "question-aware at one (Wilson 95% intervals apart)",
        sweep={},
        generation={
            "tasks": ["niah_single"], "seq_lens": [2048], "samples": 10, "keep": [0.5, 0.25],
            "protocols": ["question-agnostic", "question-aware"], "methods": ["snapkv"],
        },  # fmt: skip
        check="question_aware_keeps_retrieval",
        params={"method": "snapkv", "shares": [0.5, 0.25]},
        quick={"samples": 5},
    ),
    Claim(
        id="quest-passkey",
        paper="Tang et al. 2024, Quest: Query-Aware Sparsity for Efficient Long-Context LLM Inference",
        where="Table 1 (passkey retrieval at 10K tokens, token budgets 32-512), scaled to SmolLM2 at 2K",
        statement="Quest keeps passkey retrieval at small token budgets where H2O and StreamingLLM fail",
        published="passkey at 10K, budgets 32-512: Quest 65-100%, H2O, TOVA and StreamingLLM 0-8% (dense prefill, "
        "the first two layers never sparsified)",
        baseline="the exact model (`full`) on the same prompts",
        transfers="scaled to this model: passkey at N=2048, a budget of 1/16 and 1/32 of the prompt (128 and 64 "
        "tokens), Quest as its code selects (pages of 16 ranked per query head, the current page read, no forced first "
        "page, the first two layers dense): Quest not clearly below the exact model, H2O and "
        "StreamingLLM clearly below Quest (Wilson 95% intervals apart) at both budgets",
        sweep={},
        generation={
            "tasks": ["passkey"], "seq_lens": [2048], "samples": 10, "keep": [0.0625, 0.03125],
            "methods": ["quest", "h2o", "streamingllm"],  # Quest as published (generation.grid.ALIASES)
        },  # fmt: skip
        check="quest_keeps_where_others_fail",
        params={"method": "quest", "others": ["h2o", "streamingllm"], "shares": [0.0625, 0.03125]},
        quick={"samples": 5},
    ),
    Claim(
        id="quest-passkey-10k",
        paper="Tang et al. 2024, Quest: Query-Aware Sparsity for Efficient Long-Context LLM Inference",
        where="Table 1 (passkey retrieval at 10K tokens, token budgets 32-512), at 10K on Gemma-3-270M",
        statement="Quest keeps passkey retrieval at small token budgets where H2O and StreamingLLM fail",
        published="passkey at 10K, budgets 32-512: Quest 65-100%, H2O, TOVA and StreamingLLM 0-8% (dense prefill, "
        "the first two layers never sparsified)",
        baseline="the exact model (`full`) on the same prompts",
        transfers="at its length, on Gemma-3-270M (`make model MODEL=gemma-3-270m`; it reads 10K, SmolLM2 does not): "
        "passkey at N=10240, Quest's budgets of 128 and 512 tokens (1/80 and 1/20 of the prompt) in the model's 3 "
        "global layers (its 15 sliding-window layers keep their windows, as kvpress leaves them), Quest as its code "
        "selects: Quest not clearly below the exact model, H2O and StreamingLLM clearly below Quest (Wilson 95% "
        "intervals apart) at both budgets",
        sweep={},
        generation={
            "model": "Gemma-3-270M", "tasks": ["passkey"], "seq_lens": [10240], "samples": 10,
            "keep": [0.05, 0.0125], "methods": ["quest", "h2o", "streamingllm"],
        },  # fmt: skip
        check="quest_keeps_where_others_fail",
        params={"method": "quest", "others": ["h2o", "streamingllm"], "shares": [0.05, 0.0125]},
        quick={"samples": 5},
        quick_left_out="its --quick run saves nothing: 3.6 min here against 3.9 min for the whole claim (Gemma-3-270M "
        "at N=10240, its 5 samples one unit on one worker; 2026-11-28)",
    ),
]

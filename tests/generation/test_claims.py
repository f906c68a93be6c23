"""The checks of the claims judged on the real model's answers (StreamingLLM's window, SnapKV question-aware, Quest's
passkey), on rows made to hold or not hold them."""

from __future__ import annotations

import pandas as pd
import pytest
from attnbench.reproduce.checks import CANNOT, CHECKS, FAILS, HOLDS, TREND
from attnbench.runfolder.generations import COLUMNS


def frame(entries: list[tuple]) -> pd.DataFrame:
    """entries: (method, share, protocol, [(depth, score), ...])."""
    rows = []
    for method, share, protocol, samples in entries:
        for index, (depth, value) in enumerate(samples):
            rows.append(dict(key=f"{method}{share}{protocol}{index}", task="passkey", seq_len=2048, protocol=protocol,
                             sample=index, method=method, variant=method, share=share, status="ok", reason="",
                             depth=depth, score=value))  # fmt: skip
    return pd.DataFrame(rows).reindex(columns=COLUMNS)


DEPTHS = [i / 9 for i in range(10)]
AGNOSTIC = "question-agnostic"


@pytest.mark.parametrize("scores, verdict", [
    ({0.5: [d >= 0.5 for d in DEPTHS], 0.25: [d >= 0.75 for d in DEPTHS]}, HOLDS),  # answers what its window holds
    ({0.5: [True] * 10, 0.25: [True] * 10}, FAILS),  # answers needles it evicted: not a window
])  # fmt: skip
def test_window_retrieves_what_it_keeps(scores: dict, verdict: str) -> None:
    rows = frame([("full", None, AGNOSTIC, [(d, 1.0) for d in DEPTHS])]
                 + [("streamingllm", s, AGNOSTIC, list(zip(DEPTHS, map(float, v)))) for s, v in scores.items()])  # fmt: skip
    assert CHECKS["window_retrieves_what_it_keeps"](rows, {"method": "streamingllm"}).verdict == verdict


@pytest.mark.parametrize("aware, agnostic, verdict", [(1.0, 0.6, HOLDS), (1.0, 1.0, TREND), (0.5, 0.2, FAILS)])
def test_question_aware_keeps_retrieval(aware: float, agnostic: float, verdict: str) -> None:
    entries = [("full", None, p, [(0.5, 1.0)] * 10) for p in (AGNOSTIC, "question-aware")]
    entries += [("snapkv", 0.5, "question-aware", [(0.5, aware)] * 10), ("snapkv", 0.5, AGNOSTIC, [(0.5, agnostic)] * 10)]
    params = {"method": "snapkv", "shares": [0.5]}
    assert CHECKS["question_aware_keeps_retrieval"](frame(entries), params).verdict == verdict


@pytest.mark.parametrize("quest, others, verdict", [(0.9, 0.1, HOLDS), (0.6, 0.3, TREND), (0.3, 0.3, FAILS)])
def test_quest_keeps_where_others_fail(quest: float, others: float, verdict: str) -> None:
    entries = [("full", None, AGNOSTIC, [(0.5, 1.0)] * 10), ("quest", 0.0625, AGNOSTIC, [(0.5, quest)] * 10)]
    entries += [(m, 0.0625, AGNOSTIC, [(0.5, others)] * 10) for m in ("h2o", "streamingllm")]
    params = {"method": "quest", "others": ["h2o", "streamingllm"], "shares": [0.0625], "keeps_within": 0.2, "gap": 0.4}
    assert CHECKS["quest_keeps_where_others_fail"](frame(entries), params).verdict == verdict


def test_a_failed_generation_makes_the_claim_unrunnable() -> None:
    rows = frame([("full", None, AGNOSTIC, [(0.5, 1.0)]), ("quest", 0.0625, AGNOSTIC, [(0.5, 1.0)])])
    rows.loc[1, ["status", "reason"]] = ["error", "RuntimeError: boom"]
    outcome = CHECKS["quest_keeps_where_others_fail"](rows, {"method": "quest", "others": [], "shares": [0.0625],
                                                              "keeps_within": 0.2, "gap": 0.4})  # fmt: skip
    assert outcome.verdict == CANNOT and "boom" in outcome.detail

"""Trained recall: Zoology's multi-query associative recall (MQAR), a tiny language model trained on CPU with an
attnbench variant as its sequence mixer, scored by how many held-out queries it recalls.

mqar.py the task's data; model.py the model and its mixers; train.py one training and its result.
"""

from attnbench.recall.model import BLIND, RecallLM, make_attention
from attnbench.recall.mqar import IGNORE, MQARData, MQARTask, multiquery_ar
from attnbench.recall.train import TrainResult, TrainSpec, train_mqar

__all__ = [
    "BLIND",
    "IGNORE",
    "MQARData",
    "MQARTask",
    "RecallLM",
    "TrainResult",
    "TrainSpec",
    "make_attention",
    "multiquery_ar",
    "train_mqar",
]

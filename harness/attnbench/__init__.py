"""attnbench: time, peak memory and error of efficient attention variants versus exact softmax attention."""

from attnbench.interface import (
    AttentionVariant,
    Capabilities,
    Cost,
    Hyperparameter,
    Shape,
    UnsupportedOptionError,
    VariantError,
)

__all__ = [
    "AttentionVariant",
    "Capabilities",
    "Cost",
    "Hyperparameter",
    "Shape",
    "UnsupportedOptionError",
    "VariantError",
]
__version__ = "0.1.0"

"""Discovery through real entry points, broken plugins reported by name, helpful unknown-name errors."""

from __future__ import annotations

import pytest
from attnbench import AttentionVariant, VariantError
from attnbench.registry import BrokenVariantError, Registry, UnknownVariantError

GOOD_PLUGIN = """
    import torch
    from attnbench.interface import AttentionVariant, Hyperparameter

    class Averaging(AttentionVariant):
        name = "averaging"
        family = "toy"
        exact = False
        hyperparameters = {"scale": Hyperparameter(1.0, "multiplies the output", kind=float, minimum=0.0)}

        def forward(self, q, k, v, *, causal, key_padding_mask):
            return self.scale * v.mean(dim=-2, keepdim=True).expand(*q.shape[:-1], v.shape[-1])
"""


def test_builtins_come_through_the_entry_point_group() -> None:
    entries = Registry().entries
    assert {"full", "full-math", "full-xformers"} <= set(entries)
    assert entries["full"].target == "attnbench.variants.full:FullAttention"
    assert entries["full"].package.startswith("attnbench ")


def test_discovery_is_lazy(plugin_registry) -> None:
    registry = plugin_registry(
        "lazy-plugin", {"lazy": "lazy_module:Variant"}, {"lazy_module": "raise RuntimeError('imported too early')"}
    )
    assert "lazy" in registry.names()  # listed without importing
    assert not registry.entries["lazy"].loaded
    assert registry.load("full").name == "full"  # the others still work


def test_plugin_found_and_created_with_hyperparameters(plugin_registry) -> None:
    registry = plugin_registry("good-plugin", {"averaging": "good_module:Averaging"}, {"good_module": GOOD_PLUGIN})
    variant = registry.create("averaging", scale=2.0)
    assert variant.scale == 2.0
    assert registry.entries["averaging"].package == "good-plugin 0.1"
    with pytest.raises(ValueError, match=r"unknown hyperparameter 'scael'\. Did you mean: scale\?"):
        registry.create("averaging", scael=2.0)
    with pytest.raises(ValueError, match="below the minimum"):
        registry.create("averaging", scale=-1.0)


def test_broken_plugins_are_reported_by_name_and_the_rest_work(plugin_registry) -> None:
    registry = plugin_registry(
        "broken-plugin",
        {"crashes": "crash_module:Variant", "not-a-variant": "plain_module:thing", "missing": "no_such_module:X"},
        {"crash_module": "raise ImportError('needs a library that is not installed')", "plain_module": "thing = 42"},
    )
    entries = {entry.name: entry for entry in registry.load_all()}
    assert "needs a library that is not installed" in entries["crashes"].error
    assert "not a subclass" in entries["not-a-variant"].error
    assert "No module named 'no_such_module'" in entries["missing"].error
    with pytest.raises(BrokenVariantError, match="'crashes' from broken-plugin 0.1 cannot be used"):
        registry.load("crashes")
    assert entries["full"].variant_class is not None


def test_unknown_name_suggests_and_lists() -> None:
    with pytest.raises(
        UnknownVariantError, match=r"Unknown variant 'ful'\. Did you mean: full.*Available: .*full-math"
    ):
        Registry().load("ful")


def test_two_packages_with_one_name_is_an_error_naming_both(plugin_registry) -> None:
    plugin_registry("first-plugin", {"averaging": "good_module:Averaging"}, {"good_module": GOOD_PLUGIN})
    registry = plugin_registry("second-plugin", {"averaging": "good_module:Averaging"}, {})
    with pytest.raises(
        BrokenVariantError, match="first-plugin 0.1.*second-plugin 0.1|second-plugin 0.1.*first-plugin 0.1"
    ):
        registry.load("averaging")


def test_a_class_registered_in_process_is_checked_like_an_entry_point_and_forgotten_on_clear() -> None:
    from attnbench.registry import Registry

    class Toy(AttentionVariant):
        name, family, exact = "toy", "test", False

        def forward(self, q, k, v, *, causal, key_padding_mask):
            return v.clone()

    class Band(Toy):
        name = "band"

    class Nameless(Toy):
        name = None

    registry = Registry()
    registry.register(Toy)
    assert registry.load("toy") is Toy and registry.entries["toy"].package == "registered in-process"
    assert "toy" in [entry.name for entry in registry.load_all()]
    with pytest.raises(VariantError, match="is registered already"):
        registry.register(Band)  # the built-in keeps its name
    with pytest.raises(VariantError, match="has no name"):
        registry.register(Nameless)
    with pytest.raises(VariantError, match="not a subclass"):
        registry.register(dict)
    registry.register(Band, replace=True)
    registry.register(Band, replace=True)  # twice: `_clear` still restores what was installed
    assert registry.load("band") is Band
    registry._clear()
    assert "toy" not in registry.names() and registry.load("band").__module__ == "attnbench.variants.band"

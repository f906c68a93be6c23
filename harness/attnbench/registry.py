"""Variants discovered through the `attnbench.variants` entry-point group, built-ins and plugins alike.

Discovery reads only metadata; a variant's module is imported the first time it is used. A plugin that
fails to import, or whose object is not an AttentionVariant, is reported by name with its error, and
every other variant still works.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from attnbench.interface import AttentionVariant, VariantError, declaration_problems, did_you_mean

GROUP = "attnbench.variants"


class UnknownVariantError(VariantError):
    """No entry point has this name."""


class BrokenVariantError(VariantError):
    """The entry point exists but cannot be used: import failure, wrong type, or a name clash."""


@dataclass
class Entry:
    """One registered name: where it comes from, and once loaded, its class or what went wrong."""

    name: str
    target: str  # "module:attr"
    package: str  # the distribution that declares it, with version
    entry_point: EntryPoint | None
    variant_class: type[AttentionVariant] | None = None
    error: str | None = None

    @property
    def loaded(self) -> bool:
        return self.variant_class is not None or self.error is not None


def _package_of(entry_point: EntryPoint) -> str:
    dist = getattr(entry_point, "dist", None)
    if dist is None:
        return "unknown package"
    return f"{dist.metadata['Name']} {dist.version}"


def _unusable(obj: object, name: str | None, target: str) -> str | None:
    """Why `obj` cannot be the variant registered as `name` (None when it can)."""
    if not (isinstance(obj, type) and issubclass(obj, AttentionVariant)):
        return f"{target} is {obj!r}, not a subclass of attnbench.interface.AttentionVariant"
    if getattr(obj, "name", None) != name:
        return f"{target} has name {getattr(obj, 'name', None)!r} but is registered as '{name}'"
    if getattr(obj, "__abstractmethods__", None):
        return f"{target} does not implement {', '.join(sorted(obj.__abstractmethods__))}"
    if problems := declaration_problems(obj):
        return f"{target} " + "; ".join(problems)
    return None


class Registry:
    """Name -> variant class, discovered from an entry-point group on first use."""

    def __init__(self, group: str = GROUP) -> None:
        self.group = group
        self._entries: dict[str, Entry] | None = None
        self._registered: dict[str, Entry | None] = {}  # in-process name -> the entry it replaced (None: none)

    @property
    def entries(self) -> dict[str, Entry]:
        if self._entries is None:
            self._entries = self._discover()
        return self._entries

    def _discover(self) -> dict[str, Entry]:
        found: dict[str, Entry] = {}
        for entry_point in entry_points(group=self.group):
            entry = Entry(entry_point.name, entry_point.value, _package_of(entry_point), entry_point)
            previous = found.get(entry.name)
            if previous is None:
                found[entry.name] = entry
            elif previous.target != entry.target or previous.package != entry.package:
                previous.error = (
                    f"two entry points are named '{entry.name}': {previous.target} from {previous.package} "
                    f"and {entry.target} from {entry.package}; uninstall one or rename its entry point"
                )
                previous.package = f"{previous.package}, {entry.package}"
        return dict(sorted(found.items()))

    def names(self) -> list[str]:
        return list(self.entries)

    def load(self, name: str) -> type[AttentionVariant]:
        """The variant class for `name`, importing its module now if needed."""
        entry = self.entries.get(name)
        if entry is None:
            available = ", ".join(self.names()) or "none"
            raise UnknownVariantError(
                f"Unknown variant '{name}'.{did_you_mean(name, self.names())} Available: {available}"
            )
        if not entry.loaded:
            self._import(entry)
        if entry.error is not None:
            raise BrokenVariantError(f"Variant '{name}' from {entry.package} cannot be used: {entry.error}")
        assert entry.variant_class is not None
        return entry.variant_class

    def _import(self, entry: Entry) -> None:
        assert entry.entry_point is not None
        try:
            obj = entry.entry_point.load()
        except Exception as error:
            last = traceback.extract_tb(error.__traceback__)[-1]
            entry.error = (
                f"importing {entry.target} failed: {type(error).__name__}: {error} "
                f"(at {last.filename}:{last.lineno}); fix or uninstall the plugin"
            )
            return
        entry.error = _unusable(obj, entry.name, entry.target)
        if entry.error is None:
            entry.variant_class = obj

    def register(self, variant_class: type[AttentionVariant], *, replace: bool = False) -> None:
        """Register a variant class in this process under its `name`, checked as an entry point's class is: for
        tests and notebooks (a run's worker processes and Ray tasks see installed entry points only). A name
        already registered is refused unless `replace`; `_clear` forgets every in-process registration."""
        name = getattr(variant_class, "name", None)
        target = f"{getattr(variant_class, '__module__', '?')}:{getattr(variant_class, '__qualname__', '?')}"
        problem = _unusable(variant_class, name, target)
        if problem is None and not isinstance(name, str):
            problem = f"{target} has no name"
        if problem is not None:
            raise VariantError(f"cannot register {target}: {problem}")
        if name in self.entries and not replace:
            raise VariantError(f"a variant named '{name}' is registered already ({self.entries[name].target})")
        self._registered.setdefault(name, self.entries.get(name))  # what was there before the first registration
        self.entries[name] = Entry(name, target, "registered in-process", None, variant_class)

    def _clear(self) -> None:
        """Forget every in-process registration: the entries are those installed again."""
        for name, replaced in self._registered.items():
            if replaced is None:
                self.entries.pop(name, None)
            else:
                self.entries[name] = replaced
        self._registered.clear()

    def create(self, name: str, seed: int = 0, **hyperparams: Any) -> AttentionVariant:
        """An instance of variant `name` with validated hyperparameters."""
        return self.load(name)(seed=seed, **hyperparams)

    def load_all(self) -> list[Entry]:
        """Every entry, imported, with its class or its error: what `attnbench list` shows."""
        for entry in self.entries.values():
            if not entry.loaded:
                self._import(entry)
        return list(self.entries.values())


registry = Registry()

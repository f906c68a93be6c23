"""The words RULER's generators draw from, offline: needle keys ("adjective-noun", as RULER's niah.py pairs
wonderwords' adjectives and nouns), the common-words pool (RULER's cwe samples wonderwords' nouns, adjectives and
verbs) and the essay haystack (RULER's Paul Graham essays, which we do not ship: the prose of the shipped Python
tutorial stands in). wonderwords is not a dependency: these lists are ours."""

from __future__ import annotations

import functools
import re
from importlib import resources

ADJECTIVES = (
    "able", "acid", "agile", "alert", "amber", "ancient", "angry", "arctic", "ashen", "autumn", "bitter", "blank",
    "bold", "brave", "brief", "bright", "brisk", "broad", "bronze", "calm", "candid", "cheap", "chilly", "civil",
    "clever", "cloudy", "coarse", "cosmic", "crisp", "curly", "damp", "daring", "dense", "dizzy", "dusty", "eager",
    "early", "earthy", "elder", "empty", "faint", "fancy", "fierce", "fiery", "firm", "fluffy", "frail", "frosty",
    "gentle", "giant", "glossy", "golden", "grand", "grassy", "greedy", "gritty", "hairy", "handy", "hasty", "hazy",
    "hollow", "humble", "husky", "icy", "idle", "jolly", "juicy", "keen", "kind", "lanky", "large", "lazy", "lively",
    "lofty", "lonely", "loud", "lucky", "lunar", "mellow", "merry", "mighty", "misty", "modest", "muddy", "narrow",
    "nimble", "noble", "noisy", "odd", "olive", "pale", "plain", "polite", "proud", "quick", "quiet", "rapid", "rare",
    "rusty", "sandy", "shaky", "silent", "silky", "sleepy", "slim", "smoky", "snowy", "solar", "sour", "spicy",
    "steep", "stormy", "sturdy", "sunny", "swift", "tall", "tame", "tidy", "timid", "tiny", "vast", "vivid", "wary",
    "weary", "wild", "windy", "wise", "witty", "young", "zesty",
)  # fmt: skip
NOUNS = (
    "acorn", "anchor", "apple", "arrow", "badger", "bakery", "banjo", "barrel", "basket", "beacon", "beetle", "bell",
    "blanket", "bottle", "bridge", "bucket", "cabin", "camel", "candle", "canoe", "canyon", "carpet", "castle",
    "cellar", "chair", "cherry", "chimney", "circus", "cliff", "clock", "cobra", "comet", "copper", "cottage",
    "crane", "crayon", "dagger", "desert", "diamond", "dolphin", "donkey", "dragon", "drum", "eagle", "engine",
    "falcon", "feather", "fence", "ferry", "fiddle", "forest", "fossil", "fountain", "garden", "geyser", "glacier",
    "goblet", "harbor", "helmet", "hammer", "hornet", "island", "jacket", "jungle", "kettle", "kitten", "ladder",
    "lagoon", "lantern", "lemon", "lizard", "magnet", "mantle", "marble", "meadow", "mirror", "monkey", "mustard",
    "needle", "oasis", "orchard", "otter", "oyster", "paddle", "parrot", "pebble", "pencil", "pepper", "piano",
    "pillow", "pirate", "planet", "pocket", "pond", "puppet", "quarry", "rabbit", "raccoon", "radish", "ribbon",
    "river", "rocket", "saddle", "salmon", "scarf", "shovel", "spider", "squirrel", "statue", "stove", "sunset",
    "teapot", "temple", "thistle", "ticket", "tiger", "tower", "trumpet", "tunnel", "turnip", "umbrella", "valley",
    "violin", "wagon", "walnut", "whistle", "window", "wizard", "yacht", "zebra",
)  # fmt: skip
ESSAY_TEXT = "python_tutorial.txt"  # the shipped prose (attnbench.model.texts): the essay haystack
VOCABULARY_TEXTS = ("python_tutorial.txt", "python_argparse.txt")  # the common-words pool's further source
WORD = re.compile(r"(?<![\w.])[a-z]{3,12}(?![\w.])")  # a plain lowercase word, not part of a name or a path


def shipped_text(name: str) -> str:
    return resources.files("attnbench.model.texts").joinpath(name).read_text(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def key_words() -> tuple[str, ...]:
    """Every "adjective-noun" key, sorted (RULER's niah.py `words`)."""
    return tuple(sorted({f"{adjective}-{noun}" for adjective in ADJECTIVES for noun in NOUNS}))


@functools.lru_cache(maxsize=1)
def common_words() -> tuple[str, ...]:
    """The common-words pool, sorted: our adjectives and nouns and the plain words of the shipped texts."""
    found = {word for name in VOCABULARY_TEXTS for word in WORD.findall(shipped_text(name))}
    return tuple(sorted(found | set(ADJECTIVES) | set(NOUNS)))


@functools.lru_cache(maxsize=1)
def essay_words() -> tuple[str, ...]:
    """The essay haystack as words, whitespace collapsed (RULER: `re.sub(r'\\s+', " ", essay).split(" ")`)."""
    return tuple(re.sub(r"\s+", " ", shipped_text(ESSAY_TEXT)).strip().split(" "))

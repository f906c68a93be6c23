"""MkDocs hook: the command-line reference page (cli.md), written from attnbench's own argparse parser each time the
site is built, so every flag is documented once, in its help string, and the page can never disagree with `--help`.

The page exists only in the built site (it is added to MkDocs' files here, never written into docs/). argparse has
no public API to walk a parser, so this reads the internals its own format_help walks (_action_groups, the
formatter's helpers), as documentation generators such as sphinx-argparse do; tests/docs/test_cli_reference.py
fails if a verb or a flag goes missing."""

from __future__ import annotations

import argparse
import html
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mkdocs.config.defaults import MkDocsConfig
    from mkdocs.structure.files import Files

PAGE = "cli.md"


def escape(text: str) -> str:
    """Help text as Markdown that renders as written: `<run-id>` is no HTML tag, `*.toml` no emphasis, `|` no table
    column (backticks are kept: help strings quote names in them, as the docs do)."""
    return html.escape(text, quote=False).replace("*", r"\*").replace("|", r"\|").replace("\n", " ")


def text_block(text: str) -> str:
    """Preformatted text (a RawDescriptionHelpFormatter epilog: examples, exit statuses) as a fenced block."""
    return f"```text\n{text.rstrip()}\n```"


def prose(parser: argparse.ArgumentParser, text: str | None) -> str:
    """A description or epilog: kept as laid out where the parser keeps its layout, else one paragraph."""
    if not text:
        return ""
    raw = issubclass(parser.formatter_class, argparse.RawDescriptionHelpFormatter) and "\n" in text.strip()
    return text_block(text) if raw else escape(text.strip())


def subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    """The parser's verbs, if it has any."""
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def argument_table(parser: argparse.ArgumentParser, group: argparse._ArgumentGroup) -> str:
    """One argument group (positional arguments, options, a named group) as a table: invocation, help."""
    formatter = parser._get_formatter()
    rows = []
    for action in group._group_actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
            continue
        invocation = formatter._format_action_invocation(action)
        help_text = escape(formatter._expand_help(action)) if action.help else ""
        rows.append(f"| `{invocation}` | {help_text} |")
    if not rows:
        return ""
    return "\n".join([f"**{group.title}**", "", "| argument | what it does |", "|---|---|", *rows])


def sections(parser: argparse.ArgumentParser, level: int, summary: str | None = None) -> Iterator[str]:
    """The parser's summary (its line in its parent's --help), description, usage, arguments and epilog, then each of
    its verbs one level down."""
    yield f"{'#' * level} `{parser.prog}`"
    yield f"**{escape(summary)}**" if summary else ""
    yield prose(parser, parser.description)
    yield text_block(parser.format_usage())
    yield from (argument_table(parser, group) for group in parser._action_groups)
    yield prose(parser, parser.epilog)
    verbs = subcommands(parser)
    if verbs is not None:
        for name, subparser in verbs.choices.items():
            summary = next((c.help for c in verbs._choices_actions if c.dest == name), None)
            yield from sections(subparser, level + 1, summary)


def cli_markdown(parser: argparse.ArgumentParser) -> str:
    """The whole reference page for `parser` (attnbench's: attnbench.cli.build_parser())."""
    intro = (
        "# Command line\n\n"
        "Generated from the parser (`attnbench.cli.build_parser`) each time this site is built: the same text as "
        "`attnbench --help` and `attnbench COMMAND --help`, one section a command. For what the commands are for, "
        "start with [Using attnbench](usage.md)."
    )
    return "\n\n".join([intro, *(part for part in sections(parser, 2) if part)]) + "\n"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """MkDocs' event once the docs are collected: add the generated cli.md to them."""
    from attnbench.cli import build_parser
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=cli_markdown(build_parser())))
    return files

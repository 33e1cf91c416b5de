"""Every ``fedcxr ingest`` SOURCE declared once (``SOURCES``): the registry, ``--plan``, the CLI's
SOURCE list and per-source help (``fedcxr ingest SOURCE --help``) all derive from it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedcxr.site_adapters.ingest import ADAPTERS
from fedcxr.site_adapters.sources import SOURCES, plain_text, plan_sources, source_list

README = Path(__file__).resolve().parents[2] / "README.md"


def test_every_registered_source_has_an_entry_and_plan_support_is_declared():
    assert ADAPTERS == {name: spec.adapter for name, spec in SOURCES.items()}
    assert sorted(plan_sources()) == ["chexpert", "csv", "mimic", "nih", "openi", "padchest", "rsna", "siim", "vindr"]
    for spec in SOURCES.values():  # each declared adapter exists
        assert callable(spec.adapter_function()), spec.name


def test_the_cli_lists_every_source_and_plan_names_the_sources_that_have_one(capsys):
    from fedcxr.cli import main

    with pytest.raises(SystemExit):
        main(["ingest", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert source_list() in text and all(name in text for name in SOURCES)
    assert "rows that would be set aside (" + ", ".join(plan_sources()) + ")" in text


def _plan_help_sources(capsys) -> list[str]:
    from fedcxr.cli import main

    with pytest.raises(SystemExit):
        main(["ingest", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    return re.search(r"rows that would be set aside \(([^)]*)\)", text).group(1).split(", ")


def test_the_readme_names_the_same_plan_sources_as_the_cli(capsys):
    """README's `--plan` paragraph names exactly the sources `--plan`'s help names (it named 4 of 9)."""
    text = " ".join(README.read_text().split())
    said = re.search(r"\*\*`--plan`\*\* reads the metadata only \(([^)]*)\)", text).group(1)
    assert re.findall(r"`(\w+)`", said) == _plan_help_sources(capsys)


@pytest.mark.parametrize("source", sorted(ADAPTERS))
def test_every_source_help_shows_its_layout_and_an_example(source, capsys):
    from fedcxr.cli import main

    with pytest.raises(SystemExit):
        main(["ingest", source, "--help"])
    text = capsys.readouterr().out
    assert text.startswith(f"SOURCE {source}: ") and "Example:\n  fedcxr ingest " + source in text
    assert "--plan: " in text and "usage: fedcxr ingest" in text


@pytest.mark.parametrize("source", sorted(ADAPTERS))
def test_source_help_is_plain_text_and_points_at_nothing_a_clone_lacks(source, capsys):
    """The adapters' docstrings are reStructuredText for developers; the user reads plain text, and
    ``../shared/`` (the project's data folder) is not in a clone."""
    from fedcxr.cli import main

    with pytest.raises(SystemExit):
        main(["ingest", source, "--help"])
    text = capsys.readouterr().out.split("-" * 100)[0]
    for markup in ("``", "../shared", ":func:`", ":mod:`", ":class:`", ":data:`"):
        assert markup not in text, (source, markup)
    assert not re.search(r"\*\*\w", text), source  # **bold**


def test_plain_text_keeps_the_words_of_what_it_strips():
    doc = ("Semantics (``../shared/data/x/README.md`` lists the quirks):\n* ``Finding Labels`` is a "
           "``|``-separated list (:func:`fedcxr.vocab.canonical_class`), **only if** set. Layout::\n")
    assert plain_text(doc) == ("Semantics:\n* Finding Labels is a |-separated list (canonical_class), "
                               "only if set. Layout:\n")


def test_source_help_differs_by_source_and_names_columns(capsys):
    from fedcxr.cli import main

    texts = {}
    for source in ("nih", "chexpert", "mimic"):
        with pytest.raises(SystemExit):
            main(["ingest", source, "-h"])
        texts[source] = capsys.readouterr().out
    assert "Finding Labels" in texts["nih"] and "Frontal/Lateral" in texts["chexpert"]
    assert "mimic-cxr-2.0.0-metadata.csv" in texts["mimic"] and len(set(texts.values())) == 3
    with pytest.raises(SystemExit):
        main(["ingest", "pacs", "--help"])
    assert "unknown SOURCE 'pacs'" in capsys.readouterr().out

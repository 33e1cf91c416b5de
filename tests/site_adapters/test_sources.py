"""Per-source help (``fedcxr ingest SOURCE --help``) and plan support, from the adapters' own docs."""

from __future__ import annotations

import pytest

from fedcxr.site_adapters.ingest import ADAPTERS
from fedcxr.site_adapters.sources import SOURCES, supports_plan


def test_every_registered_source_has_an_entry_and_plan_support_is_declared():
    assert set(SOURCES) == set(ADAPTERS)
    assert sorted(s for s, t in ADAPTERS.items() if supports_plan(t)) == ["chexpert", "csv", "mimic", "nih", "openi", "padchest", "rsna", "siim", "vindr"]



@pytest.mark.parametrize("source", sorted(ADAPTERS))
def test_every_source_help_shows_its_layout_and_an_example(source, capsys):
    from fedcxr.cli import main

    with pytest.raises(SystemExit):
        main(["ingest", source, "--help"])
    text = capsys.readouterr().out
    assert text.startswith(f"SOURCE {source}: ") and "Example:\n  fedcxr ingest " + source in text
    assert "--plan: " in text and "usage: fedcxr ingest" in text


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

"""``fedcxr.escape``: hand-computed cases of each format's rule."""

from __future__ import annotations

import pandas as pd
import yaml

from fedcxr.escape import csv_cell, csv_frame, md, short, to_csv_text


def test_csv_cells_that_a_spreadsheet_would_run_get_a_quote_numbers_and_plain_text_do_not():
    for text in ("=1+1", "+1", "-1", "@SUM(A1)", "\tx", "\rx", "  =1", "\uff1d1"):
        assert csv_cell(text) == "'" + text
    for value in ("a=1", "site-1", "", 1.5, -2, None, "'=already quoted"):
        assert csv_cell(value) == value


def test_csv_frame_quotes_cells_and_column_names_keeps_numbers_and_missing_values():
    frame = pd.DataFrame([["=cmd", -1.0, None], ["ok", 2.0, "x"]], columns=["name", "=value", "note"])
    assert to_csv_text(frame) == "name,'=value,note\n'=cmd,-1.0,\nok,2.0,x\n"
    assert frame.iloc[0, 0] == "=cmd", "the input frame is not changed"
    assert csv_frame(pd.DataFrame([["=a", "=b"]], columns=["x", "x"])).values.tolist() == [["'=a", "'=b"]]


def test_md_escapes_structure_and_keeps_ordinary_text_readable():
    assert md("nih_style") == "nih_style" and md("p<0.001") == "p<0.001" and md("a & b") == "a & b"
    assert md("a|b") == "a\\|b"
    assert md("x\n## heading\r\nnext\u2028line") == "x ## heading next line"
    assert md("<img src=x>") == "&lt;img src=x>" and md("</b>") == "&lt;/b>" and md("<!-- x -->") == "&lt;!-- x -->"
    assert md("&lt;") == "&amp;lt;"
    assert md("![t](http://e/x.png)") == "!\\[t\\](http://e/x.png)" and md("`code`") == "\\`code\\`"
    assert md("$\\foo$") == "\\$\\\\foo\\$"
    assert md("a\x00b") == "a\\x00b" and md(None) == "" and md(3) == "3"


def test_short_never_expands_a_yaml_alias_bomb():
    text = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcdefgh", "bcdefghi"))
    bomb = yaml.safe_load(text)["i"]  # 10^9 leaves if expanded
    assert len(short(bomb)) <= 80 and len(short("x" * 10**6)) <= 80 and short("ok") == "'ok'"


def test_md_text_is_prose_pipes_stay_and_a_value_cannot_open_a_block():
    from fedcxr.escape import md_text

    assert md_text("hospital_a (train) a|b p<0.001") == "hospital_a (train) a|b p<0.001"
    assert md_text("x\n## heading") == "x ## heading" and md_text("<img src=x>") == "&lt;img src=x>"
    assert md_text("[t](http://e)") == "\\[t\\](http://e)" and md_text("`x`") == "\\`x\\`"
    for opener, safe in (("# h", "\\# h"), ("> q", "\\> q"), ("- i", "\\- i"), ("+ i", "\\+ i"),
                         ("* i", "\\* i"), ("~~~", "\\~~~"), ("12. x", "12\\. x"), ("3) x", "3\\) x")):
        assert md_text(opener) == safe
    assert md_text("a-b # c") == "a-b # c" and md_text(None) == ""


def test_code_spans_need_no_escaping_inside_only_a_longer_fence():
    from fedcxr.escape import code

    assert code("fedcxr sweep c.yaml --methods A_b") == "`fedcxr sweep c.yaml --methods A_b`"
    assert code("a`b") == "``a`b``" and code("``x") == "``` ``x ```" and code("x\ny") == "`x y`"
    assert code("a|b") == "`a|b`" and code("a|b", cell=True) == "`a\\|b`"
    assert code(" x ") == "`  x  `"

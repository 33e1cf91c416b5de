"""Counted nouns (fedcxr.wording): "1 patient", "2 patients"."""

from fedcxr.wording import count


def test_one_is_singular_everything_else_plural():
    assert count(1, "patient") == "1 patient" and count(0, "patient") == "0 patients"
    assert count(2, "image") == "2 images" and count(1, "class") == "1 class" and count(3, "class") == "3 classes"
    assert count(2, "reply") == "2 replies" and count(2, "criterion", "criteria") == "2 criteria"

"""The site's secret key: created once and private, read from option/env/OUT, keyed pseudonyms."""

from __future__ import annotations

import os
import stat

import pytest

from fedcxr.errors import UserError
from fedcxr.site_adapters.sitekey import KEY_FILE_NAME, PSEUDONYM_HEX, load_site_key


def _key_file(path, text="ab" * 32, mode=0o600):
    path.write_text(text)
    path.chmod(mode)
    return path


def test_default_key_is_created_once_private_and_reused(tmp_path, monkeypatch):
    monkeypatch.delenv("FEDCXR_SITE_KEY", raising=False)
    first = load_site_key(None, tmp_path / "out")
    path = tmp_path / "out" / KEY_FILE_NAME
    assert first.origin == "created" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(first.secret) == 32 and path.read_text().strip() == first.secret.hex()
    again = load_site_key(None, tmp_path / "out")
    assert again.origin == "out" and again.secret == first.secret
    assert again.pseudonym("patient", "MRN-1") == first.pseudonym("patient", "MRN-1")


def test_option_wins_over_env_and_env_over_out(tmp_path, monkeypatch):
    option = _key_file(tmp_path / "option.key", "11" * 32)
    env = _key_file(tmp_path / "env.key", "22" * 32)
    monkeypatch.setenv("FEDCXR_SITE_KEY", str(env))
    assert load_site_key(option, tmp_path / "out").secret == bytes([0x11]) * 32
    assert load_site_key(None, tmp_path / "out").secret == bytes([0x22]) * 32
    assert not (tmp_path / "out" / KEY_FILE_NAME).exists()  # nothing created when a key is given


def test_keyed_pseudonyms_same_key_same_id_other_key_other_id(tmp_path):
    a = load_site_key(_key_file(tmp_path / "a.key", "11" * 32), tmp_path)
    b = load_site_key(_key_file(tmp_path / "b.key", "22" * 32), tmp_path)
    ids = a.pseudonyms("patient", ["MRN-1", "MRN-2", "MRN-1"])
    assert ids[0] == ids[2] != ids[1] and all(len(x) == PSEUDONYM_HEX for x in ids)
    assert "MRN" not in "".join(ids)
    assert a.pseudonym("patient", "MRN-1") != b.pseudonym("patient", "MRN-1")
    assert a.pseudonym("patient", "X") != a.pseudonym("study", "X")  # domains separated
    assert a.key_id != b.key_id and a.secret.hex() not in repr(a) and a.key_id in repr(a)


@pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX")
@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_key_readable_by_others_is_refused(tmp_path, mode):
    path = _key_file(tmp_path / "k", mode=mode)
    with pytest.raises(UserError, match=f"readable by group or others.*chmod 600 {path}"):
        load_site_key(path, tmp_path)


@pytest.mark.parametrize("content, message", [
    (b"short", "too short"),
    (None, "no such file"),
])
def test_bad_key_files_are_named(tmp_path, content, message):
    path = tmp_path / "k"
    if content is not None:
        path.write_bytes(content)
        path.chmod(0o600)
    with pytest.raises(UserError, match=f"--site-key {path}: {message}"):
        load_site_key(path, tmp_path)


def test_raw_binary_key_is_accepted(tmp_path):
    path = tmp_path / "k"
    path.write_bytes(bytes(range(40)))
    path.chmod(0o600)
    assert load_site_key(path, tmp_path).secret == bytes(range(40))

"""The env-file and pyvenv.cfg rule of syspath.py (D2): read as CPython reads them."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from warden.deps.syspath import (
    env_problems,
    env_value,
    parse_pyvenv_cfg,
    pth_lines,
    pyvenv_cfg_problems,
)

# Characters str.strip() removes and str.splitlines() may split at: the ones a reader gets wrong.
ODD = ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\t", " ", "\r"]


def site_venv_reads(text: str) -> dict[str, str]:
    """What site.venv() and getpath take of a pyvenv.cfg text (an independent model: a text file in
    universal-newline mode, keys stripped; getpath's home is the first, site's other keys the last)."""
    out: dict[str, str] = {}
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if "=" in line:
            key, _, value = line.partition("=")
            key = key.strip().lower()
            if key == "home" and "home" in out:
                continue
            out[key] = value.strip()
    return out


def test_vertical_tab_key_is_read_as_site_reads_it() -> None:
    cfg = b"home = /a/bin\ninclude-system-site-packages\x0b= true\n"
    assert parse_pyvenv_cfg(cfg)["include-system-site-packages"] == "true"
    assert pyvenv_cfg_problems(cfg) and "line 2" in pyvenv_cfg_problems(cfg)[0]


def test_first_home_wins_and_a_second_is_a_problem() -> None:
    cfg = b"home\x0b= /other/bin\nhome = /a/bin\nversion = 3.11.7\n"
    assert parse_pyvenv_cfg(cfg)["home"] == "/other/bin"
    assert len(pyvenv_cfg_problems(cfg)) == 2


def test_plain_venv_cfg_has_no_problem() -> None:
    cfg = b"home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11.7\nexecutable = /usr/bin/python3.11\n"
    assert pyvenv_cfg_problems(cfg) == []
    assert pyvenv_cfg_problems(cfg.replace(b"\n", b"\r\n")) == []


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["home", "include-system-site-packages", "version", "prompt", "Home", "x"]),
            st.sampled_from(["", *ODD]),
            st.sampled_from(["", *ODD]),
            st.sampled_from(["/a/bin", "true", "false", "3.11.7"]),
            st.sampled_from(["\n", "\r\n", "\r", *ODD]),
        ),
        max_size=6,
    )
)
def test_generated_cfg_parsed_as_cpython_or_flagged(rows: list[tuple[str, str, str, str, str]]) -> None:
    text = "".join(f"{k}{pre} ={post} {v}{end}" for k, pre, post, v, end in rows)
    data = text.encode()
    assert parse_pyvenv_cfg(data) == site_venv_reads(text)
    plain = all(re.fullmatch(r"[a-z][a-z_-]* = \S+", ln) for ln in re.split(r"\r\n|\r|\n", text) if ln)
    keys = [ln.partition(" = ")[0] for ln in re.split(r"\r\n|\r|\n", text) if ln]
    if not plain or len(set(keys)) != len(keys) or "x" in keys:
        assert pyvenv_cfg_problems(data), text


def test_pth_lines_split_as_site_of_the_version() -> None:
    data = b"/x\x0b/y\nimport os\r/z\r\n"
    assert pth_lines(data, (3, 11)) == (["/x\x0b/y", "/z"], ["import os"])
    assert pth_lines(data, (3, 13)) == (["/x", "/y", "/z"], ["import os"])


def test_empty_python_variables_are_not_set() -> None:
    env = {"PYTHONNOUSERSITE": "", "PYTHONPATH": "", "PYTHONHOME": "/h"}
    assert env_value(env, "PYTHONNOUSERSITE") is None
    assert env_value(env, "PYTHONPATH") is None
    assert env_value(env, "PYTHONHOME") == "/h"


def test_unmodelled_loader_variables_are_problems() -> None:
    env = {
        "LD_PRELOAD": "/x.so",
        "LD_LIBRARY_PATH": "",
        "DYLD_INSERT_LIBRARIES": "/y",
        "PYTHONPYCACHEPREFIX": "/p",
        "PYTHONSTARTUP": "",
        "PYTHONWARNINGS": "error::mod.Cls",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONPATH": "/a",
        "PATH": "/usr/bin",
        "LANG": "C.UTF-8",
    }
    names = [n for n, _ in env_problems(env)]
    assert names == ["DYLD_INSERT_LIBRARIES", "LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPYCACHEPREFIX", "PYTHONWARNINGS"]

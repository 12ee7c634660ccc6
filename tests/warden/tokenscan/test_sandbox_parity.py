"""What the sandbox shows a template of itself is what transformers 5 shows (sandbox_child.py,
red-team round 3): the clock has real microseconds and advances between readings like
``datetime.now()``, still reading the second each battery render asks for; the string forms of
the loader's globals and their methods (``dict.fromkeys|string``) name transformers' scope, never
the sandbox's. Checked with generated instants and expressions."""

from __future__ import annotations

import datetime
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warden.tokenscan import chat_template as ct

LIMITS = ct.RenderLimits(10, 1 << 20, 1 << 29)
READINGS = 12


def _render(template: str, now: float) -> str:
    render: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "context": {}, "now": now}
    answer = ct.run_battery(template, [render], LIMITS)
    assert answer["renders"][0]["status"] == "ok", answer
    return str(answer["renders"][0]["output"])


@settings(max_examples=15, deadline=None)
@given(second=st.integers(min_value=0, max_value=4_000_000_000))
def test_clock_readings_advance_within_the_second_the_render_asks_for(second: int) -> None:
    template = "|".join(["{{ strftime_now('%Y-%m-%d %H:%M:%S.%f') }}"] * READINGS)
    readings = [datetime.datetime.strptime(r, "%Y-%m-%d %H:%M:%S.%f") for r in _render(template, second).split("|")]
    assert readings == sorted(set(readings))  # strictly later each time, as the loader's clock moves on
    asked = datetime.datetime(1970, 1, 1) + datetime.timedelta(seconds=second)
    assert all(r.replace(microsecond=0) == asked for r in readings)


def test_clock_microseconds_are_not_a_whole_second() -> None:
    micros = {_render("{{ strftime_now('%f') }}", 1767225600 + i) for i in range(8)}
    assert micros != {"000000"} and len(micros) > 1


def _transformers_render(template: str) -> str:
    from transformers.utils.chat_template_utils import _compile_jinja_template

    return str(_compile_jinja_template(template).render(messages=[]))


def _without_addresses(text: str) -> str:
    return re.sub(r"0x[0-9a-f]+", "0x", text)


GLOBALS = ("dict", "namespace", "raise_exception", "strftime_now", "dict.fromkeys", "namespace()")
SHOWN = ("{{ X|string }}", "{{ X }}", "{{ (X|string).split(' of ')[0] }}", "{{ 'cached_compile' in (X|string) }}",
         "{{ '_loader_globals' in (X|string) }}", "{{ X is callable }}", "{{ [X]|join }}")  # fmt: skip


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(GLOBALS), shown=st.sampled_from(SHOWN))
def test_the_globals_show_what_transformers_shows(name: str, shown: str) -> None:
    template = shown.replace("X", name)
    assert _without_addresses(_render(template, 0)) == _without_addresses(_transformers_render(template))


@pytest.mark.parametrize("name", [g for g in GLOBALS if g != "namespace()"])  # an instance shows <Namespace {}>
def test_no_string_form_names_the_sandbox(name: str) -> None:
    out = _render("{{ " + name + "|string }}", 0)
    assert "_loader_globals" not in out and "sandbox" not in out and "_cached_compile_jinja_template" in out

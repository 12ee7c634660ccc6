"""Policy loading: YAML -> frozen dataclasses, errors naming file and key."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest

from warden.policy import PolicyError, load_policy


@dataclass(frozen=True)
class Probe:
    name: str
    deadline_seconds: float = 1.0

    def __post_init__(self):
        if self.deadline_seconds <= 0:
            raise ValueError("deadline_seconds: must be > 0")


@dataclass(frozen=True)
class Schema:
    store: str
    top_k: int = 4
    strict: bool = False
    probes: tuple[Probe, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    note: str | None = None


def write(tmp_path, text):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return path


def test_valid_policy_becomes_frozen_dataclasses(tmp_path):
    path = write(
        tmp_path,
        "version: 1\nstore: s3://b/p\ntop_k: 8\nprobes:\n  - name: data\n    deadline_seconds: 2\nlabels: {team: rl}\n",
    )
    policy = load_policy(path, Schema)
    assert policy.store == "s3://b/p" and policy.top_k == 8 and policy.strict is False
    assert policy.probes == (Probe("data", 2.0),)
    assert policy.labels["team"] == "rl"
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.top_k = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("store: x\n", "version: must be 1, got None"),
        ("version: 2\nstore: x\n", "version: must be 1, got 2"),
        ("version: 1\n", "store: required key is missing"),
        ("version: 1\nstore: x\ntop_kk: 3\n", "top_kk: unknown key"),
        ("version: 1\nstore: x\ntop_k: three\n", "top_k: expected an integer, got 'three'"),
        ("version: 1\nstore: x\nstrict: 'yes'\n", "strict: expected true or false"),
        (
            "version: 1\nstore: x\nprobes: [{name: a, deadline_seconds: x}]\n",
            "probes[0].deadline_seconds: expected a number",
        ),
        (
            "version: 1\nstore: x\nprobes: [{name: a, deadline_seconds: -1}]\n",
            "probes[0]: deadline_seconds: must be > 0",
        ),
        ("version: 1\nstore: x\nprobes: [{nme: a}]\n", "probes[0].nme: unknown key"),
        ("version: 1\nstore: [unclosed\n", "not valid YAML"),
        ("- just a list\n", "top level must be a mapping"),
    ],
)
def test_errors_name_file_and_key(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(PolicyError) as info:
        load_policy(path, Schema)
    assert str(info.value).startswith(f"{path}: ")
    assert message in str(info.value)
    assert info.value.exit_code == 2


def test_missing_file(tmp_path):
    with pytest.raises(PolicyError, match="policy file not found"):
        load_policy(tmp_path / "nope.yaml", Schema)


def test_shipped_policies_load():
    from sidecars.registry import SIDECARS, sidecar_class

    for name in SIDECARS:
        cls = sidecar_class(name)
        if cls.policy_schema is not None:
            load_policy(f"policies/{name}.yaml", cls.policy_schema)

"""The signer policy's schema: validation errors name the key; key paths and watch roots resolve."""

from __future__ import annotations

import os

import pytest

from warden.policy import PolicyError, policy_from_mapping
from warden.signer.policy import SignerPolicy


def test_policy_validation_names_the_key(tmp_path, monkeypatch):
    with pytest.raises(PolicyError, match=r"watch\[0\]: layout: expected one of warden, hf, verl"):
        policy_from_mapping({"version": 1, "watch": [{"path": "/x", "layout": "megatron"}]}, SignerPolicy, "p.yaml")
    with pytest.raises(PolicyError, match="listed twice"):
        policy_from_mapping({"version": 1, "watch": [{"path": "/x"}, {"path": "/x/"}]}, SignerPolicy, "p.yaml")
    with pytest.raises(PolicyError, match="stable_seconds: must be >= 0"):
        policy_from_mapping({"version": 1, "stable_seconds": -1}, SignerPolicy, "p.yaml")
    with pytest.raises(PolicyError, match="hash_workers"):
        policy_from_mapping({"version": 1, "hash_workers": 0}, SignerPolicy, "p.yaml")
    policy = policy_from_mapping({"version": 1, "signing_key": "~/k.pem"}, SignerPolicy, "p.yaml")
    assert policy.key_path({}) == os.path.expanduser("~/k.pem")
    assert policy.key_path({"WARDEN_SIGNING_KEY": str(tmp_path / "env.key")}) == str(tmp_path / "env.key")
    assert SignerPolicy().key_path({}) is None
    root = policy_from_mapping({"version": 1, "watch": [{"path": str(tmp_path / "exp1")}]}, SignerPolicy).watch[0]
    assert (root.layout, root.effective_run_id) == ("hf", "exp1")

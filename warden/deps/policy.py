"""Schema of policies/deps.yaml (policies/README.md and the file's comments describe the fields).

Relative paths in the policy (the lock, the OSV database, the baseline) are resolved
against the directory of the policy file, so ``lock.path: locks/runtime.txt`` works from
any working directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from warden.deps.ignores import IgnoreRule
from warden.deps.integrity_common import DEFAULT_UNHASHED
from warden.deps.model import SEVERITIES
from warden.deps.pth import SETUPTOOLS_PTH, PthRule


@dataclass(frozen=True)
class LockRules:
    """``platforms``: marker environments the lock must resolve on (hygiene), each completed
    from the target's own; empty means the target's environment only."""

    path: str = "locks/runtime-py311-linux-x86_64.txt"
    allow_url: bool = False
    allow_vcs: bool = False
    allow_editable: bool = False
    allow_local: bool = False
    allow_prereleases: bool = False
    platforms: tuple[dict[str, str], ...] = ()
    # --index-url / --extra-index-url / --find-links / --trusted-host values a lock may name.
    allowed_indexes: tuple[str, ...] = ("https://pypi.org/simple",)
    allow_http: bool = False  # plain-http index or artifact URLs
    # Directories holding the locked wheel files (a wheelhouse, `pip download -d`): each installed
    # dist's RECORD is compared with the RECORD of the wheel whose sha256 the lock lists (wheels.py).
    wheel_dirs: tuple[str, ...] = ()
    require_wheels: bool = False  # a locked dist without its wheel there: fail (else a warning)
    # Names whose lock entry may pin only an sdist (built locally): `sdist_only` is then a warning,
    # for any other name it is blocking.
    allow_sdist_only: tuple[str, ...] = ()


@dataclass(frozen=True)
class DriftRules:
    """``allow_extra``: names or globs of packages that may be installed beside the lock."""

    allow_extra: tuple[str, ...] = ()
    ignore_missing: tuple[str, ...] = ()


@dataclass(frozen=True)
class IntegrityRules:
    """``pth_allow`` / ``startup_allow``: content sha256 digests of the ``.pth`` files and
    ``sitecustomize``/``usercustomize`` modules that may run at start-up. ``unhashed_allow``:
    RECORD rows (globs relative to site-packages) that may lack a hash. ``egg_info_allow``:
    legacy egg-info installs (names or globs) whose files are trusted by name."""

    enabled: bool = True
    check_pyc: bool = True
    pth_allow: tuple[PthRule, ...] = SETUPTOOLS_PTH
    unowned_allow: tuple[str, ...] = ()
    unhashed_allow: tuple[str, ...] = DEFAULT_UNHASHED
    egg_info_allow: tuple[str, ...] = ()
    startup_allow: tuple[str, ...] = ()
    full_pass_interval_seconds: float = 86400.0
    workers: int = 0
    baseline: str | None = None
    auto_approve: bool = True
    # Budgets (walk.Budget): a file over max_file_bytes is `oversized` (never read); a read over
    # max_file_seconds, or anything once the audit read max_audit_bytes or ran max_audit_seconds,
    # makes the audit incomplete (exit 3) with what it found before.
    max_file_bytes: int = 8 * 1024**3
    max_file_seconds: float = 600.0
    max_audit_bytes: int = 1024**4
    max_audit_seconds: float = 3600.0

    def __post_init__(self) -> None:
        if self.full_pass_interval_seconds < 0:
            raise ValueError("full_pass_interval_seconds: must be >= 0")
        for name in ("max_file_bytes", "max_file_seconds", "max_audit_bytes", "max_audit_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be > 0")
        for rule in self.pth_allow:
            if not rule.sha256 or len(rule.sha256) != 64:
                raise ValueError(f"pth_allow: {rule.name or 'an entry'} needs the sha256 of its content")


@dataclass(frozen=True)
class VulnRules:
    """``osv_db``: a directory or ``all.zip`` in OSV export format; unset disables the check."""

    osv_db: str | None = None
    fail_on: tuple[str, ...] = SEVERITIES
    max_db_age_seconds: float | None = 7 * 86400.0
    pip_audit_crosscheck: bool = True
    online: bool = False
    pip_audit_timeout_seconds: float = 300.0

    def __post_init__(self) -> None:
        bad = sorted(set(self.fail_on) - set(SEVERITIES))
        if bad:
            raise ValueError(f"fail_on: unknown severities {bad}; use {', '.join(SEVERITIES)}")


@dataclass(frozen=True)
class TargetRules:
    """The environment the sidecar audits (``warden deps audit`` takes flags instead):
    ``python`` (an interpreter) or ``site_packages`` (a directory, read only); neither means
    the sidecar's own. ``WARDEN_PYTHON`` / ``WARDEN_SITE_PACKAGES`` override them.
    ``markers`` fill in what a bare site-packages cannot tell (sys_platform, platform_machine...)."""

    python: str | None = None
    site_packages: str | None = None
    markers: dict[str, str] = field(default_factory=dict)
    # Read, never run (syspath.py): the home directories the target runs under (its user site; none
    # given: the auditor's) and files of KEY=VALUE lines its environment is made of (PYTHONPATH, PYTHONHOME).
    user_homes: tuple[str, ...] = ()
    env_files: tuple[str, ...] = ()


@dataclass(frozen=True)
class DepsPolicy:
    lock: LockRules = field(default_factory=LockRules)
    drift: DriftRules = field(default_factory=DriftRules)
    integrity: IntegrityRules = field(default_factory=IntegrityRules)
    vulnerabilities: VulnRules = field(default_factory=VulnRules)
    ignore: tuple[IgnoreRule, ...] = ()
    target: TargetRules = field(default_factory=TargetRules)
    strict: bool = True
    audit_interval_seconds: float = 3600.0
    change_debounce_seconds: float = 5.0
    check_interval_seconds: float = 1.0
    watch: bool = True

    def __post_init__(self) -> None:
        for name in ("audit_interval_seconds", "check_interval_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be > 0")
        if self.change_debounce_seconds < 0:
            raise ValueError("change_debounce_seconds: must be >= 0")


def resolve(path: str | None, policy_path: str | None) -> str | None:
    """``path`` made absolute against the policy file's directory (``~`` and ``$VARS`` expanded)."""
    if not path:
        return None
    expanded = os.path.expanduser(os.path.expandvars(path))
    if os.path.isabs(expanded) or not policy_path:
        return os.path.abspath(expanded)
    return os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(policy_path)), expanded))


def as_dict(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in dict(value or {}).items()}

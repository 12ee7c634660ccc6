"""Run ids the signer has seen in the journal and their trainer versions (``<state_dir>/runs.json``)."""

from __future__ import annotations

import contextlib
import json
import os

from warden.safeio import atomic_write_bytes

RUNS_FILE = "runs.json"
MAX_REMEMBERED_RUNS = 32


class RunRegistry:
    """Run ids seen in the journal and their trainer versions, kept in ``<state_dir>/runs.json``.

    ``run.started`` is read once (the cursor moves past it), so the version it carries is
    saved for the checkpoints of that run signed after a restart.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.versions: dict[str, str | None] = {}
        self.last_run_id: str | None = None
        try:
            with open(path, encoding="utf-8") as fh:
                raw = json.load(fh)
            self.versions = {str(k): v if isinstance(v, str) else None for k, v in raw.get("versions", {}).items()}
            last = raw.get("last_run_id")
            self.last_run_id = last if isinstance(last, str) else None
        except (OSError, ValueError, AttributeError):
            pass

    def version(self, run_id: str | None) -> str | None:
        return self.versions.get(run_id) if run_id else None

    def record(self, run_id: str, version: str | None) -> None:
        """Remembers ``run_id`` (and its version, when given); writes the file only on a change."""
        known = self.versions.get(run_id)
        new_version = version or known
        if run_id == self.last_run_id and run_id in self.versions and new_version == known:
            return
        self.versions.pop(run_id, None)
        self.versions[run_id] = new_version
        while len(self.versions) > MAX_REMEMBERED_RUNS:
            del self.versions[next(iter(self.versions))]
        self.last_run_id = run_id
        document = {"versions": self.versions, "last_run_id": run_id}
        with contextlib.suppress(OSError):
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            atomic_write_bytes(self.path, json.dumps(document, indent=1).encode("utf-8"))

"""The signer's library: what the ``signer`` sidecar (:mod:`sidecars.signer`) runs.

Four services over one shared :class:`~warden.signer.state.SignerState`:
``announced_signing`` (``checkpoint.saved``: sign exactly what was announced),
``root_scanning`` (sign the watched roots' stable checkpoints, audit the run's own root),
``reverification`` (re-verify every signed checkpoint on an interval) and
``resume_checking`` (``run.resumed`` from any trainer: verify the checkpoint the run went on
from at once, through ``reverification``'s one verification path). ``operations`` signs
and verifies one checkpoint for them; ``instruments`` is the shape of the metrics they
set. Below them: ``policy`` (policies/signer.yaml schema), ``watch`` (finding checkpoints
in a root, completion and stability, the inotify root watcher), ``announcements`` (what the
trainer announced and what was signed, kept in the state dir, and the pure audit rules),
``resumes`` (resumed checkpoints that failed, kept in the state dir) and ``runs`` (the run
ids and versions seen). The hashing, manifest, DSSE and key code is
:mod:`warden.signing`. Importing this package never imports torch or the sidecar runtime.
"""

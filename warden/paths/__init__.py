"""Path health probes in child processes with deadlines: the library the ``paths`` sidecar
and the trainer's preflight share.

Modules: ``policy`` (policies/paths.yaml schema), ``probe`` (the child side and the pure
errno -> reason classification), ``scheduler`` (the parent side: one probe per path in
flight, stuck detection, non-blocking reaping), ``mountinfo`` (a pure /proc/self/mountinfo
parser) and ``preflight`` (the trainer's one-shot check, re-exported here:
:func:`preflight`, :func:`require_healthy`, :class:`Problem`, :class:`PathsUnhealthy`).
Importing this package never imports torch.
"""

from warden.paths.preflight import PathsUnhealthy, Problem, preflight, require_healthy

__all__ = ["PathsUnhealthy", "Problem", "preflight", "require_healthy"]

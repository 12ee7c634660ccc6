"""The signer's library: what the ``signer`` sidecar (:mod:`sidecars.signer`) runs.

Modules: ``policy`` (policies/signer.yaml schema), ``watch`` (finding checkpoints in a
root, completion and stability, the inotify root watcher) and ``announcements`` (what the
trainer announced and what was signed, kept in the state dir, and the pure audit rules).
The hashing, manifest, DSSE and key code is :mod:`warden.signing`. Importing this
package never imports torch or the sidecar runtime.
"""

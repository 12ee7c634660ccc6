"""Moved to :mod:`warden.signing.manifest` (the neutral core); this alias goes once no caller is left."""

import sys

import warden.signing.manifest

sys.modules[__name__] = warden.signing.manifest

"""Moved to :mod:`warden.signing.keys` (the neutral core); this alias goes once no caller is left."""

import sys

import warden.signing.keys

sys.modules[__name__] = warden.signing.keys

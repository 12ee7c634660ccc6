"""Moved to :mod:`warden.signing.hashing` (the neutral core); this alias goes once no caller is left."""

import sys

import warden.signing.hashing

sys.modules[__name__] = warden.signing.hashing

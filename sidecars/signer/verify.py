"""Moved to :mod:`warden.signing.verify` (the neutral core); this alias goes once no caller is left."""

import sys

import warden.signing.verify

sys.modules[__name__] = warden.signing.verify

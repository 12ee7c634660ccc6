"""Moved to :mod:`warden.signing.errors` (the neutral core); this alias goes once no caller is left."""

import sys

import warden.signing.errors

sys.modules[__name__] = warden.signing.errors

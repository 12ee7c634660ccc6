"""Moved to :mod:`warden.errors` (the neutral core); this alias goes once no caller is left."""

import sys

import warden.errors

sys.modules[__name__] = warden.errors

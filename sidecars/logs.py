"""Moved to :mod:`warden.logs` (the neutral core); this alias goes once no caller is left."""

import sys

import warden.logs

sys.modules[__name__] = warden.logs

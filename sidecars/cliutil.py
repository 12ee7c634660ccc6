"""Moved to :mod:`warden.cliutil` (the neutral core); this alias goes once no caller is left."""

import sys

import warden.cliutil

sys.modules[__name__] = warden.cliutil

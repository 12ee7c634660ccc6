"""Moved to :mod:`warden.watching` (the neutral core); this alias goes once no caller is left."""

import sys

import warden.watching

sys.modules[__name__] = warden.watching

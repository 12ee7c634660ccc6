"""Moved to :mod:`warden.stability` (the neutral core); this alias goes once no caller is left."""

import sys

import warden.stability

sys.modules[__name__] = warden.stability

"""Moved to :mod:`warden.runid` (the neutral core); this alias goes once no caller is left."""

import sys

import warden.runid

sys.modules[__name__] = warden.runid

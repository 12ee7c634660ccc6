"""Moved to :mod:`warden.layouts` (the neutral core); this alias goes once no caller is left."""

import sys

import warden.layouts

sys.modules[__name__] = warden.layouts

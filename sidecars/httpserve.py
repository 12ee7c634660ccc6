"""Moved to :mod:`warden.httpserve` (the neutral core); this alias goes once no caller is left."""

import sys

import warden.httpserve

sys.modules[__name__] = warden.httpserve

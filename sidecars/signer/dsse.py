"""Moved to :mod:`warden.signing.dsse` (the neutral core); this alias goes once no caller is left."""

import sys

import warden.signing.dsse

sys.modules[__name__] = warden.signing.dsse

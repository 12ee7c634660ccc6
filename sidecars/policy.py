"""Moved to :mod:`warden.policy` (the neutral core); this alias goes once no caller is left."""

import sys

import warden.policy

sys.modules[__name__] = warden.policy

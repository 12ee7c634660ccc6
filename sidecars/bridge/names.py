"""Moved to :mod:`warden.metric_names` (the neutral core); this alias goes once no caller is left."""

import sys

import warden.metric_names

sys.modules[__name__] = warden.metric_names

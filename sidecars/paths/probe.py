"""Moved to :mod:`warden.paths.probe` (the neutral core); this alias goes once no caller is left."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("warden.paths.probe")

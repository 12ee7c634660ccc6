"""Offline OSV data: loader (directory or ``all.zip``), pure matcher, CVSS scoring, HTTP API."""

"""A CycloneDX 1.5 JSON SBOM of the audited environment (pure).

Each installed distribution is a ``library`` component with its purl; ``hashes`` are the
lock's sha256 hashes of the artifacts that may have been installed (when the installed
version is the locked one), and the property ``warden:record_sha256`` is the sha256 of
the installed RECORD, a digest of every installed file's hash. Vulnerability findings
(not the ignored ones) are listed with their CVSS rating and the affected component.
"""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import quote

from warden import __version__
from warden.deps.audit import AuditReport
from warden.deps.drift import same_version
from warden.logs import utc_timestamp

_METHODS = {"CVSS:3.1": "CVSSv31", "CVSS:3.0": "CVSSv3"}


def purl(name: str, version: str) -> str:
    return f"pkg:pypi/{quote(name.lower())}@{quote(version, safe='')}"


def _component(report: AuditReport, dist: Any, locked: dict[str, Any]) -> dict[str, Any]:
    ref = purl(dist.canonical, dist.version)
    comp: dict[str, Any] = {"type": "library", "bom-ref": ref, "name": dist.name, "version": dist.version, "purl": ref}
    pin = locked.get(dist.canonical)
    if pin is not None and pin.version and same_version(pin.version, dist.version):
        sha = sorted({h.split(":", 1)[1] for h in pin.hashes if h.startswith("sha256:")})
        if sha:
            comp["hashes"] = [{"alg": "SHA-256", "content": h} for h in sha]
    props = [{"name": "warden:location", "value": dist.meta_dir}]
    if dist.record_sha256:
        props.append({"name": "warden:record_sha256", "value": dist.record_sha256})
    if dist.installer:
        props.append({"name": "warden:installer", "value": dist.installer})
    comp["properties"] = props
    return comp


def _vulnerability(finding: Any) -> dict[str, Any]:
    d = finding.details
    vuln: dict[str, Any] = {
        "bom-ref": f"{d['id']}@{d.get('package')}",
        "id": d["id"],
        "source": {"name": "OSV"},
        "affects": [{"ref": purl(str(d.get("package")), str(d.get("version")))}],
    }
    if d.get("summary"):
        vuln["description"] = d["summary"]
    rating: dict[str, Any] = {"severity": d.get("severity") if d.get("severity") != "unknown" else "unknown"}
    if d.get("score") is not None:
        rating["score"] = d["score"]
    vector = str(d.get("vector") or "")
    if vector:
        rating["vector"] = vector
        rating["method"] = _METHODS.get(vector.split("/")[0], "CVSSv2")
    vuln["ratings"] = [rating]
    refs = [a for a in d.get("aliases") or []]
    if refs:
        vuln["references"] = [{"id": a, "source": {"name": "OSV"}} for a in refs]
    return vuln


def build_sbom(report: AuditReport) -> dict[str, Any]:
    """The CycloneDX document of ``report`` (serial number random, timestamp = audit start)."""
    locked = report.locked_by_name()
    components = [_component(report, d, locked) for d in report.dists]
    unique = list({c["bom-ref"]: c for c in components}.values())
    found = [_vulnerability(f) for f in report.findings if f.check == "vulns" and f.kind == "vulnerable"]
    vulns = list({v["bom-ref"]: v for v in found}.values())
    env = report.target
    doc: dict[str, Any] = {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": f"urn:uuid:{uuid.uuid4()}",
        "version": 1,
        "metadata": {
            "timestamp": utc_timestamp(report.started).split(".")[0] + "Z",
            "tools": {"components": [{"type": "application", "name": "warden", "version": __version__}]},
            "component": {
                "type": "platform",
                "bom-ref": "target",
                "name": env.description,
                "properties": [{"name": "warden:site_packages", "value": p} for p in env.site_packages],
            },
        },
        "components": unique,
        "dependencies": [{"ref": "target", "dependsOn": [c["bom-ref"] for c in unique]}],
    }
    if vulns:
        doc["vulnerabilities"] = vulns
    return doc

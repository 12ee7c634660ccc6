"""Provisioning: the datasource and dashboard provider agree with docker-compose.yml's mounts."""

from __future__ import annotations

from pathlib import Path

import yaml
from support import ROOT

PROVISIONING = Path(ROOT) / "grafana" / "provisioning"


def compose() -> dict:
    return yaml.safe_load((Path(ROOT) / "docker-compose.yml").read_text())


def grafana_mounts() -> dict[str, str]:
    """Host path -> container path of the grafana service's volumes."""
    mounts = {}
    for volume in compose()["services"]["grafana"]["volumes"]:
        host, container, *_ = volume.split(":")
        mounts[host.rstrip("/")] = container
    return mounts


def test_grafana_datasource_points_at_the_compose_prometheus():
    config = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yml").read_text())
    assert config["apiVersion"] == 1
    (source,) = config["datasources"]
    assert source["type"] == "prometheus" and source["access"] == "proxy" and source["isDefault"] is True
    assert source["url"] == "http://prometheus:9090"
    services = compose()["services"]
    assert "prometheus" in services
    # The container port Grafana reaches over the compose network; the host side is loopback, overridable.
    assert any(str(p).endswith(":9090") for p in services["prometheus"]["ports"]), services["prometheus"]["ports"]
    scrape = yaml.safe_load((Path(ROOT) / "alerts" / "prometheus.yml").read_text())
    assert source["jsonData"]["timeInterval"] == scrape["global"]["scrape_interval"]


def test_grafana_dashboard_provider_reads_the_mounted_dashboards():
    config = yaml.safe_load((PROVISIONING / "dashboards" / "warden.yml").read_text())
    assert config["apiVersion"] == 1
    (provider,) = config["providers"]
    assert provider["type"] == "file"
    mounts = grafana_mounts()
    assert provider["options"]["path"] == mounts["./grafana/dashboards"]
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"

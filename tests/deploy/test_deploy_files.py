"""deploy/ stays consistent with the server it ships: the flags in the compose file and the manifests
parse and validate with the server's own CLI, the grace periods cover the drain, the probes name the
server's endpoints, HAProxy's server names are the compose services, and the Dockerfiles copy every
package. (The failover test runs deploy/haproxy.cfg itself against real servers.)"""
from __future__ import annotations

import ipaddress
import os
import re
import subprocess
from pathlib import Path

import pytest

from bench.cluster import haproxy_binary
from server.cli import build_parser, config_from_args

yaml = pytest.importorskip("yaml")  # pyyaml: in the export extra, which .ci/run installs
tomllib = pytest.importorskip("tomllib")  # Python 3.11+
ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
MARGIN = 5  # seconds a grace period must leave beyond preStop and the drain


def server_config(args: list[str]):
    return config_from_args(build_parser().parse_args(args))


def seconds(duration: str) -> float:
    value, unit = re.fullmatch(r"(\d+)(s|m)", duration).groups()
    return int(value) * (60 if unit == "m" else 1)


def test_compose_servers_match_haproxy_and_drain_in_time(monkeypatch):
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    servers = {name: s for name, s in compose["services"].items() if name != "haproxy"}
    named = re.findall(r'^\s*server (\S+) "\$\{UNIPAD_SERVER_\d-(\S+):8765\}"', (DEPLOY / "haproxy.cfg").read_text(), re.M)
    assert [(n, host) for n, host in named] == [(n, n) for n in servers]  # each HAProxy server is a service
    for service in servers.values():
        assert service["build"]["dockerfile"] == "deploy/Dockerfile"
        config = server_config(service["command"])
        assert seconds(service["stop_grace_period"]) >= config.drain_timeout + MARGIN
    assert "./haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro" in compose["services"]["haproxy"]["volumes"]
    # The servers trust HAProxy's fixed address, and only it, for the client's address (X-Forwarded-For).
    haproxy_address = compose["services"]["haproxy"]["networks"]["unipad"]["ipv4_address"]
    for service in servers.values():
        monkeypatch.setenv("UNIPAD_FORWARDED_ALLOW_IPS", service["environment"]["UNIPAD_FORWARDED_ALLOW_IPS"])
        assert server_config(service["command"]).forwarded_allow_ips == (haproxy_address,)
    subnet = compose["networks"]["unipad"]["ipam"]["config"][0]
    assert ipaddress.ip_address(haproxy_address) not in ipaddress.ip_network(subnet["ip_range"])


def test_the_stats_page_stays_on_loopback():
    """HAProxy's stats page has no password: it binds the loopback unless told otherwise, and compose
    publishes it on the host's loopback only (the balancer's port, 8765, on every interface)."""
    config = (DEPLOY / "haproxy.cfg").read_text()
    assert re.search(r'^\s*bind "\$\{UNIPAD_LB_STATS-127\.0\.0\.1:8404\}"$', config, re.M)
    ports = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]["haproxy"]["ports"]
    assert sorted(ports) == ["127.0.0.1:8404:8404", "8765:8765"]


def test_haproxy_forwards_the_client_and_cuts_the_streams_of_a_dead_server():
    """The settings the failover and client-address tests rely on, with the reasons in haproxy.cfg."""
    config = (DEPLOY / "haproxy.cfg").read_text()
    assert re.search(r"^\s*option forwardfor\b", config, re.M)
    assert re.search(r"^\s*default-server .*\bon-marked-down shutdown-sessions\b", config, re.M)
    # A full or draining server (503) keeps its streams: only a server that does not answer is DOWN.
    assert re.search(r"^\s*http-check expect status 200 error-status L7OKC$", config, re.M)


def test_kubernetes_probes_grace_period_and_autoscaler():
    docs = {d["kind"]: d for f in sorted((DEPLOY / "k8s").glob("*.yaml")) if f.name != "kustomization.yaml"
            for d in yaml.safe_load_all(f.read_text())}
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    config = server_config(container["args"])
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    # long enough for the preStop wait and a drain that decodes a 30 s segment (--drain-timeout)
    assert pod["terminationGracePeriodSeconds"] >= int(pre_stop[1]) + config.drain_timeout + MARGIN
    assert docs["Service"]["spec"]["selector"] == docs["Deployment"]["spec"]["selector"]["matchLabels"]
    metric = docs["HorizontalPodAutoscaler"]["spec"]["metrics"][0]["pods"]
    assert metric["metric"]["name"] == "unipad_sessions_active"  # a gauge the server exports (server/metrics.py)
    assert 0 < float(metric["target"]["averageValue"]) < config.max_sessions  # headroom for a failed pod's streams
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    trusted = next(e for e in container["env"] if e["name"] == "UNIPAD_FORWARDED_ALLOW_IPS")["valueFrom"]
    generated = {g["name"]: dict(x.split("=", 1) for x in g["literals"]) for g in kustomization["configMapGenerator"]}
    assert trusted["configMapKeyRef"]["key"] in generated[trusted["configMapKeyRef"]["name"]]
    assert sorted(kustomization["resources"]) == sorted(f.name for f in (DEPLOY / "k8s").glob("*.yaml")
                                                       if f.name != "kustomization.yaml")


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cuda"])
def test_dockerfiles_copy_every_package(dockerfile):
    text = (DEPLOY / dockerfile).read_text()
    folders = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values()
    copied = re.findall(r"^COPY (\S+) \./", text, re.M)
    assert {"unipad_asr", *folders} <= set(copied), (folders, copied)  # what the wheel is built from
    assert all((ROOT / path).exists() for path in copied)
    assert "--host\", \"0.0.0.0\"" in text and "STOPSIGNAL SIGTERM" in text
    assert re.search(r"^RUN pip3? install --no-cache-dir \. ", text, re.M)  # a wheel, not an editable checkout
    assert 'ENTRYPOINT ["unipad", ' in text  # the installed command


@pytest.mark.skipif(haproxy_binary() is None, reason="HAProxy is not installed (Debian: apt-get install haproxy)")
def test_haproxy_accepts_the_config():
    env = {**os.environ, **{f"UNIPAD_SERVER_{i}": f"127.0.0.1:{9000 + i}" for i in (1, 2, 3)}}
    done = subprocess.run([haproxy_binary(), "-c", "-f", str(DEPLOY / "haproxy.cfg")], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr

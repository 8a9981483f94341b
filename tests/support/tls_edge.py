"""The shipped nginx with TLS switched on, outside a container, for tests/ops/test_tls.py and the
browser test: a throwaway CA and server certificate (the ``openssl`` command line), the shipped
templates rendered the way ``docker-compose.tls.yml`` lays them out for the image's template step,
and Debian's nginx on free ports.

The browser test (tests/browser/tls.e2e.test.mjs) runs it as a command::

    python -m tests.support.tls_edge --dir DIR --gateway 127.0.0.1:8001 --gateway 127.0.0.1:8001

which prints one JSON line (``https``, ``spki``, ``ca``, ``access_log``) once nginx answers over TLS
and stops nginx when its stdin closes or it gets SIGTERM.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import re
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from tests.ops.test_nginx import SUFFIX, envsubst, nginx_command, render
from tests.support.processes import ROOT
from voxroom.store.server import free_port

TLS_TEMPLATES = ROOT / "nginx" / "tls"
TLS_COMPOSE = ROOT / "docker-compose.tls.yml"
# Every variable nginx/tls/ uses; docs/deployment.md documents each, docker-compose.tls.yml sets each.
TLS_VARIABLES = ("NGINX_TLS_LISTEN", "NGINX_TLS_CERT", "NGINX_TLS_KEY")
# What the test adds beside the rendered files (as test_nginx.py's temp-path drop-in): one access
# log line per request naming nginx's connection serial number, to count connections.
ACCESS_FORMAT = "$connection $server_port $server_protocol $request_method $uri $status $ssl_protocol"


@dataclass(frozen=True)
class Certificates:
    ca: Path
    cert: Path
    key: Path
    spki_sha256: str
    """base64 SHA-256 of the server certificate's public key, as Chromium's
    ``--ignore-certificate-errors-spki-list`` wants it."""

    def client_context(self) -> ssl.SSLContext:
        """A client context that trusts only the throwaway CA and verifies host names."""
        return ssl.create_default_context(cafile=str(self.ca))


def _openssl(*args: str, stdin: bytes | None = None) -> bytes:
    done = subprocess.run(["openssl", *args], input=stdin, capture_output=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)}: {done.stderr.decode(errors='replace')}")
    return done.stdout


def make_certificates(directory: Path) -> Certificates:
    """A CA valid for two days and a server certificate it signed for ``localhost`` and ``127.0.0.1``
    (P-256 keys: fast to make). Raises RuntimeError when ``openssl`` fails."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = directory / "ca.pem", directory / "ca.key"
    cert, key, csr = directory / "server.pem", directory / "server.key", directory / "server.csr"
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca), "-days", "2",
             "-subj", "/CN=voxroom throwaway test CA",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    _openssl("req", *ec, "-keyout", str(key), "-out", str(csr), "-subj", "/CN=localhost")
    extensions = directory / "server.ext"
    extensions.write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
                          "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
             "-days", "2", "-sha256", "-extfile", str(extensions), "-out", str(cert))
    public = _openssl("x509", "-in", str(cert), "-noout", "-pubkey")
    der = _openssl("pkey", "-pubin", "-outform", "DER", stdin=public)
    return Certificates(ca, cert, key, base64.b64encode(hashlib.sha256(der).digest()).decode())


def compose_tls() -> dict[str, Any]:
    """docker-compose.tls.yml's nginx service (what it adds to docker-compose.yml's)."""
    services: dict[str, dict[str, Any]] = yaml.safe_load(TLS_COMPOSE.read_text())["services"]
    return services["nginx"]


def volumes(service: dict[str, Any]) -> list[tuple[str, str]]:
    """A service's short-syntax volumes as (source, target); a source may be ``${VAR:-default}``."""
    pairs = []
    for volume in service["volumes"]:
        m = re.fullmatch(r"(\$\{[^}]*\}|[^:]+):([^:]+)(?::ro|:rw)?", volume)
        assert m, volume
        pairs.append((m.group(1), m.group(2)))
    return pairs


def template_layout() -> dict[str, Path]:
    """The image's template directory as docker-compose.tls.yml mounts it: each subdirectory (which
    becomes a subdirectory of conf.d/) and the repository directory mounted there."""
    nginx = compose_tls()
    root = PurePosixPath(nginx["environment"]["NGINX_ENVSUBST_TEMPLATE_DIR"])
    layout: dict[str, Path] = {}
    for source, target in volumes(nginx):
        if PurePosixPath(target).is_relative_to(root):
            layout[str(PurePosixPath(target).relative_to(root))] = ROOT / source
    return layout


@dataclass(frozen=True)
class Edge:
    http_port: int
    https_port: int
    access_log: Path
    """The test's own access log (ACCESS_FORMAT)."""
    shipped_log: Path
    """nginx.conf's access log, as shipped (nginx's stdout)."""

    def connections(self, uri_prefix: str) -> list[dict[str, str]]:
        """Access log entries on the TLS port whose path starts with ``uri_prefix``."""
        fields = [f.lstrip("$") for f in ACCESS_FORMAT.split()]
        rows = [dict(zip(fields, line.split(), strict=True)) for line in self.access_log.read_text().splitlines()]
        return [r for r in rows if r["server_port"] == str(self.https_port) and r["uri"].startswith(uri_prefix)]


def render_tls(prefix: Path, http_port: int, https_port: int, gateways: list[int], certs: Certificates) -> Path:
    """Every template of docker-compose.tls.yml's layout under ``prefix/conf.d``, with the documented
    variables only; returns nginx.conf. Test additions: test_nginx.py's temp paths and an access log."""
    conf = render(prefix, http_port, gateways)  # nginx.conf, conf.d/voxroom/, the temp-path drop-in
    values = {"NGINX_LISTEN": f"127.0.0.1:{http_port}",
              **{f"NGINX_GATEWAY_{i}": f"127.0.0.1:{p}" for i, p in enumerate(gateways, 1)},
              "NGINX_TLS_LISTEN": f"127.0.0.1:{https_port}",
              "NGINX_TLS_CERT": str(certs.cert), "NGINX_TLS_KEY": str(certs.key)}
    for subdir, source in template_layout().items():
        for template in sorted(source.rglob(f"*{SUFFIX}")):
            out = prefix / "conf.d" / subdir / template.relative_to(source).with_suffix("")
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(envsubst(template.read_text(), values))
    log = prefix / "access.log"
    (prefix / "conf.d" / "voxroom" / "zz-test-access.conf").write_text(
        f"log_format voxroom_test '{ACCESS_FORMAT}';\naccess_log {log} voxroom_test;\n")
    return conf


def _answers(url: str, context: ssl.SSLContext | None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1, context=context) as resp:
            return int(resp.status) == 200
    except OSError:
        return False


@contextlib.contextmanager
def running_tls_nginx(prefix: Path, gateways: list[int], certs: Certificates) -> Iterator[Edge]:
    """Debian's nginx with the plain and the TLS site in front of ``gateways``; stopped on exit."""
    http_port, https_port = free_port(), free_port()
    base = nginx_command(prefix, render_tls(prefix, http_port, https_port, gateways, certs))
    check = subprocess.run([*base, "-t"], capture_output=True, text=True, timeout=10)
    if check.returncode != 0:
        raise RuntimeError(f"nginx -t: {check.stderr}")
    stderr = prefix / "stderr.log"
    with open(stderr, "wb") as sink, open(prefix / "stdout.log", "wb") as out:  # the shipped access log
        proc = subprocess.Popen(base, stdout=out, stderr=sink)
    try:
        deadline = time.monotonic() + 10
        context = certs.client_context()
        while not (_answers(f"https://localhost:{https_port}/nginx-health", context)
                   and _answers(f"http://127.0.0.1:{http_port}/nginx-health", None)):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"nginx did not start: {stderr.read_text()}")
            time.sleep(0.05)
        yield Edge(http_port, https_port, prefix / "access.log", prefix / "stdout.log")
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dir", type=Path, required=True, help="an empty directory for certificates and nginx")
    parser.add_argument("--gateway", action="append", required=True,
                        help="a gateway as 127.0.0.1:PORT; twice (the shipped upstream names two)")
    args = parser.parse_args()
    ports = [int(g.rpartition(":")[2]) for g in args.gateway]
    certs = make_certificates(args.dir / "certs")
    # SIGTERM unwinds like a closed stdin, through running_tls_nginx, which stops nginx.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with running_tls_nginx(args.dir / "nginx", ports, certs) as edge:
        print(json.dumps({"https": f"https://127.0.0.1:{edge.https_port}", "spki": certs.spki_sha256,
                          "ca": str(certs.ca), "access_log": str(edge.access_log)}), flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()

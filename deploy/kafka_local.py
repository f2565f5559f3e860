#!/usr/bin/env python3
"""Run a real single-node Apache Kafka 4.x broker (KRaft, no ZooKeeper) without Docker.

Standard library only.  The broker jars come from Maven Central through ``mvn``
(``org.apache.kafka:kafka_2.13`` plus its runtime dependencies), are fetched once into a
cache directory, and the broker runs as a plain ``java`` process bound to 127.0.0.1.

Command line::

    python deploy/kafka_local.py fetch
    python deploy/kafka_local.py start [--state-dir D] [--port P]   # detached
    python deploy/kafka_local.py start --secure [--user NAME ...] [--state-dir D] [--port P]
    python deploy/kafka_local.py secure-env --user NAME [--mtls] [--state-dir D]
    python deploy/kafka_local.py status [--state-dir D]
    python deploy/kafka_local.py stop [--state-dir D] [--keep]

``start`` prints ``KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:PORT`` once the broker answers.

The secured broker (``--secure``) has no plaintext listener: SASL_SSL with SCRAM-SHA-512
on PORT, SSL with required client certificates (mTLS) on a second port, and an SSL
controller listener; a certificate CN=x is ``User:x``.  Only ACLs grant access
(StandardAuthorizer; none are made); ``admin`` and the broker (``kafka-broker``) are
super users.  At start ``openssl`` makes a CA, the broker's certificate and an admin
client certificate in ``D/tls``; the SCRAM users (``admin`` and the ``--user``s, by
default DEFAULT_USERS) get random passwords, kept in ``D/tls/users.json``.
``secure-env`` prints the ``export`` lines of a worker's settings (the password in a
0600 file, or ``--mtls`` for a client certificate)::

    eval "$(python deploy/kafka_local.py secure-env --user agui-stream)"

As a module (tests load it by file path)::

    with local_broker() as bootstrap:      # "127.0.0.1:PORT"
        ...
    with local_secure_broker() as info:    # SecureBrokerInfo
        env = worker_settings(info, "agui-stream")

Environment:
    AGUI_KAFKA_VERSION  Kafka version to fetch/run (default: DEFAULT_KAFKA_VERSION)
    AGUI_KAFKA_CACHE    directory holding the jars (default ~/.cache/agui-stream/kafka-<ver>)
    AGUI_KAFKA_STATE    default state dir of the CLI (default <repo>/var/kafka-local)
    AGUI_KAFKA_HEAP     JVM max heap (default 512m)
    JAVA_HOME           java to use (default: ``java`` on PATH)

The secured broker needs ``openssl`` (3.0+) on PATH.
"""

import argparse
import contextlib
import fcntl
import ipaddress
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

DEFAULT_KAFKA_VERSION = "4.1.1"
SCALA_VERSION = "2.13"
# Log4j2 backend + SLF4J binding; kafka_2.13's pom only brings the APIs.
LOG4J_VERSION = "2.24.3"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"

REPO_ROOT = Path(__file__).resolve().parent.parent
INFO_FILE = "broker.json"
NODE_ID = 1
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0

# Secured mode: files under <state>/tls.
TLS_DIR = "tls"
KEYSTORE_FILE = "broker-keystore.pem"  # the broker's key + certificate chain (PEM store)
USERS_FILE = "users.json"  # SCRAM user -> password
BROKER_CN = "kafka-broker"
ADMIN_USER = "admin"
DEFAULT_USERS = ("agui-stream", "history-service", "agent-server")
SCRAM_MECHANISM = "SCRAM-SHA-512"
CA_DAYS = 3650
CERT_DAYS = 365
# A user / certificate CN: what the principal mapping rule keeps of a CN (and a file name).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

__all__ = [
    "DEFAULT_KAFKA_VERSION",
    "DEFAULT_USERS",
    "BrokerError",
    "BrokerInfo",
    "SecureBrokerInfo",
    "cache_dir",
    "client_certificate",
    "default_state_dir",
    "fetch",
    "foreign_ca",
    "free_port",
    "is_running",
    "local_broker",
    "local_secure_broker",
    "probe",
    "read_info",
    "server_certificate",
    "start",
    "stop",
    "wait_ready",
    "worker_settings",
]


class BrokerError(RuntimeError):
    """Fetching, starting or stopping the local broker failed."""


@dataclass(frozen=True)
class BrokerInfo:
    pid: int
    port: int
    controller_port: int
    bootstrap: str
    version: str
    state_dir: str
    log_file: str
    started_at: float


@dataclass(frozen=True)
class SecureBrokerInfo(BrokerInfo):
    """A secured broker: ``port``/``bootstrap`` is its SASL_SSL (SCRAM-SHA-512) listener."""

    mtls_port: int

    @property
    def sasl_bootstrap(self) -> str:
        return self.bootstrap

    @property
    def mtls_bootstrap(self) -> str:
        return f"127.0.0.1:{self.mtls_port}"

    @property
    def tls_dir(self) -> Path:
        return Path(self.state_dir) / TLS_DIR

    @property
    def ca_file(self) -> Path:
        return self.tls_dir / "ca.pem"

    def password(self, user: str) -> str:
        """The SCRAM password of ``user``."""
        passwords = _passwords(self.tls_dir)
        if user not in passwords:
            raise BrokerError(f"no SCRAM user {user!r} (users: {', '.join(sorted(passwords))})")
        return passwords[user]


def _say(msg: str) -> None:
    print(f"[kafka-local] {msg}", file=sys.stderr, flush=True)


def kafka_version() -> str:
    return os.environ.get("AGUI_KAFKA_VERSION", DEFAULT_KAFKA_VERSION)


def cache_dir(version: str | None = None) -> Path:
    env = os.environ.get("AGUI_KAFKA_CACHE")
    if env:
        return Path(env).expanduser().resolve()
    ver = version or kafka_version()
    return Path.home() / ".cache" / "agui-stream" / f"kafka-{ver}"


def default_state_dir() -> Path:
    env = os.environ.get("AGUI_KAFKA_STATE")
    return Path(env).expanduser().resolve() if env else REPO_ROOT / "var" / "kafka-local"


# --------------------------------------------------------------------------- fetch


_POM = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.agui-stream</groupId>
  <artifactId>kafka-local-fetch</artifactId>
  <version>0</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_{scala}</artifactId>
      <version>{kafka}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-api</artifactId>
      <version>{log4j}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-core</artifactId>
      <version>{log4j}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
      <version>{log4j}</version>
    </dependency>
  </dependencies>
</project>
"""


def _lib_dir(cache: Path) -> Path:
    return cache / "lib"


def _is_complete(cache: Path) -> bool:
    return (cache / "COMPLETE").is_file() and any(_lib_dir(cache).glob("kafka_*.jar"))


def fetch(version: str | None = None, cache: Path | None = None) -> Path:
    """Make sure the broker jars are in the cache; return the lib directory.

    The download goes to a temporary sibling directory that is renamed into place only
    after Maven succeeded, so an interrupted fetch never leaves a half-filled cache.
    Concurrent callers are serialised with a lock file.
    """
    ver = version or kafka_version()
    target = cache or cache_dir(ver)
    if _is_complete(target):
        return _lib_dir(target)
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerError("`mvn` (Apache Maven) is not on PATH; it is needed to fetch Kafka")
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.parent / f".{target.name}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _is_complete(target):  # another process fetched it while we waited
            return _lib_dir(target)
        if target.exists():  # stale, incomplete (should not happen: we rename atomically)
            shutil.rmtree(target)
        for stale in target.parent.glob(f".{target.name}.tmp-*"):  # left by a killed fetch
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            _maven_fetch(mvn, ver, tmp)
            (tmp / "COMPLETE").write_text(f"kafka_{SCALA_VERSION}:{ver}\n")
            tmp.chmod(0o755)
            os.rename(tmp, target)
            _say(f"cached in {target} (maven log: {target / 'maven.log'})")
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return _lib_dir(target)


def _maven_fetch(mvn: str, version: str, work: Path) -> None:
    pom = work / "pom.xml"
    pom.write_text(_POM.format(scala=SCALA_VERSION, kafka=version, log4j=LOG4J_VERSION))
    log = work / "maven.log"
    lib = _lib_dir(work)
    # Maven must not outlive a killed fetch (it would keep writing into the temp dir).
    setpriv = shutil.which("setpriv")
    cmd = [
        *([setpriv, "--pdeathsig", "KILL"] if setpriv else []),
        mvn,
        "-B",
        "--no-transfer-progress",
        "-f",
        str(pom),
        f"{DEPENDENCY_PLUGIN}:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={lib}",
    ]
    _say(f"fetching Apache Kafka {version} (kafka_{SCALA_VERSION}) from Maven Central")
    _say(f"maven log: {log}")
    t0 = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            while True:
                try:
                    rc = proc.wait(timeout=15)
                    break
                except subprocess.TimeoutExpired:
                    _say(f"... still resolving ({time.monotonic() - t0:.0f}s)")
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    if rc != 0:
        raise BrokerError(
            f"maven failed (exit {rc}) fetching kafka {version}; last log lines:\n" + _tail(log, 40)
        )
    jars = sorted(lib.glob("*.jar"))
    if not any(j.name.startswith("kafka_") for j in jars):
        raise BrokerError(f"maven succeeded but no kafka_*.jar in {lib}:\n" + _tail(log, 40))
    # Keep the log with the cache for later inspection.
    _say(f"fetched {len(jars)} jars in {time.monotonic() - t0:.1f}s")


# --------------------------------------------------------------------------- helpers


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, lines: int = 60) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", "replace")
    except OSError as e:
        return f"(cannot read {path}: {e})"
    return "\n".join(data.splitlines()[-lines:])


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise BrokerError("no `java` on PATH (Kafka 4.x needs Java 17+)")
    return java


def _jvm_opts(state: Path) -> list[str]:
    heap = os.environ.get("AGUI_KAFKA_HEAP", "512m")
    return [
        f"-Xmx{heap}",
        "-Xms128m",
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={state / 'log4j2.properties'}",
        f"-Dkafka.logs.dir={state / 'logs'}",
    ]


_LOG4J2 = """\
status = warn
name = kafka-local
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.state.name = state.change.logger
logger.state.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.controller.name = org.apache.kafka.controller
logger.controller.level = INFO
logger.clients.name = org.apache.kafka.clients
logger.clients.level = WARN
"""


def _plaintext_listeners(port: int, controller_port: int) -> dict[str, str]:
    return {
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
    }


def _secure_listeners(tls: Path, port: int, mtls_port: int, controller_port: int) -> dict[str, str]:
    """SASL_SSL/SCRAM for clients, mTLS for clients and the broker itself, ACLs enforced."""
    return {
        "listeners": (
            f"SECURE://127.0.0.1:{port},MTLS://127.0.0.1:{mtls_port},"
            f"CONTROLLER://127.0.0.1:{controller_port}"
        ),
        "advertised.listeners": f"SECURE://127.0.0.1:{port},MTLS://127.0.0.1:{mtls_port}",
        "listener.security.protocol.map": "SECURE:SASL_SSL,MTLS:SSL,CONTROLLER:SSL",
        "inter.broker.listener.name": "MTLS",
        "controller.listener.names": "CONTROLLER",
        "sasl.enabled.mechanisms": SCRAM_MECHANISM,
        f"listener.name.secure.{SCRAM_MECHANISM.lower()}.sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        ),
        "listener.name.mtls.ssl.client.auth": "required",
        "listener.name.controller.ssl.client.auth": "required",
        # One identity for the broker: server certificate on every listener, and client
        # certificate (User:kafka-broker) on its own controller and inter-broker connections.
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(tls / KEYSTORE_FILE),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(tls / "ca.pem"),
        "ssl.principal.mapping.rules": "RULE:^CN=([a-zA-Z0-9._-]+).*$/$1/,DEFAULT",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "false",
        "super.users": f"User:{BROKER_CN};User:{ADMIN_USER}",
    }


def _server_properties(state: Path, ports: dict[str, int]) -> str:
    port, controller_port = ports["port"], ports["controller_port"]
    listeners = (
        _secure_listeners(state / TLS_DIR, port, ports["mtls_port"], controller_port)
        if "mtls_port" in ports
        else _plaintext_listeners(port, controller_port)
    )
    props = {
        "process.roles": "broker,controller",
        "node.id": str(NODE_ID),
        **listeners,
        # Dynamic quorum (formatted with --standalone): bootstrap servers, no static voters.
        "controller.quorum.bootstrap.servers": f"127.0.0.1:{controller_port}",
        "log.dirs": str(state / "data"),
        "num.partitions": "1",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "auto.create.topics.enable": "true",
        "offsets.topic.replication.factor": "1",
        # Fewer internal partitions: first consumer group / transaction start much faster.
        "offsets.topic.num.partitions": "5",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "5",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        # Two cores shared with the tests: keep the thread pools small.
        "num.network.threads": "2",
        "num.io.threads": "4",
        "background.threads": "4",
        "num.recovery.threads.per.data.dir": "1",
        "log.retention.hours": "24",
        "log.segment.bytes": str(64 * 1024 * 1024),
    }
    return "".join(f"{k}={v}\n" for k, v in props.items())


# ------------------------------------------------------ certificates and users (secured)


def _check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise BrokerError(f"{name!r} is not a valid user name (letters, digits, '.', '_', '-')")
    return name


def _write_private(path: Path, data: bytes) -> None:
    """Write ``path`` readable by its owner only (mode 0600 from its creation on)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    path.chmod(0o600)  # an existing file keeps its mode through O_CREAT


def _openssl(*args: str, stdin: bytes | None = None) -> bytes:
    exe = shutil.which("openssl")
    if exe is None:
        raise BrokerError("`openssl` is not on PATH; the secured broker needs it for certificates")
    res = subprocess.run([exe, *args], input=stdin, capture_output=True, check=False)
    if res.returncode != 0:
        err = res.stderr.decode("utf-8", "replace")[-2000:]
        raise BrokerError(f"openssl {args[0]} failed (exit {res.returncode}):\n{err}")
    return res.stdout


def _new_key(path: Path) -> None:
    """A fresh EC P-256 private key as unencrypted PKCS#8 PEM."""
    _write_private(
        path, _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256")
    )


def _make_ca(tls: Path, cn: str) -> Path:
    """A self-signed CA in ``tls`` (ca.key, ca.pem); returns ca.pem."""
    tls.mkdir(mode=0o700, parents=True, exist_ok=True)
    _new_key(tls / "ca.key")
    # OpenSSL 3's `req -x509` lets -addext replace its default CA extensions.
    _openssl(
        "req", "-x509", "-new", "-key", str(tls / "ca.key"), "-subj", f"/CN={cn}",
        "-days", str(CA_DAYS), "-out", str(tls / "ca.pem"),
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    return tls / "ca.pem"


def _issue(
    tls: Path, cn: str, stem: str, *, days: int, hosts: Sequence[str] = ()
) -> tuple[Path, Path]:
    """Key ``<stem>.key`` and certificate ``<stem>.pem`` for CN=``cn``, signed by tls/ca.*.

    With ``hosts`` it is a server certificate for them (IP addresses or DNS names),
    which also serves as a client one.
    """
    if not (tls / "ca.pem").is_file():
        raise BrokerError(f"no CA in {tls}: start a secured broker there first")
    key, cert = tls / f"{stem}.key", tls / f"{stem}.pem"
    _new_key(key)
    csr = _openssl("req", "-new", "-key", str(key), "-subj", f"/CN={cn}")
    extensions = [
        "basicConstraints=critical,CA:FALSE",
        "keyUsage=critical,digitalSignature",
        f"extendedKeyUsage={'serverAuth,clientAuth' if hosts else 'clientAuth'}",
        *([f"subjectAltName={','.join(map(_alt_name, hosts))}"] if hosts else []),
    ]
    with tempfile.NamedTemporaryFile("w", dir=tls, prefix=f".{stem}-", suffix=".ext") as ext:
        ext.write("\n".join(extensions) + "\n")
        ext.flush()
        # -days -1 (OpenSSL 3.0) gives a certificate that expired a day ago.
        _openssl(
            "x509", "-req", "-CA", str(tls / "ca.pem"), "-CAkey", str(tls / "ca.key"),
            "-days", str(days), "-extfile", ext.name, "-out", str(cert),
            stdin=csr,
        )  # fmt: skip
    return key, cert


def _client_files(tls: Path, name: str) -> tuple[Path, Path]:
    return tls / f"client-{name}.key", tls / f"client-{name}.pem"


def client_certificate(state_dir: Path, name: str, *, days: int = CERT_DAYS) -> tuple[Path, Path]:
    """Issue (or re-issue) a client certificate CN=``name`` from the CA of ``state_dir``.

    Returns (key file, certificate file).  The broker maps it to ``User:<name>``.
    ``days=-1`` makes one that has already expired.
    """
    key, cert = _client_files(state_dir.resolve() / TLS_DIR, _check_name(name))
    return _issue(key.parent, name, cert.stem, days=days)


BROKER_HOSTS = ("127.0.0.1", "localhost")


def server_certificate(
    state_dir: Path, name: str, *, days: int = CERT_DAYS, hosts: Sequence[str] = BROKER_HOSTS
) -> tuple[Path, Path]:
    """Issue a server certificate for ``hosts`` from the CA of ``state_dir``, as the
    broker's own: (key file, certificate file) ``<tls>/server-<name>.*``.  Tests
    present one that expired (``days=-1``) or names another host."""
    tls = state_dir.resolve() / TLS_DIR
    return _issue(tls, _check_name(name), f"server-{name}", days=days, hosts=hosts)


def _alt_name(host: str) -> str:
    """A subjectAltName entry: ``IP:`` for an address, ``DNS:`` for a name."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return f"DNS:{host}"
    return f"IP:{host}"


def foreign_ca(dir: Path) -> Path:
    """Make a CA the broker does not trust in ``dir/tls``; return its certificate.

    ``client_certificate(dir, name)`` then issues client certificates from it.
    """
    return _make_ca(dir.resolve() / TLS_DIR, "foreign CA")


def _setup_tls(state: Path, users: Sequence[str]) -> None:
    """CA, broker keystore, ``admin`` client certificate and SCRAM passwords of a new state."""
    tls = state / TLS_DIR
    shutil.rmtree(tls, ignore_errors=True)  # left by a start that failed before formatting
    ca = _make_ca(tls, "agui-stream kafka-local CA")
    key, cert = _issue(tls, BROKER_CN, "broker", days=CERT_DAYS, hosts=BROKER_HOSTS)
    _write_private(tls / KEYSTORE_FILE, key.read_bytes() + cert.read_bytes() + ca.read_bytes())
    client_certificate(state, ADMIN_USER)  # the readiness probe's identity
    passwords = {user: secrets.token_urlsafe(24) for user in (ADMIN_USER, *users)}
    _write_private(tls / USERS_FILE, (json.dumps(passwords, indent=2) + "\n").encode())


def _passwords(tls: Path) -> dict[str, str]:
    try:
        return dict(json.loads((tls / USERS_FILE).read_text()))
    except FileNotFoundError:
        return {}


def _admin_context(tls: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(tls / "ca.pem"))
    key, cert = _client_files(tls, ADMIN_USER)
    context.load_cert_chain(cert, key)
    return context


def worker_settings(info: SecureBrokerInfo, user: str, *, mtls: bool = False) -> dict[str, str]:
    """The environment a worker needs to connect to ``info`` as ``user``.

    SASL_SSL with SCRAM-SHA-512 and the password in ``<tls>/<user>.password`` (0600), or
    with ``mtls`` SSL with a client certificate CN=``user`` (issued if there is none).
    The broker authorizes only what ACLs grant (``admin`` is a super user).
    """
    tls = info.tls_dir
    common = {"KAFKA_SSL_CAFILE": str(info.ca_file)}
    if mtls:
        key, cert = _client_files(tls, _check_name(user))
        if not (key.is_file() and cert.is_file()):
            key, cert = client_certificate(Path(info.state_dir), user)
        return {
            "KAFKA_BOOTSTRAP_SERVERS": info.mtls_bootstrap,
            "KAFKA_SECURITY_PROTOCOL": "SSL",
            **common,
            "KAFKA_SSL_CERTFILE": str(cert),
            "KAFKA_SSL_KEYFILE": str(key),
        }
    password_file = tls / f"{_check_name(user)}.password"
    _write_private(password_file, info.password(user).encode())
    return {
        "KAFKA_BOOTSTRAP_SERVERS": info.sasl_bootstrap,
        "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "KAFKA_SASL_MECHANISM": SCRAM_MECHANISM,
        "KAFKA_SASL_USERNAME": user,
        "KAFKA_SASL_PASSWORD_FILE": str(password_file),
        **common,
    }


# ------------------------------------------------------------- readiness (raw protocol)


def _kafka_request(
    sock: socket.socket, api_key: int, api_version: int, corr: int, body: bytes
) -> bytes:
    client_id = b"kafka-local"
    header = struct.pack(">hhih", api_key, api_version, corr, len(client_id)) + client_id
    msg = header + body
    sock.sendall(struct.pack(">i", len(msg)) + msg)
    size = struct.unpack(">i", _recv_exact(sock, 4))[0]
    data = _recv_exact(sock, size)
    (got_corr,) = struct.unpack_from(">i", data, 0)
    if got_corr != corr:
        raise OSError(f"correlation id mismatch ({got_corr} != {corr})")
    return data[4:]


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise OSError("connection closed by broker")
        buf += chunk
    return bytes(buf)


def probe(
    host: str, port: int, timeout: float = 2.0, *, ssl_context: ssl.SSLContext | None = None
) -> bool:
    """True when the broker answers ApiVersions and lists itself (unfenced) in Metadata.

    With ``ssl_context`` the probe speaks TLS (the secured broker's mTLS listener).
    """
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            if ssl_context is None:
                return _answers(sock)
            with ssl_context.wrap_socket(sock, server_hostname=host) as tls:
                return _answers(tls)
    except (OSError, struct.error):  # ssl.SSLError is an OSError
        return False


def _answers(sock: socket.socket) -> bool:
    resp = _kafka_request(sock, 18, 0, 1, b"")  # ApiVersions v0
    (err, n) = struct.unpack_from(">hi", resp, 0)
    if err != 0:
        return False
    versions: dict[int, tuple[int, int]] = {}
    for i in range(n):
        key, lo, hi = struct.unpack_from(">hhh", resp, 6 + 6 * i)
        versions[key] = (lo, hi)
    if 3 not in versions:
        return False
    lo, hi = versions[3]
    ver = max(lo, 4)
    if ver > min(hi, 8):  # only non-flexible Metadata v4..v8 is encoded here
        return True
    # Metadata: topics = [] (no topics), allow_auto_topic_creation = false,
    # v8 adds include_cluster/topic_authorized_operations.
    body = struct.pack(">i", 0) + b"\x00" + (b"\x00\x00" if ver >= 8 else b"")
    meta = _kafka_request(sock, 3, ver, 2, body)
    (brokers,) = struct.unpack_from(">i", meta, 4)  # after throttle_time_ms
    if brokers < 1:
        return False
    (node_id,) = struct.unpack_from(">i", meta, 8)
    return bool(node_id == NODE_ID)


def _probe_target(info: BrokerInfo) -> tuple[int, ssl.SSLContext | None]:
    """Port and TLS context the readiness probe uses for ``info``'s broker."""
    if isinstance(info, SecureBrokerInfo):
        return info.mtls_port, _admin_context(info.tls_dir)
    return info.port, None


def wait_ready(
    port: int,
    *,
    proc: subprocess.Popen[bytes] | None = None,
    pid: int | None = None,
    logs: Sequence[Path] = (),
    timeout: float = READY_TIMEOUT_S,
    ssl_context: ssl.SSLContext | None = None,
) -> float:
    """Poll until the broker on ``port`` is ready (TLS with ``ssl_context``); return seconds waited.

    Fails early (with the tail of the broker log) if the process exits.
    """
    t0 = time.monotonic()
    deadline = t0 + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise BrokerError(
                f"kafka broker exited with code {proc.returncode} before becoming ready"
                + _log_excerpt(logs)
            )
        if pid is not None and not _pid_alive(pid):
            raise BrokerError(
                "kafka broker process died before becoming ready" + _log_excerpt(logs)
            )
        if probe("127.0.0.1", port, timeout=2.0, ssl_context=ssl_context):
            return time.monotonic() - t0
        if time.monotonic() > deadline:
            raise BrokerError(
                f"kafka broker on 127.0.0.1:{port} not ready after {timeout:.0f}s"
                + _log_excerpt(logs)
            )
        time.sleep(0.2)  # poll interval of the readiness loop


def _log_excerpt(logs: Sequence[Path]) -> str:
    parts = [
        f"\n--- tail of {log} ---\n{_tail(log, 40)}"
        for log in logs
        if log.is_file() and log.stat().st_size
    ]
    return "".join(parts)


# --------------------------------------------------------------------------- processes


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie counts as dead
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _is_our_broker(pid: int, state: Path) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    args = [a.decode("utf-8", "replace") for a in cmdline]
    return "kafka.Kafka" in args and str(state / "server.properties") in args


def _format_storage(java: str, lib: Path, state: Path) -> None:
    cp = str(lib / "*")
    base = [java, "-Xmx256m", "-Djava.awt.headless=true", "-cp", cp, "kafka.tools.StorageTool"]
    cluster_id = subprocess.run([*base, "random-uuid"], capture_output=True, text=True, check=False)
    if cluster_id.returncode != 0 or not cluster_id.stdout.strip():
        raise BrokerError(f"StorageTool random-uuid failed:\n{cluster_id.stderr[-4000:]}")
    cid = cluster_id.stdout.strip().splitlines()[-1].strip()
    # The SCRAM credentials of a secured broker go into the metadata log from the start.
    scram = [
        arg
        for user, password in _passwords(state / TLS_DIR).items()
        for arg in ("--add-scram", f"{SCRAM_MECHANISM}=[name={user},password={password}]")
    ]
    fmt = subprocess.run(
        [
            *base,
            "format",
            "--standalone",
            "--ignore-formatted",
            "--cluster-id",
            cid,
            "--config",
            str(state / "server.properties"),
            *scram,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    (state / "format.log").write_text(fmt.stdout + fmt.stderr)
    if fmt.returncode != 0:
        raise BrokerError(f"StorageTool format failed:\n{(fmt.stdout + fmt.stderr)[-4000:]}")


def _prepare_state(
    state: Path, port: int | None, *, secure: bool, users: Sequence[str]
) -> dict[str, int]:
    """Write configs (and, if ``secure``, certificates and users) once; return the ports.

    ``port`` (the client listener; SASL_SSL if ``secure``), ``controller_port`` and, if
    ``secure``, ``mtls_port``.
    """
    state.mkdir(parents=True, exist_ok=True)
    (state / "logs").mkdir(exist_ok=True)
    ports_file = state / "ports.json"
    if ports_file.is_file() and (state / "data" / "meta.properties").is_file():
        # Formatted before: the controller endpoint is part of the quorum state, keep ports.
        saved: dict[str, int] = json.loads(ports_file.read_text())
        hint = "stop it without --keep or use another --state-dir"
        if ("mtls_port" in saved) != secure:
            kind = "secured" if "mtls_port" in saved else "plaintext"
            raise BrokerError(f"state dir {state} was set up for a {kind} broker; {hint}")
        if port not in (None, saved["port"]):
            raise BrokerError(
                f"state dir {state} was set up for port {saved['port']}, not {port}; {hint}"
            )
        return saved
    names = ("port", "controller_port", *(["mtls_port"] if secure else []))
    chosen = [port or free_port()]
    while len(chosen) < len(names):
        candidate = free_port()
        if candidate not in chosen:
            chosen.append(candidate)
    ports = dict(zip(names, chosen, strict=True))
    if secure:
        _setup_tls(state, users)
    (state / "server.properties").write_text(_server_properties(state, ports))
    (state / "log4j2.properties").write_text(_LOG4J2.format(log=state / "logs" / "server.log"))
    ports_file.write_text(json.dumps(ports))
    return ports


def _spawn(state: Path, lib: Path, detached: bool) -> subprocess.Popen[bytes]:
    java = _java()
    if not (state / "data" / "meta.properties").is_file():
        _format_storage(java, lib, state)
    # An attached broker must not outlive its owner (e.g. a SIGKILLed pytest): have the
    # kernel send it SIGTERM when the spawning thread dies (util-linux setpriv).
    setpriv = None if detached else shutil.which("setpriv")
    prefix = [setpriv, "--pdeathsig", "TERM"] if setpriv else []
    out = open(state / "broker.out", "ab")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(
            [
                *prefix,
                java,
                *_jvm_opts(state),
                "-cp",
                str(lib / "*"),
                "kafka.Kafka",
                str(state / "server.properties"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=state,
            start_new_session=detached,
        )
    finally:
        out.close()


def _terminate(pid: int, wait_dead: float = STOP_TIMEOUT_S) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_dead
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _pid_alive(pid):
        _say(f"broker pid {pid} ignored SIGTERM for {wait_dead:.0f}s, killing it")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)


def _stop_proc(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _say(f"broker pid {proc.pid} ignored SIGTERM for {STOP_TIMEOUT_S:.0f}s, killing it")
        proc.kill()
        proc.wait()


# --------------------------------------------------------------------------- public API


def read_info(state_dir: Path | None = None) -> BrokerInfo | None:
    state = (state_dir or default_state_dir()).resolve()
    try:
        raw = json.loads((state / INFO_FILE).read_text())
        return SecureBrokerInfo(**raw) if "mtls_port" in raw else BrokerInfo(**raw)
    except (OSError, ValueError, TypeError):
        return None


def is_running(state_dir: Path | None = None) -> BrokerInfo | None:
    """The info of the broker running from ``state_dir``, or None."""
    state = (state_dir or default_state_dir()).resolve()
    info = read_info(state)
    if info and _pid_alive(info.pid) and _is_our_broker(info.pid, state):
        return info
    return None


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


_STATE_ENTRIES = (
    "data",
    "logs",
    "broker.out",
    "format.log",
    "server.properties",
    "log4j2.properties",
    "ports.json",
    TLS_DIR,
    INFO_FILE,
    "broker.pid",
)


def _wipe_state(state: Path) -> None:
    """Remove what this module put in ``state`` (never anything else), then the dir if empty."""
    for name in _STATE_ENTRIES:
        path = state / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    with contextlib.suppress(OSError):
        state.rmdir()


def _launch(
    state: Path,
    port: int | None,
    version: str,
    *,
    detached: bool,
    timeout: float,
    secure: bool = False,
    users: Sequence[str] = DEFAULT_USERS,
) -> tuple[subprocess.Popen[bytes], BrokerInfo]:
    """Configure/format ``state``, spawn the broker, write the info file, wait until ready.

    ``secure``: a ``SecureBrokerInfo`` broker whose SCRAM users are ``admin`` and ``users``
    (taken into account when the state is new).  A fresh state dir whose random ports were
    taken meanwhile is redone on new ports.
    """
    lib = fetch(version)
    if port is not None and not _port_is_free(port):
        raise BrokerError(f"port {port} on 127.0.0.1 is already in use")
    for user in users:
        _check_name(user)
    attempts = 3
    for attempt in range(1, attempts + 1):
        fresh = not (state / "data" / "meta.properties").is_file()
        ports = _prepare_state(state, port, secure=secure, users=users)
        t0 = time.monotonic()
        proc = _spawn(state, lib, detached=detached)
        info = BrokerInfo(
            pid=proc.pid,
            port=ports["port"],
            controller_port=ports["controller_port"],
            bootstrap=f"127.0.0.1:{ports['port']}",
            version=version,
            state_dir=str(state),
            log_file=str(state / "logs" / "server.log"),
            started_at=time.time(),
        )
        if secure:
            info = SecureBrokerInfo(**asdict(info), mtls_port=ports["mtls_port"])
        (state / INFO_FILE).write_text(json.dumps(asdict(info), indent=2) + "\n")
        (state / "broker.pid").write_text(f"{proc.pid}\n")
        probe_port, context = _probe_target(info)
        try:
            wait_ready(
                probe_port,
                proc=proc,
                logs=_broker_logs(state),
                timeout=timeout,
                ssl_context=context,
            )
        except BrokerError as e:
            _stop_proc(proc)
            if fresh and attempt < attempts and "Address already in use" in str(e):
                _say(f"port clash on {'/'.join(map(str, ports.values()))}; retrying on new ports")
                _wipe_state(state)
                continue
            raise
        except BaseException:
            _stop_proc(proc)
            raise
        _say(f"broker ready on {info.bootstrap} in {time.monotonic() - t0:.1f}s (pid {proc.pid})")
        return proc, info
    raise AssertionError("unreachable")


def start(
    state_dir: Path | None = None,
    port: int | None = None,
    *,
    version: str | None = None,
    timeout: float = READY_TIMEOUT_S,
    secure: bool = False,
    users: Sequence[str] = DEFAULT_USERS,
) -> BrokerInfo:
    """Start a detached broker (survives this process) and wait until it is ready.

    ``secure``: the secured broker (a ``SecureBrokerInfo`` is returned), with SCRAM users
    ``admin`` and ``users`` (made when its state is new).  Idempotent: if a broker of the
    same kind already runs from ``state_dir`` its info is returned.  On failure the state
    dir is kept for inspection (``stop`` removes it).
    """
    state = (state_dir or default_state_dir()).resolve()
    running = is_running(state)
    if running:
        if port not in (None, running.port):
            raise BrokerError(f"a broker already runs from {state} on port {running.port}")
        if isinstance(running, SecureBrokerInfo) != secure:
            kind = "secured" if isinstance(running, SecureBrokerInfo) else "plaintext"
            raise BrokerError(f"a {kind} broker already runs from {state}")
        return running
    _, info = _launch(
        state,
        port,
        version or kafka_version(),
        detached=True,
        timeout=timeout,
        secure=secure,
        users=users,
    )
    return info


def _broker_logs(state: Path) -> list[Path]:
    return [state / "logs" / "server.log", state / "broker.out"]


def stop(state_dir: Path | None = None, *, keep: bool = False) -> bool:
    """Stop the broker of ``state_dir`` (SIGTERM, then SIGKILL); True if one was running.

    The state dir is removed unless ``keep``.
    """
    state = (state_dir or default_state_dir()).resolve()
    info = read_info(state)
    was_running = False
    if info and _pid_alive(info.pid) and _is_our_broker(info.pid, state):
        was_running = True
        _terminate(info.pid)
    if keep:
        for name in (INFO_FILE, "broker.pid"):
            with contextlib.suppress(FileNotFoundError):
                (state / name).unlink()
    else:
        _wipe_state(state)
    return was_running


@contextlib.contextmanager
def local_broker(
    state_dir: Path | None = None,
    *,
    port: int | None = None,
    keep: bool = False,
    version: str | None = None,
    timeout: float = READY_TIMEOUT_S,
) -> Iterator[str]:
    """Run a broker for the duration of the ``with`` block; yields ``"127.0.0.1:PORT"``.

    Without ``state_dir`` a temporary directory is used.  The broker is a child of this
    process, is stopped on exit (and gets SIGTERM if this process dies; see ``_spawn``);
    the state dir is removed unless ``keep``.
    """
    with _session(state_dir, port, keep, version, timeout, secure=False, users=()) as info:
        yield info.bootstrap


@contextlib.contextmanager
def local_secure_broker(
    state_dir: Path | None = None,
    *,
    users: Sequence[str] = DEFAULT_USERS,
    port: int | None = None,
    keep: bool = False,
    version: str | None = None,
    timeout: float = READY_TIMEOUT_S,
) -> Iterator[SecureBrokerInfo]:
    """``local_broker`` for the secured broker, with SCRAM users ``admin`` and ``users``.

    Yields its ``SecureBrokerInfo``; ``port`` is the SASL_SSL listener's.
    """
    with _session(state_dir, port, keep, version, timeout, secure=True, users=users) as info:
        assert isinstance(info, SecureBrokerInfo)
        yield info


@contextlib.contextmanager
def _session(
    state_dir: Path | None,
    port: int | None,
    keep: bool,
    version: str | None,
    timeout: float,
    *,
    secure: bool,
    users: Sequence[str],
) -> Iterator[BrokerInfo]:
    ver = version or kafka_version()
    fetch(ver)
    if state_dir is None:
        state = Path(tempfile.mkdtemp(prefix="agui-kafka-"))
    else:
        state = state_dir.resolve()
        if is_running(state):
            raise BrokerError(f"a broker already runs from {state}; stop it first")
    proc: subprocess.Popen[bytes] | None = None
    try:
        proc, info = _launch(
            state, port, ver, detached=False, timeout=timeout, secure=secure, users=users
        )
        yield info
    finally:
        if proc is not None:
            _stop_proc(proc)
        if keep:
            for name in (INFO_FILE, "broker.pid"):
                with contextlib.suppress(FileNotFoundError):
                    (state / name).unlink()
        elif state_dir is None:
            shutil.rmtree(state, ignore_errors=True)  # our own temp dir
        else:
            _wipe_state(state)


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="kafka_local.py", description="Local single-node Kafka (KRaft) for agui-stream"
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_fetch = sub.add_parser("fetch", help="download the broker jars into the cache")
    p_fetch.add_argument("--version", default=None)
    p_start = sub.add_parser("start", help="start a detached broker and wait until ready")
    p_start.add_argument("--state-dir", type=Path, default=None)
    p_start.add_argument("--port", type=int, default=None)
    p_start.add_argument("--version", default=None)
    p_start.add_argument("--timeout", type=float, default=READY_TIMEOUT_S)
    p_start.add_argument(
        "--secure", action="store_true", help="the secured broker (TLS, SCRAM, ACLs)"
    )
    p_start.add_argument(
        "--user",
        dest="users",
        action="append",
        metavar="NAME",
        help=f"SCRAM user besides admin, repeatable (default: {' '.join(DEFAULT_USERS)})",
    )
    p_env = sub.add_parser(
        "secure-env", help="print `export` lines connecting a worker to the secured broker"
    )
    p_env.add_argument("--user", required=True, metavar="NAME")
    p_env.add_argument("--mtls", action="store_true", help="client certificate, not SCRAM")
    p_env.add_argument("--state-dir", type=Path, default=None)
    p_stop = sub.add_parser("stop", help="stop the broker and remove its state dir")
    p_stop.add_argument("--state-dir", type=Path, default=None)
    p_stop.add_argument("--keep", action="store_true", help="keep the state dir")
    p_status = sub.add_parser("status", help="exit 0 if running (prints bootstrap), 3 if not")
    p_status.add_argument("--state-dir", type=Path, default=None)
    args = parser.parse_args(argv)

    try:
        if args.cmd == "fetch":
            ver = args.version or kafka_version()
            t0 = time.monotonic()
            lib = fetch(ver)
            _say(f"kafka {ver} jars in {lib} ({time.monotonic() - t0:.1f}s)")
            return 0
        if args.cmd == "start":
            if args.users and not args.secure:
                parser.error("--user needs --secure")
            started = start(
                args.state_dir,
                args.port,
                version=args.version,
                timeout=args.timeout,
                secure=args.secure,
                users=DEFAULT_USERS if args.users is None else args.users,
            )
            print(f"KAFKA_BOOTSTRAP_SERVERS={started.bootstrap}", flush=True)
            if isinstance(started, SecureBrokerInfo):
                _say(
                    f"secured: SASL_SSL/{SCRAM_MECHANISM} on {started.sasl_bootstrap}, mTLS on "
                    f"{started.mtls_bootstrap}, CA {started.ca_file}, users "
                    f"{', '.join(_passwords(started.tls_dir))}; a worker's environment: "
                    f'eval "$(python {sys.argv[0]} secure-env --user NAME [--mtls])"'
                )
            return 0
        if args.cmd == "secure-env":
            state = (args.state_dir or default_state_dir()).resolve()
            running = is_running(state)
            if not isinstance(running, SecureBrokerInfo):
                raise BrokerError(f"no secured broker runs from {state}")
            env = worker_settings(running, args.user, mtls=args.mtls)
            print("".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()), end="")
            return 0
        if args.cmd == "stop":
            state = (args.state_dir or default_state_dir()).resolve()
            if stop(state, keep=args.keep):
                _say(f"stopped broker of {state}")
            else:
                _say(f"no broker running from {state}")
            return 0
        if args.cmd == "status":
            state = (args.state_dir or default_state_dir()).resolve()
            info = is_running(state)
            if info is None:
                print(f"not running ({state})")
                return 3
            probe_port, context = _probe_target(info)
            ready = probe("127.0.0.1", probe_port, ssl_context=context)
            secured = (
                f" (SASL_SSL) mtls={info.mtls_bootstrap}"
                if isinstance(info, SecureBrokerInfo)
                else ""
            )
            print(
                f"running pid={info.pid} {'ready' if ready else 'NOT answering'} "
                f"KAFKA_BOOTSTRAP_SERVERS={info.bootstrap}{secured} state={state}"
            )
            return 0 if ready else 1
    except BrokerError as e:
        print(f"[kafka-local] error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())

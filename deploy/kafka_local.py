#!/usr/bin/env python3
"""Run a real single-node Apache Kafka 4.x broker (KRaft, no ZooKeeper) without Docker.

Standard library only.  The broker jars come from Maven Central through ``mvn``
(``org.apache.kafka:kafka_2.13`` plus its runtime dependencies), are fetched once into a
cache directory, and the broker runs as a plain ``java`` process bound to 127.0.0.1.

Command line::

    python deploy/kafka_local.py fetch
    python deploy/kafka_local.py start [--state-dir D] [--port P]   # detached
    python deploy/kafka_local.py status [--state-dir D]
    python deploy/kafka_local.py stop [--state-dir D] [--keep]

``start`` prints ``KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:PORT`` once the broker answers.

As a module (tests load it by file path)::

    with local_broker() as bootstrap:      # "127.0.0.1:PORT"
        ...

Environment:
    AGUI_KAFKA_VERSION  Kafka version to fetch/run (default: DEFAULT_KAFKA_VERSION)
    AGUI_KAFKA_CACHE    directory holding the jars (default ~/.cache/agui-stream/kafka-<ver>)
    AGUI_KAFKA_STATE    default state dir of the CLI (default <repo>/var/kafka-local)
    AGUI_KAFKA_HEAP     JVM max heap (default 512m)
    JAVA_HOME           java to use (default: ``java`` on PATH)
"""

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
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

__all__ = [
    "DEFAULT_KAFKA_VERSION",
    "BrokerError",
    "BrokerInfo",
    "cache_dir",
    "default_state_dir",
    "fetch",
    "free_port",
    "is_running",
    "local_broker",
    "probe",
    "read_info",
    "start",
    "stop",
    "wait_ready",
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


def _server_properties(state: Path, port: int, controller_port: int) -> str:
    props = {
        "process.roles": "broker,controller",
        "node.id": str(NODE_ID),
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
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


def probe(host: str, port: int, timeout: float = 2.0) -> bool:
    """True when the broker answers ApiVersions and lists itself (unfenced) in Metadata."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
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
    except (OSError, struct.error):
        return False


def wait_ready(
    port: int,
    *,
    proc: subprocess.Popen[bytes] | None = None,
    pid: int | None = None,
    logs: Sequence[Path] = (),
    timeout: float = READY_TIMEOUT_S,
) -> float:
    """Poll until the broker on ``port`` is ready; return seconds waited.

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
        if probe("127.0.0.1", port, timeout=2.0):
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
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    (state / "format.log").write_text(fmt.stdout + fmt.stderr)
    if fmt.returncode != 0:
        raise BrokerError(f"StorageTool format failed:\n{(fmt.stdout + fmt.stderr)[-4000:]}")


def _prepare_state(state: Path, port: int | None) -> tuple[int, int]:
    """Write configs and format storage (once); return (port, controller_port)."""
    state.mkdir(parents=True, exist_ok=True)
    (state / "logs").mkdir(exist_ok=True)
    ports_file = state / "ports.json"
    if ports_file.is_file() and (state / "data" / "meta.properties").is_file():
        # Formatted before: the controller endpoint is part of the quorum state, keep ports.
        saved = json.loads(ports_file.read_text())
        if port not in (None, saved["port"]):
            raise BrokerError(
                f"state dir {state} was set up for port {saved['port']}, not {port}; "
                "stop it without --keep or use another --state-dir"
            )
        return int(saved["port"]), int(saved["controller_port"])
    bport = port or free_port()
    cport = free_port()
    while cport == bport:
        cport = free_port()
    (state / "server.properties").write_text(_server_properties(state, bport, cport))
    (state / "log4j2.properties").write_text(_LOG4J2.format(log=state / "logs" / "server.log"))
    ports_file.write_text(json.dumps({"port": bport, "controller_port": cport}))
    return bport, cport


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
        return BrokerInfo(**raw)
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
    state: Path, port: int | None, version: str, *, detached: bool, timeout: float
) -> tuple[subprocess.Popen[bytes], BrokerInfo]:
    """Configure/format ``state``, spawn the broker, write the info file, wait until ready.

    A fresh state dir whose random ports were taken meanwhile is redone on new ports.
    """
    lib = fetch(version)
    if port is not None and not _port_is_free(port):
        raise BrokerError(f"port {port} on 127.0.0.1 is already in use")
    attempts = 3
    for attempt in range(1, attempts + 1):
        fresh = not (state / "data" / "meta.properties").is_file()
        bport, cport = _prepare_state(state, port)
        t0 = time.monotonic()
        proc = _spawn(state, lib, detached=detached)
        info = BrokerInfo(
            pid=proc.pid,
            port=bport,
            controller_port=cport,
            bootstrap=f"127.0.0.1:{bport}",
            version=version,
            state_dir=str(state),
            log_file=str(state / "logs" / "server.log"),
            started_at=time.time(),
        )
        (state / INFO_FILE).write_text(json.dumps(asdict(info), indent=2) + "\n")
        (state / "broker.pid").write_text(f"{proc.pid}\n")
        try:
            wait_ready(bport, proc=proc, logs=_broker_logs(state), timeout=timeout)
        except BrokerError as e:
            _stop_proc(proc)
            if fresh and attempt < attempts and "Address already in use" in str(e):
                _say(f"port clash on {bport}/{cport}; retrying on new ports")
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
) -> BrokerInfo:
    """Start a detached broker (survives this process) and wait until it is ready.

    Idempotent: if a broker already runs from ``state_dir`` its info is returned.
    On failure the state dir is kept for inspection (``stop`` removes it).
    """
    state = (state_dir or default_state_dir()).resolve()
    running = is_running(state)
    if running:
        if port not in (None, running.port):
            raise BrokerError(f"a broker already runs from {state} on port {running.port}")
        return running
    _, info = _launch(state, port, version or kafka_version(), detached=True, timeout=timeout)
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
        proc, info = _launch(state, port, ver, detached=False, timeout=timeout)
        yield info.bootstrap
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
            started = start(args.state_dir, args.port, version=args.version, timeout=args.timeout)
            print(f"KAFKA_BOOTSTRAP_SERVERS={started.bootstrap}", flush=True)
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
            ready = probe("127.0.0.1", info.port)
            print(
                f"running pid={info.pid} {'ready' if ready else 'NOT answering'} "
                f"KAFKA_BOOTSTRAP_SERVERS={info.bootstrap} state={state}"
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

"""Installing what the stack runs: Debian packages, the service account, and the Maven distributions.

Not the docker-compose CLI: only the test that checks docker-compose.yml needs it, and builds it
itself (stack/compose_cli.py), so `make demo` needs no Go.

Each step checks first and does nothing when its result is already there, so a warm `up` spends no
time here. Downloads go through Maven's local repository (a shared cache); each distribution is then
copied into the state directory under a folder named after its version, completed atomically.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path

from pipelines.errors import StackError
from pipelines.logs import get_logger
from stack.pg_extension import ensure_extension
from stack.settings import StackSettings
from stack.shell import ServiceUser, make_dir, run

log = get_logger("stack.install")

MAVEN_DIR = Path(__file__).with_name("maven")
PROMETHEUS_PACKAGE = "prometheus"
COMPLETE_MARKER = ".complete"


@dataclass(frozen=True)
class Distributions:
    """Where the installed components live."""

    java: Path
    kafka: Path
    connect: Path
    connect_plugins: Path
    elasticsearch: Path

    @property
    def java_home(self) -> Path:
        """The JDK folder holding `bin/java`, for Elasticsearch's `ES_JAVA_HOME`."""
        return self.java.parent.parent


def install(settings: StackSettings) -> tuple[ServiceUser, Distributions]:
    """Install everything missing and return the service account and the installed components."""
    ensure_debian_packages(settings.postgres_major)
    ensure_extension(settings.postgres_major, settings.paths.build)
    user = ensure_service_user(settings.stack_user)
    make_dir(settings.paths.root, user)
    check_traversable(settings.paths.root, user)
    dist = make_dir(settings.paths.dist, user)
    versions = {"kafka.version": settings.kafka_version, "log4j.version": settings.log4j_version}
    return user, Distributions(
        java=find_java(),
        kafka=maven_copy(settings, "kafka", dist / f"kafka-{settings.kafka_version}", versions),
        connect=maven_copy(settings, "connect", dist / f"connect-{settings.kafka_version}", versions),
        connect_plugins=debezium_plugin_path(settings, dist),
        elasticsearch=elasticsearch_home(settings, dist),
    )


def ensure_debian_packages(postgres_major: int) -> None:
    """PostgreSQL with the hll, rum and tdigest extensions, a JDK, Maven and Prometheus, from Debian's archive.

    Also what builds the project's own extension (pgext/): PostgreSQL's server headers and PGXS, gcc, make.
    """
    wanted = {
        f"postgresql-{postgres_major}": None,
        f"postgresql-server-dev-{postgres_major}": None,
        "gcc": "gcc",
        "make": "make",
        f"postgresql-{postgres_major}-hll": None,
        f"postgresql-{postgres_major}-rum": None,
        f"postgresql-{postgres_major}-tdigest": None,
        "openjdk-17-jdk-headless": "java",
        "maven": "mvn",
        # Prometheus 2.42 and promtool (which checks and unit-tests monitoring/alerts.yml).
        PROMETHEUS_PACKAGE: "promtool",
    }
    missing = [
        package
        for package, command in wanted.items()
        if (shutil.which(command) is None if command else not _dpkg_installed(package))
    ]
    if not missing:
        return
    if os.geteuid() != 0:
        hint = (
            " (--no-install-recommends for prometheus, then `sudo systemctl disable --now prometheus`:"
            " the stack supervises its own)"
            if PROMETHEUS_PACKAGE in missing
            else ""
        )
        raise StackError(
            f"install: missing Debian packages {' '.join(missing)}; "
            f"run `sudo apt-get install -y {' '.join(missing)}` once{hint}, or run `make up` as root"
        )
    log.info("installing Debian packages", packages=missing)
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-qq"], step="install: apt-get update", env=env)
    others = [package for package in missing if package != PROMETHEUS_PACKAGE]
    if others:
        run(["apt-get", "install", "-y", "-qq", *others], step="install: apt-get install", env=env)
    if PROMETHEUS_PACKAGE in missing:
        run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", PROMETHEUS_PACKAGE],
            step="install: apt-get install prometheus",
            env=env,
        )
        disable_system_prometheus()


def disable_system_prometheus() -> None:
    """Stop the system-wide Prometheus Debian's package starts: the stack supervises its own.

    On a host booted with systemd the package's postinst enables and starts `prometheus.service` on
    port 9090 of every interface, the port the stack's Prometheus wants. (Its recommended node
    exporter, which would take 9100, is not installed: `--no-install-recommends`.) In a container
    without systemd nothing was started.
    """
    if not Path("/run/systemd/system").is_dir() or shutil.which("systemctl") is None:
        return
    log.info("disabling the system prometheus.service; the stack runs its own under supervisord")
    run(["systemctl", "disable", "--now", "prometheus.service"], step="install: disable system prometheus")


def _dpkg_installed(package: str) -> bool:
    done = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True, check=False)
    return done.returncode == 0 and done.stdout.strip() == "install ok installed"


def ensure_service_user(name: str) -> ServiceUser:
    """As root, a system account `name` for the services; otherwise services run as the caller."""
    if os.geteuid() != 0:
        return ServiceUser.current()
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        log.info("creating system user", user=name)
        run(
            [
                "useradd",
                "--system",
                "--user-group",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                name,
            ],
            step="install: useradd",
        )
        entry = pwd.getpwnam(name)
    return ServiceUser(entry.pw_name, entry.pw_uid, entry.pw_gid)


def check_traversable(path: Path, user: ServiceUser) -> None:
    """Fail early, with the fix, when the service account cannot reach the state directory."""
    if not user.is_other:
        return
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        if not mode & 0o001 and parent.stat().st_uid != user.uid:
            raise StackError(
                f"install: user {user.name} cannot enter {parent} (mode {oct(mode & 0o777)}); "
                f"set STACK_STATE_DIR to a folder outside it, e.g. /var/lib/streamviews"
            )


def find_java() -> Path:
    """The `java` that runs Kafka, Connect and Elasticsearch: JAVA_HOME's, else the one on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    candidate = Path(java_home, "bin", "java") if java_home else shutil.which("java")
    if not candidate:
        raise StackError("install: no java found; install a JDK 17+ or set JAVA_HOME")
    return Path(candidate).resolve()


def maven_copy(settings: StackSettings, pom: str, target: Path, properties: dict[str, str]) -> Path:
    """Resolve `stack/maven/<pom>.xml` and copy its jars to `target` (once per version and pom).

    The marker holds a fingerprint of the pom and the properties: a dependency added to the pom is
    resolved on the next `up` even though the version did not change.
    """
    fingerprint = hashlib.sha256(
        (MAVEN_DIR / f"{pom}.xml").read_bytes() + repr(sorted(properties.items())).encode()
    ).hexdigest()
    marker = target / COMPLETE_MARKER
    if marker.exists() and marker.read_text().strip() == fingerprint:
        return target
    staging = target.with_name(f".{target.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    cmd = [
        "mvn",
        "-q",
        "-B",
        "-f",
        MAVEN_DIR / f"{pom}.xml",
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={staging}",
        *(f"-D{key}={value}" for key, value in properties.items()),
    ]
    if settings.stack_maven_repo:
        cmd.append(f"-Dmaven.repo.local={settings.stack_maven_repo}")
    log.info("resolving from Maven Central", component=target.name)
    run(cmd, step=f"install: maven {pom}")
    (staging / COMPLETE_MARKER).write_text(fingerprint)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def debezium_plugin_path(settings: StackSettings, dist: Path) -> Path:
    """A Connect `plugin.path` holding the Debezium PostgreSQL connector in its own folder."""
    plugins = dist / f"connect-plugins-debezium-{settings.debezium_version}"
    plugins.mkdir(exist_ok=True)
    maven_copy(
        settings, "debezium", plugins / "debezium-connector-postgres", {"debezium.version": settings.debezium_version}
    )
    return plugins


def elasticsearch_home(settings: StackSettings, dist: Path) -> Path:
    """The unpacked Elasticsearch distribution, with executable bits restored from the zip."""
    version = settings.elasticsearch_version
    home = dist / f"elasticsearch-{version}"
    if (home / COMPLETE_MARKER).exists():
        return home
    download = maven_copy(
        settings, "elasticsearch", dist / f"elasticsearch-{version}-zip", {"elasticsearch.version": version}
    )
    staging = dist / f".elasticsearch-{version}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    with zipfile.ZipFile(download / f"elasticsearch-{version}.zip") as archive:
        for member in archive.infolist():
            extracted = Path(archive.extract(member, staging))
            mode = member.external_attr >> 16
            if mode:
                extracted.chmod(mode & 0o777)
    unpacked = staging / f"elasticsearch-{version}"
    (unpacked / COMPLETE_MARKER).touch()
    shutil.rmtree(home, ignore_errors=True)
    unpacked.rename(home)
    shutil.rmtree(staging)
    shutil.rmtree(download)
    return home

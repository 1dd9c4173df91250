"""docker-compose.yml as the real Compose CLI reads it: a pinned binary these tests build themselves.

test_compose.py reasons over the YAML as PyYAML parses it; Compose may read it otherwise (merge keys,
interpolation, path resolution, the Compose specification's schema). `docker-compose config` needs no
Docker engine, so these tests ask the tool itself. They are the only users of the CLI, so they build it
(stack/compose_cli.py: seconds with Go's caches warm, about 3 minutes cold) and nothing on `make demo`'s
path does. Without Go they skip, saying so, except under CI, where a skip would hide a broken check.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipelines.errors import StackError
from stack.compose_cli import COMPOSE_VERSION, ensure_compose_cli
from stack.settings import StackSettings
from tests.unit.test_compose import COMPOSE_FILE, DOTENV, ROOT, read_dotenv

# Only .env may set the file's variables: a variable exported by the caller's shell (say from a
# sourced .state/stack.env) would hide one missing from .env, and COMPOSE_* variables change what
# Compose reads. HOME stays for the CLI's config folder.
CLEAN_ENV = {"PATH": os.defpath, "HOME": os.environ.get("HOME", "/nonexistent")}
UNSET_WARNING = re.compile(r'The \\?"(\w+)\\?" variable is not set')

Compose = Callable[..., subprocess.CompletedProcess[str]]


# A cold build downloads and compiles Compose's modules: minutes, counted in the first test's time.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def compose() -> Compose:
    """Run `docker-compose <args>` on the repository's file, building the pinned CLI first if needed."""
    try:
        binary = ensure_compose_cli(StackSettings().paths)
    except StackError as e:
        if os.environ.get("CI") or shutil.which("go"):  # under CI, or a failed build: a real failure
            raise
        pytest.skip(f"docker-compose {COMPOSE_VERSION} cannot be built: {e}")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [str(binary), "--project-directory", str(ROOT), "-f", str(COMPOSE_FILE), *args]
        return subprocess.run(cmd, env=CLEAN_ENV, capture_output=True, text=True, check=False, timeout=60)

    return run


@pytest.fixture(scope="module")
def declared() -> dict[str, Any]:
    """The file as PyYAML reads it, the view test_compose.py checks."""
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def resolved(compose: Compose) -> dict[str, Any]:
    """The model as Compose resolves it: merged, interpolated from .env, paths made absolute."""
    done = compose("config", "--format", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def lines(done: subprocess.CompletedProcess[str]) -> set[str]:
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def interpolate(value: Any, dotenv: dict[str, str]) -> str | None:
    """A scalar of the file as Compose passes it on: ${NAME} replaced from .env (Compose prints `$$` as is)."""
    if value is None:
        return None
    return re.sub(r"(?<!\$)\$\{(\w+)\}", lambda match: dotenv[match[1]], str(value))


def test_the_cli_is_the_pinned_version(compose: Compose) -> None:
    done = compose("version", "--short")

    assert done.stdout.strip() == COMPOSE_VERSION.removeprefix("v"), done.stderr


def test_compose_accepts_the_file_without_a_warning(compose: Compose) -> None:
    done = compose("config", "--quiet")

    assert done.returncode == 0, done.stderr
    # Warnings go to stderr: an unset variable, an obsolete attribute, an unknown extension...
    assert done.stderr == "", done.stderr


def test_every_variable_compose_reads_is_set_in_dotenv_and_every_setting_is_used(compose: Compose) -> None:
    done = compose("config", "--variables", "--format", "json")
    assert done.returncode == 0, done.stderr
    variables = set(json.loads(done.stdout))
    settings = set(read_dotenv(DOTENV)) - {"COMPOSE_PROJECT_NAME"}  # Compose's own, not interpolated

    assert variables, "versions and ports come from .env"
    assert variables <= settings, f"not set in .env: {sorted(variables - settings)}"
    assert settings <= variables, f"set in .env but used nowhere: {sorted(settings - variables)}"

    # Without .env, Compose names every one of them: the silence above is .env's doing.
    bare = compose("--env-file", os.devnull, "config", "--quiet")
    assert set(UNSET_WARNING.findall(bare.stderr)) == variables, bare.stderr


def test_compose_lists_the_services_and_profiles_the_file_declares(compose: Compose, declared: dict[str, Any]) -> None:
    services = declared["services"]
    profiles = {name: set(service.get("profiles", [])) for name, service in services.items()}

    assert lines(compose("config", "--services")) == {name for name, used in profiles.items() if not used}
    assert lines(compose("--profile", "*", "config", "--services")) == set(services)
    assert lines(compose("config", "--profiles")) == set().union(*profiles.values())


def test_compose_resolves_what_the_yaml_tests_read(resolved: dict[str, Any], declared: dict[str, Any]) -> None:
    dotenv = read_dotenv(DOTENV)
    assert resolved["name"] == dotenv["COMPOSE_PROJECT_NAME"]
    assert set(resolved["services"]) == set(declared["services"])
    for name, service in declared["services"].items():
        actual = resolved["services"][name]
        assert actual["image"] == interpolate(service["image"], dotenv), name
        # YAML merge keys (`<<: *pipeline-env`) resolve in Compose as in PyYAML.
        environment = {key: interpolate(value, dotenv) for key, value in (service.get("environment") or {}).items()}
        assert actual.get("environment", {}) == environment, name
        secrets = {ref if isinstance(ref, str) else ref["source"] for ref in service.get("secrets", [])}
        assert {ref["source"] for ref in actual.get("secrets", [])} == secrets, name
        depends_on = service.get("depends_on") or {}
        assert {dep: spec["condition"] for dep, spec in actual.get("depends_on", {}).items()} == {
            dep: spec["condition"] for dep, spec in depends_on.items()
        }, name


def test_every_file_compose_would_mount_or_build_from_is_in_the_repository(resolved: dict[str, Any]) -> None:
    # Compose creates a missing bind-mount source as an empty directory, so a typo'd path starts a
    # container with an empty config folder instead of failing.
    for name, service in resolved["services"].items():
        for volume in service.get("volumes", []):
            if volume["type"] == "bind":
                source = Path(volume["source"])
                assert source.is_relative_to(ROOT), f"{name}: bind mount {source} outside the repository"
                assert source.exists(), f"{name}: bind mount {source} does not exist"
        if "build" in service:
            context = Path(service["build"]["context"])
            assert (context / service["build"].get("dockerfile", "Dockerfile")).is_file(), name
    # Secrets are made by docker/gen-secrets.sh (git-ignored), so only their folder is checked.
    for name, secret in resolved["secrets"].items():
        assert Path(secret["file"]).parent == ROOT / "secrets", name

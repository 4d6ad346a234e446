"""docker/: what can be checked without a Docker engine.

The Dockerfile is parsed with dockerfile-parse and its stages followed from base to target; the compose
files are read with PyYAML (anchors and merge keys resolved as compose does) and, where a compose client
is installed (``docker compose`` or Debian's ``docker-compose``), also rendered by ``config``, which
validates them against the compose schema. The processes the images run are exercised directly by other
tests: the worker with ``-Q auto`` in test_routing.py, gunicorn and /healthz in the load and fault tests.
"""
import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import DockerfileParser

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
TARGETS = ("web", "cpu-worker", "gpu-worker")
INSTRUCTIONS = {"FROM", "ARG", "ENV", "RUN", "COPY", "ADD", "WORKDIR", "USER", "EXPOSE", "CMD", "ENTRYPOINT",
                "HEALTHCHECK", "LABEL", "VOLUME", "STOPSIGNAL", "SHELL", "ONBUILD", "COMMENT"}
SECRET_NAME = re.compile(r"SECRET|PASSWORD|PASSWD|TOKEN|CREDENTIAL|_KEY\b|DATABASE_URL|BROKER_URL", re.I)


def stages():
    """{stage name: {"parent": name or image, "instructions": [(instruction, value)]}} in file order."""
    parser = DockerfileParser(str(DOCKER / "Dockerfile"))
    found, current = {}, None
    for item in parser.structure:
        if item["instruction"] == "FROM":
            image, _, name = item["value"].partition(" AS ")
            current = found.setdefault(name.strip(), {"parent": image.strip(), "instructions": []})
        elif current is not None:
            current["instructions"].append((item["instruction"], item["value"]))
    return found


def global_arguments():
    """The Dockerfile's ARGs before its first FROM, with their defaults: {name: default}."""
    found = {}
    for item in DockerfileParser(str(DOCKER / "Dockerfile")).structure:
        if item["instruction"] == "FROM":
            return found
        if item["instruction"] == "ARG":
            name, _, default = item["value"].partition("=")
            found[name] = default
    return found


def chain(name, all_stages):
    """The instructions that build target ``name``, base stage first."""
    stage = all_stages[name]
    parent = stage["parent"]
    return (chain(parent, all_stages) if parent in all_stages else []) + stage["instructions"]


def compose(name):
    return yaml.safe_load((DOCKER / name).read_text())


def torch_pin():
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(dep.split("==")[1] for dep in dependencies if dep.startswith("torch=="))


def test_the_base_image_is_an_argument_whose_default_is_the_official_python_image():
    """A host without a registry gives bin/build-images' Debian-built base (docker/python.Containerfile)."""
    assert global_arguments()["BASE_IMAGE"] == "python:3.11-slim-bookworm"
    containerfile = (DOCKER / "python.Containerfile").read_text()
    assert "python3.11 -m venv /usr/local" in containerfile  # python, pip and site-packages where the image has them


def test_the_dockerfile_parses_into_the_three_targets():
    parser = DockerfileParser(str(DOCKER / "Dockerfile"))
    assert {item["instruction"] for item in parser.structure} <= INSTRUCTIONS
    all_stages = stages()
    assert set(TARGETS) <= set(all_stages)
    for name, stage in all_stages.items():
        assert stage["parent"] in all_stages or stage["parent"] == "${BASE_IMAGE}", name
        for instruction, value in stage["instructions"]:
            if instruction in ("CMD", "ENTRYPOINT") or (instruction == "HEALTHCHECK" and '["' in value):
                exec_form = value[value.index("["):] if instruction == "HEALTHCHECK" else value
                assert isinstance(json.loads(exec_form), list), (name, value)  # exec form is valid JSON


@pytest.mark.parametrize("target", TARGETS)
def test_each_image_runs_as_a_user_with_a_health_check_and_no_secret(target):
    instructions = chain(target, stages())
    users = [value for instruction, value in instructions if instruction == "USER"]
    assert users and users[-1] == "silentbench"  # not root
    assert any(instruction == "HEALTHCHECK" for instruction, _ in instructions)
    assert any(instruction == "CMD" for instruction, _ in instructions)
    for instruction, value in instructions:
        if instruction in ("ENV", "ARG"):
            names = re.findall(r"(?:^|\s)([A-Za-z_][A-Za-z0-9_]*)=", value) or [value.split("=")[0]]
            assert not [name for name in names if SECRET_NAME.search(name)], (target, value)
        assert "DJANGO_SECRET_KEY=" not in value and "postgres://" not in value, (target, value)


@pytest.mark.parametrize("target, index", [("web", "/whl/cpu"), ("cpu-worker", "/whl/cpu"),
                                           ("gpu-worker", "/whl/${TORCH_CUDA}")])
def test_each_image_pins_the_torch_of_pyproject_from_the_right_build(target, index):
    instructions = chain(target, stages())
    args = dict(value.split("=", 1) for instruction, value in instructions if instruction == "ARG" and "=" in value)
    assert args["TORCH_VERSION"] == torch_pin()
    install = next(value for instruction, value in instructions if instruction == "RUN" and "torch==" in value)
    index_argument = "TORCH_CUDA_INDEX_URL" if target == "gpu-worker" else "TORCH_INDEX_URL"
    assert '"torch==${TORCH_VERSION}"' in install and f'--index-url "${{{index_argument}}}"' in install
    assert args[index_argument] == f"https://download.pytorch.org{index}"
    if target == "gpu-worker":
        assert re.fullmatch(r"cu1\d{2}", args["TORCH_CUDA"])
        env = " ".join(value for instruction, value in instructions if instruction == "ENV")
        assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in env  # utility: nvidia-smi in the container


@pytest.mark.parametrize("target", TARGETS)
def test_dependencies_install_before_the_code_is_copied(target):
    """The old Dockerfile ran `pip install -e .` with only pyproject.toml copied. Now the dependencies come
    from pyproject.toml in a layer of their own, and the code (COPY .) only after them."""
    instructions = chain(target, stages())
    copy_code = next(i for i, (instruction, value) in enumerate(instructions)
                     if instruction == "COPY" and value.split()[0] == ".")
    installs = [i for i, (instruction, value) in enumerate(instructions)
                if instruction == "RUN" and "pip install -r /tmp/requirements.txt" in value]
    assert installs and max(installs) < copy_code
    # nor any system package after the code: a change of code would install it again (seen: 80 s a build)
    assert not [value for instruction, value in instructions[copy_code:] if "apt-get" in value]
    assert not any("pip install -e" in value or "pip install ." in value for _, value in instructions)


def test_the_build_context_leaves_out_secrets_and_local_state():
    ignored = (ROOT / ".dockerignore").read_text().split()
    for entry in (".env", "**/.env", ".venv", "var", ".git", ".mypy_cache"):  # mypy's cache: 150 MB in an image
        assert entry in ignored
    assert "docker/.env" in (ROOT / ".gitignore").read_text().split()


def test_compose_wires_every_service_with_health_checks():
    services = compose("compose.yaml")["services"]
    assert set(services) == {"db", "redis", "web", "cpu-worker", "gpu-worker", "reconciler"}
    dockerfile_stages = stages()
    for name, service in services.items():
        assert service["healthcheck"]["test"], name
        if "build" in service:
            assert service["build"]["target"] in dockerfile_stages and service["build"]["context"] == ".."
            assert service["depends_on"]["db"]["condition"] == "service_healthy"
            assert service["depends_on"]["redis"]["condition"] == "service_healthy"
            assert service["environment"]["CELERY_BROKER_URL"].endswith("@redis:6379/0")
    for name in ("cpu-worker", "gpu-worker", "reconciler"):  # after the web node migrated the database
        assert services[name]["depends_on"]["web"]["condition"] == "service_healthy", name
    assert "manage.py reconcile" in " ".join(services["reconciler"]["command"])
    assert "gunicorn" in " ".join(services["web"]["command"]) and "/healthz" in str(services["web"]["healthcheck"])
    assert "-Q cpu " in services["cpu-worker"]["command"][-1]
    assert "-Q auto-gpu " in services["gpu-worker"]["command"][-1]
    assert services["gpu-worker"]["profiles"] == ["gpu"]  # a host without GPUs starts everything else


@pytest.mark.parametrize("filename", ["compose.yaml", "gpu-node.compose.yaml"])
def test_gpu_workers_reserve_the_nvidia_devices_and_finish_their_run_on_stop(filename):
    worker = compose(filename)["services"]["gpu-worker"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert worker["build"]["target"] == "gpu-worker"
    minutes = int(worker["stop_grace_period"].rstrip("m"))
    assert minutes * 60 > 600  # longer than the default SILENTBENCH_MAX_TIME_LIMIT


def required_variables(text):
    return set(re.findall(r"\$\{([A-Z_]+):\?", text))


def test_secrets_come_from_the_env_file_never_from_the_compose_files():
    text = (DOCKER / "compose.yaml").read_text()
    assert required_variables(text) == {"POSTGRES_PASSWORD", "REDIS_PASSWORD", "DJANGO_SECRET_KEY"}
    for service in compose("compose.yaml")["services"].values():
        for name, value in (service.get("environment") or {}).items():
            if SECRET_NAME.search(name):  # keys, passwords, and URLs with their credentials
                assert "${" in value.split("@")[0], (name, value)  # a reference to .env, never a literal
    workers = compose("compose.yaml")["services"]
    for name in ("cpu-worker", "gpu-worker", "reconciler"):  # workers never need the web node's secret key
        assert "DJANGO_SECRET_KEY" not in workers[name]["environment"]
    example = (DOCKER / ".env.example").read_text()
    for filename in ("compose.yaml", "gpu-node.compose.yaml"):
        for variable in set(re.findall(r"(?<!\$)\$\{([A-Z_]+)", (DOCKER / filename).read_text())):
            assert re.search(rf"^{variable}=", example, re.M), f"{variable} is not in docker/.env.example"
    assert not re.search(r"^(POSTGRES_PASSWORD|DJANGO_SECRET_KEY)=\S", example, re.M)  # left for the operator


def test_a_gpu_node_joins_by_the_database_and_broker_urls_alone():
    text = (DOCKER / "gpu-node.compose.yaml").read_text()
    assert list(compose("gpu-node.compose.yaml")["services"]) == ["gpu-worker"]
    assert required_variables(text) == {"SILENTBENCH_DATABASE_URL", "SILENTBENCH_BROKER_URL"}
    assert "DJANGO_SECRET_KEY" not in text


def compose_client():
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


@pytest.mark.skipif(compose_client() is None, reason="no compose client (docker compose / docker-compose)")
@pytest.mark.parametrize("filename, variables", [
    ("compose.yaml", {"POSTGRES_PASSWORD": "p", "REDIS_PASSWORD": "r", "DJANGO_SECRET_KEY": "k"}),
    ("gpu-node.compose.yaml", {"SILENTBENCH_DATABASE_URL": "postgres://u:p@db.lab/silentbench",
                               "SILENTBENCH_BROKER_URL": "redis://broker.lab:6379/0"}),
])
def test_the_compose_client_accepts_the_files_and_refuses_missing_secrets(filename, variables, tmp_path):
    """``config`` needs no engine: it interpolates, validates against the compose schema and prints."""
    import os

    env = {key: value for key, value in os.environ.items() if key not in variables}
    command = compose_client() + ["--project-directory", str(tmp_path), "-f", str(DOCKER / filename), "config"]
    rendered = subprocess.run(command, capture_output=True, text=True, env={**env, **variables}, cwd=tmp_path)
    assert rendered.returncode == 0, rendered.stderr
    config = yaml.safe_load(rendered.stdout)
    assert "gpu-worker" in config["services"]
    missing = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert missing.returncode != 0 and next(iter(variables)) in missing.stderr

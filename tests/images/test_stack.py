"""The images and docker/compose.yaml for real: bin/build-images builds the images, podman-compose runs the stack as
a lab would (PostgreSQL, Redis, web, a CPU worker and the reconciler, each in a container, network namespace and user
of its own), and these tests drive it from outside, over HTTP, podman and PostgreSQL's published port. A second
worker plays another host: its own network, reaching the database and the broker only through their published ports
with the documented passwords (docs/gpu-nodes.md). bin/test-images runs them; bin/test leaves them out (they need
root, podman and the built images). docs/operations.md, "Containers", says what they found."""
import hashlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
DOCKER = REPOSITORY / "docker"
TAG = os.environ.get("SILENTBENCH_TAG", "latest")
IMAGES = {name: f"localhost/silentbench/{name}:{TAG}" for name in ("web", "cpu-worker", "postgres", "redis")}
BUGS = ["PT-115607", "DS-1801"]
SLOW_BUGS = ["PT-197888"]  # torch.compile: seconds a run, long enough to be killed in the middle of one
DETECTORS = ["plain", "nan_inf"]
SEALED = {"user namespace", "mount namespace", "pid namespace", "network namespace"}
# What podman's runtime is given where it cannot raise a container's limits to its own defaults (a sandboxed host:
# "error setting rlimit type 7: operation not permitted"): containers.conf, read through CONTAINERS_CONF.
CONTAINERS_CONF = """[containers]
default_ulimits = ["nofile=16384:16384", "nproc=8192:8192"]
"""


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def host_address():
    """This host's address on its network, which another host (a container on a network of its own) reaches."""
    addresses = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=True).stdout.split()
    return next(address for address in addresses if "." in address and not address.startswith("127."))


@dataclass
class Lab:
    project: str
    directory: Path
    env: dict = field(repr=False)
    web: str
    db_port: int
    redis_port: int
    address: str
    other_hosts: list = field(default_factory=list)
    token: str = field(default="", repr=False)
    campaign: int = 0

    # --- commands, as an operator types them ---

    def run(self, *command, check=True, timeout=300, **options):
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "CONTAINERS_CONF": str(self.directory / "containers.conf")},
                              **options)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done

    def compose(self, *arguments, **options):
        return self.run(sys.executable, "-m", "podman_compose", "--env-file", str(self.directory / "lab.env"),
                        "-p", self.project, "-f", str(DOCKER / "compose.yaml"), *arguments, cwd=DOCKER, **options)

    def container(self, service):
        names = self.run("podman", "ps", "-a", "--format", "{{.Names}}",
                         "--filter", f"label=com.docker.compose.project={self.project}",
                         "--filter", f"label=com.docker.compose.service={service}").stdout.split()
        assert len(names) == 1, f"{service}: {names}"
        return names[0]

    def exec(self, service, *command, **options):
        return self.run("podman", "exec", self.container(service), *command, **options)

    def healthy(self, name):
        """Runs the container's own health check now (podman without systemd runs none on a timer)."""
        return self.run("podman", "healthcheck", "run", name, check=False).returncode == 0

    def wait_healthy(self, *services, timeout):
        deadline, waiting = time.monotonic() + timeout, list(services)
        while waiting and time.monotonic() < deadline:
            waiting = [service for service in waiting if not self.healthy(self.container(service))]
            if waiting:
                time.sleep(2)
        assert not waiting, f"not healthy after {timeout} s: {waiting}\n{self.logs(*waiting)}"

    def logs(self, *services, tail=60):
        """The last lines each service wrote, standard output and error together."""
        texts = []
        for service in services:
            done = self.run("podman", "logs", "--tail", str(tail), self.container(service), check=False)
            texts.append(f"--- {service} ---\n{done.stdout}{done.stderr}"[-8000:])
        return "\n".join(texts)

    # --- the site, over HTTP ---

    def http(self, method, path, data=None, token=None, form=False):
        headers = {"Accept": "application/json"}
        body = None
        if data is not None and form:
            body, headers["Content-Type"] = urllib.parse.urlencode(data).encode(), "application/x-www-form-urlencoded"
        elif data is not None:
            body, headers["Content-Type"] = json.dumps(data).encode(), "application/json"
        if token:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(self.web + path, data=body, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def api(self, method, path, data=None):
        status, body = self.http(method, path, data, token=self.token)
        assert status < 300, f"{method} {path}: {status} {body[:500]}"
        return json.loads(body)

    def every(self, path):
        """Every item of a paginated API listing, page after page."""
        items, url = [], path
        while url:
            page = self.api("GET", url)
            items += page["results"]
            url = page["next"] and page["next"].removeprefix(self.web)
        return items

    def post_campaign(self, name, seeds, bugs=BUGS):
        return self.api("POST", "/api/campaigns/", {"name": name, "bugs": bugs, "detectors": DETECTORS,
                                                    "seeds": seeds})["id"]

    def wait_completed(self, campaign, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.api("GET", f"/api/campaigns/{campaign}/")["state"] == "finished":
                return
            time.sleep(2)
        raise AssertionError(f"campaign {campaign} not finished after {timeout} s: {self.runs_of(campaign)}\n"
                             + self.logs("cpu-worker", "reconciler"))

    # --- the database, through its published port ---

    def database(self, name="silentbench", attempts=12):
        """A connection through the published port. Tried again for about 80 s: right after ``podman kill`` of
        another container, connections time out while podman tears that container's network down (seen once in CI
        with 4 tries; on 2026-11-29 two runs in a row on this machine outlasted 4 tries, 28 s, and passed with 12)."""
        for attempt in range(attempts):
            try:
                return psycopg.connect(host=self.address, port=self.db_port, dbname=name, user="silentbench",
                                       password=self.env["POSTGRES_PASSWORD"], connect_timeout=5, autocommit=True)
            except psycopg.OperationalError:
                if attempt == attempts - 1:
                    raise
                time.sleep(2)

    def runs_of(self, campaign):
        """{run ID: (status, attempts, worker's host name)} of a campaign, read as a lab's operator would."""
        with self.database() as connection:
            rows = connection.execute(
                "SELECT r.id, r.status, r.attempts, coalesce(w.hostname, '') FROM runners_run r "
                "LEFT JOIN runners_worker w ON w.id = r.worker_id WHERE r.campaign_id = %s ORDER BY r.id",
                [campaign]).fetchall()
        return {run: (status, attempts, worker) for run, status, attempts, worker in rows}

    def worker_name(self, container):
        return "cpu@" + self.run("podman", "inspect", "--format", "{{.Config.Hostname}}", container).stdout.strip()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    for name, image in IMAGES.items():
        assert subprocess.run(["podman", "image", "exists", image]).returncode == 0, \
            f"{image} is not built: bin/build-images (bin/test-images builds them first)"
    directory = tmp_path_factory.mktemp("lab")
    (directory / "containers.conf").write_text(CONTAINERS_CONF)
    address = host_address()
    web_port, db_port, redis_port = free_port(), free_port(), free_port()
    env = {
        # docker/.env.example's variables, secrets generated as it says (openssl rand -hex 32).
        "POSTGRES_PASSWORD": secrets.token_hex(32), "REDIS_PASSWORD": secrets.token_hex(32),
        "DJANGO_SECRET_KEY": secrets.token_hex(32), "DJANGO_ALLOWED_HOSTS": "localhost",
        # A trial on a private network: plain HTTP, no proxy in front (docker/.env.example).
        "DJANGO_HTTPS": "false", "SILENTBENCH_NUM_PROXIES": "0",
        "WEB_PUBLISH": f"127.0.0.1:{web_port}", "DB_PUBLISH": f"{address}:{db_port}",
        "REDIS_PUBLISH": f"{address}:{redis_port}",
        "POSTGRES_IMAGE": IMAGES["postgres"], "REDIS_IMAGE": IMAGES["redis"], "SILENTBENCH_TAG": TAG,
        "WEB_CONCURRENCY": "2", "RECONCILE_EVERY": "5", "SILENTBENCH_WORKER_STALE_SECONDS": "35",
        "CPU_WORKER_CONCURRENCY": os.environ.get("CPU_WORKER_CONCURRENCY", "1"),
    }
    (directory / "lab.env").write_text("".join(f"{key}={value}\n" for key, value in env.items()))
    lab = Lab(project=f"sbtest{uuid.uuid4().hex[:8]}", directory=directory, env=env,
              web=f"http://127.0.0.1:{web_port}", db_port=db_port, redis_port=redis_port, address=address)
    try:
        # podman before 4.6 cannot wait for a dependency's health (podman-compose says so and goes on): one tier
        # at a time, as docs/operations.md tells a podman host to.
        started = time.monotonic()
        lab.compose("up", "-d", "db", "redis")
        lab.wait_healthy("db", "redis", timeout=90)
        services = time.monotonic()
        lab.compose("up", "-d", "web")
        lab.wait_healthy("web", timeout=240)
        web = time.monotonic()
        lab.compose("up", "-d")
        lab.wait_healthy("cpu-worker", timeout=120)
        print(f"\nfrom up to healthy: db and redis {services - started:.1f} s, web (migrated, catalog loaded) "
              f"{web - started:.1f} s, cpu-worker {time.monotonic() - started:.1f} s")
        yield lab
    finally:
        for name in lab.other_hosts:
            lab.run("podman", "rm", "-f", "-t", "0", name, check=False)
        lab.compose("down", "-v", "-t", "5", check=False, timeout=600)
        lab.run("podman", "network", "rm", "-f", f"{lab.project}_otherhost", check=False)


def test_every_service_answers_its_health_check(lab):
    lab.wait_healthy("db", "redis", "web", "cpu-worker", "reconciler", timeout=60)
    status, body = lab.http("GET", "/healthz")
    assert status == 200 and json.loads(body) == {"status": "ok", "database": "ok"}
    status, body = lab.http("GET", "/healthz/ready")
    assert status == 200, body


def test_each_service_runs_as_a_user_of_its_own_not_root(lab):
    users = {service: lab.exec(service, "id", "-un").stdout.strip()
             for service in ("db", "redis", "web", "cpu-worker", "reconciler")}
    assert users == {"db": "postgres", "redis": "redis", "web": "silentbench", "cpu-worker": "silentbench",
                     "reconciler": "silentbench"}


def test_the_web_container_migrated_and_loaded_the_catalog(lab):
    lab.exec("web", "python", "manage.py", "migrate", "--check")
    status, body = lab.http("GET", "/api/bugs/?page_size=100")
    assert status == 200
    bugs = {bug["id"] for bug in json.loads(body)["results"]}
    assert set(BUGS) <= bugs and len(bugs) >= 30


def test_static_files_are_served_compressed_by_the_web_container(lab):
    status, page = lab.http("GET", "/")
    assert status == 200
    stylesheet = next(part.split('"')[0] for part in page.split('href="')[1:] if part.split('"')[0].endswith(".css"))
    request = urllib.request.Request(lab.web + stylesheet, headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200 and response.headers["Content-Encoding"] == "gzip"


def test_a_maintainer_is_made_and_fetches_a_token_over_http(lab):
    password = secrets.token_urlsafe(18) + "&+%"  # sent URL-encoded, as docs/accounts.md's curl does
    lab.run("podman", "exec", "-e", f"DJANGO_SUPERUSER_PASSWORD={password}", lab.container("web"),
            "python", "manage.py", "createsuperuser", "--noinput", "--username", "lab", "--email", "lab@example.org")
    lab.exec("web", "python", "manage.py", "set_role", "lab", "maintainer")
    status, body = lab.http("POST", "/api/token/", {"username": "lab", "password": password, "name": "ci"},
                            form=True)
    assert status in (200, 201), body
    lab.token = json.loads(body)["token"]
    assert lab.api("GET", "/api/tokens/")["count"] == 1


def test_a_campaign_posted_to_the_web_container_runs_sealed_on_the_cpu_worker(lab):
    campaign = lab.post_campaign("containers", seeds=[0])
    lab.wait_completed(campaign, timeout=300)
    runs = lab.api("GET", f"/api/runs/?campaign={campaign}&page_size=100")["results"]
    assert len(runs) == len(BUGS) * len(DETECTORS) * 2
    assert {run["status"] for run in runs} == {"succeeded"}, [run["failure_reason"] for run in runs]
    for run in runs:
        assert SEALED <= set(run["execution"]["layers"]), run["execution"]
        assert run["execution"]["start"] == "warm", run["execution"]
    worker = lab.worker_name(lab.container("cpu-worker"))
    assert {host for _, _, host in lab.runs_of(campaign).values()} == {worker}
    # the fixed twins stay clean; each bug shows at least in its buggy variant
    assert not any(run["manifested"] for run in runs if run["variant"] == "fixed")
    assert {run["bug"] for run in runs if run["variant"] == "buggy" and run["manifested"]} == set(BUGS)
    lab.campaign = campaign


def test_its_results_show_on_the_web_container_s_pages_and_api(lab):
    campaign = lab.campaign
    status, page = lab.http("GET", f"/campaigns/{campaign}/")
    assert status == 200 and all(bug in page for bug in BUGS)
    run = lab.api("GET", f"/api/runs/?campaign={campaign}&variant=buggy&page_size=1")["results"][0]
    status, page = lab.http("GET", f"/runs/{run['id']}/")
    assert status == 200 and "user namespace" in page and run["bug"] in page
    status, record = lab.http("GET", f"/runs/{run['id']}/record.json")
    assert status == 200 and json.loads(record)["run"] == run["id"]


def test_every_cpu_reproducer_of_the_catalog_runs_in_the_worker_image(lab):
    """The catalog's CPU reproducers, both variants, through the containers: none may fail for want of something
    the image lacks (torch.compile's C++ compiler was missing: every one of its runs crashed)."""
    bugs = [bug["id"] for bug in lab.every("/api/bugs/?page_size=100")]
    detectors = ["plain"]
    if os.environ.get("SILENTBENCH_CATALOG_DETECTORS") == "without-fit":  # bin/test-images --gpu
        detectors = [detector["name"] for detector in lab.every("/api/detectors/?page_size=100")
                     if detector["current"] and not detector["needs_fit"]]
    asked = {"name": "the catalog", "bugs": bugs, "detectors": detectors, "seeds": [0]}
    status, body = lab.http("POST", "/api/campaigns/", asked, token=lab.token)
    assert status == 400  # the bugs with CUDA reproducers only, which the API names
    refusals = json.loads(body)["bugs"]
    cuda_only = {refusal.split(":")[0] for refusal in refusals if "no approved CPU reproducer" in refusal}
    assert cuda_only and len(bugs) - len(cuda_only) >= 30, body
    started = time.monotonic()
    campaign = lab.api("POST", "/api/campaigns/", {**asked, "bugs": sorted(set(bugs) - cuda_only)})["id"]
    lab.wait_completed(campaign, timeout=600)
    runs = lab.every(f"/api/runs/?campaign={campaign}&page_size=100")
    print(f"the catalog through the containers ({IMAGES['cpu-worker']}, {len(detectors)} detectors): {len(runs)} runs "
          f"in {time.monotonic() - started:.1f} s")
    failed = {(run["bug"], run["variant"]): run["failure_reason"][-300:]
              for run in runs if run["status"] != "succeeded"}
    assert not failed, failed
    assert not [run["bug"] for run in runs if run["variant"] == "fixed" and run["manifested"]]
    manifested = {run["bug"] for run in runs if run["variant"] == "buggy" and run["manifested"]}
    assert len(manifested) >= len({run["bug"] for run in runs}) - 3, manifested


@pytest.fixture
def other_host(lab):
    """A network namespace of its own, as another machine on the lab's network: a link to this host, and a route to
    this host's address alone (none to the containers' networks). Its name, for ``podman run --network ns:``."""
    name, subnet = f"{lab.project}-host2", f"10.231.{secrets.randbelow(250)}"
    outside, inside = f"{lab.project[-7:]}h2o", f"{lab.project[-7:]}h2i"
    commands = [("ip", "netns", "add", name),
                ("ip", "link", "add", outside, "type", "veth", "peer", "name", inside),
                ("ip", "link", "set", inside, "netns", name),
                ("ip", "addr", "add", f"{subnet}.1/30", "dev", outside), ("ip", "link", "set", outside, "up"),
                ("ip", "-n", name, "addr", "add", f"{subnet}.2/30", "dev", inside),
                ("ip", "-n", name, "link", "set", inside, "up"), ("ip", "-n", name, "link", "set", "lo", "up"),
                ("ip", "-n", name, "route", "add", f"{lab.address}/32", "via", f"{subnet}.1")]
    try:
        for command in commands:
            lab.run(*command)
        yield f"/run/netns/{name}"
    finally:
        for container in lab.other_hosts:  # before its network goes: a worker cut off would keep what it took
            lab.run("podman", "rm", "-f", "-t", "10", container, check=False)
        lab.other_hosts.clear()
        lab.run("ip", "link", "del", outside, check=False)
        lab.run("ip", "netns", "del", name, check=False)


def test_a_worker_on_another_host_reaches_the_database_and_broker_only_over_the_network(lab, other_host):
    """docs/gpu-nodes.md: a node joins by the two URLs, with the passwords of docker/.env. Here a CPU worker on
    "another host" (a network namespace with a route to this host's address only) runs a whole campaign while the
    lab's own worker is stopped."""
    name = f"{lab.project}_otherhost_worker"
    password, broker_password = lab.env["POSTGRES_PASSWORD"], lab.env["REDIS_PASSWORD"]
    lab.run("podman", "run", "-d", "--name", name, "--network", f"ns:{other_host}", "--restart", "unless-stopped",
            "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
            "--security-opt", "unmask=ALL",
            "-e", f"DATABASE_URL=postgres://silentbench:{password}@{lab.address}:{lab.db_port}/silentbench",
            "-e", f"CELERY_BROKER_URL=redis://:{broker_password}@{lab.address}:{lab.redis_port}/0",
            IMAGES["cpu-worker"])
    lab.other_hosts.append(name)
    # neither the lab's names nor its containers' addresses are within its reach
    assert lab.run("podman", "exec", name, "getent", "hosts", "db", check=False).returncode != 0
    db_address = lab.run("podman", "inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                         lab.container("db")).stdout.strip()
    reach = f"import socket; socket.create_connection(({db_address!r}, 5432), timeout=3)"
    assert lab.run("podman", "exec", name, "python", "-c", reach, check=False).returncode != 0
    deadline = time.monotonic() + 120
    while not lab.healthy(name):
        assert time.monotonic() < deadline, lab.run("podman", "logs", "--tail", "40", name).stderr
        time.sleep(2)
    lab.compose("stop", "-t", "60", "cpu-worker")
    try:
        campaign = lab.post_campaign("another host", seeds=[1])
        lab.wait_completed(campaign, timeout=240)
    finally:
        lab.compose("start", "cpu-worker")
    runs = lab.runs_of(campaign)
    assert {status for status, _, _ in runs.values()} == {"succeeded"}
    assert {host for _, _, host in runs.values()} == {lab.worker_name(name)}


def results_digest(connection):
    """What a restored copy must show alike: every run's outcome and every alarm."""
    digest = hashlib.sha256()
    for query in ("SELECT id, campaign_id, status, manifested, trigger_step, attempts, execution::text "
                  "FROM runners_run ORDER BY id",
                  "SELECT id, run_id, step, rank, rule, message FROM runners_alarm ORDER BY id",
                  "SELECT id, name, completed_at FROM runners_campaign ORDER BY id"):
        for row in connection.execute(query):
            digest.update(repr(row).encode())
    return digest.hexdigest()


def test_backup_and_restore_work_against_the_containerised_database(lab):
    """docs/operations.md's commands, in the web container (it has PostgreSQL's client), over the lab network."""
    url = f"postgres://silentbench:{lab.env['POSTGRES_PASSWORD']}@db:5432"
    web = lab.container("web")
    lab.run("podman", "exec", "-e", f"DATABASE_URL={url}/silentbench", web, "bin/backup", "/tmp/lab.dump")
    with lab.database() as connection:
        connection.execute("CREATE DATABASE silentbench_restored")
        original = results_digest(connection)
        runs = connection.execute("SELECT count(*) FROM runners_run").fetchone()[0]
    assert runs >= 2 * len(BUGS) * len(DETECTORS) * 2
    restored = lab.run("podman", "exec", "-e", f"DATABASE_URL={url}/silentbench_restored", web,
                       "bin/restore", "/tmp/lab.dump")
    assert "restored /tmp/lab.dump" in restored.stdout
    with lab.database("silentbench_restored") as connection:
        assert results_digest(connection) == original
    # and the site, pointed at the restored copy, shows it (a one-off container of the web image)
    shown = lab.run("podman", "exec", "-e", f"DATABASE_URL={url}/silentbench_restored", web,
                    "python", "manage.py", "shell", "-c",
                    "from runners.models import Run; print(Run.objects.filter(status='succeeded').count())")
    with lab.database() as connection:
        succeeded = connection.execute("SELECT count(*) FROM runners_run WHERE status = 'succeeded'").fetchone()[0]
    assert int(shown.stdout.split()[-1]) == succeeded


def kill_mid_run(lab, campaign, kill):
    """Once the lab's worker holds a run of ``campaign``, ``kill(container)``; returns the run it held."""
    container = lab.container("cpu-worker")
    victim, deadline = lab.worker_name(container), time.monotonic() + 240
    while True:
        assert time.monotonic() < deadline, f"no run started on {victim}: {lab.runs_of(campaign)}"
        held = [run for run, (status, _, host) in lab.runs_of(campaign).items()
                if status == "running" and host == victim]
        if held:
            kill(container)
            return held[0]
        time.sleep(0.1)


def test_kill_9_of_the_worker_s_processes_loses_no_run(lab):
    """A crash of the worker (SIGKILL to its container's processes, as the OOM killer sends) while it holds a run:
    podman restarts the container (restart: unless-stopped), the worker queues the run again as it starts, and the
    campaign ends with every run succeeded."""
    lab.wait_healthy("cpu-worker", timeout=120)
    campaign = lab.post_campaign("kill -9", seeds=[2], bugs=SLOW_BUGS)
    held = kill_mid_run(lab, campaign, lambda container: os.kill(int(lab.run(
        "podman", "inspect", "--format", "{{.State.Pid}}", container).stdout), signal.SIGKILL))
    lab.wait_completed(campaign, timeout=300)
    runs = lab.runs_of(campaign)
    assert {status for status, _, _ in runs.values()} == {"succeeded"}, runs
    assert runs[held][1] == 2, runs  # a second attempt, on the restarted worker
    assert "was running before it restarted: requeued [" in lab.logs("cpu-worker", tail=400)


def test_a_worker_container_killed_for_good_loses_no_run_the_reconciler_queues_it_again(lab):
    """``podman kill`` stops the worker for good (no restart). Once it has been silent for
    SILENTBENCH_WORKER_STALE_SECONDS the reconciler queues its run again, and a worker that comes back runs it."""
    lab.wait_healthy("cpu-worker", timeout=120)
    campaign = lab.post_campaign("killed for good", seeds=[3], bugs=SLOW_BUGS)
    held = kill_mid_run(lab, campaign, lambda container: lab.run("podman", "kill", "--signal", "KILL", container))
    deadline = time.monotonic() + 120
    while lab.runs_of(campaign)[held][:2] != ("queued", 1):
        assert time.monotonic() < deadline, (lab.runs_of(campaign)[held], lab.logs("reconciler"))
        time.sleep(2)
    # its whole log: a cycle a second adds lines, so under load the requeue had scrolled out of a tail (CI once)
    log = lab.run("podman", "logs", lab.container("reconciler"), check=False)
    reconciled = log.stdout + log.stderr
    assert "requeued from silent workers: [" in reconciled or "requeued from silent workers 1" in reconciled
    lab.compose("start", "cpu-worker")
    lab.wait_completed(campaign, timeout=300)
    runs = lab.runs_of(campaign)
    assert {status for status, _, _ in runs.values()} == {"succeeded"}, runs
    assert runs[held][1] == 2, runs

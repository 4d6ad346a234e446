"""Build a Python environment on this machine (runners/environments/python_environments.py, docs/environments.md).

    python manage.py build_environment torch==2.11.0
    python manage.py build_environment torch==2.15.0 numpy==2.4.6

Prints its name, where it is, how long its build took and how large it is. A second call finds it built and
builds nothing. A worker builds the environments it serves by itself (SILENTBENCH_WORKER_ENVIRONMENTS); this
command builds one ahead of time, or for a look at it."""
import socket

from django.core.management.base import BaseCommand, CommandError

from runners.environments.python_environments import EnvironmentBuildError, build_environment, environment_dir
from runners.models import EnvironmentBuild


class Command(BaseCommand):
    help = "Build (once per machine) the Python environment of these pip requirements, e.g. torch==2.11.0."

    def add_arguments(self, parser):
        parser.add_argument("requirements", nargs="+", help="pip requirements; one of them must name torch")

    def handle(self, requirements, **options):
        try:
            environment = build_environment(requirements)
        except (ValueError, EnvironmentBuildError) as error:
            raise CommandError(str(error)) from None
        build = EnvironmentBuild.objects.get(host=socket.gethostname(), path=str(environment_dir(environment.name)))
        self.stdout.write(f"{environment.name}: torch {environment.torch}, Python {environment.python}, "
                          f"{len(environment.resolved)} packages")
        self.stdout.write(f"  {build.path}: built in {build.build_seconds:g} s, {build.size_bytes / 2**30:.2f} GiB")

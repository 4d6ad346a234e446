import factory
from django.contrib.auth.models import Group, User

from bugs.catalog import content_hash
from bugs.models import Bug, BugStatus, Reproducer, ReproducerVersion, ReviewState
from core.roles import MAINTAINERS_GROUP
from runners.models import Run
from runners.registry import detector_record


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = User
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.django.Password("a-long-test-password")


class MaintainerFactory(UserFactory):
    @factory.post_generation
    def maintainer_group(user, create, extracted, **kwargs):
        if create:
            user.groups.add(Group.objects.get(name=MAINTAINERS_GROUP))


class BugFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Bug

    bug_id = factory.Sequence(lambda n: f"TEST-{n + 1}")
    title = "A test bug"
    framework = "pytorch"
    fault_location = "user"
    root_cause = "The root cause."
    symptom = "The symptom."
    status = BugStatus.APPROVED


class ReproducerFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Reproducer

    bug = factory.SubFactory(BugFactory)
    name = "cpu"
    strategy = "injected"


# The command line and report helper that every test program starts with (docs/reproducer-protocol.md).
PROGRAM_PREAMBLE = """
import argparse, json, os, time
parser = argparse.ArgumentParser()
parser.add_argument("--variant"); parser.add_argument("--seed", type=int); parser.add_argument("--steps", type=int)
args = parser.parse_args()
def report(**record):
    with open(os.environ["SILENTBENCH_REPORT"], "a") as f:
        f.write(json.dumps(record) + "\\n")
"""

GOOD_REPRODUCER = PROGRAM_PREAMBLE + """
report(event="start", time=time.time(), variant=args.variant, seed=args.seed, steps=args.steps, world_size=1)
for step in range(args.steps):
    report(event="step", step=step, rank=0, loss=1.0 / (step + 1), time=time.time())
report(event="oracle", manifested=args.variant == "buggy", trigger_step=1, summary="toy oracle",
       evidence={"environment": sorted(os.environ)})
"""


class ReproducerVersionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ReproducerVersion

    reproducer = factory.SubFactory(ReproducerFactory)
    files = factory.LazyFunction(lambda: {"repro.py": GOOD_REPRODUCER})
    manifest = factory.LazyFunction(lambda: {"entrypoint": "repro.py", "strategy": "injected", "default_steps": 3,
                                             "needs": {"time_limit_seconds": 20, "memory_mb": 1024}})
    content_hash = factory.LazyAttribute(lambda o: content_hash(o.files, o.manifest))
    entrypoint = "repro.py"
    default_steps = 3
    time_limit_seconds = 20
    memory_mb = 1024
    review_state = ReviewState.APPROVED


class RunFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Run

    reproducer_version = factory.SubFactory(ReproducerVersionFactory)
    detector = factory.LazyFunction(lambda: detector_record("plain"))
    variant = "buggy"
    seed = 0
    steps = 3

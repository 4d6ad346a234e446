"""factory_boy factories for every model the tests build. Fields a factory does not declare keep the
model's defaults, so ``XFactory(a=1)`` stores what ``X.objects.create(a=1)`` would (plus required values)."""
import factory
from django.contrib.auth.models import Group, User
from django.utils import timezone

from bugs.catalog import content_hash
from bugs.models import Bug, BugStatus, Reproducer, ReproducerVersion
from core.enums import ReviewState
from core.roles import MAINTAINERS_GROUP
from evaluation.models import Evaluation
from runners.actions.detectors import do_record_detector
from runners.models import Alarm, Campaign, CampaignPurpose, Detector, Environment, Run, StabilityCheck, Worker


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


class DetectorFactory(factory.django.DjangoModelFactory):
    """The Detector row of a registered plugin with this config (its defaults plus ``config``), as the
    registry records it for runs: the same row every time (``runners.actions.detectors.do_record_detector``)."""

    class Meta:
        model = Detector

    name = "plain"
    config = factory.Dict({})

    @classmethod
    def _create(cls, model_class, name, config=None, **kwargs):
        return do_record_detector(name, config)


class CampaignFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Campaign

    name = factory.Sequence(lambda n: f"campaign {n}")


class WorkerFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Worker

    hostname = factory.Sequence(lambda n: f"worker{n}@test")
    last_seen = factory.LazyFunction(timezone.now)


class EnvironmentFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Environment

    fingerprint = factory.Sequence(lambda n: f"environment-{n}")
    host = "test-host"
    python = "3.11"


class RunFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Run

    reproducer_version = factory.SubFactory(ReproducerVersionFactory)
    detector = factory.SubFactory(DetectorFactory)
    variant = "buggy"
    seed = 0
    steps = 3


class AlarmFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Alarm

    run = factory.SubFactory(RunFactory)
    step = 0
    rule = "test_rule"
    message = "A test alarm."


class StabilityCheckFactory(factory.django.DjangoModelFactory):
    """A verification over ``seeds`` seeds; the verdict follows from the counts unless given."""

    class Meta:
        model = StabilityCheck

    reproducer_version = factory.SubFactory(ReproducerVersionFactory)
    seeds = 3
    buggy_manifested = factory.SelfAttribute("seeds")
    fixed_manifested = 0
    failed_runs = 0
    verdict = factory.LazyAttribute(lambda o: StabilityCheck.verdict_for(o.seeds, o.buggy_manifested,
                                                                         o.fixed_manifested, o.failed_runs))


class EvaluationFactory(factory.django.DjangoModelFactory):
    """A stored evaluation with empty tables unless given."""

    class Meta:
        model = Evaluation

    campaign = factory.SubFactory(CampaignFactory, name="evaluation", purpose=CampaignPurpose.EVALUATION)
    tables = factory.Dict({})

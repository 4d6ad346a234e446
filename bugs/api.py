from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Prefetch
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import mixins, permissions, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.response import Response

from core.caching import cached, digest, reader, rows_state
from core.enums import VerificationVerdict

from .actions import do_review_version, do_submit_reproducer
from .filters import BugFilter
from .forms import SUBMITTED_BUG_FIELDS
from .models import Bug, BugStatus, Reproducer, ReproducerVersion, Reproduction, id_prefix_problem
from .permissions import CanReview, can_resubmit
from .selectors import visible_bugs, visible_reproducers, visible_versions
from .submissions import check_uploads


class ReproducerVersionSummarySerializer(serializers.ModelSerializer):
    class Meta:
        model = ReproducerVersion
        fields = ["id", "content_hash", "entrypoint", "default_steps", "time_limit_seconds", "memory_mb",
                  "review_state", "created_at"]


class ReproducerSerializer(serializers.ModelSerializer):
    versions = ReproducerVersionSummarySerializer(many=True, read_only=True)

    class Meta:
        model = Reproducer
        fields = ["id", "name", "strategy", "strategy_note", "oracle_symptom", "oracle_check", "fidelity_note",
                  "simulated", "historical_reason", "needs_cuda", "world_size", "versions"]


class BugSerializer(serializers.ModelSerializer):
    id = serializers.CharField(source="bug_id", read_only=True)
    reproducers = ReproducerSerializer(many=True, read_only=True)

    class Meta:
        model = Bug
        fields = ["id", "title", "framework", "framework_versions", "fault_location", "root_cause_category",
                  "root_cause", "symptom", "fix", "detection_signal", "upstream_issue_url", "fix_url", "links",
                  "reproduction", "catalog_only_reason", "reference_pipelines", "needs_cuda_original",
                  "multi_rank", "source", "status", "deprecation_reason", "held_out", "reproducers"]


class BugViewSet(viewsets.ReadOnlyModelViewSet):
    """The catalog. Filter with ?framework=, ?fault_location=, ?status=, ?multi_rank=, ?q=."""

    serializer_class = BugSerializer
    filterset_class = BugFilter
    lookup_field = "bug_id"
    lookup_value_regex = "[A-Za-z0-9-]+"

    def get_queryset(self):
        """The bugs, reproducers and versions the caller may see (bugs.selectors), nested alike."""
        user = self.request.user
        versions = visible_versions(user).defer("files", "manifest")
        reproducers = visible_reproducers(user).prefetch_related(Prefetch("versions", versions))
        return visible_bugs(user).prefetch_related(Prefetch("reproducers", reproducers)).order_by("bug_id")

    def list(self, request, *args, **kwargs):
        """A page of bugs, serialized once for the same content: the page's bug IDs are read, then every value their
        representations show as plain rows (``shown_rows``: no model instances, no prefetching, which cost more
        than the serializing), and only a page not seen with those values is read whole and serialized. A bug's
        representation is the same for every reader who sees the same reproducers and versions. Where the database
        tells the state of the tables it shows (``core.caching.rows_state``), the whole answer is kept for the same
        state, address and reader, and found again with that one query."""
        state = rows_state(*SHOWN_TABLES)
        key = state and f"api-bugs-page:{digest((state, request.build_absolute_uri(), reader(request.user)))}"
        return Response(cached(key, lambda: self.page(request).data))

    def page(self, request):
        user = request.user
        ids = self.paginate_queryset(self.filter_queryset(visible_bugs(user).order_by("bug_id")).values_list(
            "pk", flat=True))
        return self.get_paginated_response(cached(f"api-bugs:{digest(shown_rows(ids, user))}", lambda: (
            self.get_serializer(self.get_queryset().filter(pk__in=ids), many=True).data)))


SHOWN_TABLES = ("bugs.Bug", "bugs.Reproducer", "bugs.ReproducerVersion")  # everything a bug's representation shows


def shown_rows(bug_ids, user):
    """Every value that BugSerializer shows of these bugs, as ``user`` may see them: their fields, and those of their
    reproducers and versions that ``user`` may see (as ``BugViewSet.get_queryset`` nests them)."""
    def shown(serializer, *nested):
        return [name for name in serializer.Meta.fields if name not in ("id", *nested)]
    return [
        list(Bug.objects.filter(pk__in=bug_ids).order_by("pk").values_list("pk", "bug_id", *shown(
            BugSerializer, "reproducers"))),
        list(visible_reproducers(user).filter(bug__in=bug_ids).order_by("pk").values_list("pk", "bug", *shown(
            ReproducerSerializer, "versions"))),
        list(visible_versions(user).filter(reproducer__bug__in=bug_ids).order_by("pk").values_list(
            "pk", "reproducer", *shown(ReproducerVersionSummarySerializer))),
    ]


class ReviewSerializer(serializers.Serializer):
    decision = serializers.ChoiceField(choices=["approve", "reject"])
    note = serializers.CharField(required=False, allow_blank=True, default="")


class BugSubmissionFieldsSerializer(serializers.ModelSerializer):
    class Meta:
        model = Bug
        fields = SUBMITTED_BUG_FIELDS


class ReproducerVersionSerializer(ReproducerVersionSummarySerializer):
    reproducer = serializers.StringRelatedField()

    class Meta(ReproducerVersionSummarySerializer.Meta):
        fields = [*ReproducerVersionSummarySerializer.Meta.fields, "reproducer", "manifest", "files"]


class ReproducerVersionViewSet(viewsets.ReadOnlyModelViewSet):
    """Exact reproducer contents, by content hash. Runs name the version they executed. Code waiting for
    review, or rejected, is listed only to its submitter and to maintainers."""

    serializer_class = ReproducerVersionSerializer
    filterset_fields = ["review_state", "content_hash", "reproducer__bug__bug_id"]

    def get_queryset(self):
        return visible_versions(self.request.user).select_related("reproducer__bug").order_by("id")

    @extend_schema(request=ReviewSerializer, responses=ReproducerVersionSummarySerializer)
    @action(detail=True, methods=["post"], permission_classes=[CanReview])
    def review(self, request, pk=None):
        """A maintainer approves (verification runs start) or rejects (a note is required) this version."""
        review = ReviewSerializer(data=request.data)
        review.is_valid(raise_exception=True)
        try:
            version = do_review_version(self.get_object(), review.validated_data["decision"] == "approve",
                                        review.validated_data["note"], acting_user=request.user)
        except DjangoValidationError as error:
            raise ValidationError(error.messages) from error
        return Response(ReproducerVersionSummarySerializer(version).data)


class StabilitySerializer(serializers.Serializer):
    """The latest verification of a version: over ``seeds`` seeds, how often each variant showed the symptom."""

    verdict = serializers.ChoiceField(choices=[(v.value, v.label) for v in VerificationVerdict],
                                      help_text="verified: buggy on every seed, fixed on none, no run failed; "
                                                "unreproducible: buggy on none; flaky: anything else.")
    seeds = serializers.IntegerField(help_text="Seeds run, each of them in the buggy and the fixed variant.")
    buggy_manifested = serializers.IntegerField(help_text="Seeds on which the buggy variant showed the symptom.")
    fixed_manifested = serializers.IntegerField(help_text="Seeds on which the fixed variant showed it (none when "
                                                          "verified).")
    failed_runs = serializers.IntegerField(help_text="Runs that failed (crash, time limit, ...); none when verified.")
    campaign = serializers.IntegerField(source="campaign_id", allow_null=True, help_text="The verification campaign.")
    checked_at = serializers.DateTimeField()


class SubmissionSerializer(serializers.ModelSerializer):
    """A new bug and its reproducer (multipart). With ``resubmit_to`` set to a bug ID of yours, only
    ``files`` and ``reproducer_name`` are read: a new version of that bug's reproducer."""

    resubmit_to = serializers.CharField(required=False, write_only=True,
                                        help_text="ID of your own bug, to submit a new version of its reproducer.")
    reproducer_name = serializers.SlugField(default="cpu", max_length=50, write_only=True)
    files = serializers.ListField(child=serializers.FileField(), write_only=True,
                                  help_text="reproducer.yaml and the program, or one .zip/.tar.gz of the folder.")
    bug = serializers.CharField(source="reproducer.bug.bug_id", read_only=True)
    reproducer = serializers.CharField(source="reproducer.name", read_only=True)
    bug_status = serializers.CharField(  # a string in the schema: BugSerializer's status names the enum
        source="reproducer.bug.status", read_only=True,
        help_text=f"The bug's status ({', '.join(BugStatus.values)}): submitted until a version is approved, "
                  f"approved while it is verified, then the verdict (verified, flaky or unreproducible).")
    verification = serializers.SerializerMethodField(
        help_text="The latest verification of this version, once its campaign has finished; null before.")

    class Meta:
        model = ReproducerVersion
        fields = ["id", "bug", "reproducer", "content_hash", "review_state", "review_note", "reviewed_at",
                  "created_at", "bug_status", "verification", "resubmit_to", "reproducer_name", "files"]
        read_only_fields = ["content_hash", "review_state", "review_note", "reviewed_at", "created_at"]

    def get_fields(self):
        """The bug's own fields and validators (ID form and uniqueness, URLs), write-only here."""
        fields = super().get_fields()
        bug_fields = BugSubmissionFieldsSerializer().get_fields()
        for name in SUBMITTED_BUG_FIELDS:
            fields[name] = bug_fields[name]
            fields[name].required = False
            fields[name].write_only = True
        return fields

    @extend_schema_field(StabilitySerializer(allow_null=True))
    def get_verification(self, version):
        checks = version.stability_checks.all()  # runners' StabilityCheck rows, newest first (prefetched)
        return StabilitySerializer(checks[0]).data if checks else None

    # Each check below is a field's, so that DRF reports every field's problems in one answer: the files' with
    # the ID's, instead of the files' only once the ID is right.

    def validate_files(self, uploads):
        """``({path: text}, checked)`` of files without a problem (bugs.submissions.check_uploads)."""
        files, checked, problems = check_uploads(uploads)
        if problems:
            raise ValidationError(problems)
        return files, checked

    def validate_bug_id(self, bug_id):
        """An ID whose prefix another framework reserves is refused (bugs.models.RESERVED_ID_PREFIXES)."""
        if problem := id_prefix_problem(bug_id, self.initial_data.get("framework")):
            raise ValidationError(problem)
        return bug_id

    def validate_reproduction(self, reproduction):
        if reproduction == Reproduction.CATALOG_ONLY:
            raise ValidationError("A submission brings a reproducer: it is faithful or injected, not catalog_only.")
        return reproduction

    def validate_resubmit_to(self, bug_id):
        """The bug to add a version to: one the caller may see and submit versions of."""
        user = self.context["request"].user
        bug = visible_bugs(user).filter(bug_id=bug_id).first()
        if bug is None:
            raise ValidationError(f"No bug {bug_id}.")
        if not can_resubmit(user, bug):
            raise PermissionDenied(f"{bug.bug_id} was submitted by someone else; only they or a maintainer can "
                                   f"submit new versions of it.")
        return bug


class SubmissionViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Your submissions, each with its review, the bug's status and the latest verification. Submitting stores
    the code for review only: nothing runs before a maintainer approves that exact version. Every problem found
    is returned at once, by field (the files' problems under ``files``)."""

    serializer_class = SubmissionSerializer
    permission_classes = [permissions.IsAuthenticated]
    parser_classes = [MultiPartParser, FormParser]

    queryset = ReproducerVersion.objects.none()  # for the schema; get_queryset gives the caller's own

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return self.queryset
        return (visible_versions(self.request.user).filter(submitted_by=self.request.user)
                .select_related("reproducer__bug").prefetch_related("stability_checks")
                .defer("files", "manifest").order_by("-created_at", "-id"))

    def perform_create(self, serializer):
        data = serializer.validated_data
        files, checked = data["files"]
        bug = data.get("resubmit_to")
        bug_fields = None if bug else {name: data.get(name, Bug._meta.get_field(name).get_default())
                                       for name in SUBMITTED_BUG_FIELDS}
        try:
            serializer.instance = do_submit_reproducer(files, data["reproducer_name"], bug=bug, bug_fields=bug_fields,
                                                       acting_user=self.request.user, checked=checked)
        except DjangoValidationError as error:
            raise ValidationError({"files": error.messages}) from error

from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db import models

from .actions import do_hold_out_bug, do_publish_bug
from .models import Bug, Reproducer, ReproducerVersion
from .permissions import can_review
from .selectors import visible_bugs, visible_reproducers, visible_versions


class VisibleOnlyAdmin(admin.ModelAdmin):
    """An admin that lists only what its user may see (bugs.selectors): staff are not maintainers, and
    unreviewed code is shown only to its submitter and to maintainers, here too."""

    visible = None  # the selector: user -> the queryset that user may see

    def get_queryset(self, request):
        return super().get_queryset(request).filter(pk__in=type(self).visible(request.user).values("pk"))


class ReadOnlyAdmin(VisibleOnlyAdmin):
    """Shown, never changed here: what comes from the catalog or a submission."""

    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in self.model._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ReproducerInline(admin.TabularInline):
    model = Reproducer
    extra = 0
    fields = readonly_fields = ["name", "strategy", "simulated", "historical_reason", "needs_cuda", "world_size"]
    show_change_link = True
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def get_queryset(self, request):
        return super().get_queryset(request).filter(pk__in=visible_reproducers(request.user).values("pk"))


@admin.register(Bug)
class BugAdmin(VisibleOnlyAdmin):
    list_display = ["bug_id", "title", "framework", "fault_location", "status", "reproduction", "held_out"]
    list_filter = ["framework", "fault_location", "status", "reproduction", "multi_rank"]
    search_fields = ["bug_id", "title", "root_cause", "symptom"]
    inlines = [ReproducerInline]
    visible = visible_bugs
    # The status and the held-out split change only through the actions (review, verification, deprecate_bug,
    # hold out, publish), which leave a record.
    readonly_fields = ["status", "deprecation_reason", "submitted_by", "held_out", "held_out_at"]
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}  # links typed without a scheme
    actions = ["hold_out", "publish"]

    def has_delete_permission(self, request, obj=None):
        return False  # bugs are deprecated, never deleted

    def has_split_permission(self, request):
        """Moving bugs between the public and the held-out split is the maintainers' (bugs.permissions)."""
        return can_review(request.user)

    def _move(self, request, bugs, action):
        for bug in bugs:
            try:
                bug = action(bug, acting_user=request.user)
            except ValidationError as error:
                self.message_user(request, " ".join(error.messages), messages.WARNING)
            else:
                where = f"held out as {bug.held_out_label}" if bug.held_out else "public"
                self.message_user(request, f"{bug.bug_id}: {where}.")

    @admin.action(description="Hold out the selected bugs", permissions=["split"])
    def hold_out(self, request, queryset):
        self._move(request, queryset, do_hold_out_bug)

    @admin.action(description="Publish the selected held-out bugs", permissions=["split"])
    def publish(self, request, queryset):
        self._move(request, queryset, do_publish_bug)


@admin.register(Reproducer)
class ReproducerAdmin(ReadOnlyAdmin):
    """A reproducer's fields come from its versions' manifests (the catalog or a submission)."""

    list_display = ["__str__", "strategy", "simulated", "needs_cuda", "world_size"]
    list_filter = ["strategy", "simulated", "needs_cuda"]
    visible = visible_reproducers


@admin.register(ReproducerVersion)
class ReproducerVersionAdmin(ReadOnlyAdmin):
    """Versions are immutable and come from submissions or the catalog; they are approved only on the
    review page (``do_review_version``), where the maintainer reads the code."""

    list_display = ["__str__", "review_state", "reviewed_by", "created_at"]
    list_filter = ["review_state"]
    visible = visible_versions

from django.contrib import admin
from django.db import models

from .models import Bug, Reproducer, ReproducerVersion
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
    fields = readonly_fields = ["name", "strategy", "simulated", "needs_cuda", "world_size"]
    show_change_link = True
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def get_queryset(self, request):
        return super().get_queryset(request).filter(pk__in=visible_reproducers(request.user).values("pk"))


@admin.register(Bug)
class BugAdmin(VisibleOnlyAdmin):
    list_display = ["bug_id", "title", "framework", "fault_location", "status", "reproduction"]
    list_filter = ["framework", "fault_location", "status", "reproduction", "multi_rank"]
    search_fields = ["bug_id", "title", "root_cause", "symptom"]
    inlines = [ReproducerInline]
    visible = visible_bugs
    # The status changes only through the actions (review, verification, deprecate_bug), which leave a record.
    readonly_fields = ["status", "deprecation_reason", "submitted_by"]
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}  # links typed without a scheme

    def has_delete_permission(self, request, obj=None):
        return False  # bugs are deprecated, never deleted


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

from django.contrib import admin

from .actions import do_revoke_api_token
from .models import ApiToken


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["__str__", "user", "created_at", "last_used_at", "revoked_at"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "prefix", "user__username"]
    fields = ["user", "name", "prefix", "key_hash", "created_at", "last_used_at", "revoked_at"]
    readonly_fields = ["user", "prefix", "key_hash", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False  # a secret is shown once to its owner: users create tokens at /account/tokens/

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request, queryset):
        for token in queryset.filter(revoked_at__isnull=True):
            do_revoke_api_token(token, acting_user=request.user)

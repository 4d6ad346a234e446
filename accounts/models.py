import hashlib

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import models


def username_max_length():
    """The longest username the user model takes: a longer one cannot exist, so it is neither accepted nor
    counted (the API's sign-in fields, django-axes' failed attempts)."""
    user_model = get_user_model()
    return user_model._meta.get_field(user_model.USERNAME_FIELD).max_length


class ApiToken(models.Model):
    """A named API credential. Only the SHA-256 of the secret is stored; the secret is shown once."""

    PREFIX_LENGTH = 8

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=PREFIX_LENGTH, help_text="The secret's first characters, to recognise it.")
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "API token"

    def __str__(self):
        return f"{self.name} ({self.prefix}…)"

    @staticmethod
    def hash_secret(secret):
        return hashlib.sha256(secret.encode()).hexdigest()

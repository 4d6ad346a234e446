import hashlib

from datetime import timezone

from django.db import migrations


def import_drf_tokens(apps, schema_editor):
    """Keys issued by DRF's authtoken (before named tokens) keep working: their hashes become
    ApiTokens and the plaintext keys are deleted. A fresh database has no such table."""
    connection = schema_editor.connection
    if "authtoken_token" not in connection.introspection.table_names():
        return
    ApiToken = apps.get_model("accounts", "ApiToken")
    with connection.cursor() as cursor:
        cursor.execute("SELECT key, user_id, created FROM authtoken_token")
        rows = cursor.fetchall()
        for key, user_id, created in rows:
            token = ApiToken.objects.create(user_id=user_id, name="API token (from /api/token/, before named tokens)",
                                            prefix=key[:8], key_hash=hashlib.sha256(key.encode()).hexdigest())
            if created.tzinfo is None:  # SQLite hands back naive UTC
                created = created.replace(tzinfo=timezone.utc)
            ApiToken.objects.filter(pk=token.pk).update(created_at=created)
        cursor.execute("DELETE FROM authtoken_token")


class Migration(migrations.Migration):
    dependencies = [("accounts", "0001_initial")]
    operations = [migrations.RunPython(import_drf_tokens, migrations.RunPython.noop)]

from django.db import migrations


class Migration(migrations.Migration):
    """StabilityCheck moved to runners (it records what a verification campaign ran), so that the catalog
    depends on no other app. Only the model state moves here; runners 0006 takes the table."""

    dependencies = [
        ('bugs', '0004_scale_indexes'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[
            migrations.DeleteModel(name='StabilityCheck'),
        ]),
    ]

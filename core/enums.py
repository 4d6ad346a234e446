"""Values that several apps share."""
from django.db import models


class Variant(models.TextChoices):
    """The two sides of every bug reproducer; a clean reference pipeline has only ``fixed``."""
    BUGGY = "buggy", "buggy"
    FIXED = "fixed", "fixed"

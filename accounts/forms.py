from django import forms
from django.contrib.auth.forms import UserCreationForm

from .models import ApiToken


class SignUpForm(UserCreationForm):
    """Username, optional email, the password twice; Django's password validators apply."""

    email = forms.EmailField(required=False, help_text="Optional. Only used to reach you about your submissions.")

    class Meta(UserCreationForm.Meta):
        fields = ["username", "email"]


class ApiTokenForm(forms.Form):
    name = forms.CharField(max_length=ApiToken._meta.get_field("name").max_length,
                           help_text="What will use it, e.g. “laptop” or “CI”.")

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.http import JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from core.roles import capabilities_of, role_of

from .actions import do_create_api_token, do_revoke_api_token
from .forms import ApiTokenForm, SignUpForm
from .models import ApiToken


def safe_next(request):
    target = request.POST.get("next") or request.GET.get("next") or ""
    if url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
        return target
    return "/"


def signup(request):
    form = SignUpForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        user = form.save()
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        return redirect(safe_next(request))
    return render(request, "registration/signup.html", {"form": form, "next": safe_next(request)})


@login_required
def account(request):
    return render(request, "accounts/account.html", {
        "user_role": role_of(request.user), "capabilities": capabilities_of(request.user),
        "active_tokens": request.user.api_tokens.filter(revoked_at__isnull=True).count(),
    })


@never_cache
@login_required
def tokens(request):
    """List, and create: the new secret is rendered in this one response and never again."""
    form = ApiTokenForm(request.POST if request.method == "POST" else None)
    new_secret = None
    if request.method == "POST" and form.is_valid():
        token, new_secret = do_create_api_token(form.cleaned_data["name"], acting_user=request.user)
        form = ApiTokenForm()
    return render(request, "accounts/tokens.html", {
        "form": form, "new_secret": new_secret, "tokens": request.user.api_tokens.all(),
    })


@require_POST
@login_required
def revoke_token(request, pk):
    token = get_object_or_404(ApiToken, pk=pk, user=request.user)
    do_revoke_api_token(token, acting_user=request.user)
    messages.success(request, f"Token “{token.name}” revoked.")
    return redirect("accounts:tokens")


def locked_out(request, original_response=None, credentials=None):
    """django-axes' answer to a sign-in while the account or the client address is locked out: a 429 saying
    for how long, as JSON on the API and as a page on the site."""
    minutes = round(settings.AXES_COOLOFF_TIME.total_seconds() / 60)
    message = (f"Too many failed sign-ins for this account or from this address: signing in is refused, the right "
               f"password too, until {minutes} minutes after the failure that locked it; attempts meanwhile "
               "do not count and do not extend it.")
    if request.path.startswith("/api/"):
        response = JsonResponse({"detail": message}, status=429)
    else:
        response = render(request, "registration/locked_out.html", {"message": message, "next": safe_next(request)},
                          status=429)
    response["Retry-After"] = str(int(settings.AXES_COOLOFF_TIME.total_seconds()))
    return response

from django.urls import path

from . import views

app_name = "accounts"
urlpatterns = [
    path("accounts/signup/", views.signup, name="signup"),
    path("account/", views.account, name="account"),
    path("account/tokens/", views.tokens, name="tokens"),
    path("account/tokens/<int:pk>/revoke/", views.revoke_token, name="revoke_token"),
]

from django.urls import path

from . import views

app_name = "runners"
urlpatterns = [
    path("runs/<int:pk>/", views.run_detail, name="run"),
    path("campaigns/", views.campaign_list, name="campaigns"),
    path("campaigns/<int:pk>/", views.campaign_detail, name="campaign"),
]
